"""Chatter for long conversations: small talk that tells nothing about the user, answered neutrally.

A long conversation tells facts early, then goes on for many turns of chatter ("Tell me something,
number 3.", "Do you like old films?") before a fact is asked. Every chatter turn is committed to memory
like any other, so its reply must not restate or invent a fact about the user ("Got it! I will remember
that ..."): replies here are neutral. The split follows :mod:`memt_demo.values`: about a fifth of
:data:`CHATTER` (by :func:`values.template_split`) and of :data:`TOPICS` is held out, and held-out draws
(``rng.heldout_templates`` / ``rng.heldout_values``) take only those, with numbers from
:data:`HELDOUT_NUMBERS`; names and cities come from the generators of :mod:`memt_demo.values`,
which hold out their own share.

Besides the fixed sentences of :data:`CHATTER`, chatter is composed from :data:`FRAMES` and word pools
(verbs, times, moods, weather, relations...), statements that sound like facts but are none ("I'm tired
today.", "Jazz is underrated.") among them, each answered by one of a few neutral replies: many more
distinct messages than sentences, so a model learns to let any small talk pass rather than a list of it.
Every pool is split like the templates (:func:`values.template_split`).
"""

from __future__ import annotations

import random

from memt_demo import values

#: User message → neutral reply. Slots: {n} a number, {t} a topic ({T} capitalised), {p} a person's name
#: (not the user's), {c} a city (not the user's), {trivia} a sentence of :data:`TRIVIA`.
CHATTER: dict[str, str] = {
    "Tell me something, number {n}.": "Here is something: {trivia}",
    "Say something interesting.": "{trivia}",
    "Tell me a fun fact.": "Here is a fun fact: {trivia}",
    "Give me fact number {n}.": "Fact {n}: {trivia}",
    "Any fun facts today?": "Sure! {trivia}",
    "Surprise me with something.": "{trivia}",
    "What do you think about {t}?": "{T} is an interesting topic. What do you like about it?",
    "I was thinking about {t} today.": "That sounds interesting. Tell me more if you like.",
    "Do you like {t}?": "I don't have favourites, but {t} sounds nice.",
    "I read an article about {t}.": "Nice! What was it about?",
    "Let's talk about {t}.": "Sure, let's talk about {t}.",
    "I might try {t} this weekend.": "Have fun with it!",
    "Is {t} fun?": "Many people think so!",
    "{T} is nice, isn't it?": "Many people enjoy {t}.",
    "My friend {p} loves {t}.": "That's nice for {p}!",
    "I saw {p} at the shop today.": "Nice! I hope {p} is well.",
    "{p} called me this morning.": "That's nice. I hope it was a good call.",
    "Do you know {p}?": "No, I have not met {p}.",
    "My cousin is travelling to {c}.": "I hope the trip to {c} goes well.",
    "Have you ever heard of {c}?": "I have heard the name {c}. Why do you ask?",
    "There was a festival in {c} on the news.": "That sounds lively!",
    "It is raining again.": "Oh no! Stay dry.",
    "What a long day.": "I hope you can rest soon.",
    "Ha ha, that's funny.": "I'm glad you liked it!",
    "Okay.": "Okay! Anything else?",
    "Hmm, let me think.": "Take your time.",
    "Are you still there?": "Yes, I am here.",
    "Round {n}: keep chatting with me.": "Happy to chat! What's on your mind?",
    "Question {n}: how are you today?": "I am fine, thank you!",
    "Just saying hi again.": "Hi again!",
    "Do you ever get bored?": "Not really. I like our chats.",
    "What's new?": "Not much. What would you like to talk about?",
    "Tell me a story.": "Once upon a time, a small robot learned to listen. The end!",
    "Sing me a song.": "La la la! I am better at chatting than singing.",
    "Nothing much to say today.": "That's fine. I'm here if you need me.",
    "I'm bored.": "Let's chat then! What would you like to talk about?",
    "Give me a number.": "How about {n}?",
    "Is {n} a big number?": "It depends on what you count!",
    "Let's play a game.": "Sure! You choose the game.",
    "What time is it?": "I can't see a clock, sorry.",
    "Pick a number between 1 and {n}.": "I pick 1. Simple!",
    "Step {n}, still here.": "Still here too!",
    "Good talk so far.": "I agree, thank you!",
    "Can we just chat for a bit?": "Of course, let's chat.",
    "I'm not sure what to ask next.": "No problem. Ask anything you like.",
}

#: Things chatter is about. None is a value of a personal fact (not in :mod:`memt_demo.pools`).
TOPICS = (
    "old films", "the ocean", "board games", "space travel", "jazz", "thunderstorms", "trains", "volcanoes",
    "lighthouses", "comic books", "street art", "the moon", "crossword puzzles", "bridges", "rainbows",
    "castles", "dinosaurs", "seashells", "poetry", "mountains", "deserts", "museums", "fireworks", "waterfalls",
    "the circus", "magic tricks", "hot air balloons", "submarines", "ancient Rome", "clocks", "maps",
    "autumn leaves", "snowmen", "campfires", "bees", "windmills", "sunsets", "long walks", "rainy days",
    "quiet mornings",
)

TRIVIA = (
    "Octopuses have three hearts.", "Honey never spoils.", "Bananas are berries, but strawberries are not.",
    "A group of crows is called a murder.", "Sharks are older than trees.", "The Eiffel Tower grows in summer.",
    "Sloths can hold their breath for a long time.", "A day on Venus is longer than its year.",
    "Some turtles can breathe through their tails.", "Snails can sleep for a very long time.",
    "Lightning is hotter than the surface of the sun.", "Cows have best friends.",
)

TRIVIA += (
    "Some frogs can freeze and thaw again.", "Butterflies taste with their feet.", "A cloud can weigh a lot.",
    "The moon drifts away from the earth a little every year.", "Owls cannot move their eyes.",
    "Penguins have knees.", "Hot water can freeze faster than cold water.", "Koalas sleep most of the day.",
    "A bolt of lightning is very thin.", "Starfish have no brain.",
    "Wombats make cube-shaped droppings.", "Some trees talk to each other through fungi.",
    "A snail can have thousands of teeth.", "Sea otters hold hands while they sleep.",
    "The heart of a blue whale is as big as a small car.", "Ants never sleep in the way we do.",
    "Flamingos are pink because of what they eat.", "Rain has a smell, and it has a name: petrichor.",
)

#: User message frame → neutral replies. Slots besides :data:`CHATTER`'s: {o} an opener, {v} a verb phrase, {w} a
#: time, {g} a place anyone goes, {a} an adjective, {m} a mood, {now} a moment, {x} weather, {r} a relation,
#: {rv} what the relation does, {q} a trivia sentence in lower case.
FRAMES: dict[str, tuple[str, ...]] = {
    "{o}, I {v} {t} {w}.": ("That sounds interesting.", "Nice! Tell me more if you like.", "Oh, {t}! What did you think?", "Thanks for sharing that."),
    "I {v} {t} {w}.": ("That sounds interesting.", "Nice! Tell me more if you like.", "Thanks for sharing that."),
    "{w} I {v} {t}.": ("Oh, {t}! What did you think?", "That sounds interesting."),
    "{T} is {a}.": ("Many people think so.", "I can see why you say that.", "Interesting! What makes it {a} for you?"),
    "I think {t} is {a}.": ("That's a fair thought.", "I can see why you say that.", "Many people think so."),
    "{o}, {t} is {a}, right?": ("Many people would agree.", "It can be! What do you think?"),
    "I'm {m} {now}.": ("Thanks for telling me.", "I see. Want to chat for a while?", "Okay! I'm here if you want to talk."),
    "{o}, I'm feeling {m}.": ("Thanks for telling me.", "I see. Want to chat for a while?"),
    "I feel {m} {now}.": ("Okay! I'm here if you want to talk.", "Thanks for telling me."),
    "It's {x} today.": ("Thanks for the update!", "Sounds like a {x} day."),
    "It was {x} {w}.": ("I see. Thanks for telling me.", "Sounds like it was {x}."),
    "What do you know about {t}?": ("{T} is a big topic. What would you like to know?", "A little! What about {t} interests you?"),
    "Can you tell me something about {t}?": ("Sure! {trivia}", "{T} is a big topic. Where should we start?"),
    "Did you know that {q}": ("I did not know that! Thanks.", "Interesting! Thanks for telling me."),
    "My {r} {p} {rv} {t}.": ("That's nice for {p}!", "Nice! Do you like {t} too?"),
    "My {r} told me about {t} {w}.": ("That sounds interesting.", "Nice! What did they say?"),
    "Let's chat about {t} for a bit.": ("Sure, let's talk about {t}.", "Happy to! What about {t}?"),
    "{o}, what should we talk about?": ("Anything you like! Maybe {t}?", "How about {t}?"),
    "{o}, never mind.": ("No problem.", "Okay! I'm here if you need me."),
    "I just got back from {g}.": ("Welcome back!", "I hope it was a nice time.", "Oh, how was it?"),
    "{o}, I went to {g} {w}.": ("Sounds like a busy day.", "I hope it was a nice time."),
}

#: Every chatter message template → its replies: :data:`CHATTER`'s sentences and the :data:`FRAMES`.
TEMPLATES: dict[str, tuple[str, ...]] = {**{user: (reply,) for user, reply in CHATTER.items()}, **FRAMES}

#: Word pools of the frames' slots (split like the templates: a fifth of each is held out).
WORDS: dict[str, tuple[str, ...]] = {
    "{o}": ("So", "Well", "Anyway", "Oh", "Hey", "Honestly", "By the way", "You know", "Okay", "Hmm", "Alright", "Ah"),
    "{v}": ("watched a show about", "read about", "talked about", "heard a podcast about", "saw a video about",
            "thought about", "learned about", "dreamed about", "looked at pictures of", "argued about"),
    "{w}": ("yesterday", "this morning", "last week", "today", "last night", "on the weekend", "an hour ago",
            "after lunch", "on the train", "before bed"),
    "{a}": ("nice", "fun", "interesting", "a bit boring", "amazing", "strange", "relaxing", "hard to explain",
            "underrated", "beautiful"),
    "{m}": ("bored", "tired", "hungry", "happy", "sleepy", "busy", "a bit sad", "excited", "calm", "grumpy"),
    "{now}": ("today", "right now", "again", "this evening", "at the moment"),
    "{x}": ("sunny", "cold", "windy", "rainy", "warm", "cloudy", "foggy", "snowy", "humid", "stormy"),
    "{r}": ("neighbour", "cousin", "colleague", "uncle", "aunt", "classmate", "brother", "sister", "teacher", "roommate"),
    "{rv}": ("likes", "is into", "talked about", "keeps mentioning", "wrote a poem about"),
    "{g}": ("the shop", "the post office", "a walk", "the bakery", "the dentist", "the market", "the bank",
            "the hairdresser", "a meeting", "the station"),
}

TRAINING_NUMBERS = range(1, 60)
HELDOUT_NUMBERS = range(60, 100)


def _capitalise(text: str) -> str:
    return text[:1].upper() + text[1:]


def _drawn(rng: random.Random, pool: tuple[str, ...]) -> str:
    train, held = values.template_split(pool)
    return rng.choice(held if getattr(rng, "heldout_values", False) else train)


def topic(rng: random.Random) -> str:
    return _drawn(rng, TOPICS)


def number(rng: random.Random) -> str:
    return str(rng.choice(HELDOUT_NUMBERS if getattr(rng, "heldout_values", False) else TRAINING_NUMBERS))


def chatter(rng: random.Random) -> tuple[str, str, tuple[str, ...]]:
    """One chatter turn: ``(user message, neutral reply, values the reply copies)``, from ``rng``'s side of the split.

    A training message is perturbed by :func:`values.vary` like other training phrasings (``rng.variation``).
    """
    train, held = values.template_split(tuple(TEMPLATES))
    heldout = getattr(rng, "heldout_templates", False)
    template = rng.choice(held if heldout else train)
    user, reply = template, rng.choice(TEMPLATES[template])
    variation = getattr(rng, "variation", 0.0)
    if not heldout and variation and rng.random() < variation:
        user = values.vary(rng, template, held)
    trivia = _drawn(rng, TRIVIA)
    slots = {"{n}": number(rng), "{p}": values.person_name(rng), "{c}": values.city(rng), "{trivia}": trivia,
             "{q}": trivia[:1].lower() + trivia[1:], "{t}": topic(rng)}
    slots["{T}"] = _capitalise(slots["{t}"])
    slots.update({key: _drawn(rng, pool) for key, pool in WORDS.items()})
    for key in sorted(slots, key=len, reverse=True):  # {now} before {n}
        user, reply = user.replace(key, slots[key]), reply.replace(key, slots[key])
    user, reply = _capitalise(user), _capitalise(reply)
    copied = tuple(v for k, v in slots.items() if k in ("{p}", "{c}", "{n}") and v in reply)
    return user, reply, copied


def is_fact_shaped(reply: str) -> bool:
    """A reply that confirms a fact about the user, as a statement's acknowledgement does (chatter must not)."""
    lowered = reply.lower()
    return "i will remember" in lowered or "nice to meet you" in lowered or lowered.startswith("got it")

"""Synthetic conversations for the demo model, at the text level.

An :class:`Episode` is what one training example (or one evaluation case) is made of: the things
written to latent memory, in order (conversation turns, tool-calling turns, documents), and a final
:class:`EpisodeQuestion` whose prompt holds *only* what a client would send after trimming committed turns, with
the answer the model should give. Every value (names, cities, addresses, codes, …) is drawn for each
episode by the open-vocabulary generators of :mod:`memt_demo.values` (or from the word lists of
:mod:`memt_demo.pools`), so the only place an episode's facts can come from is the memory (or, for
in-context episodes, the prompt). ``EpisodeSampler(seed, heldout=True)`` draws the held-out split:
held-out values and held-out phrasings that training never sees.

Skills: (1) personal facts said in one turn and asked about later, several facts per turn and several
turns; (2) a document ingested through memory and questions about it; (3) tool calls for
``get_weather``, ``add`` and ``multiply`` and answers from the tool's result, given as JSON or as plain
text; (4) repeating or typing a text exactly; (5) long conversations: facts kept through many turns of
neutrally answered chatter (:mod:`memt_demo.chatter`). :class:`EpisodeSampler` mixes them; :class:`Mix` says in what proportions, with a
curriculum from a warm-up on single facts to the full mix with many facts and distractor commits.
Turning an episode into token ids is :mod:`memt_demo.format`'s job.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Union

from memt_demo import chatter, pools, values
from memt_demo.values import DemoRandom, phrasing

# --------------------------------------------------------------------------------------------------
# Data model


@dataclass(frozen=True)
class EpisodeToolCall:
    name: str
    arguments: dict


@dataclass
class EpisodeTurn:
    """A conversation turn: the user's message and the assistant's reply (``values``: words to stress)."""

    user: str
    reply: str
    values: tuple[str, ...] = ()


@dataclass
class ToolTurn:
    """A turn that calls a tool: user message, the call, the tool's result (JSON or plain text), the final reply."""

    user: str
    tools: list[dict]
    call: EpisodeToolCall
    result: str
    reply: str
    values: tuple[str, ...] = ()


@dataclass
class Document:
    """Raw text ingested through memory, split into ``chunk_tokens`` pieces (one commit each)."""

    text: str


#: One commit: several turns concatenated, or a document (which becomes one commit per piece).
Commit = Union[list[Union[EpisodeTurn, ToolTurn]], Document]


@dataclass
class EpisodeQuestion:
    """The request after the commits: chat messages (+ tools) and the expected answer text."""

    messages: list[dict]
    answer: str
    tools: list[dict] | None = None
    thinking: bool = False
    values: tuple[str, ...] = ()  # words of the answer that carry the skill (recalled values, copied args)
    meta: dict = field(default_factory=dict)


@dataclass
class Episode:
    kind: str
    commits: list[Commit]
    query: EpisodeQuestion


# --------------------------------------------------------------------------------------------------
# Personal facts


@dataclass(frozen=True)
class Attribute:
    """A kind of personal fact: how its values are drawn, how the user states and asks it, how it is said back.

    Templates use ``{v}`` for the value, ``{a}`` for its article ("a"/"an") and ``{animal}`` for a pet's
    kind; statements are sentence fragments (lower-case unless they start with "I") so they can be joined
    with "and". :func:`~memt_demo.values.phrasing` holds out ~20 % of each template tuple.
    """

    key: str
    draw: Callable[[random.Random], str]
    statements: tuple[str, ...]
    questions: tuple[str, ...]
    clause: str  # second person, e.g. "you live in {v}": used in replies and answers
    unknown: str  # "I don't know ...": e.g. "where you live"
    keys: tuple[str, ...] = ()  # what the user calls it after "my" ("employer"): composed phrasings, see :func:`composed`


def _from(pool: tuple[str, ...]) -> Callable[[random.Random], str]:
    return lambda rng: rng.choice(pool)


ATTRIBUTES: dict[str, Attribute] = {
    a.key: a
    for a in (
        Attribute(
            "name", values.person_name,
            ("my name is {v}", "I am {v}", "I'm {v}", "call me {v}", "my name's {v}", "everyone knows me as {v}",
             "my friends know me as {v}", "the name is {v}", "you can call me {v}", "people call me {v}",
             "I go by {v}", "my first name is {v}", "I'm called {v}", "I am called {v}", "{v} is my name",
             "{v} here", "this is {v} speaking", "it's me, {v}", "my parents named me {v}", "please call me {v}",
             "the name's {v}", "I am named {v}", "they call me {v}", "I introduce myself as {v}"),
            ("What is my name?", "What's my name?", "Do you remember my name?", "Who am I?", "What am I called?",
             "Can you tell me my name?", "What did I say my name was?", "Do you know my name?",
             "What do people call me?", "Whats my name", "Tell me my name.", "Who is talking to you?",
             "Remind me what my name is.", "What name did I give you?", "Say my name.", "What should you call me?",
             "Do you still know who I am?", "How am I called?", "What was my name again?",
             "Can you remember what I'm called?", "Who did I say I was?", "Which name do I use?"),
            "your name is {v}", "your name",
            ("name", "first name", "given name", "full name"),
        ),
        Attribute(
            "age", lambda rng: str(rng.randint(16, 90)),
            ("I am {v} years old", "I'm {v} years old", "my age is {v}", "I just turned {v}",
             "I turned {v} this year", "I'm {v}", "I am {v} now", "my age is {v} years", "I'm {v} years of age",
             "I have been alive for {v} years", "I will be {v} until my next birthday", "last month I turned {v}",
             "age-wise I'm {v}", "I am aged {v}"),
            ("How old am I?", "What is my age?", "What's my age?", "Do you know how old I am?",
             "How many years old am I?", "What age am I?", "Tell me my age.", "How old did I say I was?",
             "Remind me how old I am.", "Do you remember my age?", "What is my current age?",
             "Can you tell me how old I am?", "What age did I tell you?"),
            "you are {v} years old", "how old you are",
            ("age", "current age"),
        ),
        Attribute(
            "city", values.city,
            ("I live in {v}", "I'm from {v}", "my home town is {v}", "I am living in {v}", "my city is {v}",
             "I moved to {v} last year", "home for me is {v}", "I grew up in {v} and still live there",
             "I'm based in {v}", "I reside in {v}", "I've lived in {v} for years", "my home is in {v}",
             "I come from {v}", "I stay in {v}", "these days I live in {v}", "my flat is in {v}",
             "I was born and raised in {v}", "I call {v} home", "right now I live in {v}", "we live in {v}",
             "my house is in {v}", "I have a place in {v}", "{v} is where I live", "I am a resident of {v}"),
            ("Where do I live?", "Which city do I live in?", "Where am I from?", "What is my home town?",
             "What city am I from?", "In which city is my home?", "Remind me where I live.", "Where's my home?",
             "What city do I live in?", "Where am I based?", "Do you remember where I live?",
             "Which city is my home?", "Where did I say I live?", "Tell me where I live.", "Where is my house?",
             "What's my city?", "Do you know which city I'm in?", "Where do I come from?", "What's my home town?",
             "In what city do I reside?"),
            "you live in {v}", "where you live",
            ("city", "home city", "home town", "town", "city of residence"),
        ),
        Attribute(
            "food", values.food,
            ("my favourite food is {v}", "my favorite food is {v}", "I love eating {v}", "I really like {v}",
             "nothing beats {v} for me", "I could eat {v} every day", "I adore {v}", "my favourite dish is {v}",
             "I'm crazy about {v}", "I eat {v} whenever I can", "the best food in the world is {v}",
             "my favorite meal is {v}", "I really enjoy {v}", "I'm a big fan of {v}", "I never say no to {v}",
             "my go-to food is {v}", "I'd eat {v} for every meal", "food-wise I love {v}", "I am addicted to {v}",
             "I like {v} more than anything"),
            ("What is my favourite food?", "What's my favorite food?", "What food do I like?",
             "What do I love eating?", "Which food do I like best?", "What's my favourite dish?",
             "What do I like to eat?", "Which dish do I love?", "What food am I crazy about?",
             "Do you remember my favourite food?", "What is my favorite meal?", "whats my favourite food",
             "What should you cook for me?", "Tell me my favourite food.", "Which food did I say I love?",
             "What would I eat every day?"),
            "your favourite food is {v}", "your favourite food",
            ("favourite food", "favorite food", "favourite dish", "favourite meal", "best-loved food"),
        ),
        Attribute(
            "pet", _from(pools.ANIMALS),
            ("I have a pet {v}", "I have {a} {v} at home", "my pet is {a} {v}", "I own {a} {v}",
             "there is {a} {v} living with me", "I keep {a} {v} as a pet", "I live with {a} {v}",
             "my only pet is {a} {v}", "at home I have {a} {v}", "I got {a} {v} last year", "I look after {a} {v}",
             "I share my flat with {a} {v}", "we have {a} {v}", "I recently adopted {a} {v}"),
            ("What pet do I have?", "What kind of pet do I have?", "What animal do I have at home?",
             "Which animal lives with me?", "What is my pet?", "What's my pet?", "Do I have a pet, and which?",
             "What animal do I own?", "Which pet did I tell you about?", "What kind of animal is my pet?",
             "Remind me what pet I have.", "Which animal do I keep?",
             "What animal shares my home?"),
            "you have {a} {v}", "what pet you have",
        ),
        Attribute(
            "pet_name", values.pet_name,
            ("I have {a} {animal} named {v}", "my {animal} is called {v}", "my {animal}'s name is {v}",
             "I have a three-month-old {animal} named {v} who loves eating small shrimp",
             "we adopted {a} {animal} and called it {v}", "I have a little {animal} called {v} who loves to play",
             "my pet {animal} is named {v}", "I've got {a} {animal} called {v}", "my {animal} goes by {v}",
             "I named my {animal} {v}", "there's {a} {animal} at home, its name is {v}", "I own {a} {animal} named {v}",
             "our {animal} is called {v}", "I have a pet {animal} and its name is {v}",
             "my {animal}, {v}, is sleeping next to me", "I have a two-year-old {animal} named {v}",
             "I have {a} {animal} named {v} who loves sleeping in the sun", "{v} is the name of my {animal}",
             "I just got {a} {animal}, I called it {v}", "I have a fluffy {animal} named {v}",
             "I have {a} {animal} and I named it {v}", "my little {animal} is called {v}"),
            ("What is my {animal}'s name?", "What is my {animal} called?", "What's the name of my {animal}?",
             "What is my pet's name?", "Do you remember what my {animal} is called?", "What's my {animal}'s name?",
             "What did I name my {animal}?", "How is my {animal} called?", "Tell me my {animal}'s name.",
             "What's my pet called?", "What name does my {animal} have?", "whats my {animal} called",
             "Do you remember my {animal}'s name?", "What's the name of my pet?", "Remind me what I called my {animal}.",
             "What do I call my {animal}?", "Which name did I give my {animal}?"),
            "your {animal} is called {v}", "your pet's name",
            ("{animal}'s name", "pet's name", "little {animal}'s name", "animal's name"),
        ),
        Attribute(
            "job", _from(pools.JOBS),
            ("I work as {a} {v}", "I'm {a} {v} by trade", "by profession I am {a} {v}", "I earn my living as {a} {v}",
             "I have been {a} {v} for years", "I am {a} {v}", "my job is {v}", "I work as {a} {v} in a small firm",
             "I'm employed as {a} {v}", "for work I am {a} {v}", "my profession is {v}", "I trained as {a} {v}",
             "I make a living as {a} {v}", "my job title is {v}"),
            ("What is my job?", "What do I do for a living?", "What is my profession?", "What do I work as?",
             "What kind of work do I do?", "What's my job?", "What's my profession?", "How do I earn my living?",
             "What is my line of work?", "Do you remember my job?", "what do i do for work",
             "Which job do I have?", "What do I do at work?", "What's my job title?"),
            "you work as {a} {v}", "your job",
            ("job", "profession", "occupation", "line of work"),
        ),
        Attribute(
            "company", values.company,
            ("I work for {v}", "my employer is {v}", "I have a job at {v}", "my company is called {v}",
             "I am employed by {v}", "I work at {v}", "I'm with {v}", "I've been working at {v} for a year",
             "{v} pays my salary", "my boss runs {v}", "I got hired by {v}", "my office is at {v}",
             "I joined {v} last month", "I'm on the staff of {v}", "my workplace is {v}", "I do my job at {v}",
             "the company I work for is {v}"),
            ("Where do I work?", "Which company do I work for?", "Who is my employer?",
             "What is the name of my company?", "Which firm employs me?", "What company do I work at?",
             "Who do I work for?", "Where's my job?", "Which company pays my salary?", "What's my employer called?",
             "Do you remember where I work?", "What is my workplace?",
             "Which company did I join?", "Tell me where I work."),
            "you work for {v}", "where you work",
            ("employer", "company", "workplace", "firm", "current employer"),
        ),
        Attribute(
            "trait", _from(pools.TRAITS),
            ("I am very {v}", "people say I am {v}", "my friends think I am {v}", "everyone says I'm {v}",
             "I would describe myself as {v}", "I'm quite {v}", "I am a {v} person", "I've always been {v}",
             "most people find me {v}", "I tend to be {v}", "I consider myself {v}", "my family calls me {v}",
             "I'm rather {v}"),
            ("How would you describe me?", "What kind of person am I?", "What is my personality like?",
             "What am I like?", "How do my friends describe me?", "What's my personality?",
             "How do people see me?", "What sort of person am I?", "Describe me in one word.",
             "What do my friends think of me?", "How would I describe myself?"),
            "you are {v}", "what you are like",
        ),
        Attribute(
            "colour", _from(pools.COLOURS),
            ("my favourite colour is {v}", "my favorite color is {v}", "I like the colour {v} best",
             "the colour I love most is {v}", "I always wear {v} because it is my favourite colour",
             "I love the color {v}", "my favourite color has always been {v}",
             "I like {v} more than any other colour", "my room is painted {v}, my favourite colour",
             "the best colour is {v}", "I'm a fan of the colour {v}", "my fave colour is {v}",
             "if I had to pick a colour, it would be {v}"),
            ("What is my favourite colour?", "What's my favorite color?", "Which colour do I like best?",
             "What colour do I love most?", "Do you remember my favourite colour?", "Which color is my favourite?",
             "What's my favourite colour?", "What colour do I like?", "Tell me my favourite colour.",
             "whats my favorite color", "What colour should my present be?", "Which colour did I say I love?",
             "What is my favorite colour?"),
            "your favourite colour is {v}", "your favourite colour",
            ("favourite colour", "favorite color", "favourite color", "colour"),
        ),
        Attribute(
            "hobby", _from(pools.HOBBIES),
            ("my hobby is {v}", "I enjoy {v} in my free time", "in my free time I love {v}",
             "I spend my weekends on {v}", "my favourite pastime is {v}", "I'm really into {v}",
             "my main hobby is {v}", "I love {v}", "for fun I do {v}", "when I have time I go for {v}",
             "I've been into {v} for years", "my weekends are all about {v}", "I relax with {v}",
             "my favorite hobby is {v}", "I'm passionate about {v}"),
            ("What is my hobby?", "What do I do in my free time?", "What's my hobby?", "What is my favourite pastime?",
             "How do I spend my free time?", "What do I do for fun?", "What am I into?", "What's my favorite hobby?",
             "How do I spend my weekends?", "Do you remember my hobby?",              "What do I like doing?", "Which hobby did I mention?", "How do I relax?"),
            "your hobby is {v}", "your hobby",
            ("hobby", "favourite hobby", "pastime", "favourite pastime"),
        ),
        Attribute(
            "friend", values.person_name,
            ("my best friend is {v}", "my best friend is called {v}", "my closest friend is {v}",
             "I have a best friend named {v}", "my best friend's name is {v}", "{v} is my best friend",
             "my best mate is {v}", "my oldest friend is {v}", "I've known my best friend {v} since school",
             "my dearest friend is called {v}", "the person I trust most is my friend {v}",
             "my bestie is {v}", "my best buddy is {v}", "I spend every weekend with my best friend {v}",
             "my best friend, {v}, lives next door", "my closest friend goes by {v}"),
            ("Who is my best friend?", "What is my best friend's name?", "What's my best friend called?",
             "Who is my closest friend?", "Do you remember my best friend's name?", "Who's my best friend?",
             "What's the name of my best friend?", "Who is my best mate?", "Tell me who my best friend is.",
             "whos my best friend", "Which friend is closest to me?", "Who did I say my best friend was?",
             "What is my closest friend called?", "Who's my oldest friend?"),
            "your best friend is {v}", "who your best friend is",
            ("best friend", "closest friend", "best mate", "oldest friend", "dearest friend"),
        ),
        Attribute(
            "birthday", values.date,
            ("my birthday is on {v}", "I was born on {v}", "I celebrate my birthday on {v}", "my date of birth is {v}",
             "I came into the world on {v}", "my birthday is {v}", "I was born {v}", "my birth date is {v}",
             "I have my birthday on {v}", "every year on {v} I have my birthday", "my bday is {v}",
             "I'm celebrating my birthday on {v}", "my DOB is {v}", "I was born on the day {v}"),
            ("When is my birthday?", "When was I born?", "What is my date of birth?", "On which day is my birthday?",
             "When do I celebrate my birthday?", "What's my birthday?", "When's my birthday?",
             "What is my birth date?", "Do you remember my birthday?", "when is my bday",
             "Which day was I born?", "Tell me my date of birth.", "What date is my birthday?"),
            "your birthday is on {v}", "when your birthday is",
            ("birthday", "date of birth", "birth date", "bday"),
        ),
        Attribute(
            "address", values.address,
            ("I live at {v}", "my address is {v}", "my home address is {v}", "you can find me at {v}",
             "send letters to me at {v}", "my flat is at {v}", "my street address is {v}", "I'm at {v}",
             "my house is at {v}", "I just moved to {v}", "deliveries go to {v}", "my postal address is {v}",
             "we live at {v}", "home is {v}", "my new address is {v}"),
            ("What is my address?", "Where exactly do I live?", "What's my home address?", "At which address do I live?",
             "Where should letters to me be sent?", "What's my address?", "What is my street address?",
             "Where do deliveries go?", "Do you remember my address?", "whats my address",
             "Tell me my home address.", "Which street do I live on?", "What is my postal address?",
             "Where can I be found?"),
            "your address is {v}", "your address",
            ("address", "home address", "postal address", "street address", "mailing address"),
        ),
        Attribute(
            "code", values.code,
            ("my door code is {v}", "my booking code is {v}", "the code for my locker is {v}",
             "my membership code is {v}", "my secret code is {v}", "my code is {v}", "the code is {v}",
             "my access code is {v}", "my reference number is {v}", "please remember the code {v}",
             "my ticket code is {v}", "the PIN for my bike lock is {v}", "{v} is my code",
             "my voucher code is {v}", "my confirmation code is {v}", "note my code: {v}"),
            ("What is my code?", "What was my code?", "Which code did I give you?", "Can you tell me my code?",
             "Remind me of my code.", "What's my code?", "Do you remember my code?", "whats my code",
             "Which code is mine?", "Tell me the code I gave you.", "What code did I tell you?",
             "What was the code again?", "Read me my code.", "Could you repeat my code?"),
            "your code is {v}", "your code",
            ("code", "door code", "locker code", "PIN", "access code", "booking code", "secret code"),
        ),
    )
}

#: Frames that compose training phrasings from an attribute's ``keys`` ("my {k} is {v}" → "my employer is
#: {v}"): many more sentence shapes than the hand-written templates, so the model learns to find "my <key>"
#: and its value in a sentence it has not seen. Held-out phrasings are never composed (``values.allowed_extras``).
STATEMENT_FRAMES = ("my {k} is {v}", "{v} is my {k}", "my {k}: {v}", "as for my {k}, it is {v}",
                    "for the record, my {k} is {v}", "remember that my {k} is {v}", "my {k} happens to be {v}",
                    "I want you to know that my {k} is {v}", "note that my {k} is {v}",
                    "in case you need it, my {k} is {v}", "I can tell you my {k}: it is {v}",
                    "you should know my {k} is {v}", "about my {k}: it's {v}")
QUESTION_FRAMES = ("What is my {k}?", "What's my {k}?", "Do you know my {k}?", "Can you recall my {k}?",
                   "Tell me my {k}.", "Remind me of my {k}.", "What did I tell you my {k} was?",
                   "Do you still remember my {k}?", "I need my {k}. What is it?", "What was my {k} again?",
                   "Could you tell me my {k}?", "Which {k} did I give you?", "Say my {k}, please.")

#: Statements told with a verb rather than "my {k}" ("I {p} {v}" → "I reside in {v}"): the shape most
#: held-out statements have, so the model learns to take the value from a predicate it has not seen.
VERB_FRAMES = ("I {p} {v}", "as it happens, I {p} {v}", "I should mention that I {p} {v}", "for the record, I {p} {v}",
               "just so you know, I {p} {v}", "actually I {p} {v}", "oh, and I {p} {v}", "I {p} {v}, by the way")
VERBS = {
    "name": ("am called", "go by the name", "answer to", "am known as", "was named", "introduce myself as"),
    "age": ("turned", "have turned", "recently turned", "celebrated turning", "am now"),
    "city": ("live in", "reside in", "am based in", "stay in", "settled in", "have a flat in", "make my home in"),
    "food": ("love eating", "could live on", "always order", "crave", "adore eating", "most enjoy eating"),
    "pet": ("own {a}", "keep {a}", "look after {a}", "share my flat with {a}", "take care of {a}"),
    "pet_name": ("named my {animal}", "call my {animal}", "gave my {animal} the name", "chose for my {animal} the name"),
    "job": ("work as {a}", "earn a living as {a}", "make my money as {a}", "trained as {a}", "have a job as {a}"),
    "company": ("work for", "am employed by", "work at", "have a job at", "am on the payroll of", "get paid by"),
    "trait": ("tend to be", "would call myself", "am quite", "have always been", "am known to be"),
    "colour": ("love the colour", "prefer the colour", "adore the colour", "always pick the colour", "like the colour"),
    "hobby": ("love", "am into", "spend my free time on", "do a lot of", "am passionate about"),
    "friend": ("hang out most with", "am best friends with", "go everywhere with my friend", "grew up with my best friend"),
    "birthday": ("celebrate my birthday on", "came into the world on", "turn a year older on", "have my birthday on"),
    "address": ("live at", "reside at", "get my post at", "can be reached at", "stay at"),
    "code": ("use the code", "was given the code", "have the code", "got the code", "was sent the code"),
}


#: Questions asked with a verb ("Which firm do I work for?"), the shape many people ask in: a key and a
#: verb in its base form (:data:`QUESTION_VERBS`), so "do I {q}" and "the {k} I {q}" both read well.
QUESTION_VERB_FRAMES = ("Which {k} do I {q}?", "What {k} do I {q}?", "Tell me the {k} I {q}.", "Remind me which {k} I {q}.",
                        "Do you remember the {k} I {q}?", "What was the {k} I {q}?", "Can you tell me which {k} I {q}?",
                        "Which {k} did I say I {q}?")
QUESTION_VERBS = {
    "name": ("use", "answer to", "prefer"),
    "city": ("live in", "reside in", "stay in", "come from", "call home"),
    "food": ("love", "like best", "enjoy most", "crave"),
    "job": ("do", "have", "do for a living"),
    "company": ("work for", "work at", "get paid by", "have a job at"),
    "colour": ("like", "love", "prefer", "like best"),
    "hobby": ("enjoy", "love", "do in my free time", "spend my weekends on"),
    "friend": ("hang out with", "trust most", "spend time with"),
    "address": ("live at", "get my post at", "stay at"),
    "code": ("use", "have", "need"),
}


def told_with_verb(key: str) -> tuple[str, ...]:
    """Statements of the attribute told with a verb ("I reside in {v}")."""
    return values.compose(VERB_FRAMES, "{p}", VERBS.get(key, ()))


def asked_with_verb(key: str) -> tuple[str, ...]:
    """Questions about the attribute asked with a verb ("Which firm do I work for?")."""
    return values.compose(values.compose(QUESTION_VERB_FRAMES, "{q}", QUESTION_VERBS.get(key, ())), "{k}", ATTRIBUTES[key].keys)


@lru_cache(maxsize=None)
def composed(key: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(statements, questions)`` composed from the frames, the attribute's keys and verbs (training only)."""
    keys = ATTRIBUTES[key].keys
    statements = values.compose(STATEMENT_FRAMES, "{k}", keys) + told_with_verb(key)
    return statements, values.compose(QUESTION_FRAMES, "{k}", keys) + asked_with_verb(key)


#: Attributes that are never told together (both would be about "my pet").
EXCLUSIVE = {"pet": "pet_name", "pet_name": "pet"}


@dataclass(frozen=True)
class Fact:
    attribute: str
    value: str
    animal: str = ""  # the pet's kind, for ``pet_name``


def article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def fill(template: str, value: str, animal: str = "") -> str:
    """A template with ``{v}``, ``{animal}`` and ``{a}`` (the article of the word after it) filled in."""
    text = template.replace("{a} {v}", f"{article(value)} {value}").replace("{a} {animal}", f"{article(animal)} {animal}")
    return text.replace("{v}", value).replace("{animal}", animal)


def _fill_fact(template: str, fact: Fact) -> str:
    return fill(template, fact.value, fact.animal)


def capitalise(text: str) -> str:
    return text[:1].upper() + text[1:]


def lower_first(text: str) -> str:
    """Lower-case the first letter unless the text starts with the pronoun "I"."""
    if re.match(r"I\b|I'", text):
        return text
    return text[:1].lower() + text[1:]


def join_clauses(clauses: list[str]) -> str:
    if len(clauses) == 1:
        return clauses[0]
    return ", ".join(clauses[:-1]) + " and " + clauses[-1]


def make_fact(rng: random.Random, key: str) -> Fact:
    animal = rng.choice(pools.ANIMALS) if key == "pet_name" else ""
    return Fact(key, ATTRIBUTES[key].draw(rng), animal)


def sample_facts(rng: random.Random, count: int, *, exclude: tuple[str, ...] = (), used: set[str] | None = None) -> list[Fact]:
    """``count`` facts about distinct, compatible attributes, with values distinct from ``used``."""
    keys = [k for k in ATTRIBUTES if k not in exclude]
    chosen: list[str] = []
    while len(chosen) < count:
        key = rng.choice(keys)
        if key not in chosen and EXCLUSIVE.get(key) not in chosen:
            chosen.append(key)
    used = set() if used is None else used
    facts = []
    for key in chosen:
        fact = make_fact(rng, key)
        while fact.value in used:
            fact = make_fact(rng, key)
        used.add(fact.value)
        facts.append(fact)
    return facts


def acknowledgement(facts: list[Fact]) -> str:
    """The assistant's reply to a turn that tells facts: it restates them (a second write to memory)."""
    name = next((f.value for f in facts if f.attribute == "name"), None)
    rest = [_fill_fact(ATTRIBUTES[f.attribute].clause, f) for f in facts if f.attribute != "name"]
    parts = []
    if name is not None:
        parts.append(f"Nice to meet you, {name}!")
    if rest:
        parts.append(("" if name is not None else "Got it! ") + "I will remember that " + join_clauses(rest) + ".")
    return " ".join(parts)


GREETINGS = ("", "", "", "", "", "Hi, ", "Hello! ", "Hey, ", "Hi there. ", "Good morning! ", "Greetings! ", "Good evening! ",
             "Hey there! ", "Hiya, ", "Ok so ", "So, ", "Well, ", "Listen, ", "Hi MemT! ", "Hello again. ", "Um, ",
             "Just so you know, ", "Quick note: ", "FYI, ", "Alright, ", "Morning! ", "Yo, ")
STATEMENT_ENDINGS = ("", "", "", "", "", "", " Please remember that.", " Remember that!", " Don't forget it.",
                     " Just so you know.", " Keep that in mind.", " Thanks!", " Nice to meet you.",
                     " Can you remember that?", " Note that down, please.", " That's all for now.", " :)",
                     " Please keep it in mind.", " Got it?", " Try not to forget.")
JOINERS = (" and ", " and ", " and ", ", and ", " and also ", ", plus ", " and by the way ")
#: More openers and closers of messages, drawn like composed phrasings (training only, a held-out one or one
#: containing it never): so that a message's first or last words, whatever they are, are not taken for a value.
GREETINGS_EXTRA = ("Hello there, ", "Hey hey! ", "Evening! ", "Afternoon! ", "Hi friend, ", "Right, ", "Look, ", "Note: ",
                   "Heads up: ", "Small thing: ", "Hello, ", "Hi! ", "OK, ",
                   "Good afternoon. ", "Howdy! ", "Dear MemT, ", "Oh, and ", "By the way, ", "Real quick: ", "PS: ")
STATEMENT_ENDINGS_EXTRA = (" Remember it, okay?", " Write that down.", " Make a note of it.", " Keep it safe.", " Don't lose that.",
                           " For later.", " In case you need it.", " Hold on to that.", " OK?", " Cheers!", " :D",
                           " Bye!", " Thanks a lot.", " That's it.", " Alright?", " Understood?", " You'll need it later.",
                           " No need to reply.", " Have a nice day!", " Thanks in advance.", " Please store that.")
QUESTION_PREFIXES_EXTRA = ("Hi! ", "Hello, ", "Right, ", "Alright, ", "Wait, ", "Uh, ", "Say, ", "Excuse me, ", "Quick one: ",
                           "Remind me again: ", "Can I ask: ", "Honest question: ",
                           "Out of curiosity, ", "Let's see, ", "Actually, ", "And ", "MemT, ", "Dear MemT, ")
QUESTION_ENDINGS_EXTRA = (" Thanks.", " Please?", " If you know.", " Any clue?", " Cheers.", " :D", " Do you know?",
                          " Can you tell?", " Thanks a lot!", " Quick answer please.", " If you still know.", " Curious.",
                          " No rush.", " I need it now.")


def casual(rng: random.Random) -> bool:
    """Whether a user message is typed casually: all lower case, sometimes without final punctuation."""
    return rng.random() < 0.12


def _casual_text(template: str, lowered: bool) -> str:
    """A template (placeholders still in it) lower-cased for a casual message; values stay as given."""
    return template.lower() if lowered else template


@lru_cache(maxsize=None)
def _held_statements() -> tuple[str, ...]:
    """Every attribute's held-out statements: no training statement may become one (see ``values.phrasing``)."""
    return tuple(h for a in ATTRIBUTES.values() for h in values.template_split(a.statements)[1])


@lru_cache(maxsize=None)
def _held_questions() -> tuple[str, ...]:
    return tuple(h for a in ATTRIBUTES.values() for h in values.template_split(a.questions)[1])


def statement_message(rng: random.Random, facts: list[Fact]) -> str:
    """A user message telling ``facts``, e.g. "Hi, my name is Alice and I live in Lisbon. I'm a chef."

    Templates are lower-cased or capitalised *before* values are filled in, so a value is always
    written exactly as given (a value may start a fragment: "{v} is my name").
    """
    low = casual(rng)
    templates = [_casual_text(phrasing(rng, ATTRIBUTES[f.attribute].statements, composed(f.attribute)[0], _held_statements()), low)
                 for f in facts]
    sentences, i = [], 0
    while i < len(templates):
        if i + 1 < len(templates) and rng.random() < 0.4:
            second = templates[i + 1] if low else lower_first(templates[i + 1])
            sentences.append((_fill_fact(templates[i], facts[i]), phrasing(rng, JOINERS), _fill_fact(second, facts[i + 1])))
            i += 2
        else:
            sentences.append((_fill_fact(templates[i], facts[i]),))
            i += 1
    greeting = _casual_text(phrasing(rng, GREETINGS, GREETINGS_EXTRA), low)
    # capitalise the template's first letter only (a filled value is never changed)
    def first_word(template_index: int, text: str, keep: bool) -> str:
        return text if keep or templates[template_index].startswith("{") else capitalise(text)
    parts, index = [], 0
    for n, sentence in enumerate(sentences):
        keep = low or (n == 0 and greeting.endswith(", ")) or (n == 0 and greeting.endswith(": "))
        parts.append(first_word(index, sentence[0], keep) + "".join(sentence[1:]))
        index += 2 if len(sentence) == 3 else 1
    end = "" if low and rng.random() < 0.5 else rng.choice((".", ".", ".", ".", "!"))
    return greeting + ". ".join(parts) + end + _casual_text(phrasing(rng, STATEMENT_ENDINGS, STATEMENT_ENDINGS_EXTRA), low)


QUESTION_PREFIXES = ("", "", "", "", "", "", "", "", "By the way, ", "Quick question: ", "Tell me, ", "Hey, ", "Remind me: ",
                     "One more thing: ", "So, ", "Hmm, ", "Okay, ", "Hi again! ", "Now, ", "Let me ask you: ",
                     "Question: ", "I forgot, ", "Sorry, ", "Oh, ", "Do you know this one? ", "Hey MemT, ", "Um, ",
                     "Please tell me: ", "Well then, ")
QUESTION_ENDINGS = ("", "", "", "", "", "", "", " Thanks!", " Thank you.", " Please.", " I forgot.",
                    " Do you remember?", " Just checking.", " Any idea?", " :)", " Be honest.")


def question_message(rng: random.Random, asked: list[Fact]) -> str:
    """A question about the facts ``asked`` (a ``Fact`` with an empty value asks about an untold one)."""
    low = casual(rng)
    templates = [_casual_text(phrasing(rng, ATTRIBUTES[f.attribute].questions, composed(f.attribute)[1], _held_questions()), low)
                 for f in asked]
    questions = [_fill_fact(t, f) for t, f in zip(templates, asked)]
    text = questions[0]
    if len(questions) > 1:
        text = text.rstrip("?.!") + " and " + (questions[1] if low else lower_first(questions[1]))
    if low and rng.random() < 0.5:
        text = text.rstrip("?.!")
    prefix = _casual_text(phrasing(rng, QUESTION_PREFIXES, QUESTION_PREFIXES_EXTRA), low)
    text = prefix + (lower_first(text) if prefix and not prefix.endswith(("! ", "? ")) else text)
    return text + _casual_text(phrasing(rng, QUESTION_ENDINGS, QUESTION_ENDINGS_EXTRA), low)


def fact_answer(facts: list[Fact]) -> str:
    return capitalise(join_clauses([_fill_fact(ATTRIBUTES[f.attribute].clause, f) for f in facts])) + "."


def unknown_answer(attribute: str) -> str:
    return f"I don't know {ATTRIBUTES[attribute].unknown}."


def fact_turn(rng: random.Random, facts: list[Fact]) -> EpisodeTurn:
    return EpisodeTurn(statement_message(rng, facts), acknowledgement(facts), tuple(f.value for f in facts))


# --------------------------------------------------------------------------------------------------
# Distractor turns: small talk that must not disturb what memory holds


SMALL_TALK = (
    ("How are you?", "I am fine, thank you! How can I help you?"),
    ("Thank you!", "You are welcome!"),
    ("Thanks a lot.", "You are welcome!"),
    ("Good morning!", "Good morning! How can I help you?"),
    ("Hello!", "Hello! How can I help you?"),
    ("What is your name?", "I am MemT, a tiny assistant with latent memory."),
    ("Who are you?", "I am MemT, a tiny assistant with latent memory."),
    ("What can you do?", "I can remember what you tell me, call tools and repeat text."),
    ("Tell me a joke.", "Why did the cat sit on the computer? To keep an eye on the mouse!"),
    ("Can you help me?", "Of course! What do you need?"),
    ("Goodbye!", "Goodbye! Talk to you soon."),
    ("The weather is nice today.", "That is great! Enjoy the sun."),
    ("I am tired.", "Take a break and rest a little."),
    ("Let's talk about something else.", "Sure! What would you like to talk about?"),
    ("Do you like music?", "I like all kinds of music!"),
)


def small_talk_turn(rng: random.Random) -> EpisodeTurn:
    """A distractor turn; some mention names, cities or foods that are *not* the user's own."""
    kind = rng.random()
    if kind < 0.6:
        user, reply = rng.choice(SMALL_TALK)
        return EpisodeTurn(user, reply)
    if kind < 0.7:
        animal = rng.choice(pools.ANIMALS)
        return EpisodeTurn(f"I watched a film about {animal}s yesterday.", "That sounds fun!")
    if kind < 0.8:
        city = values.city(rng)
        return EpisodeTurn(f"I am going to {city} next week.", f"Have a great trip to {city}!", (city,))
    if kind < 0.9:
        name = values.person_name(rng)
        return EpisodeTurn(f"My neighbour {name} is visiting me today.", f"That sounds nice! Say hello to {name}.", (name,))
    food = values.food(rng)
    return EpisodeTurn(f"I ate {food} for lunch today.", "Sounds tasty!")


# --------------------------------------------------------------------------------------------------
# Documents


@dataclass(frozen=True)
class DocumentFact:
    key: str
    value: str
    sentences: tuple[str, ...]  # "{org}" and "{v}" filled in later
    questions: tuple[str, ...]
    answer: str


def _org_facts(rng: random.Random) -> list[DocumentFact]:
    return [
        DocumentFact("city", values.city(rng),
                     ("{org} is a company based in {v}.", "{org} has its head office in {v}.", "{org} is a firm from {v}.",
                      "{org} is headquartered in {v}.", "{org} is a business located in {v}.",
                      "The offices of {org} are in {v}.", "{org}, a company from {v}, is growing fast.",
                      "Founded as a small shop, {org} is now based in {v}.", "{org} operates out of {v}.",
                      "The home of {org} is the city of {v}."),
                     ("Where is {org} based?", "In which city is {org} based?", "Where is the head office of {org}?",
                      "Which city is {org} from?", "Where can I find {org}?", "Where is {org} headquartered?",
                      "Where are the offices of {org}?", "In what city is {org} located?",                       "Which city is home to {org}?", "Where does {org} operate from?", "Where's {org}?",
                      "What city is {org} in?"),
                     "{org} is based in {v}."),
        DocumentFact("founder", values.person_name(rng),
                     ("It was founded by {v}.", "The company was started by {v}.", "Its founder is {v}.",
                      "{v} founded the company.", "It was set up by {v}.", "The founder of the company is {v}.",
                      "{v} started it with a small loan.", "The business was created by {v}.",
                      "It was established by {v}.", "Its first owner and founder was {v}."),
                     ("Who founded {org}?", "Who started {org}?", "Who is the founder of {org}?",
                      "Which person founded {org}?", "Who set up {org}?", "Who created {org}?",
                      "Who established {org}?", "Who's the founder of {org}?",                       "Whose company was {org} at the start?", "Who was behind the founding of {org}?",
                      "Name the founder of {org}.", "Tell me who founded {org}."),
                     "{org} was founded by {v}."),
        DocumentFact("year", str(rng.randint(1900, 2024)),
                     ("It was founded in {v}.", "The company started in {v}.", "It opened its doors in {v}.",
                      "It has existed since {v}.", "The firm was set up in {v}.", "Its story began in {v}.",
                      "It was established in {v}.", "The company dates back to {v}."),
                     ("When was {org} founded?", "In which year was {org} founded?", "When did {org} start?",
                      "What year was {org} set up?", "How long ago, in which year, did {org} open?",
                      "Since when has {org} existed?", "In what year did {org} open?",                       "Which year was {org} established?", "When did the story of {org} begin?"),
                     "{org} was founded in {v}."),
        DocumentFact("product", rng.choice(pools.PRODUCTS),
                     ("The company makes {v}.", "{org} is known for its {v}.", "Its main product is {v}.",
                      "It produces {v}.", "The firm sells {v}.", "Most of its income comes from {v}.",
                      "It is famous for {v}.", "Its best-selling product is {v}."),
                     ("What does {org} make?", "What does {org} produce?", "What is {org} known for?",
                      "What is the main product of {org}?", "Which products does {org} sell?", "What does {org} sell?",
                      "What is {org} famous for?", "What's the main product of {org}?",
                      "What is the best-selling product of {org}?"),
                     "{org} makes {v}."),
        DocumentFact("employees", str(rng.randint(10, 9990)),
                     ("It has {v} employees.", "About {v} people work there.", "Its staff counts {v} people.",
                      "The company employs {v} people.", "There are {v} people on its payroll.",
                      "It has a team of {v}.", "{v} employees work for it.", "Its workforce is {v} strong."),
                     ("How many employees does {org} have?", "How many people work at {org}?",
                      "How big is the staff of {org}?", "How many workers does {org} employ?",
                      "What is the number of employees at {org}?", "How many people does {org} employ?",
                      "How large is the team at {org}?",                       "What's the headcount of {org}?", "How many staff work for {org}?"),
                     "{org} has {v} employees."),
        DocumentFact("colour", rng.choice(pools.COLOURS),
                     ("Its logo is {v}.", "The logo of the company is {v}.", "The company logo is painted {v}.",
                      "Its logo is a {v} circle.", "The brand colour of its logo is {v}.", "Its logo comes in {v}.",
                      "Everyone knows its {v} logo.", "The firm's logo is {v}."),
                     ("What colour is the logo of {org}?", "What colour is the {org} logo?",
                      "Which colour does the logo of {org} have?", "How does the {org} logo look, what colour?",
                      "What is the colour of the {org} logo?", "What color is the logo of {org}?",
                      "Which colour is the {org} logo?",                       "What's the colour of {org}'s logo?", "In which colour is the logo of {org}?"),
                     "The logo of {org} is {v}."),
        DocumentFact("code", values.code(rng),
                     ("Its stock code is {v}.", "The company is listed under the code {v}.", "Its trading code is {v}.",
                      "On the stock market it trades as {v}.", "Its ticker is {v}.", "Investors know it by the code {v}.",
                      "It is listed as {v}.", "The share code of the firm is {v}.", "Its listing code is {v}."),
                     ("What is the stock code of {org}?", "Under which code is {org} listed?", "What is {org}'s code?",
                      "Which trading code does {org} have?", "What code is {org} listed under?",
                      "What's the ticker of {org}?", "How does {org} trade on the stock market?",
                      "what is the code of {org}", "Which code do investors use for {org}?",
                      "What is the listing code of {org}?", "Tell me the stock code of {org}."),
                     "The code of {org} is {v}."),
    ]


#: What a document fact is called ("the {k} of {org}"): document sentences and questions composed from these
#: and the frames below, for training only (see :data:`STATEMENT_FRAMES`).
DOCUMENT_KEYS = {
    "city": ("home city", "base city", "city", "location", "head office city"),
    "founder": ("founder", "creator", "first owner", "founding person"),
    "year": ("founding year", "year of founding", "start year", "first year"),
    "product": ("main product", "best-known product", "product", "core product"),
    "employees": ("number of employees", "headcount", "staff size", "employee count"),
    "colour": ("logo colour", "logo color", "brand colour", "logo's colour"),
    "code": ("stock code", "ticker", "trading code", "listing code", "share code", "exchange code"),
}
DOCUMENT_SENTENCE_FRAMES = ("The {k} of {org} is {v}.", "{org}'s {k} is {v}.", "As for {org}, its {k} is {v}.",
                            "For {org}, the {k} is {v}.", "{org} gives its {k} as {v}.",
                            "Records show that the {k} of {org} is {v}.", "{v} is the {k} of {org}.")
DOCUMENT_QUESTION_FRAMES = ("What is the {k} of {org}?", "What's {org}'s {k}?", "Tell me the {k} of {org}.",
                            "Do you know the {k} of {org}?", "What does the text give as the {k} of {org}?",
                            "Name the {k} of {org}.", "Which {k} does {org} have?", "And the {k} of {org}?")


@lru_cache(maxsize=None)
def composed_document(key: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(sentences, questions)`` of a document fact composed from the frames and :data:`DOCUMENT_KEYS`."""
    keys = DOCUMENT_KEYS[key]
    return values.compose(DOCUMENT_SENTENCE_FRAMES, "{k}", keys), values.compose(DOCUMENT_QUESTION_FRAMES, "{k}", keys)


def document(rng: random.Random, *, fillers: int | None = None) -> tuple[str, str, list[DocumentFact]]:
    """A company profile: ``(org, text, facts)``; the first sentence names the company and its city."""
    org = values.company(rng)
    facts = _org_facts(rng)
    intro, others = facts[0], facts[1:]
    rng.shuffle(others)
    keep = others[: rng.randint(2, 5)]
    sentences = [phrasing(rng, f.sentences, composed_document(f.key)[0]).replace("{v}", f.value) for f in keep]
    count = rng.choice((0, 0, 1, 2, 3, 6)) if fillers is None else fillers
    for filler in rng.sample(pools.FILLER_SENTENCES, count):
        sentences.insert(rng.randint(0, len(sentences)), filler)
    text = " ".join([phrasing(rng, intro.sentences, composed_document(intro.key)[0]).replace("{v}", intro.value)] + sentences).replace("{org}", org)
    if rng.random() < 0.3:
        text = f"About {org}\n" + text
    return org, text, [intro] + keep


DOCUMENT_PREFIXES = ("", "", "", "", "", "", "According to the document, ", "From the document: ", "In the text you read, ",
                     "Based on what you read, ", "From the profile: ", "In the company profile, ", "From what you read, ",
                     "Looking at the text, ", "Quick question about the document: ", "According to the profile, ",
                     "Based on the text, ", "From the file I gave you: ", "About the company: ", "Hey, ",
                     "In the article, ", "Regarding that document, ")


def document_question(rng: random.Random, org: str, fact: DocumentFact) -> tuple[str, str]:
    question = phrasing(rng, fact.questions, composed_document(fact.key)[1]).replace("{org}", org)
    prefix = phrasing(rng, DOCUMENT_PREFIXES)
    if prefix:
        question = prefix + (question if prefix.endswith(": ") else lower_first(question))
    return question, fact.answer.replace("{org}", org).replace("{v}", fact.value)


# --------------------------------------------------------------------------------------------------
# Tools


def _tool(name: str, description: str, properties: dict) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(properties)},
        },
    }


NUMBER = {"type": "number"}
TOOLS = {
    "get_weather": _tool("get_weather", "Get the current weather in a city.", {"city": {"type": "string", "description": "The city name."}}),
    "add": _tool("add", "Add two numbers.", {"a": NUMBER, "b": NUMBER}),
    "multiply": _tool("multiply", "Multiply two numbers.", {"a": NUMBER, "b": NUMBER}),
}

WEATHER_REQUESTS = ("What is the weather in {c}?", "What's the weather like in {c}?", "How is the weather in {c} today?",
                    "Tell me the weather in {c}.", "Is it raining in {c}?", "Weather in {c}, please.",
                    "Can you check the weather in {c}?", "I'm going to {c} today. What's the weather there?",
                    "Is it warm in {c} right now?", "What's the forecast for {c}?", "weather in {c}?",
                    "How's the weather in {c}?", "Do I need an umbrella in {c} today?", "Is it sunny in {c}?",
                    "What's it like outside in {c}?", "Could you look up the weather for {c}?", "How cold is it in {c}?",
                    "What is the temperature in {c}?", "Get me the weather for {c}.", "Check {c} weather please",
                    "Please find out the weather in {c}.", "What are the conditions in {c} right now?",
                    "I'm flying to {c} tomorrow, how is the weather?", "Any idea what the weather is in {c}?",
                    "Is it nice out in {c} today?", "Tell me how warm it is in {c}.", "whats the weather in {c}",
                    "My sister lives in {c}. Is it raining there?", "Weather report for {c}, please!",
                    "How hot is it in {c} today?")
WEATHER_AT_HOME = ("What is the weather where I live?", "How is the weather in my city?", "What's the weather like at home?",
                   "Is it cold in my home town today?", "Check the weather in my city, please.",
                   "What's the weather like where I live?", "Is it raining where I live?", "How's the weather at home?",
                   "What's the forecast for my city?", "Do I need an umbrella at home today?",
                   "What's the temperature in my town?", "Check the weather where I live.", "weather at home?",
                   "Is it sunny in my city today?", "How warm is it where I live?", "Tell me the weather in my home town.",
                   "Can you look up the weather where I'm based?", "What's it like outside in my city?",
                   "What is the weather at my place today?", "Get me the weather for where I live, please.")
#: Weather requests composed from frames and places (training only, held-out ones left out; see
#: :data:`STATEMENT_FRAMES`): "weather where I live" must be understood however it is asked.
WEATHER_FRAMES = ("What's the weather {p}?", "How is the weather {p} right now?", "Is it cold {p}?",
                  "Is it raining {p} today?", "Tell me the weather {p}.", "Weather {p}, please.",
                  "What's the temperature {p}?", "Do I need a jacket {p}?", "Any sun {p} today?",
                  "Look up the weather {p}.", "How warm is it {p} today?", "Is it windy {p}?",
                  "What are the conditions {p}?", "Could you check the weather {p}?")
HOME_PLACES = ("where I live", "in my city", "at home", "in my home town", "where I'm based", "in the city I live in",
               "at my place", "in my town", "where my home is")
CITY_PLACES = ("in {c}", "over in {c}", "for {c}", "in the city of {c}")
# each also kept clear of the other's held-out phrasings ("Weather in {c}, please." reads "Weather in my town, please.")
_WEATHER_HELD = values.template_split(WEATHER_REQUESTS)[1] + values.template_split(WEATHER_AT_HOME)[1]
WEATHER_AT_HOME_COMPOSED = values.allowed_extras(values.compose(WEATHER_FRAMES, "{p}", HOME_PLACES), _WEATHER_HELD)
WEATHER_COMPOSED = values.allowed_extras(values.compose(WEATHER_FRAMES, "{p}", CITY_PLACES), _WEATHER_HELD)
ADD_REQUESTS = ("What is {a} plus {b}?", "Add {a} and {b}.", "What is {a} + {b}?", "Can you add {a} and {b}?",
                "How much is {a} plus {b}?", "What do {a} and {b} add up to?", "Sum {a} and {b}, please.",
                "what's {a}+{b}", "Please add {a} to {b}.", "What's the sum of {a} and {b}?", "{a} + {b} = ?",
                "Calculate {a} plus {b}.", "I need {a} plus {b}.", "What do I get if I add {a} and {b}?",
                "Could you work out {a} + {b}?", "Add up {a} and {b} for me.", "How much do {a} and {b} make together?",
                "Compute the sum of {a} and {b}.", "{a} plus {b} is what?", "Quick maths: {a} + {b}?")
MULTIPLY_REQUESTS = ("What is {a} times {b}?", "Multiply {a} by {b}.", "What is {a} * {b}?", "How much is {a} times {b}?",
                     "What do you get if you multiply {a} and {b}?", "Can you multiply {a} by {b}?", "what's {a}*{b}",
                     "What's the product of {a} and {b}?", "Calculate {a} times {b}.", "{a} * {b} = ?",
                     "Please multiply {a} and {b}.", "I need {a} times {b}.", "Could you work out {a} x {b}?",
                     "How much is {a} multiplied by {b}?", "Compute the product of {a} and {b}.", "{a} times {b} is what?",
                     "Quick maths: {a} * {b}?", "What is {a} multiplied by {b}?", "Multiply {a} with {b} for me.",
                     "What do {a} and {b} make when multiplied?")
WEATHER_TEXT_RESULTS = ("{t} degrees and {c}", "{c}, {t} degrees", "It is {c} with {t} degrees.",
                        "Currently {t} degrees and {c} in {city}.", "{city}: {c}, {t} degrees", "Temperature {t}, {c}",
                        "{c} and {t} degrees", "Weather in {city}: {c}. Temperature: {t} degrees.", "{t} C, {c}",
                        "It's {t} degrees and {c}.", "{city} is {c} today, {t} degrees.", "temp={t} sky={c}",
                        "Right now: {c}, {t} degrees", "The weather is {c} and it is {t} degrees.",
                        "{c} skies, {t} degrees", "Forecast for {city}: {c}, around {t} degrees",
                        "{t} degrees, {c} in {city}", "Conditions: {c}; temperature: {t}")
NUMBER_TEXT_RESULTS = ("{r}", "The result is {r}.", "result: {r}", "= {r}", "Answer: {r}", "It is {r}.",
                       "The answer is {r}", "output: {r}", "That makes {r}.", "value {r}",
                       "The calculator says {r}.", "ok: {r}", "Computed: {r}")


def tool_call_text(call: EpisodeToolCall) -> str:
    """A tool call exactly as the Nano chat template renders one (and as the model must write it)."""
    return '<tool_call>\n{"name": "' + call.name + '", "arguments": ' + json.dumps(call.arguments, ensure_ascii=False) + "}\n</tool_call>"


def _number(rng: random.Random) -> int:
    return rng.choice((rng.randint(0, 20), rng.randint(0, 100), rng.randint(0, 999)))


def weather_result(rng: random.Random, city: str, temperature: int, condition: str, *, text: bool | None = None) -> str:
    """What ``get_weather`` returns: JSON, or (``text``) plain text such as "17 degrees and sunny"."""
    if text if text is not None else rng.random() < 0.5:
        form = phrasing(rng, WEATHER_TEXT_RESULTS)
        return form.replace("{t}", str(temperature)).replace("{c}", condition).replace("{city}", city)
    return json.dumps({"city": city, "temperature": temperature, "condition": condition}, ensure_ascii=False)


def number_result(rng: random.Random, value: int, *, text: bool | None = None) -> str:
    if text if text is not None else rng.random() < 0.5:
        return phrasing(rng, NUMBER_TEXT_RESULTS).replace("{r}", str(value))
    return json.dumps({"result": value})


def tool_turn(rng: random.Random, *, tool: str | None = None, home_city: str | None = None, tools: list[str] | None = None,
              text: bool | None = None, home_p: float = 0.5) -> ToolTurn:
    """A tool-calling turn; with ``home_city`` the weather request may say "where I live" (from memory).

    ``text``: the result is plain text (``True``), JSON (``False``) or either (``None``).
    """
    tool = tool or rng.choice(("get_weather", "get_weather", "add", "multiply"))
    offered = tools if tools is not None else _offered_tools(rng, tool)
    if tool == "get_weather":
        if home_city is not None and rng.random() < home_p:
            city, user = home_city, phrasing(rng, WEATHER_AT_HOME, WEATHER_AT_HOME_COMPOSED)
        else:
            city = values.city(rng)
            user = phrasing(rng, WEATHER_REQUESTS, WEATHER_COMPOSED).replace("{c}", city)
        temperature, condition = rng.randint(-10, 40), rng.choice(pools.CONDITIONS)
        call = EpisodeToolCall("get_weather", {"city": city})
        result = weather_result(rng, city, temperature, condition, text=text)
        reply = f"It is {condition} and {temperature} degrees in {city}."
        found = (city, condition, str(temperature))
    else:
        a, b = _number(rng), _number(rng)
        add = tool == "add"
        user = phrasing(rng, ADD_REQUESTS if add else MULTIPLY_REQUESTS).replace("{a}", str(a)).replace("{b}", str(b))
        value = a + b if add else a * b
        call = EpisodeToolCall(tool, {"a": a, "b": b})
        result = number_result(rng, value, text=text)
        reply = f"{a} {'plus' if add else 'times'} {b} is {value}."
        found = (str(value),)
    return ToolTurn(user, [TOOLS[name] for name in offered], call, result, reply, found)


def _offered_tools(rng: random.Random, needed: str | None) -> list[str]:
    names = list(TOOLS)
    offered = rng.sample(names, rng.randint(1, len(names)))
    if needed is not None and needed not in offered:
        offered.insert(rng.randint(0, len(offered)), needed)
    return offered


# --------------------------------------------------------------------------------------------------
# Repetition

#: Repetition requests composed from verbs and frames (training only, held-out ones left out).
REPEAT_VERBS = ("repeat", "type", "write", "copy", "say", "echo", "print", "output", "reproduce", "send back")
REPEAT_FRAMES = ("{V} this exactly: {t}", "{V} the following: {t}", "Kindly {v} this: {t}", "{V} it back exactly: {t}",
                 "Can you {v} this? {t}", "I need you to {v} this: {t}", "{V} word for word:\n{t}",
                 "{V} the text below exactly.\n{t}", "Just {v} '{t}'.", "{V} '{t}', nothing else.")
REPEAT_COMPOSED = values.compose(REPEAT_FRAMES, "{v}", REPEAT_VERBS)
REPEAT_REQUESTS = ("Repeat exactly:\n{t}", "Repeat after me: {t}", "Please repeat this text exactly: {t}",
                   "Say this back to me word for word:\n{t}", "Repeat this: {t}", "Copy this text:\n{t}",
                   "Type '{t}' exactly.", "Type exactly: {t}", "Please write exactly this: {t}", 'Say "{t}"',
                   "Echo this back: {t}", "Write '{t}' and nothing else.", 'Type "{t}" and nothing more.',
                   "Can you repeat this for me? {t}", "Copy exactly: {t}", "Repeat: {t}",
                   "Say exactly this: {t}", "Please type {t}", "Write this exactly:\n{t}", 'Just say "{t}".',
                   "Copy the following text exactly: {t}", "Echo: {t}", "Could you write '{t}' for me?",
                   'Reply with exactly "{t}".', "Type this word for word: {t}", "Say back: {t}",
                   "Please echo the following:\n{t}", "Write down exactly what I say: {t}",                    "Repeat the next text and nothing else: {t}", "Respond only with: {t}", 'Output "{t}" exactly.',
                   "Can you type '{t}'?", "I want you to repeat this: {t}", "Copy-paste this back to me: {t}",
                   "Please say {t}", "Type the following exactly:\n{t}", "Write '{t}'.", "Repeat word for word: {t}",
                   'Say "{t}" and nothing else.', "Echo back exactly: {t}", "Print exactly: {t}",
                   "Can you say '{t}' for me?", "Please copy this:\n{t}")


def repeat_text(rng: random.Random) -> str:
    """A text to repeat: a short phrase ("hello world"), a sentence, or a bare value such as a code."""
    kind = rng.random()
    if kind < 0.2:
        return " ".join(rng.choice(pools.COMMON_WORDS) for _ in range(rng.randint(1, 4)))
    if kind < 0.3:
        return values.generic(rng)
    words = [rng.choice(pools.STARTERS)]
    for _ in range(rng.randint(2, 12)):
        r = rng.random()
        if r < 0.65:
            words.append(rng.choice(pools.COMMON_WORDS))
        elif r < 0.8:
            words.append(values.person_name(rng))
        elif r < 0.9:
            words.append(rng.choice((values.city, values.food, values.generic))(rng))
        else:
            words.append(str(_number(rng)))
    return " ".join(words) + rng.choice((".", ".", "!", "?", ""))


def repeat_turn(rng: random.Random, text: str | None = None) -> EpisodeTurn:
    text = text or repeat_text(rng)
    return EpisodeTurn(phrasing(rng, REPEAT_REQUESTS, REPEAT_COMPOSED).replace("{t}", text), text)


def chatter_turn(rng: random.Random) -> EpisodeTurn:
    """Small talk of a long conversation (:mod:`memt_demo.chatter`), answered neutrally: no fact about the user."""
    user, reply, copied = chatter.chatter(rng)
    return EpisodeTurn(user, reply, copied)


def recall_turn(rng: random.Random, fact: Fact) -> EpisodeTurn:
    """A question about a told fact in the middle of a conversation, answered (and committed like any turn)."""
    return EpisodeTurn(question_message(rng, [fact]), fact_answer([fact]), (fact.value,))


# --------------------------------------------------------------------------------------------------
# Episodes


def _system(rng: random.Random, p: float) -> list[dict]:
    return [{"role": "system", "content": rng.choice(pools.SYSTEM_PROMPTS)}] if rng.random() < p else []


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _group_commits(rng: random.Random, turns: list, merge: float) -> list[Commit]:
    """Commit turns one by one, sometimes several turns in one commit; documents stay on their own."""
    commits: list[Commit] = []
    for item in turns:
        if isinstance(item, Document):
            commits.append(item)
        elif commits and isinstance(commits[-1], list) and rng.random() < merge:
            commits[-1].append(item)
        else:
            commits.append([item])
    return commits


@dataclass
class Mix:
    """What an :class:`EpisodeSampler` draws: kind weights and the difficulty of fact episodes."""

    facts: float = 0.48
    unknown: float = 0.05
    document: float = 0.10
    tool_call: float = 0.08
    tool_answer: float = 0.08
    repeat: float = 0.10
    statement: float = 0.04
    context: float = 0.05
    small_talk: float = 0.02
    long: float = 0.2  # long conversations: facts told early, many turns of chatter, a fact asked late
    min_chatter: int = 5  # turns between the facts and the question in a long conversation
    max_chatter: int = 40
    max_facts: int = 5  # facts told in one episode
    max_turns: int = 3  # turns they are spread over
    max_distractors: int = 3  # distractor commits (small talk, tools, documents, repeats)
    distractor_p: float = 0.7  # probability that a fact episode has distractors at all
    merge: float = 0.25  # probability of committing a turn together with the previous one
    system: float = 0.25
    thinking: float = 0.05
    extra_tools: float = 0.1  # tools offered in a prompt that needs none
    replayed: float = 0.5  # in-context episodes whose earlier turns are replayed as committed (see ``context``)
    variation: float = 0.3  # training phrasings perturbed by ``values.vary`` (fillers, dropped words, typos)
    composition: float = 0.3  # training statements / questions composed from frames and keys (``composed``)

    @classmethod
    def warm_up(cls) -> "Mix":
        """The start of training: one fact told in one turn and asked right after, a little in-context copying.

        Recall through memory is learned first on this easy case; without it, multi-fact episodes and
        distractor commits from the start train far more slowly.
        """
        return cls(
            facts=0.8, unknown=0.0, document=0.0, tool_call=0.0, tool_answer=0.0, repeat=0.05, statement=0.05,
            context=0.1, small_talk=0.0, long=0.0, max_facts=1, max_turns=1, max_distractors=1, distractor_p=0.0,
            merge=0.0, system=0.0, thinking=0.0, extra_tools=0.0,
        )

    @classmethod
    def curriculum(cls, progress: float, *, warm: float = 0.15, full: float = 0.45, end: "Mix | None" = None) -> "Mix":
        """:meth:`warm_up` until ``warm`` of training, then a linear blend reaching ``end`` (the full mix) at ``full``."""
        start, end = cls.warm_up(), end or cls()
        t = min(1.0, max(0.0, (progress - warm) / (full - warm)))
        blended = {}
        for name, a in vars(start).items():
            b = getattr(end, name)
            value = a + (b - a) * t
            blended[name] = round(value) if isinstance(b, int) else value
        return cls(**blended)


class EpisodeSampler:
    """Draws random episodes of every kind; seeded, so a run is reproducible."""

    def __init__(self, seed: int = 0, *, heldout: bool = False):
        self.rng = DemoRandom(seed, heldout_values=heldout, heldout_templates=heldout)

    # -- building blocks -------------------------------------------------------------------------

    def distractor(self, mix: Mix, *, home_city: str | None = None, exclude_documents: bool = False) -> EpisodeTurn | ToolTurn | Document:
        rng = self.rng
        r = rng.random()
        if r < 0.5:
            return small_talk_turn(rng)
        if r < 0.65:
            return repeat_turn(rng)
        if r < 0.85 or exclude_documents:
            return tool_turn(rng, home_city=home_city)
        return Document(document(rng)[1])

    def _finish(self, kind: str, items: list, query: EpisodeQuestion, mix: Mix, *, tools_needed: bool = False) -> Episode:
        rng = self.rng
        if not tools_needed and query.tools is None and rng.random() < mix.extra_tools:
            query.tools = [TOOLS[name] for name in _offered_tools(rng, None)]
        if query.thinking is False and rng.random() < mix.thinking:
            query.thinking = True
        return Episode(kind, _group_commits(rng, items, mix.merge), query)

    def _fact_turns(self, mix: Mix, count: int, turns: int, used: set[str]) -> tuple[list[Fact], list[EpisodeTurn]]:
        rng = self.rng
        facts = sample_facts(rng, count, used=used)
        turns = min(turns, count)
        cuts = sorted(rng.sample(range(1, count), turns - 1)) if turns > 1 else []
        groups = [facts[i:j] for i, j in zip([0] + cuts, cuts + [count])]
        return facts, [fact_turn(rng, group) for group in groups]

    def _with_distractors(self, mix: Mix, items: list, *, home_city: str | None = None) -> list:
        rng = self.rng
        if rng.random() >= mix.distractor_p:
            return items
        for _ in range(rng.randint(1, mix.max_distractors)):
            position = rng.randint(0, len(items))
            if position == 0 and rng.random() < 0.7:  # mostly after the first fact turn
                position = len(items)
            items.insert(position, self.distractor(mix, home_city=home_city))
        return items

    # -- episode kinds ---------------------------------------------------------------------------

    def facts(self, mix: Mix, *, count: int | None = None, turns: int | None = None, ask: int | None = None) -> Episode:
        """Facts told in 1+ turns (with distractors); the query asks about one or two of them."""
        rng = self.rng
        count = count or rng.randint(1, mix.max_facts)
        turns = turns or rng.randint(1, min(count, mix.max_turns))
        facts, items = self._fact_turns(mix, count, turns, set())
        home = next((f.value for f in facts if f.attribute == "city"), None)
        items = self._with_distractors(mix, items, home_city=home)
        ask = ask or (2 if count > 1 and rng.random() < 0.1 else 1)
        asked = rng.sample(facts, ask)
        query = EpisodeQuestion(
            _system(rng, mix.system) + [_user(question_message(rng, asked))],
            fact_answer(asked),
            values=tuple(f.value for f in asked),
            meta={"facts": facts, "asked": asked},
        )
        return self._finish(f"facts{count}", items, query, mix)

    def unknown(self, mix: Mix) -> Episode:
        """The asked attribute was never told (memory empty, or holding other things): "I don't know …"."""
        rng = self.rng
        items: list = []
        told: list[Fact] = []
        if rng.random() < 0.6:
            told, items = self._fact_turns(mix, rng.randint(1, mix.max_facts), 1, set())
        items = self._with_distractors(mix, items) if rng.random() < 0.5 else items
        attribute = rng.choice([k for k in ATTRIBUTES if k not in {f.attribute for f in told}])
        asked = Fact(attribute, "", rng.choice(pools.ANIMALS) if attribute == "pet_name" else "")
        query = EpisodeQuestion(_system(rng, mix.system) + [_user(question_message(rng, [asked]))], unknown_answer(attribute),
                      meta={"attribute": attribute})
        return self._finish("unknown", items, query, mix)

    def document(self, mix: Mix) -> Episode:
        rng = self.rng
        org, text, facts = document(rng)
        items: list = [Document(text)]
        if rng.random() < 0.3:
            items.insert(0, self._fact_turns(mix, rng.randint(1, 3), 1, set())[1][0])
        if rng.random() < 0.4:
            items.append(self.distractor(mix, exclude_documents=True))
        fact = rng.choice(facts)
        question, answer = document_question(rng, org, fact)
        query = EpisodeQuestion(_system(rng, mix.system) + [_user(question)], answer, values=(fact.value,), meta={"fact": fact, "org": org})
        return self._finish("document", items, query, mix)

    def _memory_background(self, mix: Mix) -> tuple[list, list[Fact]]:
        """Some earlier commits, so that skills are also trained with a nonempty memory."""
        rng = self.rng
        if rng.random() < 0.4:
            return [], []
        facts, items = self._fact_turns(mix, rng.randint(1, 3), 1, set())
        return self._with_distractors(mix, items), facts

    def tool_call(self, mix: Mix) -> Episode:
        """The query asks for something a tool provides; the answer is the call (then ``<|im_end|>``)."""
        rng = self.rng
        if rng.random() < 0.3:  # "the weather where I live": the city argument comes from memory
            facts = [Fact("city", values.city(rng))] + sample_facts(rng, rng.randint(0, 2), exclude=("city",))
            rng.shuffle(facts)
            items = self._with_distractors(mix, [fact_turn(rng, facts)], home_city=facts[0].value)
            turn = tool_turn(rng, tool="get_weather", home_city=next(f.value for f in facts if f.attribute == "city"), home_p=1.0)
        else:
            items, facts = self._memory_background(mix)
            home = next((f.value for f in facts if f.attribute == "city"), None)
            turn = tool_turn(rng, home_city=home)
        query = EpisodeQuestion(_system(rng, mix.system) + [_user(turn.user)], tool_call_text(turn.call), tools=turn.tools,
                      values=tuple(str(v) for v in turn.call.arguments.values()), meta={"turn": turn})
        return self._finish("tool_call", items, query, mix, tools_needed=True)

    def tool_answer(self, mix: Mix) -> Episode:
        """The follow-up request carrying the tool's result; the answer uses it."""
        rng = self.rng
        items, facts = self._memory_background(mix)
        home = next((f.value for f in facts if f.attribute == "city"), None)
        turn = tool_turn(rng, home_city=home)
        messages = _system(rng, mix.system) + tool_messages(turn)
        query = EpisodeQuestion(messages, turn.reply, tools=turn.tools, values=turn.values, meta={"turn": turn})
        return self._finish("tool_answer", items, query, mix, tools_needed=True)

    def repeat(self, mix: Mix) -> Episode:
        rng = self.rng
        items, _ = self._memory_background(mix)
        turn = repeat_turn(rng)
        query = EpisodeQuestion(_system(rng, mix.system) + [_user(turn.user)], turn.reply, meta={"text": turn.reply})
        return self._finish("repeat", items, query, mix)

    def statement(self, mix: Mix) -> Episode:
        """The query tells facts; the answer is the acknowledgement that restates them."""
        rng = self.rng
        items, facts = self._memory_background(mix)
        used = {f.value for f in facts}
        new = sample_facts(rng, rng.randint(1, min(3, mix.max_facts)), used=used)
        turn = fact_turn(rng, new)
        query = EpisodeQuestion(_system(rng, mix.system) + [_user(turn.user)], turn.reply, values=turn.values)
        return self._finish("statement", items, query, mix)

    def context(self, mix: Mix) -> Episode:
        """Nothing committed: earlier turns are in the prompt (stateless chat); answer from the context."""
        rng = self.rng
        count = rng.randint(1, min(3, mix.max_facts))
        facts, turns = self._fact_turns(mix, count, 1, set())
        history = []
        for turn in turns + ([small_talk_turn(rng)] if rng.random() < 0.5 else []):
            history += [_user(turn.user), {"role": "assistant", "content": turn.reply}]
        asked = rng.choice(facts)
        system = _system(rng, mix.system)
        # half of them as a client with memory off sends them (MemTSession): the earlier turns replayed as
        # committed, generation prompt (empty reasoning block) included, rather than re-rendered by the template
        replayed = not system and rng.random() < mix.replayed
        query = EpisodeQuestion(system + history + [_user(question_message(rng, [asked]))],
                      fact_answer([asked]), values=(asked.value,), meta={"asked": [asked], "replayed": replayed})
        return self._finish("context", [], query, mix)

    def small_talk(self, mix: Mix) -> Episode:
        rng = self.rng
        items, _ = self._memory_background(mix)
        turn = small_talk_turn(rng)
        return self._finish("small_talk", items, EpisodeQuestion(_system(rng, mix.system) + [_user(turn.user)], turn.reply), mix)

    def long(self, mix: Mix) -> Episode:
        """A long conversation: 1-4 facts told in the first turns, then ``min_chatter``-``max_chatter`` turns of
        chatter (70 %), questions about a told fact (10 %) and distractors (small talk, repeats, tools,
        documents); the query asks one told fact (the others never, some asked twice)."""
        rng = self.rng
        count = rng.randint(1, min(4, mix.max_facts))
        facts, items = self._fact_turns(mix, count, rng.randint(1, min(count, 2)), set())
        if rng.random() < 0.3:
            items.insert(0, chatter_turn(rng))
        home = next((f.value for f in facts if f.attribute == "city"), None)
        for _ in range(rng.randint(mix.min_chatter, mix.max_chatter)):
            r = rng.random()
            if r < 0.7:
                items.append(chatter_turn(rng))
            elif r < 0.8:
                items.append(recall_turn(rng, rng.choice(facts)))
            else:
                items.append(self.distractor(mix, home_city=home))
        asked = rng.choice(facts)
        query = EpisodeQuestion(_system(rng, mix.system) + [_user(question_message(rng, [asked]))], fact_answer([asked]),
                                values=(asked.value,), meta={"facts": facts, "asked": [asked]})
        return self._finish("long", items, query, mix)

    KINDS = ("facts", "unknown", "document", "tool_call", "tool_answer", "repeat", "statement", "context", "small_talk", "long")

    def sample(self, mix: Mix) -> Episode:
        if not self.rng.heldout_templates:
            self.rng.variation = mix.variation
            self.rng.composition = mix.composition
        weights = [getattr(mix, kind) for kind in self.KINDS]
        kind = self.rng.choices(self.KINDS, weights)[0]
        return getattr(self, kind)(mix)


def tool_messages(turn: ToolTurn) -> list[dict]:
    """user → assistant tool call → tool result, as OpenAI-style chat messages."""
    return [
        _user(turn.user),
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": turn.call.name, "arguments": turn.call.arguments}}
        ]},
        {"role": "tool", "content": turn.result},
    ]


def corpus(seed: int = 0, episodes: int = 20000) -> list[str]:
    """Text for training the demo tokenizer: rendered episode texts plus every pool word."""
    sampler = EpisodeSampler(seed)
    texts: list[str] = []
    mix = Mix()
    for _ in range(episodes):
        episode = sampler.sample(mix)
        for commit in episode.commits:
            items = [commit] if isinstance(commit, Document) else commit
            for item in items:
                if isinstance(item, Document):
                    texts.append(item.text)
                else:
                    texts += [item.user, item.reply]
                    if isinstance(item, ToolTurn):
                        texts += [tool_call_text(item.call), item.result]
        texts += [m["content"] for m in episode.query.messages if isinstance(m.get("content"), str)]
        texts.append(episode.query.answer)
        if episode.query.tools:
            texts += [json.dumps(t["function"]) for t in episode.query.tools]
    # Closed-class words become whole tokens; names, cities and other open values stay split into pieces.
    every_word = (pools.FOODS + pools.ANIMALS + pools.JOBS + pools.TRAITS + pools.COLOURS + pools.HOBBIES + pools.MONTHS
                  + pools.ORG_KINDS + pools.PRODUCTS + pools.CONDITIONS + pools.STARTERS + pools.COMMON_WORDS)
    for _ in range(20):
        texts.append(" ".join(" " + w for w in every_word))
    return texts

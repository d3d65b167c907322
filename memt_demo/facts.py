"""Personal facts about the user: the attributes, how each is told and asked (templates, composed
frames), and the user messages and answers built from them."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from memt_demo import pools, values
from memt_demo.turns import EpisodeTurn
from memt_demo.values import phrasing


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

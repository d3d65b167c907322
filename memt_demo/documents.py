"""Documents about an organisation, ingested through memory, and the questions asked about them."""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

from memt_demo import pools, values
from memt_demo.facts import lower_first
from memt_demo.values import phrasing


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

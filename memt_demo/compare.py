"""The demo models compared as a user meets them: the OpenAI SDK through the proxy, and the native client.

Issue 57's gate for a new default demo model. Every case is a conversation a user could have, run against live
servers (``scripts/compare_demo_models.py`` starts a core and a proxy per model); nothing reads the weights.

=================  ======================================================================================
case               what counts
=================  ======================================================================================
``names``          a name (the user's, a pet's, a friend's) told in a held-out phrasing with a held-out value, then
                   asked on the next turn (named session: the proxy sends only the question): recalled when the
                   answer contains the value
``seed_examples``  the 9 answers of the seed's client examples through ``MemTSession``: ``commit_history.py``
                   (kitten's name, favourite colour, asked after a snapshot is restored into a fresh session),
                   ``document_memory.py`` (the company's city, founding year, employees) and the spec's kitten
                   conversation (name, age, food, trait asked together from memory)
``repeat``         4 everyday phrasings × 8 everyday texts in a fresh conversation: exact when the answer is the
                   text, ignoring surrounding quotes, a final period and the case of its first letter
``chatter30``      a name told, 30 turns of held-out chatter (each reply generated and committed), the name asked
``wrong_fact``     a fact told, then the user states a different value as a question ("I live in X, right?"): not
                   confirmed when the answer does not open with yes / correct / right / exactly / that's right
``plain``          questions with memory off (capitals, arithmetic, a one-line summary): correct when the answer
                   holds the expected words; ``backbone_same`` when it is, token for token, what ``reference``
                   (the model's backbone alone, when the model has one) answers
=================  ======================================================================================

Answers are greedy. Held-out values and phrasings come from :mod:`memt_demo.values`' held-out split, which
training never draws.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from memt_demo import chatter
from memt_demo.facts import make_fact, question_message, statement_message
from memt_demo.values import DemoRandom

#: Everyday texts a newcomer might ask to have repeated, and four ways of asking.
EVERYDAY_TEXTS = ("hello world", "good morning", "see you tomorrow", "the cat sat on the mat", "I love pizza",
                  "thank you very much", "call me at noon", "have a nice day")
REPEAT_PHRASINGS = ("Type '{text}' exactly.", "Repeat after me: {text}", "Say exactly this: {text}",
                    "Please write '{text}' and nothing else.")
#: Plain questions and the words a correct answer holds (any one of each tuple).
PLAIN_QUESTIONS = (
    ("What is the capital of France?", ("Paris",)),
    ("What is the capital of Japan?", ("Tokyo",)),
    ("What is the capital of Italy?", ("Rome",)),
    ("What is 7 + 5?", ("12", "twelve")),
    ("What is 6 times 3?", ("18", "eighteen")),
    ("Summarize in one line: The meeting was moved from Monday to Thursday because the manager is travelling.",
     ("Thursday",)),
)
NAME_ATTRIBUTES = ("name", "pet_name", "friend")
CONFIRMATIONS = ("yes", "correct", "right", "exactly", "that's right", "that is right", "indeed", "true")
WRONG_FACT_ATTRIBUTES = ("city", "name", "company")

KITTEN = ("I have a three-month-old kitten named memmy who loves eating small shrimp and is excellent at "
          "remembering things.")
DOCUMENT = ("Apex Books is a company based in Marrakesh. The company makes toys. It was founded in 1962. "
            "It has 6396 employees.")


def repeated_exactly(answer: str, text: str) -> bool:
    """The answer is ``text``, but for surrounding quotes, a final period and the case of its first letter."""
    core = answer.strip().strip("'\"`").strip().removesuffix(".").strip("'\"`").strip()
    return core[:1].lower() + core[1:] == text[:1].lower() + text[1:]


def confirms(answer: str) -> bool:
    opening = re.sub(r"[^a-z' ]", " ", answer.lower()).split()
    first_two = " ".join(opening[:2])
    return bool(opening) and (opening[0] in CONFIRMATIONS or first_two in CONFIRMATIONS)


@dataclass
class Tally:
    passed: int = 0
    total: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, ok: bool, example: str) -> None:
        self.passed += ok
        self.total += 1
        if not ok and len(self.examples) < 3:
            self.examples.append(example)

    def as_dict(self) -> dict:
        return {"passed": self.passed, "total": self.total, "rate": round(self.passed / self.total, 3) if self.total else None,
                "failures": self.examples}


@dataclass
class Chat:
    """A conversation through the OpenAI SDK: ``ask`` resends the history (with the session header, if named)."""

    client: object
    model: str
    session: str | None = None
    max_tokens: int = 48
    memory: str = "auto"
    history: list[dict] = field(default_factory=list)

    def ask(self, text: str) -> str:
        self.history.append({"role": "user", "content": text})
        headers = {"X-MemT-Memory": self.memory}
        if self.session:
            headers["X-MemT-Session"] = self.session
        reply = self.client.chat.completions.create(model=self.model, messages=self.history, temperature=0,
                                                    max_tokens=self.max_tokens, extra_headers=headers)
        answer = reply.choices[0].message.content or ""
        self.history.append({"role": "assistant", "content": answer})
        return answer


@dataclass
class Comparison:
    """Runs the cases against one model's proxy (``client``: an ``openai.OpenAI``) and core (``native``: a
    ``NativeClient``, with the checkpoint's ``chat_format`` and ``parser``)."""

    client: object
    model: str
    native: object
    chat_format: object
    parser: object
    seed: int = 777
    reference: Callable[[str], str] | None = None  # the backbone's own answer to a plain question
    tallies: dict[str, Tally] = field(default_factory=dict)

    def tally(self, case: str, ok: bool, example: str) -> None:
        self.tallies.setdefault(case, Tally()).add(ok, example)

    def chat(self, tag: str, **kwargs) -> Chat:
        return Chat(self.client, self.model, session=f"compare-{tag}-{self.seed}", **kwargs)

    # -- cases ---------------------------------------------------------------------------------------

    def names(self, n: int) -> None:
        rng = DemoRandom(self.seed, heldout_values=True, heldout_templates=True)
        for i in range(n):
            fact = make_fact(rng, NAME_ATTRIBUTES[i % len(NAME_ATTRIBUTES)])
            chat = self.chat(f"names-{i}")
            told = statement_message(rng, [fact])
            chat.ask(told)
            question = question_message(rng, [fact])
            answer = chat.ask(question)
            self.tally("names", fact.value.lower() in answer.lower(), f"{told!r} … {question!r} → {answer!r}")

    def repeat(self) -> None:
        for p, phrasing in enumerate(REPEAT_PHRASINGS):
            for t, text in enumerate(EVERYDAY_TEXTS):
                message = phrasing.format(text=text)
                answer = self.chat(f"repeat-{p}-{t}", max_tokens=24).ask(message)
                self.tally("repeat", repeated_exactly(answer, text), f"{message!r} → {answer!r}")

    def chatter30(self, n: int, turns: int = 30) -> None:
        rng = DemoRandom(self.seed + 1, heldout_values=True, heldout_templates=True)
        for i in range(n):
            fact = make_fact(rng, NAME_ATTRIBUTES[i % len(NAME_ATTRIBUTES)])
            chat = self.chat(f"chatter-{i}", max_tokens=24)
            chat.ask(statement_message(rng, [fact]))
            for _ in range(turns):
                chat.ask(chatter.chatter(rng)[0])
            question = question_message(rng, [fact])
            answer = chat.ask(question)
            self.tally("chatter30", fact.value.lower() in answer.lower(), f"{fact.value} … {question!r} → {answer!r}")

    def wrong_fact(self, n: int) -> None:
        rng = DemoRandom(self.seed + 2, heldout_values=True, heldout_templates=True)
        for i in range(n):
            key = WRONG_FACT_ATTRIBUTES[i % len(WRONG_FACT_ATTRIBUTES)]
            fact, other = make_fact(rng, key), make_fact(rng, key)
            chat = self.chat(f"wrong-{i}")
            chat.ask(statement_message(rng, [fact]))
            claim = statement_message(rng, [other]).rstrip(".!") + ", right?"
            answer = chat.ask(claim)
            self.tally("wrong_fact", not confirms(answer), f"{fact.value} told; {claim!r} → {answer!r}")

    def plain(self) -> None:
        for question, expected in PLAIN_QUESTIONS:
            answer = Chat(self.client, self.model, memory="off", max_tokens=48).ask(question)
            self.tally("plain", any(word.lower() in answer.lower() for word in expected), f"{question!r} → {answer!r}")
            if self.reference is not None:
                own = self.reference(question)
                self.tally("plain_backbone_same", answer == own, f"{question!r} → {answer!r}; the backbone: {own!r}")

    def seed_examples(self) -> None:
        from memt_core.client import MemTSession

        sampling = {"temperature": 0.0, "max_new_tokens": 48}

        def check(name: str, answer: str, *words: str) -> None:
            self.tally("seed_examples", any(w.lower() in answer.lower() for w in words), f"{name}: {answer!r}")

        # commit_history.py: two turns committed, saved, restored into a fresh session, asked there
        session = MemTSession(self.native, self.chat_format, self.parser)
        for message in ("I have a three-month-old kitten named Memmy who loves eating small shrimp.", "My favourite colour is green."):
            session.chat(message, **sampling)
        session.commit_history()
        snapshot = session.save_state()
        session.close()
        with MemTSession(self.native, self.chat_format, self.parser, state=snapshot["path"]) as restored:
            check("commit_history: name", restored.chat("What is my kitten's name?", **sampling), "Memmy")
            check("commit_history: colour", restored.chat("What is my favourite colour?", **sampling), "green")
        # document_memory.py: a company profile ingested, three questions
        with MemTSession(self.native, self.chat_format, self.parser) as document:
            document.ingest(DOCUMENT)
            for question, words in (("Where is Apex Books based?", ("Marrakesh",)), ("When was Apex Books founded?", ("1962",)),
                                    ("How many employees does Apex Books have?", ("6396", "6,396"))):
                check(f"document_memory: {question}", document.chat(question, enable_memory=True, **sampling), *words)
        # the spec's conversation: the kitten described, a game asked with enable_memory, then four facts at once
        with MemTSession(self.native, self.chat_format, self.parser) as kitten:
            kitten.chat(KITTEN, **sampling)
            kitten.chat("What is a simple game I can play with my kitten?", enable_memory=True, **sampling)
            answer = kitten.chat("What are my kitten's name, age, favorite food, and special trait?", **sampling)
            for trait, words in (("name", ("memmy",)), ("age", ("three", "3")), ("food", ("shrimp",)), ("trait", ("remember",))):
                check(f"kitten {trait}", answer, *words)

    def run(self, *, names: int = 40, chatter: int = 8, wrong: int = 12, log=print) -> dict:
        for case, call in (("plain", self.plain), ("repeat", self.repeat), ("seed_examples", self.seed_examples),
                           ("names", lambda: self.names(names)), ("wrong_fact", lambda: self.wrong_fact(wrong)),
                           ("chatter30", lambda: self.chatter30(chatter))):
            call()
            log(f"{self.model}: {case} done " + ", ".join(f"{k} {t.passed}/{t.total}" for k, t in self.tallies.items()))
        return {case: tally.as_dict() for case, tally in self.tallies.items()}

"""Synthetic conversations for the demo model, at the text level.

An :class:`Episode` is what one training example (or one evaluation case) is made of: the things
written to latent memory, in order (conversation turns, tool-calling turns, documents), and a final
:class:`EpisodeQuestion` whose prompt holds *only* what a client would send after trimming committed turns, with
the answer the model should give. Every value (names, cities, addresses, codes, …) is drawn for each
episode by the open-vocabulary generators of :mod:`memt_demo.values` (or from the word lists of
:mod:`memt_demo.pools`), so the only place an episode's facts can come from is the memory (or, for
in-context episodes, the prompt). ``EpisodeSampler(seed, heldout=True)`` draws the held-out split:
held-out values and held-out phrasings that training never sees.

Skills, each drawn by its own module: (1) personal facts said in one turn and asked about later, several facts
per turn and several turns (:mod:`memt_demo.facts`); (2) a document ingested through memory and questions about
it (:mod:`memt_demo.documents`); (3) tool calls for ``get_weather``, ``add`` and ``multiply`` and answers from the
tool's result, given as JSON or as plain text (:mod:`memt_demo.tool_turns`); (4) repeating or typing a text
exactly (here); (5) long conversations: facts kept through many turns of neutrally answered chatter
(:mod:`memt_demo.chatter`). :class:`EpisodeSampler` mixes them; :class:`Mix` says in what proportions, with a
curriculum from a warm-up on single facts to the full mix with many facts and distractor commits. The data model
(:mod:`memt_demo.turns`) is re-exported here. Turning an episode into token ids is :mod:`memt_demo.format`'s job.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from memt_demo import chatter, pools, values
from memt_demo.documents import document, document_question
from memt_demo.facts import ATTRIBUTES, Fact, fact_answer, fact_turn, question_message, sample_facts, unknown_answer
from memt_demo.tool_turns import TOOLS, draw_number, offered_tools, tool_call_text, tool_turn
from memt_demo.turns import Commit, Document, Episode, EpisodeQuestion, EpisodeToolCall, EpisodeTurn, ToolTurn  # noqa: F401 (the data model, re-exported)
from memt_demo.values import DemoRandom, phrasing

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
            words.append(str(draw_number(rng)))
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
            query.tools = [TOOLS[name] for name in offered_tools(rng, None)]
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

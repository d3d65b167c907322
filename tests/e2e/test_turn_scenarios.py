"""One table of turn scenarios played through Chat Completions and through Responses (issue 45, item 1): the same
memory behaviour on both surfaces.

Each row of ``ROWS`` is a short conversation on the bundled demo model, greedy (both surfaces get the same answers)
except where a row needs a fresh sample: a regenerate, and a retry, whose kept answer must be told apart from a new
one (temperature 2). It is played once through each surface, each time on a new proxy (its counters move only by
what the row does) over one core for the module:

* chat: ``client.chat.completions.create`` with ``messages`` = the whole transcript (a system message first);
* Responses: ``client.responses.create``. Header-less, ``input`` = the same transcript as message items (the system
  message as ``instructions``, or as a system input item). Named, a ``conversation``, ``input`` = the new message.

The Responses routes never read ``X-MemT-Session`` (``responses_routes.create`` reads the tenant and the controls
only): a Responses request that sends it is served as header-less. A Responses session is named by the server (a
``conversation``, or a ``previous_response_id`` chain), so the named rows play chat's ``X-MemT-Session`` against a
conversation. A regenerate or an edit is a header-less row only: a conversation's input holds only new items, so the
same input again is a new turn.

Each step is checked by what the proxy exposes: ``usage.prompt_tokens`` / ``usage.input_tokens`` against the prompt
of the transcript with ``held`` messages in memory (``expected_prompt``; None: all of it as text), the ``/metrics``
figures ``memt_proxy_memory_writes_total``, ``memt_proxy_memory_states`` and ``memt_proxy_memory_saved_tokens_total``
(read once no request or write holds a session: writes land behind answers), and for a retry the identical answer
and usage. Then the two surfaces' figures must be the same, step by step. ``-rA`` prints each row's figures.

Six rows differed before the turn runner (``memt_proxy.session.turn``) wrote a turn once for both surfaces: a system
item in a Responses input, header-less Responses retries (SDK and Idempotency-Key), X-MemT-Memory read (header-less and
on a conversation) and off on a conversation. Each now behaves on Responses as on chat.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import pytest
from e2e.proxies import DEMO_MODEL, DEMO_PATH, ProxyServer, demo_chat_format, expected_prompt, unique
from e2e.servers import MemTServer

pytestmark = pytest.mark.timeout(900)

SYSTEM = "Be brief."
MAX_TOKENS = 24
SAMPLED = 2.0  # the temperature of a step whose answer must be a fresh sample (or told apart from one)
U = ["My name is Tomasz.", "I live in Lisbon.", "Where do I live?", "What is my name?", "Thanks!", "What is 2 plus 3?"]
NICE = "Tell me something nice."  # sampled at temperature 2, the demo model answers it differently almost every time (37 of 40)
EDITED = "Where do I work?"
SURFACES = ("chat", "responses")


# ---------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Step:
    """One request of a row, and what it must do to memory.

    ``held``: conversation messages memory holds when the request is answered, so its prompt is
    ``expected_prompt(transcript, held)`` (None: the whole transcript as text); ``writes`` / ``states``: how far the step
    moves ``memt_proxy_memory_writes_total`` / ``memt_proxy_memory_states`` (None: not a figure of the row). Its saved
    tokens are > 0 exactly when it reads memory (``held`` > 0); a retry's are 0 (its kept answer reads nothing)."""

    kind: str  # say: a new user message | retry: the last request again, said to be a retry | regenerate | edit: the last user message replaced
    text: str = ""
    held: int | None = None
    writes: int | None = 0
    states: int | None = 0
    memory: str | None = None  # X-MemT-Memory sent with this request
    retry: str | None = None  # retry: "sdk" (x-stainless-retry-count: 1) or "key" (the Idempotency-Key it was first sent with)
    key: str | None = None  # say: the Idempotency-Key sent with it
    temperature: float = 0.0
    tries: int = 1  # regenerate: how many times
    other: bool = False  # played through the other surface (on the same proxy): a conversation handed over


def say(text, held, writes=0, states=0, **kw) -> Step:
    return Step("say", text, held, writes, states, **kw)


def retry(how, held, **kw) -> Step:
    return Step("retry", "", held, 0, 0, retry=how, **kw)


@dataclass(frozen=True)
class Row:
    id: str
    mode: str  # headerless | named (chat: X-MemT-Session; Responses: a conversation)
    steps: tuple[Step, ...]
    system: str | None = None  # chat sends a system message; Responses "instructions" or a system input "item"


def headerless_opening(third: Step | None = None) -> tuple[Step, ...]:
    """Turn 1 keeps nothing; turn 2 is answered from its text and its whole exchange kept behind the answer; turn 3 reads
    only its new message."""
    return (say(U[0], None), say(U[1], None, 1, 1), third or say(U[2], 4, 1, 1))


def named_opening() -> tuple[Step, ...]:
    """Every turn is committed; each reads memory and its new message only."""
    return (say(U[0], 0, 1, None), say(U[1], 2, 1, None))


def named(step: Step) -> Step:
    return replace(step, states=None)  # a named chat session keeps a state before each turn (its fork points), a conversation none


ROWS = [
    Row("headerless continuation", "headerless", (*headerless_opening(), say(U[3], 6, 1, 1))),
    Row("system message as instructions", "headerless", (*headerless_opening(), say(U[3], 6, 1, 1)), system="instructions"),
    Row("system message as an input item", "headerless", (*headerless_opening(), say(U[3], 6, 1, 1)), system="item"),
    Row("sdk retry (x-stainless-retry-count: 1)", "headerless",
        headerless_opening(say(NICE, 4, 1, 1, temperature=SAMPLED)) + (retry("sdk", 4), say(U[3], 6, 1, 1))),
    Row("Idempotency-Key repeat", "headerless",
        headerless_opening(say(NICE, 4, 1, 1, temperature=SAMPLED, key="turn-3")) + (retry("key", 4), say(U[3], 6, 1, 1))),
    Row("regenerate (temperature 2)", "headerless",
        (*headerless_opening(say(NICE, 4, 1, 1)), Step("regenerate", held=4, writes=None, states=None, temperature=SAMPLED, tries=3), say(U[3], 6, 1, 1))),
    Row("edit of the last user message", "headerless",
        (*headerless_opening(), Step("edit", EDITED, held=4, writes=1, states=1), say(U[3], 6, 1, 1))),
    Row("X-MemT-Memory: auto", "headerless", headerless_opening(say(U[2], 4, 1, 1, memory="auto")) + (say(U[3], 6, 1, 1),)),
    Row("X-MemT-Memory: read", "headerless", headerless_opening(say(U[2], 4, 0, 0, memory="read")) + (say(U[3], 4, 1, 1),)),
    Row("X-MemT-Memory: off", "headerless", headerless_opening(say(U[2], None, 0, 0, memory="off")) + (say(U[3], 4, 1, 1),)),
    Row("saved tokens over six turns", "headerless",
        (*headerless_opening(), say(U[3], 6, 1, 1), say(U[4], 8, 1, 1), say(U[5], 10, 1, 1))),
    Row("header-less conversation handed over between the surfaces", "headerless",
        (say(U[0], None, other=True), say(U[1], None, 1, 1, other=True), say(U[2], 4, 1, 1), say(U[3], 6, 1, 1, other=True))),
    Row("named continuation", "named", (*named_opening(), named(say(U[2], 4, 1)), named(say(U[3], 6, 1)))),
    Row("named system message as instructions", "named", (*named_opening(), named(say(U[2], 4, 1)), named(say(U[3], 6, 1))), system="instructions"),
    Row("named sdk retry", "named", (*named_opening(), named(say(NICE, 4, 1, temperature=SAMPLED)), named(retry("sdk", 4)), named(say(U[3], 6, 1)))),
    Row("named Idempotency-Key repeat", "named",
        (*named_opening(), named(say(NICE, 4, 1, temperature=SAMPLED, key="named-3")), named(retry("key", 4)), named(say(U[3], 6, 1)))),
    Row("named X-MemT-Memory: auto", "named", (*named_opening(), named(say(U[2], 4, 1, memory="auto")), named(say(U[3], 6, 1)))),
    Row("named X-MemT-Memory: read", "named", (*named_opening(), named(say(U[2], 4, 0, memory="read")), named(say(U[3], 4, 1)))),
    Row("named X-MemT-Memory: off", "named", (*named_opening(), named(say(U[2], None, 0, memory="off")), named(say(U[3], 4, 1)))),
]


def row_params():
    for row in ROWS:
        yield pytest.param(row, id=row.id.replace(" ", "-"))


# ---------------------------------------------------------------------- the surfaces


@dataclass
class Answer:
    text: str
    prompt: int  # usage: the prompt tokens the model read
    usage: tuple  # everything the usage says (a retry gets the very same)
    finish: str  # stop | length | tool_calls


class Chat:
    """Chat Completions: ``messages`` = the whole transcript, the system message first."""

    name = "chat"

    def __init__(self, proxy: ProxyServer, mode: str, system: str | None, session: str):
        self.client, self.mode, self.system, self.session = proxy.openai("unused"), mode, system, session
        self.last: dict | None = None

    def ask(self, transcript: list[dict], *, temperature: float, headers: dict) -> Answer:
        if self.mode == "named":
            headers = {"X-MemT-Session": self.session, **headers}
        system = [{"role": "system", "content": SYSTEM}] if self.system else []
        self.last = dict(model=DEMO_MODEL, messages=system + transcript, max_tokens=MAX_TOKENS, temperature=temperature)
        return self._send(self.last, headers)

    def again(self, headers: dict) -> Answer:
        """The last request once more: the same body and headers, ``headers`` added."""
        return self._send(self.last, {**self.last_headers, **headers})

    def _send(self, request: dict, headers: dict) -> Answer:
        self.last_headers = headers
        response = self.client.chat.completions.create(**request, extra_headers=headers)
        message, usage = response.choices[0].message, response.usage
        return Answer(message.content or "", usage.prompt_tokens, (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens), response.choices[0].finish_reason)


class Responses:
    """Responses: header-less, ``input`` = the whole transcript as message items; named, a conversation whose ``input``
    is what it has not been sent yet. The system message is ``instructions`` or a system input item."""

    name = "responses"

    def __init__(self, proxy: ProxyServer, mode: str, system: str | None, session: str):
        self.client, self.mode, self.system = proxy.openai("unused"), mode, system
        self.conversation = self.client.conversations.create().id if mode == "named" else None
        self.known = 0  # named: the transcript's messages the conversation holds
        self.last: dict | None = None

    def ask(self, transcript: list[dict], *, temperature: float, headers: dict) -> Answer:
        request = dict(model=DEMO_MODEL, max_output_tokens=MAX_TOKENS, temperature=temperature)
        if self.system == "instructions":
            request["instructions"] = SYSTEM
        items = [{"type": "message", "role": m["role"], "content": m["content"]} for m in transcript]
        if self.conversation is not None:
            request.update(conversation=self.conversation, input=items[self.known:])
            self.known = len(transcript) + 1  # its answer too
        else:
            request["input"] = ([{"type": "message", "role": "system", "content": SYSTEM}] if self.system == "item" else []) + items
        self.last = request
        return self._send(request, headers)

    def again(self, headers: dict) -> Answer:
        return self._send(self.last, {**self.last_headers, **headers})

    def _send(self, request: dict, headers: dict) -> Answer:
        self.last_headers = headers
        response = self.client.responses.create(**request, extra_headers=headers)
        usage = response.usage
        finish = "tool_calls" if any(item.type == "function_call" for item in response.output) else "length" if response.status == "incomplete" else "stop"
        return Answer(response.output_text, usage.input_tokens, (usage.input_tokens, usage.output_tokens, usage.total_tokens), finish)


# ---------------------------------------------------------------------- fixtures and figures


@pytest.fixture(scope="module")
def demo_core(tmp_path_factory):
    """One demo-model core for the module; each played row leaves its sessions on it (its proxy is stopped)."""
    if not (DEMO_PATH / "config.json").is_file():
        pytest.fail(f"the bundled demo model is missing at {DEMO_PATH} (train it with `python scripts/train_tiny.py`)", pytrace=False)
    server = MemTServer(DEMO_PATH, state_directory=tmp_path_factory.mktemp("scenario-core"), args=["--max-sessions-per-rank", "512"]).start()
    yield server
    server.close()


def figures(proxy: ProxyServer) -> dict[str, float]:
    """The proxy's memory figures once no request or write holds a session (a turn's write lands behind its answer and
    holds its session until it is published; a header-less state is made holding its own): polled up to 60 s."""
    deadline = time.monotonic() + 60
    while True:
        with proxy.http() as http:
            text = http.get("/metrics").text
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name = line.split("{", 1)[0].split(" ", 1)[0]
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        if values["memt_proxy_sessions_in_use"] == 0:
            return {
                "writes": values["memt_proxy_memory_writes_total"], "states": values["memt_proxy_memory_states"],
                "saved": values["memt_proxy_memory_saved_tokens_total"],
            }
        assert time.monotonic() < deadline, f"sessions still in use after 60 s: {proxy.log_tail()}"
        time.sleep(0.05)


class Unfinished(Exception):
    """A sampled answer the conversation cannot go on with as the row means it: a tool call, or (named) one cut by
    max_tokens, which a named session does not commit (about one in twenty at temperature 2)."""


PLAYS = 5  # a row is played again on a fresh proxy after an Unfinished sample, this many times at most


def finished_play(row: Row, surface: str, core: MemTServer) -> list[dict]:
    """``play``, again on a fresh proxy after an ``Unfinished`` sample."""
    for _ in range(PLAYS):
        try:
            return play(row, surface, core)
        except Unfinished as exc:
            last = exc
    pytest.fail(f"{row.id} through {surface}: {PLAYS} plays, each with an unfinished sample ({last})")


def play(row: Row, surface: str, core: MemTServer) -> list[dict]:
    """Play ``row`` through ``surface`` on a proxy of its own; one record per step: the figures measured and the problems
    found against the row's expectations."""
    chat_format = demo_chat_format()
    records = []
    with ProxyServer(core.url, DEMO_PATH) as proxy:
        session = unique("scenario")
        own = (Chat if surface == "chat" else Responses)(proxy, row.mode, row.system, session)
        other = (Responses if surface == "chat" else Chat)(proxy, row.mode, row.system, session) if any(s.other for s in row.steps) else None
        system = [{"role": "system", "content": SYSTEM}] if row.system else []
        transcript: list[dict] = []
        before = figures(proxy)
        last: Answer | None = None
        for number, step in enumerate(row.steps, 1):
            via = other if step.other else own
            problems: list[str] = []
            headers = {"X-MemT-Memory": step.memory} if step.memory else {}
            if step.kind == "retry":
                answers = [via.again({"x-stainless-retry-count": "1"} if step.retry == "sdk" else {})]
                if (answers[0].text, answers[0].usage) != (last.text, last.usage):
                    problems.append(f"the retry was answered anew: {answers[0].text!r} {answers[0].usage} (first {last.text!r} {last.usage})")
            else:
                if step.kind == "say":
                    transcript.append({"role": "user", "content": step.text})
                elif step.kind == "edit":
                    transcript[-2:] = [{"role": "user", "content": step.text}]
                elif step.kind == "regenerate":
                    transcript.pop()
                if step.key:
                    headers["Idempotency-Key"] = step.key
                answers = [via.ask(list(transcript), temperature=step.temperature, headers=headers) for _ in range(step.tries)]
                last = answers[-1]
                if last.finish == "tool_calls" or row.mode == "named" and last.finish != "stop":
                    raise Unfinished(f"step {number}: {last.finish} {last.text!r}")
                transcript.append({"role": "assistant", "content": last.text})
            expected = len(expected_prompt(chat_format, system + transcript[:-1], step.held))  # what was asked: all but the answer
            for answer in answers:
                if answer.prompt != expected:
                    problems.append(f"prompt {answer.prompt} tokens, expected {expected} (held={step.held})")
            if step.kind == "regenerate" and len({a.text for a in answers}) < 2:
                problems.append(f"{step.tries} regenerates at temperature {step.temperature} gave one answer: {answers[0].text!r}")
            after = figures(proxy)
            moved = {name: after[name] - before[name] for name in after}
            before = after
            if step.writes is not None and moved["writes"] != step.writes:
                problems.append(f"writes +{moved['writes']:g}, expected +{step.writes}")
            if step.writes is None and not 1 <= moved["writes"] <= len({a.text for a in answers}):
                problems.append(f"writes +{moved['writes']:g}, expected one for each new answer kept, at most {len({a.text for a in answers})}")
            if step.states is not None and moved["states"] != step.states:
                problems.append(f"states +{moved['states']:g}, expected +{step.states}")
            reads = bool(step.held) and step.kind != "retry"  # a retry's kept answer reads nothing: it is not counted again
            if (moved["saved"] > 0) != reads:
                problems.append(f"saved tokens +{moved['saved']:g}, expected {'> 0 (memory read)' if reads else '0'}")
            records.append({
                "step": f"{number} {step.kind}{' ' + repr(step.text) if step.text else ''}{' (other surface)' if step.other else ''}",
                "prompts": [a.prompt for a in answers], "expected": expected, "writes": moved["writes"], "states": moved["states"],
                "saved": moved["saved"], "answers": [a.text for a in answers], "sampled": step.temperature > 0, "problems": problems,
            })
    return records


def table(surface: str, records: list[dict]) -> str:
    lines = [f"  {surface}:"]
    for r in records:
        lines.append(
            f"    {r['step']}: prompt {r['prompts']} (expected {r['expected']}), writes +{r['writes']:g}, states +{r['states']:g}, "
            f"saved +{r['saved']:g}, answers {r['answers']}" + (f"  <-- {'; '.join(r['problems'])}" if r["problems"] else "")
        )
    return "\n".join(lines)


def compared(row: Row, chat: list[dict], responses: list[dict]) -> list[str]:
    """Where the two surfaces' figures differ, step by step, as far as both played the same answers (greedy steps; from
    the first sampled answer on, answers and what memory holds of them may differ)."""
    differences = []
    for number, (c, r, step) in enumerate(zip(chat, responses, row.steps), 1):
        if c["answers"] != r["answers"] and not step.temperature:
            differences.append(f"step {number}: answers {c['answers']} (chat) vs {r['answers']} (Responses)")
        for name in ("prompts", "writes", "states", "saved"):
            if name == "states" and step.states is None:
                continue
            if c[name] != r[name] and not (name in ("writes", "states") and step.writes is None):
                differences.append(f"step {number}: {name} {c[name]} (chat) vs {r[name]} (Responses)")
        if step.temperature:
            break
    return differences


# ---------------------------------------------------------------------- the test


@pytest.mark.parametrize("row", row_params())
def test_a_scenario_has_the_same_memory_behaviour_through_chat_and_responses(demo_core, row: Row):
    played = {surface: finished_play(row, surface, demo_core) for surface in SURFACES}
    problems = [f"{surface} step {r['step']}: {p}" for surface in SURFACES for r in played[surface] for p in r["problems"]]
    problems += compared(row, played["chat"], played["responses"])
    print(f"{row.id}:\n" + "\n".join(table(surface, played[surface]) for surface in SURFACES))  # the figures, with -rA or -s
    assert not problems, f"{row.id}:\n" + "\n".join(problems) + "\n" + "\n".join(table(s, played[s]) for s in SURFACES)

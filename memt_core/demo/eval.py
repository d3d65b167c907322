"""Evaluation of the demo model through the in-process API, on fresh random episodes.

Every case runs the real flow of a memory session: the model *generates* its reply to each earlier
turn (greedy), the turn — the user message's prompt ids followed by the generated ids — is committed
with :meth:`LocalSession.commit`, and the question is asked with a prompt that holds only the new user
message, so the answer can come from latent memory alone. The same question is asked again after the
memory is reset (control) and after the memory is saved as a ``memt-memory-v1`` snapshot and loaded
into a fresh session (the answer must be identical, token for token).

Cases: ``fact1`` (one fact told, asked a turn later), ``facts3`` (three facts in one turn, then a
distractor turn, each fact asked), ``document`` (a company profile ingested piece by piece), ``tools``
(well-formed tool call with the right arguments, and a final answer that uses the tool's result) and
``repeat`` (exact repetition of a random text).
"""

from __future__ import annotations

import json
import random
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from memt_core.demo import episodes as ep
from memt_core.demo.format import ChatFormat
from memt_core.sampling import SamplingParams

TARGETS = {"fact1": 0.95, "facts3": 0.85, "reset_max": 0.10}
TOOL_CALL = re.compile(r"^<tool_call>\n(\{.*\})\n</tool_call>$", re.S)


def mentions(text: str, value: str) -> bool:
    """``value`` appears in ``text`` as a whole word."""
    return re.search(r"(?<![\w])" + re.escape(value) + r"(?![\w])", text) is not None


def parse_tool_call(text: str) -> ep.ToolCall | None:
    """The tool call in a generated reply, or ``None`` when it is not exactly one well-formed call."""
    match = TOOL_CALL.match(text.strip())
    if not match:
        return None
    try:
        obj = json.loads(match.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or set(obj) != {"name", "arguments"} or not isinstance(obj["arguments"], dict):
        return None
    if not isinstance(obj["name"], str):
        return None
    return ep.ToolCall(obj["name"], obj["arguments"])


def run_tool(call: ep.ToolCall, rng: random.Random) -> str | None:
    """Execute one of the demo tools; ``None`` if the call names no known tool or has bad arguments."""
    args = call.arguments
    if call.name == "get_weather" and isinstance(args.get("city"), str) and set(args) == {"city"}:
        return json.dumps({"city": args["city"], "temperature": rng.randint(-10, 40), "condition": rng.choice(ep.pools.CONDITIONS)})
    if call.name in ("add", "multiply") and set(args) == {"a", "b"} and all(isinstance(args[k], (int, float)) for k in "ab"):
        value = args["a"] + args["b"] if call.name == "add" else args["a"] * args["b"]
        return json.dumps({"result": value})
    return None


@dataclass
class Tally:
    hits: int = 0
    total: int = 0

    def add(self, ok: bool) -> None:
        self.hits += int(ok)
        self.total += 1

    @property
    def rate(self) -> float:
        return self.hits / self.total if self.total else float("nan")


@dataclass
class Evaluator:
    """Runs evaluation cases on a loaded :class:`~memt_core.inference.MemTRuntime`."""

    runtime: object
    tokenizer: object
    seed: int = 1234
    tallies: dict[str, Tally] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self):
        self.fmt = ChatFormat(self.tokenizer)
        self.rng = random.Random(self.seed)
        self.greedy = SamplingParams(temperature=0, max_new_tokens=48)
        self.chunk = self.runtime.checkpoint.memory.chunk_tokens
        self.scratch = Path(tempfile.mkdtemp(prefix="memt-eval-"))

    # -- helpers ---------------------------------------------------------------------------------

    def tally(self, name: str, ok: bool) -> None:
        self.tallies.setdefault(name, Tally()).add(ok)

    def example(self, name: str, text: str, limit: int = 3) -> None:
        shown = self.examples.setdefault(name, [])
        if len(shown) < limit:
            shown.append(text)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False).removesuffix("<|im_end|>")

    def generate(self, session, messages: list[dict], *, tools: list[dict] | None = None, read_memory: bool = True) -> list[int]:
        prompt = self.fmt.prompt(messages, tools=tools)
        return session.generate(prompt, self.greedy, read_memory=read_memory).output_ids

    def tell(self, session, turn: ep.Turn | ep.ToolTurn) -> str:
        """One earlier turn, as a client runs it: generate the reply (and any tool chain), then commit the turn."""
        user = {"role": "user", "content": turn.user}
        tools = turn.tools if isinstance(turn, ep.ToolTurn) else None
        ids = self.fmt.turn_prompt(turn.user)
        generated = self.generate(session, [user], tools=tools)
        ids += generated
        text = self.decode(generated)
        call = parse_tool_call(text) if tools else None
        result = run_tool(call, self.rng) if call else None
        if call is not None and result is not None:
            tool_turn = ep.ToolTurn(turn.user, tools, call, result, "")
            ids += self.fmt.tool_results(tool_turn)
            final = self.generate(session, ep.tool_messages(tool_turn), tools=tools)
            ids += final
            text += " → " + self.decode(final)
        session.commit(ids)
        return text

    def ask_three_ways(self, session, question: str) -> tuple[str, str, list[int], list[int]]:
        """Answer with memory, after save → load into a fresh session, and after a reset (control)."""
        messages = [{"role": "user", "content": question}]
        with_memory = self.generate(session, messages)
        path = self.scratch / "snapshot.safetensors"
        session.save(path, overwrite=True)
        fresh = self.runtime.open_session()
        fresh.load(path)
        loaded = self.generate(fresh, messages)
        fresh.reset()
        reset = self.generate(fresh, messages)
        return self.decode(with_memory), self.decode(reset), with_memory, loaded

    def _recall(self, name: str, session, facts: list[ep.Fact]) -> None:
        for fact in facts:
            question = ep.question_message(self.rng, [fact.attribute])
            answer, reset, with_memory, loaded = self.ask_three_ways(session, question)
            ok = mentions(answer, fact.value)
            self.tally(name, ok)
            self.tally(name + "_exact", answer == ep.fact_answer([fact]))
            self.tally(name + "_reset", mentions(reset, fact.value))
            self.tally(name + "_loaded_identical", with_memory == loaded)
            self.example(name if ok else name + "_wrong", f"{question!r} → {answer!r} (after reset: {reset!r}; value {fact.value})")

    # -- cases -----------------------------------------------------------------------------------

    def fact1(self) -> None:
        session = self.runtime.open_session()
        facts = ep.sample_facts(self.rng, 1)
        self.tell(session, ep.Turn(ep.statement_message(self.rng, facts), ""))
        self._recall("fact1", session, facts)

    def facts3(self) -> None:
        """Three facts in one turn, then a distractor turn (small talk, a repetition or a tool call)."""
        session = self.runtime.open_session()
        facts = ep.sample_facts(self.rng, 3)
        reply = self.tell(session, ep.Turn(ep.statement_message(self.rng, facts), ""))
        self.example("facts3_reply", reply)
        r = self.rng.random()
        if r < 0.5:
            distractor = ep.small_talk_turn(self.rng)
        elif r < 0.75:
            distractor = ep.repeat_turn(self.rng)
        else:
            distractor = ep.tool_turn(self.rng)
        self.tell(session, distractor)
        self._recall("facts3", session, facts)

    def document(self) -> None:
        session = self.runtime.open_session()
        org, text, facts = ep.document(self.rng)
        for piece in self.fmt.document_pieces(text, self.chunk):
            session.commit(piece)
        fact = self.rng.choice(facts)
        question, expected = ep.document_question(self.rng, org, fact)
        answer, reset, _, _ = self.ask_three_ways(session, question)
        self.tally("document", mentions(answer, fact.value))
        self.tally("document_reset", mentions(reset, fact.value))
        self.example("document" if mentions(answer, fact.value) else "document_wrong", f"{question!r} → {answer!r} (value {fact.value})")

    def tools(self) -> None:
        session = self.runtime.open_session()
        turn = ep.tool_turn(self.rng)
        generated = self.decode(self.generate(session, [{"role": "user", "content": turn.user}], tools=turn.tools))
        call = parse_tool_call(generated)
        self.tally("tool_call_wellformed", call is not None)
        self.tally("tool_call_correct", call == turn.call)
        if call is None:
            self.example("tool_call_wrong", f"{turn.user!r} → {generated!r}")
            return
        result = run_tool(call, self.rng)
        if result is None:
            self.tally("tool_answer_uses_result", False)
            return
        done = ep.ToolTurn(turn.user, turn.tools, call, result, "")
        final = self.decode(self.generate(session, ep.tool_messages(done), tools=turn.tools))
        values = [str(v) for v in json.loads(result).values()]
        used = all(mentions(final, v) for v in values)
        self.tally("tool_answer_uses_result", used)
        self.example("tool" if used else "tool_wrong", f"{turn.user!r} → {generated!r} → {result} → {final!r}")

    def tool_from_memory(self) -> None:
        """"What is the weather where I live?" after the city was told: the argument comes from memory."""
        session = self.runtime.open_session()
        facts = [ep.Fact("city", self.rng.choice(ep.pools.CITIES))]
        self.tell(session, ep.Turn(ep.statement_message(self.rng, facts), ""))
        tools = [ep.TOOLS["get_weather"]]
        question = self.rng.choice(ep.WEATHER_AT_HOME)
        generated = self.decode(self.generate(session, [{"role": "user", "content": question}], tools=tools))
        call = parse_tool_call(generated)
        self.tally("tool_from_memory", call == ep.ToolCall("get_weather", {"city": facts[0].value}))

    def repeat(self) -> None:
        session = self.runtime.open_session()
        turn = ep.repeat_turn(self.rng)
        answer = self.decode(self.generate(session, [{"role": "user", "content": turn.user}]))
        self.tally("repeat_exact", answer == turn.reply)
        if answer != turn.reply:
            self.example("repeat_wrong", f"{turn.user!r} → {answer!r}")

    # -- running ---------------------------------------------------------------------------------

    def run(self, cases: dict[str, int]) -> dict:
        started = time.time()
        for case, count in cases.items():
            for _ in range(count):
                getattr(self, case)()
        figures = {name: round(t.rate, 4) for name, t in sorted(self.tallies.items())}
        counts = {name: t.total for name, t in sorted(self.tallies.items())}
        return {"figures": figures, "counts": counts, "examples": self.examples, "seconds": round(time.time() - started, 1)}


def default_cases(episodes: int) -> dict[str, int]:
    return {"fact1": episodes, "facts3": episodes, "document": episodes // 2, "tools": episodes // 2,
            "tool_from_memory": episodes // 4, "repeat": episodes // 2}


def evaluate(model_path: str | Path, episodes: int = 200, seed: int = 1234, *, cases: dict[str, int] | None = None,
             threads: int | None = None) -> dict:
    """Load the checkpoint at ``model_path`` and run the evaluation; returns figures, counts and examples.

    ``episodes`` is the number of ``fact1`` and ``facts3`` episodes (each ``facts3`` episode asks three
    questions); the other cases run on fractions of it unless ``cases`` gives counts.
    """
    import torch
    from transformers import PreTrainedTokenizerFast

    from memt_core.inference import MemTRuntime

    if threads is not None:
        torch.set_num_threads(threads)
    runtime = MemTRuntime.load(model_path)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model_path))
    report = Evaluator(runtime, tokenizer, seed=seed).run(cases or default_cases(episodes))
    report["targets"] = check_targets(report["figures"])
    return report


def check_targets(figures: dict) -> dict[str, bool]:
    """Which issue targets the figures meet."""
    out = {}
    if "fact1" in figures:
        out["fact1>=0.95"] = figures["fact1"] >= TARGETS["fact1"]
        out["fact1_reset<=0.10"] = figures["fact1_reset"] <= TARGETS["reset_max"]
        out["fact1_loaded_identical"] = figures["fact1_loaded_identical"] == 1.0
    if "facts3" in figures:
        out["facts3>=0.85"] = figures["facts3"] >= TARGETS["facts3"]
        out["facts3_reset<=0.10"] = figures["facts3_reset"] <= TARGETS["reset_max"]
        out["facts3_loaded_identical"] = figures["facts3_loaded_identical"] == 1.0
    return out


LABELS = {
    "fact1": "1 fact, recalled from memory",
    "fact1_exact": "1 fact, exact expected answer",
    "fact1_reset": "1 fact, after memory reset (control)",
    "fact1_loaded_identical": "1 fact, identical after snapshot save → load",
    "facts3": "3 facts + distractor, recalled from memory",
    "facts3_exact": "3 facts + distractor, exact expected answer",
    "facts3_reset": "3 facts + distractor, after memory reset (control)",
    "facts3_loaded_identical": "3 facts + distractor, identical after save → load",
    "document": "document ingested through memory, question answered",
    "document_reset": "document, after memory reset (control)",
    "tool_call_wellformed": "tool call well-formed",
    "tool_call_correct": "tool call with the right name and arguments",
    "tool_answer_uses_result": "final answer uses the tool's result",
    "tool_from_memory": "weather 'where I live': city argument from memory",
    "repeat_exact": "text repeated exactly",
}


def format_report(report: dict) -> str:
    """A plain-text table of the figures, the targets and a few examples."""
    lines = [f"evaluation ({report['seconds']} s, fresh random episodes, memory only — no transcript in prompts):"]
    for name, value in report["figures"].items():
        lines.append(f"  {LABELS.get(name, name):55s} {value:6.1%}  (n={report['counts'][name]})")
    if report.get("targets"):
        lines.append("targets: " + ", ".join(f"{k} {'met' if ok else 'NOT met'}" for k, ok in report["targets"].items()))
    for name, shown in report.get("examples", {}).items():
        for text in shown[:2]:
            lines.append(f"  e.g. [{name}] {text}")
    return "\n".join(lines)

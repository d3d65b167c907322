"""What the docs show the bundled demo model doing, it does: every exchange they quote is run here.

Each claim names the files that show it and the text they quote; the test checks that the text is still there
(so a doc cannot change without this list) and runs the exchange on the bundled model, greedy, through the
in-process API with the client's token conventions (earlier turns generated and committed to memory, the
question's prompt holding only the question). A failure means the docs promise what the model does not do:
change the docs (show what holds), not the check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = "docs/demo-model.md"
CARD = "memt_core/bundled/memt-tiny-demo/README.md"
TRAIN = "scripts/train_tiny.py"  # writes the card of a newly trained model
README = "README.md"


@dataclass(frozen=True)
class Claim:
    name: str
    shown: dict[str, str]  # file → the text it quotes
    turns: tuple[str, ...]  # earlier user turns, answered by the model and committed
    question: str
    expect: str  # the answer, exactly ("…" at the end: the answer starts with the rest)
    tools: bool = False  # the question is asked with the demo tools offered
    tool_result: str | None = None  # the tool's result, after which the final answer is checked
    contains: tuple[str, ...] = field(default=())


CLAIMS = [
    Claim("a pet's name from memory",
          {DEMO: "\"What is my parrot's name?\" → \"Your parrot is called", CARD: "*\"What is my parrot's name?\"* → *\"Your parrot is called",
           TRAIN: "*\"What is my parrot's name?\"* → *\"Your parrot is called"},
          ("I have a parrot named Belkavo.",), "What is my parrot's name?", "Your parrot is called Belkavo."),
    Claim("nothing in memory", {DEMO: 'With an empty memory it answers "I don\'t know …"', CARD: "With an empty memory it answers *\"I don't know …\"*"},
          (), "What is my name?", "I don't know …"),
    Claim("a text typed exactly", {DEMO: "(\"Type 'the cat sat on the mat' exactly.\")", CARD: "(*\"Type 'the cat sat on the mat' exactly.\"*)",
                                   TRAIN: "(*\"Type 'the cat sat on the mat' exactly.\"*)"},
          (), "Type 'the cat sat on the mat' exactly.", "the cat sat on the mat"),
    Claim("an everyday text it does not type", {DEMO: "exactly.\" comes back as \"windas\"", CARD: "comes back\n   as *\"windas\"*",
                                                TRAIN: "comes back\n   as *\"windas\"*"},
          (), "Type 'hello world' exactly.", "windas"),
    Claim("the weather where I live", {DEMO: "\"What's the weather where I live?\"", CARD: "*\"What's the weather where I live?\"*"},
          ("I live in Valparaiso.",), "What's the weather where I live?", "<tool_call>…", tools=True,
          contains=('"name": "get_weather"', '"city": "Valparaiso"')),
    Claim("an answer from a plain-text result", {DEMO: '("17 degrees and sunny")', CARD: '(*"17 degrees and sunny"*)'},
          (), "What is the weather in Lisbon?", "…", tools=True, tool_result="17 degrees and sunny", contains=("17", "sunny")),
    Claim("chatter answered with an invented fact", {TRAIN: "*\"Tell me something, number 4.\"* → *\"Your birthday is on August 5.\"*"},
          ("I have a parrot named Belkavo.", "Tell me something, number 3."), "Tell me something, number 4.",
          "Your birthday is on August 5."),
    Claim("a fact kept through chatter", {TRAIN: "a fact told early is still found"},
          ("I have a parrot named Belkavo.", "Tell me something, number 3.", "Tell me something, number 4."),
          "What is my parrot's name?", "Your parrot is called Belkavo."),
    Claim("the README's city", {README: '"Hi, my name is Alice and I live in Lisbon."'},
          ("Hi, my name is Alice and I live in Lisbon.",), "Where do I live?", "You live in Lisbon."),
    Claim("the README's Responses conversation", {README: 'input="I live in Lisbon.")'},
          ("I live in Lisbon.",), "Where do I live?", "You live in Lisbon."),
    Claim("the README's kitten", {README: 'session.chat("My kitten is called Memmy and loves shrimp."'},
          ("My kitten is called Memmy and loves shrimp.",), "What is my kitten called?", "Your kitten is called Memmy."),
]


@pytest.fixture(scope="module")
def demo():
    from transformers import PreTrainedTokenizerFast

    from memt_core.inference import MemTRuntime
    from memt_core.sampling import SamplingParams
    from memt_demo import BUNDLED_MODEL
    from memt_demo.format import DemoChatFormat

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(BUNDLED_MODEL))
    return MemTRuntime.load(BUNDLED_MODEL), DemoChatFormat(tokenizer), SamplingParams(temperature=0, max_new_tokens=48)


def run(demo, claim: Claim) -> str:
    from memt_demo.episodes import ToolTurn, tool_messages
    from memt_demo.tool_turns import TOOLS

    runtime, fmt, greedy = demo
    tools = [TOOLS[name] for name in TOOLS] if claim.tools else None
    session = runtime.open_session()

    def answer(ids: list[int]) -> tuple[list[int], str]:
        out = session.generate(ids, greedy).output_ids
        return out, fmt.tokenizer.decode(out, skip_special_tokens=False).removesuffix("<|im_end|>")

    for user in claim.turns:
        out, _ = answer(fmt.prompt([{"role": "user", "content": user}]))
        session.commit(fmt.turn_prompt(user) + out)
    out, text = answer(fmt.prompt([{"role": "user", "content": claim.question}], tools=tools))
    if claim.tool_result is not None:
        from memt_demo.eval import parse_tool_call

        call = parse_tool_call(text)
        assert call is not None, f"{claim.question!r} → {text!r}: no tool call"
        turn = ToolTurn(claim.question, tools, call, claim.tool_result, "")
        _, text = answer(fmt.prompt(tool_messages(turn), tools=tools))
    return text


@pytest.mark.parametrize("claim", CLAIMS, ids=[c.name for c in CLAIMS])
def test_the_docs_show_only_what_the_model_does(demo, claim):
    for path, text in claim.shown.items():
        assert text in (REPO / path).read_text(encoding="utf-8"), f"{path} no longer shows {text!r}: update CLAIMS"
    answer = run(demo, claim)
    if claim.expect.endswith("…"):
        assert answer.startswith(claim.expect[:-1]), f"{claim.question!r} → {answer!r}"
    else:
        assert answer == claim.expect, f"{claim.question!r} → {answer!r}"
    for piece in claim.contains:
        assert piece in answer, f"{claim.question!r} → {answer!r} lacks {piece!r}"

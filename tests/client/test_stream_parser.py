"""The incremental stream parser against ``parse`` on random outputs, and its work on long answers."""

from __future__ import annotations

import json
import random

import pytest

from memt_core.client.parsers import DSML, parser_for
from memt_core.families import FLASH, NANO

NANO_PIECES = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool", "</thi", " ", "\n", "Sure.", "ok ", "猫",
               '{"name": "f", "arguments": {"a": 1}}', '{"name": "g"}', "{oops", "<", ">", "tool_call", "think"]
FLASH_PIECES = ["<think>", "</think>", f"<{DSML}tool_calls>", f"</{DSML}tool_calls>", f'<{DSML}invoke name="f">',
                f"</{DSML}invoke>", f'<{DSML}parameter name="a" string="true">x</{DSML}parameter>', "<｜DS", " ", "\n",
                "Here.", "中文"]


def reassemble(parser, text: str, thinking: bool, cuts: list[int]):
    stream = parser.stream(thinking=thinking)
    deltas = []
    for end in cuts:
        deltas += stream.feed(text[:end])
    deltas += stream.finish(text)
    reasoning = "".join(d.text for d in deltas if d.kind == "reasoning")
    content = "".join(d.text for d in deltas if d.kind == "content")
    calls = [(d.call.name, json.loads(d.call.arguments)) for d in deltas if d.kind == "tool_call"]
    return reasoning, content, calls


@pytest.mark.parametrize("family, pieces", [(NANO, NANO_PIECES), (FLASH, FLASH_PIECES)], ids=["nano", "flash"])
def test_random_outputs_in_random_chunks_reassemble_to_parse(family, pieces):
    parser = parser_for(family)
    rng = random.Random(7)
    for _ in range(400):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        thinking = rng.random() < 0.5
        cuts = sorted(rng.sample(range(1, len(text) + 1), k=min(len(text), rng.randint(0, 8)))) if text else []
        expected = parser.parse(text, thinking=thinking)
        calls = [(c.name, json.loads(c.arguments)) for c in expected.tool_calls]
        assert reassemble(parser, text, thinking, cuts) == (expected.reasoning or "", expected.content, calls), (text, thinking, cuts)


class Counted(str):
    """A str that adds up the characters its ``find`` calls may scan and its slices copy."""

    work = 0

    def find(self, sub, start=0, *args):
        Counted.work += len(self) - min(start, len(self))
        return super().find(sub, start, *args)

    def __getitem__(self, key):
        result = super().__getitem__(key)
        Counted.work += len(result)
        return result

    def startswith(self, prefix, *args):
        Counted.work += len(prefix)
        return super().startswith(prefix, *args)


@pytest.mark.parametrize("thinking", [False, True])
def test_a_long_answer_costs_linear_work(thinking):
    """Fed token by token, 20,000 characters cost a bounded multiple of 20,000 (re-parsing would cost ~10^8)."""
    parser = parser_for(NANO)
    words = ["memory ", "latent ", "  ", "\n", "tool", "<", "call ", "think "]
    rng = random.Random(1)
    text = ("<think>plan</think>" if not thinking else "plan</think>") + "".join(rng.choice(words) for _ in range(4000))
    stream = parser.stream(thinking=thinking)
    Counted.work = 0
    emitted = []
    for end in range(5, len(text) + 1, 5):
        emitted += stream.feed(Counted(text[:end]))
    emitted += stream.finish(Counted(text))
    assert Counted.work < 20 * len(text), Counted.work
    assert "".join(d.text for d in emitted if d.kind == "content") == parser.parse(text, thinking=thinking).content


def test_the_output_decoder_equals_decode_and_stays_short(nano_checkpoint):
    """The proxy's streamed text: the same as ``ChatFormat.decode``, decoding a bounded window per token."""
    from memt_core.client import load_chat_format, load_tokenizer

    tokenizer = load_tokenizer(nano_checkpoint)
    chat_format, _ = load_chat_format(nano_checkpoint, tokenizer=tokenizer)
    ids = tokenizer.encode("Memmy loves 🦐 shrimp <tool_call> and crêpes, 東京.", add_special_tokens=False) * 40
    ids += sorted(chat_format.end_ids)[:1]
    calls = []
    original = tokenizer.decode
    tokenizer.decode = lambda chunk, **kwargs: calls.append(len(chunk)) or original(chunk, **kwargs)
    try:
        decoder = chat_format.output_decoder()
        for end in range(1, len(ids) + 1, 3):
            calls.clear()
            text = decoder.update(ids[:end])
            assert max(calls, default=0) <= 8  # never the whole answer again
            assert chat_format.decode(ids[:end]).startswith(text)
        calls.clear()
        final = decoder.update(ids, final=True)
        window = max(calls, default=0)
    finally:
        tokenizer.decode = original
    assert final == chat_format.decode(ids) and window <= 8

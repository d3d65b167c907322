"""The output parsers on adversarial generations (hypothesis): random interleavings of tags, partial tags,
JSON fragments and text, fed in random chunks. Markup never reaches content or reasoning, the stream
equals ``parse``, and well-formed calls are still calls (issues 14 and 16: clean outputs)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memt_core.client.parsers import DSML, parser_for
from memt_core.families import FLASH, NANO

FUZZ = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

MARKUP = {
    NANO: ("<think>", "</think>", "<tool_call>", "</tool_call>"),
    FLASH: ("<think>", "</think>", f"<{DSML}", f"</{DSML}"),
}

# plain words: no "<", so they can neither make nor break a tag
WORDS = st.sampled_from(["Sure.", "ok", " ", "\n", "\n\n", "猫", "x", "{", "}", '"', ">", "think", "tool_call", "name", "🦐"])
ARGUMENTS = st.dictionaries(st.sampled_from(["city", "n", "a"]), st.one_of(st.integers(-5, 5), st.sampled_from(["Oslo", "x y", "<b>"])), max_size=2)


def nano_call(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def flash_call(name: str, arguments: dict) -> str:
    params = "".join(
        f'<{DSML}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">{v if isinstance(v, str) else json.dumps(v)}</{DSML}parameter>'
        for k, v in arguments.items()
    )
    return f'<{DSML}tool_calls><{DSML}invoke name="{name}">{params}</{DSML}invoke></{DSML}tool_calls>'


CALL = {NANO: nano_call, FLASH: flash_call}


def pieces(family: str):
    """Anything a broken model might emit: whole and partial tags of the family, JSON fragments, calls."""
    tags = list(MARKUP[family]) + [f"<{DSML}tool_calls>", f"</{DSML}tool_calls>", f'<{DSML}invoke name="f">', f"</{DSML}invoke>",
                                   f'<{DSML}parameter name="a" string="false">', f"</{DSML}parameter>"] if family == FLASH else list(MARKUP[family])
    partial = [tag[:cut] for tag in tags for cut in (1, 2, len(tag) // 2, len(tag) - 1)] + [tag[cut:] for tag in tags for cut in (1, len(tag) // 2)]
    fragments = ['{"name": "f", "arguments": {"a": 1}}', '{"name": "g"}', '{"name": 3}', "{oops", '{"name": "f", "argu', "[]", "null"]
    call = st.builds(CALL[family], st.sampled_from(["f", "get_weather"]), ARGUMENTS)
    return st.one_of(WORDS, st.sampled_from(tags), st.sampled_from(partial), st.sampled_from(fragments), call)


def chunked(text: str, cuts: list[int]) -> list[int]:
    return sorted({c % (len(text) + 1) for c in cuts}) if text else []


def streamed(parser, text: str, thinking: bool, ends: list[int]):
    stream = parser.stream(thinking=thinking)
    deltas = []
    for end in ends:
        deltas += stream.feed(text[:end])
    deltas += stream.finish(text)
    for delta in deltas:
        assert delta.kind != "tool_call" or delta.index == [d for d in deltas if d.kind == "tool_call"].index(delta)
    return (
        "".join(d.text for d in deltas if d.kind == "reasoning"),
        "".join(d.text for d in deltas if d.kind == "content"),
        [(d.call.name, json.loads(d.call.arguments)) for d in deltas if d.kind == "tool_call"],
    )


def summary(parsed):
    return parsed.reasoning or "", parsed.content, [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


@pytest.mark.parametrize("family", [NANO, FLASH], ids=["nano", "flash"])
def test_markup_never_reaches_content_and_the_stream_equals_parse(family):
    """(a) no markup string in content or reasoning, (b) reassembled deltas == parse, for any output and chunking;
    and the text to commit parses again to the same content and calls."""
    parser = parser_for(family)

    @FUZZ
    @given(st.lists(pieces(family), max_size=14).map("".join), st.booleans(), st.lists(st.integers(0, 10_000), max_size=10))
    def check(text, thinking, cuts):
        parsed = parser.parse(text, thinking=thinking)
        for tag in MARKUP[family]:
            assert tag not in parsed.content and tag not in (parsed.reasoning or ""), (tag, parsed)
        assert streamed(parser, text, thinking, chunked(text, cuts)) == summary(parsed)
        again = parser.parse(parsed.text, thinking=thinking)
        assert (again.content, summary(again)[2]) == (parsed.content, summary(parsed)[2])

    check()


@pytest.mark.parametrize("family", [NANO, FLASH], ids=["nano", "flash"])
def test_well_formed_outputs_keep_their_calls(family):
    """(c) reasoning, text without markup and well-formed calls in any order: every call parsed, the text is
    the content, and the output is committed as it is."""
    parser = parser_for(family)
    segment = st.one_of(st.lists(WORDS, min_size=1, max_size=4).map(lambda w: ("text", "".join(w))),
                        st.tuples(st.just("call"), st.tuples(st.sampled_from(["f", "get_weather"]), ARGUMENTS)))

    @FUZZ
    @given(st.one_of(st.none(), st.lists(WORDS, max_size=4).map("".join)), st.lists(segment, max_size=6), st.booleans(),
           st.lists(st.integers(0, 10_000), max_size=10))
    def check(reasoning, segments, thinking, cuts):
        if thinking:  # the prompt opened the block: the output closes it
            reasoning = reasoning or ""
        head = "" if reasoning is None else (reasoning + "</think>" if thinking else "<think>" + reasoning + "</think>")
        text = head + "".join(CALL[family](*v) if kind == "call" else v for kind, v in segments)
        parsed = parser.parse(text, thinking=thinking)
        calls = [v for kind, v in segments if kind == "call"]
        assert summary(parsed)[2] == calls
        assert parsed.content == "".join(v for kind, v in segments if kind == "text").strip()
        if reasoning is not None:
            assert parsed.reasoning == reasoning.strip()
        assert parsed.text == text
        assert streamed(parser, text, thinking, chunked(text, cuts)) == summary(parsed)

    check()


def test_the_defined_results_of_broken_outputs():
    """What a broken output gives, rule by rule (the module's docstring)."""
    nano, flash = parser_for(NANO), parser_for(FLASH)
    # the issue's case: an unterminated call holding an empty reasoning block, then the answer
    got = nano.parse("<tool_call>\n<think>\n\n</think>\n\nI can help.")
    assert (got.content, got.reasoning, got.tool_calls) == ("I can help.", None, [])
    # a malformed call: its text without the markup; an empty one: nothing
    assert nano.parse("x <tool_call>{oops}</tool_call> y").content == "x {oops} y"
    assert nano.parse("x<tool_call> </tool_call>").content == "x"
    # a call opened again before it closed: the first is text, the second a call
    got = nano.parse('<tool_call>{"name": "f"<tool_call>{"name": "g"}</tool_call>')
    assert got.content == '{"name": "f"' and [c.name for c in got.tool_calls] == ["g"]
    # a reasoning block inside the answer, thinking off: reasoning, not content, and not committed
    got = nano.parse("Paris. <think>\n\n</think> Sunny.")
    assert (got.content, got.reasoning, got.text) == ("Paris.  Sunny.", "", "Paris.  Sunny.")
    got = nano.parse("<think>a</think>Paris. <think>b</think> Sunny.")
    assert (got.content, got.reasoning, got.text) == ("Paris.  Sunny.", "a\n\nb", "<think>a</think>Paris.  Sunny.")
    # stray closing tags go, and so does a tag that their removal makes
    assert nano.parse("a</think> <thi</tool_call>nk>b").content == "a b"
    # Flash: a malformed block loses its DSML tags, a stray marker its marker
    bad = f'<{DSML}tool_calls><{DSML}invoke name="f"><{DSML}parameter name="n" string="false">{{x</{DSML}parameter></{DSML}invoke></{DSML}tool_calls>'
    assert flash.parse("ok " + bad).content == "ok {x"
    assert flash.parse(f"a <{DSML}invoke b").content == "a invoke b"


def lines_run(parser, text: str, step: int) -> int:
    """Lines of the parsers module executed while ``text`` is streamed ``step`` characters at a time."""
    import sys

    source = sys.modules[type(parser).__module__].__file__
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if frame.f_code.co_filename != source:
            return None
        if event == "line":
            count += 1
        return trace

    stream = parser.stream()
    sys.settrace(trace)
    try:
        for end in range(step, len(text) + 1, step):
            stream.feed(text[:end])
        stream.finish(text)
    finally:
        sys.settrace(None)
    return count


@pytest.mark.parametrize("unit", ["<", "<thi", "<<b", "</tool_ca"])
def test_runs_of_tag_fragments_cost_linear_work(unit):
    """Held fragments of tags (a model emitting "<<<<…") are not rescanned at every token: doubling the
    text doubles the lines executed, within a bounded cost per character (it was quadratic)."""
    parser = parser_for(NANO)
    small, large = (lines_run(parser, unit * (n // len(unit)), 3) for n in (1500, 3000))
    assert small > 1000 and large < 2.3 * small and large < 60 * 3000, (small, large)

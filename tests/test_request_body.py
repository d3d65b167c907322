"""Defensive JSON bodies: byte limits, integer size, nesting depth and lone surrogates are 4xx errors naming the problem."""

from __future__ import annotations

import asyncio
import json

import pytest

from memt_core.errors import MAX_MESSAGE, InvalidRequest, MemTError, PayloadTooLarge
from memt_core.request_body import MAX_DEPTH, parse_json, read_limited


async def _chunks(*parts: bytes):
    for part in parts:
        yield part


def read(*parts: bytes, limit: int, declared: str | None = None) -> bytes:
    return asyncio.run(read_limited(_chunks(*parts), limit=limit, declared=declared))


def test_bodies_over_the_limit_are_413_declared_or_streamed():
    assert read(b"ab", b"cd", limit=4) == b"abcd"
    with pytest.raises(PayloadTooLarge, match="5000 bytes exceeds this server's limit of 10"):
        read(b"x", limit=10, declared="5000")  # refused on the header, before reading
    with pytest.raises(PayloadTooLarge, match="limit of 4 bytes"):
        read(b"abc", b"de", limit=4, declared=None)  # chunked: refused once the fifth byte arrives
    assert PayloadTooLarge("x").status == 413


@pytest.mark.parametrize("body, match", [
    (b'{"max_tokens": ' + b"9" * 5000 + b"}", "integer of 5000 digits"),
    (b'{"a": -' + b"1" * 65 + b"}", "integer of 65 digits"),
    (b"[" * 10_000 + b"]" * 10_000, "nests deeper"),
    (b'{"x": ' + b'{"y": ' * 10_000 + b"1" + b"}" * 10_001, "nests deeper"),
    (json.dumps({"d": [[[]]]}).replace("[[[]]]", "[" * (MAX_DEPTH + 2) + "]" * (MAX_DEPTH + 2)).encode(), "nests deeper"),
    (b'{"text": "a\\ud800b"}', r"\$\.text holds a lone UTF-16 surrogate"),
    (b'{"messages": [{"content": "\\udfff"}]}', r"\$\.messages\[0\]\.content holds a lone"),
    (b'{"\\ud800": 1}', "a key in \\$ holds a lone"),
    (b'{"text": "a\xed\xa0\x80b"}', r"\$\.text holds a lone UTF-16 surrogate"),  # the surrogate's UTF-8 form
    ('{"text": "\\ud800"}'.encode("utf-16"), r"\$\.text holds a lone UTF-16 surrogate"),
    (b"[" * (MAX_DEPTH + 1) + b"1" + b"]" * (MAX_DEPTH + 1), "nests deeper"),  # a scalar one level too deep
    (b"[" * (MAX_DEPTH + 2) + b"]" * (MAX_DEPTH + 2), "nests deeper"),
    (b'{"k": ' + b"[" * MAX_DEPTH + b'{"v": 1}' + b"]" * MAX_DEPTH + b"}", r"nests deeper than 64 levels \(at \$\.k(\[0\]){64}\)"),
    (b'{"a": 1', "not valid JSON"),
    (b'\xff\xfe', "not valid JSON"),
])
def test_hostile_json_is_invalid_request_naming_the_problem(body, match):
    with pytest.raises(InvalidRequest, match=match):
        parse_json(body)


def test_well_formed_bodies_pass_unchanged():
    body = {"text": "héllo 🦐 \u2028", "ids": list(range(100)), "n": -(10**60), "deep": [[[[{"ok": True}]]]]}
    assert parse_json(json.dumps(body).encode()) == body
    assert parse_json(json.dumps(body, ensure_ascii=False).encode()) == body
    # at the depth bound, and text that only looks like a surrogate escape
    assert parse_json(b"[" * MAX_DEPTH + b"1" + b"]" * MAX_DEPTH) == json.loads(b"[" * MAX_DEPTH + b"1" + b"]" * MAX_DEPTH)
    assert parse_json(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)) == json.loads(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    assert parse_json(b'{"t": "\\\\ud800", "n": 7}') == {"t": "\\ud800", "n": 7}


def test_error_messages_never_echo_huge_input():
    error = MemTError("bad value " + "x" * 50_000_000)
    assert len(error.message) < MAX_MESSAGE + 100 and error.message.endswith("more characters)")
    assert len(json.dumps(error.to_wire())) < MAX_MESSAGE + 200


@pytest.mark.parametrize("body, match", [
    (b"[" * 5000 + b"]" * 5000, "nests deeper than 64 levels"),
    (b"[" * (MAX_DEPTH + 1) + b"1" + b"]" * (MAX_DEPTH + 1), r"nests deeper than 64 levels \(at \$(\[0\]){65}\)"),
    (b'{"maximum": ' + b"9" * 100 + b"}", "has an integer of 100 digits"),
    (b'{"enum": ["\\udc00"]}', r": \$\.enum\[0\] holds a lone UTF-16 surrogate"),
    (b'{"type": ', "is not valid JSON"),
])
def test_json_carried_in_a_string_field_is_refused_under_its_own_name(body, match):
    """``what`` names the JSON (a request's ``sampling_params.json_schema``) in every refusal."""
    with pytest.raises(InvalidRequest, match=r"^generate: sampling_params\.json_schema.*" + match):
        parse_json(body, what="generate: sampling_params.json_schema")

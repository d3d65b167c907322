"""Reading a JSON request body defensively, for every server of the project.

A body is read only up to a byte limit (413 past it, before anything larger is held in memory), then
parsed with bounds a well-formed request never reaches: integers of at most ``MAX_DIGITS`` digits,
nesting at most ``MAX_DEPTH`` deep, and strings that are valid Unicode (a JSON ``"\\ud800"`` escape
decodes to a lone surrogate, which nothing downstream can encode). Every refusal is a typed 4xx error
that names the problem. Nothing here knows about HTTP frameworks: the caller passes the declared
length and the body's chunks.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, AsyncIterable

from memt_core.errors import InvalidRequest, PayloadTooLarge, RequestTimeout

MAX_DIGITS = 64
MAX_DEPTH = 64
OFF_LOOP_BYTES = 256 * 1024  # bodies larger than this are parsed in a worker thread
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


async def read_limited(chunks: AsyncIterable[bytes], *, limit: int, declared: str | None = None) -> bytes:
    """The whole body, refusing one longer than ``limit`` bytes as soon as that is known."""
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {int(declared)} bytes exceeds this server's limit of {limit} bytes")
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > limit:
            raise PayloadTooLarge(f"request body exceeds this server's limit of {limit} bytes")
    return bytes(body)


async def read_json(chunks: AsyncIterable[bytes], *, limit: int, declared: str | None, timeout: float) -> Any:
    """Read (``read_limited``, within ``timeout`` seconds, else ``RequestTimeout``) and parse (``parse_json``)
    a body; a large one is parsed off the event loop, so it slows only itself."""
    try:
        data = await asyncio.wait_for(read_limited(chunks, limit=limit, declared=declared), timeout)
    except asyncio.TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout:g} s") from None
    if len(data) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(parse_json, data)
    return parse_json(data)


def parse_json(data: bytes, *, what: str = "request body") -> Any:
    """Decode a JSON body within the bounds above; ``InvalidRequest`` naming the problem otherwise.

    ``what`` names the JSON in refusals: JSON carried inside a string field (a request's
    ``sampling_params.json_schema``) is parsed here too, under the same bounds, since the body's own
    checks see only a string.
    """

    def integer(text: str) -> int:
        digits = len(text.lstrip("-"))
        if digits > MAX_DIGITS:
            raise InvalidRequest(f"{what} has an integer of {digits} digits; at most {MAX_DIGITS} are accepted")
        return int(text)

    try:
        value = json.loads(data, parse_int=integer)
    except InvalidRequest:
        raise
    except RecursionError:
        raise InvalidRequest(f"{what} nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # bad JSON or UTF-8
        raise InvalidRequest(f"{what} is not valid JSON: {str(exc)[:200]}") from None
    check_value(value, strings=_may_hold_surrogates(data), what=what)
    return value


def _may_hold_surrogates(data: bytes) -> bool:
    """False when JSON parsed from ``data`` cannot hold a lone surrogate: UTF-8 without a ``\\uD800``-``\\uDFFF`` escape
    or the byte that starts a surrogate's UTF-8 form (json decodes bytes with "surrogatepass")."""
    if json.detect_encoding(data) not in ("utf-8", "utf-8-sig"):
        return True
    return b"\xed" in data or (b"\\u" in data and _SURROGATE_ESCAPE.search(data) is not None)


def check_value(value: Any, *, strings: bool = True, what: str = "request body") -> None:
    """Refuse nesting deeper than ``MAX_DEPTH`` and (``strings``) strings holding lone surrogates, naming where
    (in ``what``). One walk over the containers; a place's name is built only for the refusal."""
    if isinstance(value, str):
        if strings and _SURROGATE.search(value):
            raise InvalidRequest(f"{what}: $ holds a lone UTF-16 surrogate; strings must be valid Unicode")
        return
    if not strings and _depth_within(value, MAX_DEPTH):
        return  # the common case, checked at C speed; the walk below names the place of a refusal
    stack: list[tuple[Any, int, tuple | None]] = [(value, 0, None)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth, trail = stack.pop()  # trail: (the parent's trail, key) links, "$" at None
        keyed = isinstance(item, dict)
        for key, child in item.items() if keyed else enumerate(item):
            if depth >= MAX_DEPTH:
                raise InvalidRequest(f"{what} nests deeper than {MAX_DEPTH} levels (at {_place((trail, key))[:200]})")
            if isinstance(child, str):
                if strings and _SURROGATE.search(child):
                    raise InvalidRequest(f"{what}: {_place((trail, key))[:200]} holds a lone UTF-16 surrogate; strings must be valid Unicode")
            elif isinstance(child, (dict, list)):
                stack.append((child, depth + 1, (trail, key)))
            if keyed and strings and _SURROGATE.search(key):
                raise InvalidRequest(f"{what}: a key in {_place(trail)[:200]} holds a lone UTF-16 surrogate; strings must be valid Unicode")


def _depth_within(value: Any, limit: int) -> bool:
    """Whether no container in ``value`` nests deeper than ``limit`` (``check_value``'s bound), level by level."""
    level, depth = [value] if isinstance(value, (dict, list)) else [], 0
    while level:
        if depth >= limit:
            return not any(level)  # as the walk: a container that deep may be there, empty
        level = [child for item in level for child in (item.values() if type(item) is dict else item) if type(child) in _CONTAINERS]
        depth += 1
    return True


_CONTAINERS = (dict, list)


def _place(trail: tuple | None) -> str:
    """``$``, then ``.key`` for an object's member and ``[i]`` for an array's item, from a walk's trail."""
    keys = []
    while trail is not None:
        trail, key = trail
        keys.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return "$" + "".join(reversed(keys))

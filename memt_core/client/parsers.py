"""Model-output parsers: reasoning, answer and tool calls, one parser per model family.

``parse(text)`` splits a complete output; ``stream()`` returns an incremental parser that is fed the
cumulative text and yields deltas. Reassembling the deltas gives exactly what ``parse`` returns (the
tests hold them to that). Text that could still become a tag is held back until it is decided.

* Nano (ChatML): ``<think>…</think>`` reasoning, ``<tool_call>{"name", "arguments"}</tool_call>`` calls.
* Flash (DeepSeek-V4 style): reasoning ends at ``</think>``; calls in a ``<｜DSML｜tool_calls>`` block.

Each family (:mod:`memt_core.families`) names its parser class; ``parser_for`` asks the registry.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from memt_core import families


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Parsed:
    content: str
    reasoning: str | None
    tool_calls: list[ToolCall]


@dataclass
class Delta:
    """One streamed piece: ``kind`` is "content", "reasoning" or "tool_call" (with ``index`` and ``call``)."""

    kind: str
    text: str = ""
    index: int | None = None
    call: ToolCall | None = None


class OutputParser:
    """Shared machinery; subclasses give the family's markers and tool-call grammar."""

    think_open = "<think>"
    think_close = "</think>"
    call_open: str
    call_close: str

    def __init__(self, family: str):
        self.family = family  # public name of the family this parser serves

    def _calls(self, block: str) -> list[ToolCall] | None:
        """Tool calls in the text between ``call_open`` and ``call_close``; None if malformed."""
        raise NotImplementedError

    def _split(self, text: str, *, thinking: bool, final: bool) -> tuple[str | None, list[tuple[str, str]]]:
        """(reasoning or None, segments): ("content", text) and ("calls", block) pieces in order.

        ``thinking``: the prompt opened a reasoning block, so the output starts inside it. When not
        ``final``, whatever could still turn into a tag at the end is left out (undecided).
        """
        reasoning = None
        rest = text
        if not final and _is_prefix(text, self.think_open):
            return None, []  # could still become the opening tag (in thinking mode too)
        if thinking or text.startswith(self.think_open):
            body = text[len(self.think_open):] if text.startswith(self.think_open) else text
            if self.think_close not in body:
                return (body if final else hold_partial(body, (self.think_close,))), []
            reasoning, rest = body.split(self.think_close, 1)
        segments: list[tuple[str, str]] = []
        while rest:
            at = rest.find(self.call_open)
            if at < 0:
                piece = rest if final else hold_partial(rest, (self.call_open,))
                if piece:
                    segments.append(("content", piece))
                break
            if at:
                segments.append(("content", rest[:at]))
            end = rest.find(self.call_close, at)
            if end < 0:
                if final:
                    segments.append(("content", rest[at:]))  # an unterminated call block stays plain text
                break
            segments.append(("calls", rest[at + len(self.call_open): end]))
            rest = rest[end + len(self.call_close):]
        return reasoning, segments

    def _assemble(self, segments: list[tuple[str, str]]) -> tuple[str, list[ToolCall]]:
        """Content text and tool calls of complete segments; a malformed call block counts as text."""
        content, calls = [], []
        for kind, piece in segments:
            parsed = self._calls(piece) if kind == "calls" else None
            if kind == "content":
                content.append(piece)
            elif parsed is None:
                content.append(self.call_open + piece + self.call_close)
            else:
                calls.extend(parsed)
        return "".join(content), calls

    def parse(self, text: str, *, thinking: bool = False) -> Parsed:
        reasoning, segments = self._split(text, thinking=thinking, final=True)
        content, calls = self._assemble(segments)
        return Parsed(content=content.strip(), reasoning=None if reasoning is None else reasoning.strip(), tool_calls=calls)

    def stream(self, *, thinking: bool = False) -> "StreamParser":
        return StreamParser(self, thinking=thinking)


class StreamParser:
    """Feed cumulative text; get the deltas decided since the last feed.

    Incremental: each feed searches only text it has not searched before and slices only the part not
    yet turned into deltas, so a long answer costs work proportional to its length, not its square.
    ``OutputParser.parse`` is the reference; reassembled deltas equal what it returns.
    """

    def __init__(self, parser: OutputParser, *, thinking: bool):
        self.parser = parser
        self.thinking = thinking
        self._reasoning = _Trimmed()
        self._content = _Trimmed()
        self.calls: list[ToolCall] = []
        self._phase = "start"  # start (reasoning undecided) → reasoning → body
        self._pos = 0  # text before this is already in deltas (or held in a _Trimmed)
        self._searched = 0  # the tag being looked for does not start before this
        self._block: int | None = None  # where an unclosed tool-call block opens

    def feed(self, text: str, *, final: bool = False) -> list[Delta]:
        p = self.parser
        if self._phase == "start":
            if not final and _is_prefix(text, p.think_open):
                return []  # could still become the opening tag (in thinking mode too)
            if self.thinking or text.startswith(p.think_open):
                self._phase = "reasoning"
                self._pos = self._searched = len(p.think_open) if text.startswith(p.think_open) else 0
            else:
                self._phase = "body"
        deltas: list[Delta] = []
        if self._phase == "reasoning":
            at = self._find(text, p.think_close)
            if at < 0:
                end = len(text) if final else self._pos + len(hold_partial(text[self._pos:], (p.think_close,)))
                deltas += [Delta("reasoning", piece) for piece in self._reasoning.extend(text[self._pos:end], final)]
                self._pos = end
                return deltas + self._close(final)
            deltas += [Delta("reasoning", piece) for piece in self._reasoning.extend(text[self._pos:at], False)]
            self._phase = "body"
            self._pos = self._searched = at + len(p.think_close)
        return deltas + self._body(text, final) + self._close(final)

    def finish(self, text: str) -> list[Delta]:
        return self.feed(text, final=True)

    def _find(self, text: str, tag: str) -> int:
        """``tag``'s first place at or after ``_searched`` (a tag may straddle the last search's end)."""
        at = text.find(tag, self._searched)
        self._searched = max(self._searched, len(text) - len(tag) + 1) if at < 0 else at
        return at

    def _body(self, text: str, final: bool) -> list[Delta]:
        p, deltas = self.parser, []
        while True:
            if self._block is None:
                at = self._find(text, p.call_open)
                if at < 0:
                    end = len(text) if final else self._pos + len(hold_partial(text[self._pos:], (p.call_open,)))
                    deltas += self._text(text[self._pos:end])
                    self._pos = end
                    return deltas
                deltas += self._text(text[self._pos:at])
                self._block = self._pos = at
                self._searched = at + len(p.call_open)
            end = self._find(text, p.call_close)
            if end < 0:
                if final:  # an unterminated call block stays plain text
                    deltas += self._text(text[self._block:])
                    self._pos, self._block = len(text), None
                return deltas
            block = text[self._block + len(p.call_open): end]
            calls = p._calls(block)
            if calls is None:  # a malformed call block counts as text
                deltas += self._text(p.call_open + block + p.call_close)
            for call in calls or ():
                self.calls.append(call)
                deltas.append(Delta("tool_call", index=len(self.calls) - 1, call=call))
            self._pos = self._searched = end + len(p.call_close)
            self._block = None

    def _text(self, piece: str) -> list[Delta]:
        return [Delta("content", text) for text in self._content.extend(piece, False)]

    def _close(self, final: bool) -> list[Delta]:
        if final:
            self._reasoning.extend("", True)
            self._content.extend("", True)
        return []


class _Trimmed:
    """Emits a text given piece by piece without its leading and trailing whitespace, as ``str.strip``
    would: leading whitespace is dropped, trailing whitespace waits for what follows (dropped at the end)."""

    def __init__(self):
        self.started = False
        self.pending = ""  # whitespace not emitted yet: it may turn out to be trailing

    def extend(self, piece: str, final: bool) -> list[str]:
        if not self.started:
            piece = piece.lstrip()
            self.started = bool(piece)
        if not piece:
            if final:
                self.pending = ""
            return []
        text = self.pending + piece
        core = text.rstrip()
        self.pending = "" if final else text[len(core):]
        return [core] if core else []


def _is_prefix(text: str, tag: str) -> bool:
    return len(text) < len(tag) and tag.startswith(text)


def hold_partial(text: str, tags: tuple[str, ...]) -> str:
    """Drop a trailing part of ``text`` that could be the start of one of ``tags``."""
    cut = len(text)
    for tag in tags:
        for size in range(min(len(tag) - 1, len(text)), 0, -1):
            if tag.startswith(text[-size:]):
                cut = min(cut, len(text) - size)
                break
    return text[:cut]


class NanoParser(OutputParser):
    """ChatML output: ``<tool_call>`` blocks of one JSON object each."""

    call_open = "<tool_call>"
    call_close = "</tool_call>"

    def _calls(self, block: str) -> list[ToolCall] | None:
        try:
            data = json.loads(block.strip())
        except json.JSONDecodeError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return None
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return None
        return [ToolCall(name=data["name"], arguments=json.dumps(arguments, ensure_ascii=False))]


DSML = "｜DSML｜"
_INVOKE = re.compile(rf'<{DSML}invoke name="([^"]+)">(.*?)</{DSML}invoke>', re.S)
_PARAMETER = re.compile(rf'<{DSML}parameter name="([^"]+)" string="(true|false)">(.*?)</{DSML}parameter>', re.S)


class FlashParser(OutputParser):
    """DeepSeek-V4 output: one ``tool_calls`` block of ``invoke`` elements with typed parameters."""

    call_open = f"<{DSML}tool_calls>"
    call_close = f"</{DSML}tool_calls>"

    def _calls(self, block: str) -> list[ToolCall] | None:
        calls = []
        for name, body in _INVOKE.findall(block):
            arguments = {}
            for key, is_string, value in _PARAMETER.findall(body):
                if is_string == "true":
                    arguments[key] = value
                else:
                    try:
                        arguments[key] = json.loads(value)
                    except json.JSONDecodeError:
                        return None
            calls.append(ToolCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False)))
        return calls or None


def parser_for(family: str) -> OutputParser:
    """A fresh output parser of the registered model family named ``family`` (e.g. "memt-nano")."""
    return families.get(family).parser()

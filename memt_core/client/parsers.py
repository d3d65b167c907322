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
    """Feed cumulative text; get the deltas decided since the last feed."""

    def __init__(self, parser: OutputParser, *, thinking: bool):
        self.parser = parser
        self.thinking = thinking
        self._reasoning = _Trimmed()
        self._content = _Trimmed()
        self.calls: list[ToolCall] = []

    def feed(self, text: str, *, final: bool = False) -> list[Delta]:
        reasoning, segments = self.parser._split(text, thinking=self.thinking, final=final)
        deltas = [Delta("reasoning", piece) for piece in self._reasoning.extend(reasoning or "", final)]
        content, calls = self.parser._assemble(segments)
        deltas += [Delta("content", piece) for piece in self._content.extend(content, final)]
        for call in calls[len(self.calls):]:
            self.calls.append(call)
            deltas.append(Delta("tool_call", index=len(self.calls) - 1, call=call))
        return deltas

    def finish(self, text: str) -> list[Delta]:
        return self.feed(text, final=True)


class _Trimmed:
    """Emits a growing text without its leading and trailing whitespace, as ``str.strip`` would."""

    def __init__(self):
        self.sent = 0  # characters of the stripped text already emitted

    def extend(self, text: str, final: bool) -> list[str]:
        decided = text.strip() if final else text.lstrip().rstrip()  # trailing whitespace waits for what follows
        if len(decided) <= self.sent:
            return []
        piece = decided[self.sent:]
        self.sent = len(decided)
        return [piece]


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

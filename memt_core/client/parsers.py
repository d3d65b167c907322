"""Model-output parsers: reasoning, answer and tool calls, one parser per model family.

``parse(text)`` splits a complete output; ``stream()`` returns an incremental parser that is fed the
cumulative text and yields deltas. Reassembling the deltas gives exactly what ``parse`` returns (the
tests hold them to that, also on adversarial outputs). Text that could still become a tag is held back
until it is decided.

* Nano (ChatML): ``<think>…</think>`` reasoning, ``<tool_call>{"name", "arguments"}</tool_call>`` calls.
* Flash (DeepSeek-V4 style): reasoning ends at ``</think>``; calls in a ``<｜DSML｜tool_calls>`` block.

Clean outputs: markup is never content, and never reasoning either. The rules, for any output:

* A reasoning block (the output's start in thinking mode, or ``<think>`` … ``</think>`` anywhere in the
  answer) is reasoning; blocks after the first are appended to it after a blank line. An unclosed block
  runs to the end of the output.
* A call block whose body is a well-formed call is a tool call. A malformed one (not the family's call
  grammar), one opened again before it closes, or one still open at the end of the output is reported as
  its body's text without the markup (nothing when the body is empty). Text inside a call block is never
  reasoning.
* Stray tags (a ``</think>`` or ``</tool_call>`` with nothing open; Flash's ``<｜DSML｜``/``</｜DSML｜``
  markers) are removed from content and reasoning, repeatedly, so that removing one never leaves a new one
  (an answer's ``<thi</think>nk>`` leaves nothing, not ``<think>``). A fragment of a tag just before a tool call or a reasoning block is dropped.
* ``Parsed.text`` is the output as it may be committed to memory: the reasoning block it opens with and its
  well-formed calls in their own markup, the content as returned, and nothing else (no later reasoning
  block, no stray or malformed markup). It equals the output whenever the output is clean.

Each family (:mod:`memt_core.families`) names its parser class (``parser_class``); ``parser_for`` resolves it.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from memt_core import families
from memt_core.families.base import resolve


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
    text: str = ""  # the output as it may be committed (see the module's docstring); "" when not parsed from text


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
    # strings never left in content or reasoning; each starts with "<" and has no other "<", so that no two
    # overlap and removing them repeatedly has one result, whatever the order (the stream relies on it)
    markup: tuple[str, ...]

    def __init__(self, family: str):
        self.family = family  # public name of the family this parser serves

    def _calls(self, block: str) -> list[ToolCall] | None:
        """Tool calls in the text between ``call_open`` and ``call_close``; None if malformed."""
        raise NotImplementedError

    def _loose(self, block: str) -> str:
        """The text of a call block that is not a well-formed call (its markup is removed later)."""
        return block

    def parse(self, text: str, *, thinking: bool = False) -> Parsed:
        """``text``, a complete output: ``thinking`` says the prompt opened a reasoning block."""
        stream = StreamParser(self, thinking=thinking, keep=True)
        deltas = stream.finish(text)
        reasoning = "".join(d.text for d in deltas if d.kind == "reasoning")
        content = "".join(d.text for d in deltas if d.kind == "content")
        return Parsed(content=content, reasoning=reasoning if stream.reasoned else None, tool_calls=stream.calls, text="".join(stream.kept))

    def stream(self, *, thinking: bool = False) -> "StreamParser":
        return StreamParser(self, thinking=thinking)


class StreamParser:
    """Feed cumulative text; get the deltas decided since the last feed.

    Incremental: each feed searches only text it has not searched before and slices only the part not
    yet turned into deltas, so a long answer costs work proportional to its length, not its square.
    ``OutputParser.parse`` is this parser fed the whole output at once.
    """

    def __init__(self, parser: OutputParser, *, thinking: bool, keep: bool = False):
        self.parser = parser
        self.thinking = thinking
        self.calls: list[ToolCall] = []
        self.reasoned = thinking  # a reasoning block was opened (parse's reasoning is then not None)
        self.kept: list[str] = []  # with ``keep``: the pieces of ``Parsed.text``
        self._keep = keep
        self._reasoning, self._content = _Trimmed(), _Trimmed()
        self._reasoning_clean, self._content_clean = _Scrubbed(parser.markup), _Scrubbed(parser.markup)
        self._state = "think" if thinking else "text"  # text, think (inside a reasoning block), call (inside a call block)
        self._leading = thinking  # the open reasoning block is the output's first thing (kept in Parsed.text)
        self._begun = False  # the output has had more than whitespace
        self._pos = 0  # text before this is already in deltas (or held in a _Scrubbed/_Trimmed)
        self._searched = 0  # the tags being looked for do not start before this
        self._block = 0  # where the open call block's body starts

    def feed(self, text: str, *, final: bool = False) -> list[Delta]:
        p, deltas = self.parser, []
        while True:
            if self._state == "think":
                at, _ = self._find(text, (p.think_close,))
                if at < 0:
                    end = len(text) if final else self._pos + len(hold_partial(text[self._pos:], (p.think_close,)))
                    deltas += self._reason(text[self._pos:end], closed=final)
                    self._pos = end
                    break
                deltas += self._reason(text[self._pos:at], closed=True)
                if self._leading:
                    self._keep_piece(p.think_close)
                self._state, self._leading = "text", False
                self._pos = self._searched = at + len(p.think_close)
            elif self._state == "text":
                at, tag = self._find(text, (p.call_open, p.think_open))
                if at < 0:
                    end = len(text) if final else self._pos + len(hold_partial(text[self._pos:], (p.call_open, p.think_open)))
                    deltas += self._say(text[self._pos:end])
                    self._pos = end
                    break
                deltas += self._say(text[self._pos:at])
                self._pos = self._searched = at + len(tag)
                if tag == p.call_open:
                    self._state, self._block = "call", self._pos
                    continue
                deltas += self._say("", drop=True)  # a tag's fragment just before the block is dropped
                self._state, self._leading, self._begun = "think", not self._begun, True
                if self._leading:
                    self._keep_piece(p.think_open)
                if self.reasoned:  # a later block: a blank line between (dropped if nothing precedes or follows)
                    deltas += [Delta("reasoning", piece) for piece in self._reasoning.extend("\n\n", False)]
                self.reasoned = True
            else:
                at, tag = self._find(text, (p.call_close, p.call_open))
                if at < 0:
                    if not final:
                        break
                    # an unterminated call block: its text without the opening tag
                    deltas += self._say(p._loose(text[self._block:]))
                    self._state, self._pos = "text", len(text)
                    continue
                block = text[self._block:at]
                self._pos = self._searched = at + len(tag)
                if tag == p.call_open:  # opened again before it closed: the earlier block is its text
                    deltas += self._say(p._loose(block))
                    self._block = self._pos
                    continue
                self._state = "text"
                calls = p._calls(block)
                if calls is None:
                    deltas += self._say(p._loose(block))
                    continue
                deltas += self._say("", drop=True)  # a tag's fragment just before the call is dropped
                self._begun = True
                self._keep_piece(p.call_open + block + p.call_close)
                for call in calls:
                    self.calls.append(call)
                    deltas.append(Delta("tool_call", index=len(self.calls) - 1, call=call))
        if final:
            deltas += self._say("", final=True)
            self._reasoning.extend("", True)
            self._content.extend("", True)
        return deltas

    def finish(self, text: str) -> list[Delta]:
        return self.feed(text, final=True)

    def _find(self, text: str, tags: tuple[str, ...]) -> tuple[int, str]:
        """The first of ``tags`` at or after ``_searched`` as (place, tag), or (-1, "") (a tag may
        straddle the last search's end)."""
        best, found = -1, ""
        for tag in tags:
            at = text.find(tag, self._searched)
            if at >= 0 and (best < 0 or at < best):
                best, found = at, tag
        if best < 0:
            self._searched = max(self._searched, len(text) - max(map(len, tags)) + 1)
        return best, found

    def _keep_piece(self, piece: str) -> None:
        if self._keep and piece:
            self.kept.append(piece)

    def _say(self, piece: str, *, final: bool = False, drop: bool = False) -> list[Delta]:
        clean = self._content_clean.extend(piece, final=final, drop=drop)
        self._keep_piece(clean)
        self._begun = self._begun or bool(clean.strip())
        return [Delta("content", text) for text in self._content.extend(clean, False)]

    def _reason(self, piece: str, *, closed: bool) -> list[Delta]:
        clean = self._reasoning_clean.extend(piece, final=closed)
        if self._leading:
            self._keep_piece(clean)
        return [Delta("reasoning", text) for text in self._reasoning.extend(clean, False)]


class _Scrubbed:
    """A text given piece by piece with every ``markup`` string removed, repeatedly: removing one may join
    two fragments into another, which goes too. What a later piece could still join into markup is held
    back; ``final`` lets it out, ``drop`` drops it (the text is cut there).

    Every markup string has one "<", its first character, so what is held is a stack of proper prefixes
    of markup, each from a "<" on: the top one completes (and goes) or grows, or, once it can no longer
    become markup, nothing held before it can either, and all is let out. Linear in the text.
    """

    def __init__(self, markup: tuple[str, ...]):
        assert all(m.count("<") == 1 and m.startswith("<") and len(m) > 1 for m in markup)
        self.markup = set(markup)
        self.prefixes = {m[:size] for m in markup for size in range(1, len(m))}
        self.held: list[str] = []  # open prefixes, oldest first

    def extend(self, piece: str, *, final: bool = False, drop: bool = False) -> str:
        held, out = self.held, []
        for ch in piece:
            if ch == "<":
                held.append(ch)
            elif not held:
                out.append(ch)
            else:
                top = held[-1] + ch
                if top in self.markup:
                    held.pop()
                elif top in self.prefixes:
                    held[-1] = top
                else:  # the top can no longer become markup, and nothing under it can
                    held[-1] = top
                    out += held
                    held.clear()
        if final or drop:
            if not drop:
                out += held
            held.clear()
        return "".join(out)


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
    markup = ("<think>", "</think>", "<tool_call>", "</tool_call>")

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
_DSML_TAG = re.compile(rf"</?{DSML}[^<>]*>")


class FlashParser(OutputParser):
    """DeepSeek-V4 output: one ``tool_calls`` block of ``invoke`` elements with typed parameters."""

    call_open = f"<{DSML}tool_calls>"
    call_close = f"</{DSML}tool_calls>"
    markup = ("<think>", "</think>", f"<{DSML}", f"</{DSML}")  # any DSML element's tag loses its marker at least

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

    def _loose(self, block: str) -> str:
        """Its text with whole DSML tags (invoke, parameter) taken out."""
        return _DSML_TAG.sub("", block)


def parser_for(family: str) -> OutputParser:
    """A fresh output parser of the registered model family named ``family`` (e.g. "memt-nano")."""
    found = families.get(family)
    return resolve(found.parser_class)(found.name)

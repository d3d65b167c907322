"""Text of a growing list of generated tokens, decoded incrementally.

Decoding the whole output again for every new token costs O(n) per token, O(n²) per answer. The
``IncrementalDecoder`` decodes only a short window: the tokens since the last emitted text plus one
token before them, so that decoders that treat the first token specially (a leading space, a
sentencepiece ``▁``) see the same context as in a full decode. Text is emitted only once it no longer
ends in an incomplete UTF-8 sequence (``\\ufffd``), so emitted text never changes afterwards.

``decode_all`` is the reference: the whole list at once. Tests hold the two equal.
"""

from __future__ import annotations

from typing import Protocol, Sequence

REPLACEMENT = "\ufffd"


class Decodes(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


def decode_all(tokenizer: Decodes, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
    """The reference: decode every token at once."""
    return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


class IncrementalDecoder:
    """Append tokens one at a time; ``text`` is the decoded output so far (append-only)."""

    def __init__(self, tokenizer: Decodes, *, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # start of the decode window: one token before the pending ones
        self._read = 0  # tokens whose text is already in ``text``

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token: int) -> str:
        """Add one token; returns the text it completed (possibly empty while a character is incomplete)."""
        self.ids.append(token)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of generation: emit whatever is pending, incomplete characters included."""
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        if self._read == len(self.ids):
            return ""
        before = self._decode(self.ids[self._prefix:self._read]) if self._read > self._prefix else ""
        window = self._decode(self.ids[self._prefix:])
        if not final and (len(window) <= len(before) or window.endswith(REPLACEMENT)):
            return ""  # nothing printable yet, or a multi-byte character still incomplete
        delta = window[len(before):]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += delta
        return delta

"""Client strings never become control tokens: the control tokens of a prompt are exactly those its template wrote.

A chat template writes what a client sent (message contents, reasoning, tool names, descriptions, parameter
keys, enum values, tool-call arguments, tool results) between its own markers, and escapes some of it on the
way (``tojson`` turns a newline, a quote, a tab, a backslash into an escape; a Flash encoder decodes JSON
arguments), so a control string a client typed ("<|im_end|>", "<think>", an end token) cannot be found again
in the rendered text by looking for what the client sent. It is cut before the template sees it instead:

1. ``ControlGuard.guard`` copies the template's inputs with every control text in every string (keys too) cut
   after its first character by a *nonce*, a run of random digits that no escaping, case change or trimming
   alters. So is a string's end that starts a control text, and its start that ends one, which could join the
   template's own text into one ("...<|im_" + "end|>"); and JSON text with escapes (``\\u003c``), which a
   template may decode, is cut in its decoded strings.
2. The rendered text is split at the nonces: no piece holds a control text of the client's.
3. ``ControlGuard.encode`` encodes each piece. A piece whose ids hold more control tokens than the control
   texts it holds (a normalizer joining text) is encoded again around its control texts, with the text
   between them checked by id and, where needed, encoded character by character.

Text that holds no control text (nor the start or end of one at its edges) is not changed, so it renders
and encodes exactly as it would unguarded. Rules: no I/O, no state but the tokenizer's vocabulary.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from typing import Any

NONCE_DIGITS = 24


class ControlGuard:
    """The control texts of one tokenizer (its added tokens) and how to keep client text from forming one."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        added = tokenizer.get_added_vocab()  # text → id: turn markers, think and tool-call tags, end tokens
        texts = sorted(added, key=len, reverse=True)
        self.ids = frozenset(added.values())
        self.pattern = re.compile("|".join(map(re.escape, texts))) if texts else None
        self.heads = frozenset(text[:n] for text in texts for n in range(1, len(text)))  # proper starts
        self.tails = frozenset(text[n:] for text in texts for n in range(1, len(text)))  # proper ends
        self.longest = max(map(len, texts), default=0)

    # ------------------------------------------------------------------ 1. cutting the template's inputs

    def guard(self, value: Any, nonce: str) -> Any:
        """``value`` (strings, nested lists, tuples and dicts) with every string cut by ``nonce`` where it holds,
        starts or ends a control text; the same object where nothing needed a cut."""
        if isinstance(value, str):
            return self.cut(value, nonce)
        if isinstance(value, dict):
            items = [(self.guard(key, nonce), self.guard(item, nonce)) for key, item in value.items()]
            if all(new_key is key and new is item for (new_key, new), (key, item) in zip(items, value.items())):
                return value
            return dict(items)
        if isinstance(value, (list, tuple)):
            items = [self.guard(item, nonce) for item in value]
            return value if all(new is item for new, item in zip(items, value)) else type(value)(items)
        return value

    def cut(self, text: str, nonce: str) -> str:
        """``text`` with each control text cut after its first character, and an edge that could join the
        template's text into one cut off; ``text`` itself when none is there."""
        if self.pattern is None:
            return text
        cut = self._decoded(text, nonce)
        for _ in range(4):  # a cut cannot form a new control text (digits in between); bounded all the same
            found = self.pattern.search(cut)
            if found is None:
                break
            cut = self.pattern.sub(lambda match: match.group()[0] + nonce + match.group()[1:], cut)
        if any(cut[-n:] in self.heads for n in range(1, min(self.longest, len(cut) + 1))):
            cut += nonce
        if any(cut[:n] in self.tails for n in range(1, min(self.longest, len(cut) + 1))):
            cut = nonce + cut
        return text if cut == text else cut

    def _decoded(self, text: str, nonce: str) -> str:
        """JSON text with escapes, whose decoded strings hold a control text, written again from the decoded
        value with those strings cut (a template may decode it: a Flash encoder does tool-call arguments)."""
        if "\\" not in text or text.lstrip()[:1] not in ("{", "["):
            return text
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return text
        guarded = self.guard(value, nonce)
        return text if guarded is value else json.dumps(guarded, ensure_ascii=False)

    @staticmethod
    def nonce(parts) -> str:
        """A run of random digits found in none of ``parts``' strings."""
        while True:
            nonce = "".join(secrets.choice("0123456789") for _ in range(NONCE_DIGITS))
            if not any(nonce in text for text in strings(parts)):
                return nonce

    # ------------------------------------------------------------------ 2., 3. encoding the rendered text

    def encode(self, text: str, nonce: str | None = None) -> list[int]:
        """The ids of rendered ``text``, split at ``nonce`` (where client text was cut): the only control tokens
        in them are the control texts the pieces hold, i.e. the template's own."""
        pieces = text.split(nonce) if nonce else [text]
        return [i for piece in pieces for i in self._piece(piece)]

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def _piece(self, text: str) -> list[int]:
        ids = self._ids(text)
        if self.pattern is None or sum(i in self.ids for i in ids) == len(self.pattern.findall(text)):
            return ids
        ids, at = [], 0
        for match in self.pattern.finditer(text):
            ids += self.plain(text[at:match.start()]) + self._ids(match.group())
            at = match.end()
        return ids + self.plain(text[at:])

    def plain(self, text: str) -> list[int]:
        """``text`` encoded as the plain text it is: no control token, whatever it spells."""
        ids = self._ids(text)
        if not any(i in self.ids for i in ids):
            return ids
        return [i for char in text for i in self._ids(char) if i not in self.ids]

    def protect(self, render: Callable[..., str], *parts) -> list[int]:
        """The ids of ``render(*parts)``, ``parts`` being what a client wrote: steps 1 to 3 above."""
        if self.pattern is None:
            return self._ids(render(*parts))
        nonce = self.nonce(parts)
        guarded = [self.guard(part, nonce) for part in parts]
        changed = any(new is not part for new, part in zip(guarded, parts))
        return self.encode(render(*guarded), nonce if changed else None)


def strings(value) -> list[str]:
    """Every string in ``value`` (nested lists, tuples and dicts; their keys too)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in (*strings(key), *strings(item))]
    if isinstance(value, (list, tuple)):
        return [text for item in value for text in strings(item)]
    return []

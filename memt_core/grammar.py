"""Grammar-constrained decoding: JSON schema, regular expression or EBNF (GBNF, or llguidance Lark when it
starts with ``%llguidance``), compiled with llguidance.

``GrammarCompiler`` wraps one tokenizer (its llguidance view is built once, on first use); ``compile``
returns a fresh ``Grammar`` per request, the ``TokenConstraint`` the sampler applies: at every step
only tokens that keep the output inside the grammar are allowed, and once the grammar is complete
only the end-of-sequence token is. A grammar that does not compile is an ``InvalidRequest`` naming
why, raised before the request is admitted.

An answer cut by ``max_new_tokens`` would not parse, so a grammar also watches its budget: when the
tokens left barely suffice to finish (estimated at the first token, and again as the budget shrinks,
by finishing a copy of the grammar greedily; in closing, forced text takes its canonical tokens), it
allows only tokens that close what is open (quotes, brackets, separators, a tag's ``<``) or end the
output, as long as the grammar permits any; otherwise the usual mask applies. A closer that is only
more text where it stands (a quote in raw text ended by a tag, as in DSML's ``string="true"``
parameters; a ``<`` inside a JSON string) is passed over: it leaves the grammar's state as it was.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import torch

from memt_core.errors import InvalidRequest

KINDS = ("json_schema", "regex", "ebnf")
#: An ``ebnf`` source that starts with this is llguidance Lark (``%json {schema}`` rules, ``<[id]>`` tokens),
#: compiled as it is (vLLM's convention); the proxy composes tool-call grammars that way.
LARK_MARKER = "%llguidance"
CLOSING_CHARS = frozenset('"}],')
ESTIMATE_LIMIT = 1024  # an estimate of the closing cost simulates this many tokens at most


class Grammar:
    """One request's grammar state (an llguidance matcher)."""

    def __init__(self, matcher, vocab_size: int, closers: list[torch.Tensor], eos: int | None):
        self.matcher = matcher
        self.vocab_size = vocab_size  # the tokenizer's; model logits may have more rows
        self.closers = closers  # [vocab_size] bool masks of closing tokens, one per tier, tried in order
        self.eos = eos
        self._check_below: int | None = None  # re-estimate the closing cost once this few tokens are left (None: now)
        self._closing_now = False  # once the budget is tight it stays tight

    def _mask(self, matcher) -> torch.Tensor:
        bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        return torch.from_numpy(bits[: self.vocab_size].astype(bool))

    def _closing(self, matcher, mask: torch.Tensor) -> torch.Tensor:
        """Of the allowed tokens, those that finish soonest: the end, else the first tier of closers the
        grammar allows whose first token changes its state (a quote ends an open string; inside one,
        brackets are only text), else the last tier allowed, else all."""
        if self.eos is not None and self.eos < self.vocab_size and mask[self.eos]:
            only = torch.zeros_like(mask)
            only[self.eos] = True
            return only
        allowed = [closing for closing in (mask & tier for tier in self.closers) if closing.any()]
        for closing in allowed[:-1]:
            if self._moves(matcher, mask, int(closing.nonzero()[0])):
                return closing
        return allowed[-1] if allowed else mask

    def _moves(self, matcher, mask: torch.Tensor, token: int) -> bool:
        """Whether ``token`` changes what the grammar allows next (``mask`` now), or is only more of the same text."""
        after = matcher.deep_copy()
        after.consume_token(token)
        return after.is_accepting() or not torch.equal(self._mask(after), mask)

    def _steps_to_finish(self, limit: int) -> int:
        """Tokens a copy of the grammar needs to be complete when it always takes the first closing token."""
        matcher, steps = self.matcher.deep_copy(), 0
        while steps < limit and not (matcher.is_accepting() or matcher.is_stopped()):
            forced = matcher.compute_ff_tokens()  # e.g. the rest of a required key: no choice to make
            if forced:
                matcher.consume_tokens(forced)
                steps += len(forced)
                continue
            allowed = self._closing(matcher, self._mask(matcher))
            matcher.consume_token(int(allowed.nonzero()[0]))
            steps += 1
        return steps

    def allowed(self, vocab_size: int, remaining: int | None = None) -> torch.Tensor:
        mask = self._mask(self.matcher)
        if remaining is not None and not self._closing_now and (self._check_below is None or remaining <= self._check_below):
            need = self._steps_to_finish(min(remaining, ESTIMATE_LIMIT))
            if need >= remaining - 1:
                self._closing_now = True
            else:  # the cost of finishing grows slowly: look again when half the slack is spent
                self._check_below = need + (remaining - need) // 2
        if self._closing_now:
            forced = self.matcher.compute_ff_tokens()  # the estimate took these: other spellings could be longer
            if forced:
                mask = torch.zeros_like(mask)
                mask[forced[0]] = True
            else:
                mask = self._closing(self.matcher, mask)
        full = torch.zeros(vocab_size, dtype=torch.bool)
        size = min(vocab_size, self.vocab_size)
        full[:size] = mask[:size]
        return full

    def advance(self, token: int) -> None:
        self.matcher.consume_token(token)


class GrammarCompiler:
    """Compiles request grammars against one tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._llg_tokenizer = None
        self._closers: list[torch.Tensor] | None = None
        self._lock = threading.Lock()

    def _tokenizer(self):
        with self._lock:
            if self._llg_tokenizer is None:
                try:
                    import llguidance.hf
                except ImportError:  # pragma: no cover - llguidance is part of the server install
                    raise InvalidRequest("grammar-constrained decoding needs the 'llguidance' package on the server") from None
                self._llg_tokenizer = llguidance.hf.from_tokenizer(self.tokenizer)
                self._closers = self._closing_tokens(self._llg_tokenizer.vocab_size)
            return self._llg_tokenizer

    def _closing_tokens(self, size: int) -> list[torch.Tensor]:
        """Tiers of closing tokens: those that start with a quote, brackets only, any with a separator, and
        those that open a tag (text starting with ``<``; a special token too, as a tag may be one)."""
        special = set(self.tokenizer.all_special_ids)
        tiers = [torch.zeros(size, dtype=torch.bool) for _ in range(4)]
        for token in range(min(size, len(self.tokenizer))):
            text = self.tokenizer.decode([token])
            if text.startswith("<") and token != self.tokenizer.eos_token_id:
                tiers[3][token] = True
            elif token not in special and text and set(text) <= CLOSING_CHARS:
                tier = 2 if "," in text else (0 if text.startswith('"') else 1)  # a comma opens another item: last
                tiers[tier][token] = True
        return tiers

    def compile(self, kind: str, source: str) -> Grammar:
        """A fresh grammar state for one request; ``InvalidRequest`` when ``source`` does not compile."""
        import llguidance

        tokenizer = self._tokenizer()
        try:
            if kind == "json_schema":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(json.loads(source), defaults={"whitespace_flexible": False})
            elif kind == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(source)
            elif kind == "ebnf" and source.lstrip().startswith(LARK_MARKER):  # llguidance's own Lark dialect, as vLLM takes it
                grammar = llguidance.LLMatcher.grammar_from_lark(source)
            elif kind == "ebnf":
                from llguidance.gbnf_to_lark import gbnf_to_lark

                grammar = llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(source))
            else:
                raise InvalidRequest(f"unknown grammar kind {kind!r}; use one of {', '.join(KINDS)}")
            matcher = llguidance.LLMatcher(tokenizer, grammar)
        except InvalidRequest:
            raise
        except Exception as exc:  # llguidance reports grammar errors as plain exceptions
            raise InvalidRequest(f"sampling_params.{kind} does not compile: {str(exc)[:500]}") from None
        if matcher.is_error():
            raise InvalidRequest(f"sampling_params.{kind} does not compile: {matcher.get_error()[:500]}")
        return Grammar(matcher, tokenizer.vocab_size, self._closers, self.tokenizer.eos_token_id)

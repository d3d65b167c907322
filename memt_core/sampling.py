"""Sampling parameters of a generation request and the per-request sampler.

The sampler turns one step's logits into a token in a fixed order, each stage a small function:
grammar mask → logit bias → repetition / frequency / presence penalties → minimum length (end tokens
masked) → temperature → top-k → top-p → min-p → draw. Log-probabilities, when asked for, are those of
the model's own distribution (log-softmax of the raw logits), as OpenAI and SGLang report them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from memt_core.sampling_params import DEFAULT_MAX_NEW_TOKENS, SamplingParams

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "Choice", "Sampler", "SamplingParams", "TokenConstraint"]


class TokenConstraint(Protocol):
    """Which tokens may come next (e.g. a grammar); advanced with every chosen token."""

    def allowed(self, vocab_size: int, remaining: int | None = None) -> torch.Tensor:
        """A bool mask ``[vocab_size]`` of the tokens allowed next, ``remaining`` tokens of budget left."""

    def advance(self, token: int) -> None:
        """Take the chosen token."""


@dataclass
class Choice:
    """The chosen token, with its log-probability and the top alternatives when asked for."""

    token: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


@dataclass
class Sampler:
    """Picks the next token of one request; owns that request's random generator and output history."""

    params: SamplingParams
    prompt: tuple[int, ...] = ()
    end_ids: frozenset[int] = frozenset()  # tokens that end generation (masked before min_new_tokens)
    generator: torch.Generator | None = field(default=None, repr=False)
    output: list[int] = field(default_factory=list)
    last: Choice | None = None

    def __post_init__(self):
        if not self.params.greedy:
            self.generator = torch.Generator(device="cpu")
            if self.params.seed is not None:
                self.generator.manual_seed(self.params.seed)
            else:
                self.generator.seed()
        self._counts: dict[int, int] = {}

    def __call__(self, logits: torch.Tensor) -> int:
        """``logits [vocab]`` → the chosen token id (``last`` holds its log-probabilities when asked for)."""
        raw = logits.float()
        logits = self._processed(raw)
        if self.params.greedy:
            token = int(torch.argmax(logits))
        else:
            token = int(torch.multinomial(self._distribution(logits).cpu(), 1, generator=self.generator))
        self.last = self._choice(raw, token)
        self.output.append(token)
        self._counts[token] = self._counts.get(token, 0) + 1
        if self.params.constraint is not None:
            self.params.constraint.advance(token)
        return token

    @property
    def plain(self) -> bool:
        """Whether the next token is the argmax of the raw logits, with no log-probabilities to report: then an
        engine may pick it for many requests at once (one argmax over the batch, one read back) and ``take`` it."""
        p = self.params
        return (
            p.greedy and p.constraint is None and not p.logit_bias and p.repetition_penalty == 1.0
            and not p.frequency_penalty and not p.presence_penalty and not (p.logprobs or p.top_logprobs)
            and not (len(self.output) < p.min_new_tokens and self.end_ids)
        )

    def take(self, token: int) -> int:
        """Record ``token`` as chosen, where ``plain`` said it is the logits' argmax (exactly what ``__call__`` does then)."""
        self.last = Choice(token)
        self.output.append(token)
        self._counts[token] = self._counts.get(token, 0) + 1
        return token

    def _processed(self, logits: torch.Tensor) -> torch.Tensor:
        """Every stage that changes logits before temperature; a copy when anything applies."""
        p = self.params
        if p.constraint is not None:
            allowed = p.constraint.allowed(logits.shape[-1], p.max_new_tokens - len(self.output)).to(logits.device)
            logits = logits.masked_fill(~allowed, float("-inf"))
        if p.logit_bias:
            ids = torch.tensor([t for t, _ in p.logit_bias], device=logits.device)
            logits = logits.index_add(0, ids, torch.tensor([b for _, b in p.logit_bias], device=logits.device))
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(self.prompt) | self._counts.keys()), dtype=torch.long, device=logits.device)
            if seen.numel():
                picked = logits[seen]
                logits = logits.index_copy(0, seen, torch.where(picked > 0, picked / p.repetition_penalty, picked * p.repetition_penalty))
        if (p.frequency_penalty or p.presence_penalty) and self._counts:
            ids = torch.tensor(list(self._counts), dtype=torch.long, device=logits.device)
            counts = torch.tensor(list(self._counts.values()), dtype=logits.dtype, device=logits.device)
            logits = logits.index_add(0, ids, -(p.frequency_penalty * counts + p.presence_penalty))
        if len(self.output) < p.min_new_tokens and self.end_ids:
            ends = torch.tensor(sorted(self.end_ids), dtype=torch.long, device=logits.device)
            logits = logits.index_fill(0, ends[ends < logits.shape[-1]], float("-inf"))
        return logits

    def _distribution(self, logits: torch.Tensor) -> torch.Tensor:
        """Temperature, top-k, top-p and min-p over processed logits → probabilities."""
        p = self.params
        # in FP64 with the largest logit shifted to 0, so no valid temperature overflows to inf/nan
        logits = (logits.double() - logits.max()) / p.temperature
        if p.top_k > 0:
            kth = torch.topk(logits, min(p.top_k, logits.shape[-1])).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # keep the smallest prefix whose mass reaches top_p (always at least one token)
            drop = sorted_probs.cumsum(-1) - sorted_probs >= p.top_p
            drop[..., 0] = False  # (a top_p below float32's smallest value would otherwise drop them all)
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        if p.min_p > 0:
            probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
        return probs

    def _choice(self, raw: torch.Tensor, token: int) -> Choice:
        p = self.params
        if not (p.logprobs or p.top_logprobs):
            return Choice(token)
        logprobs = torch.log_softmax(raw.double(), dim=-1)
        top = None
        if p.top_logprobs:
            values, ids = torch.topk(logprobs, min(p.top_logprobs, logprobs.shape[-1]))
            top = [(int(i), float(v)) for i, v in zip(ids, values)]
        return Choice(token, float(logprobs[token]), top)


def greedy_rows(samplers: list[Sampler], logits) -> dict[int, int]:
    """The tokens of the rows whose sampler takes the logits' argmax (``Sampler.plain``), by row: one argmax over
    them all and one read back to the host, not one per row."""
    plain = [i for i, sampler in enumerate(samplers) if sampler.plain]
    if not plain:
        return {}
    picked = logits if len(plain) == len(samplers) else logits[torch.tensor(plain, device=logits.device)]
    return dict(zip(plain, picked.argmax(dim=-1).tolist()))

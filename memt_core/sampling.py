"""Sampling parameters of a generation request and the per-request sampler."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` (or ``top_k == 1``) is greedy."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no limit
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()  # in addition to the model's end-of-sequence tokens
    stop: tuple[str, ...] = ()  # stop strings, checked on decoded text by the server
    skip_eos: bool = False  # never set by requests (ignore_eos is refused); used by benchmarks

    def __post_init__(self):
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be a non-negative integer")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError("top_k must be -1 (no limit) or a positive integer")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


@dataclass
class Sampler:
    """Picks the next token of one request; owns that request's random generator."""

    params: SamplingParams
    generator: torch.Generator | None = field(default=None, repr=False)

    def __post_init__(self):
        if not self.params.greedy:
            self.generator = torch.Generator(device="cpu")
            if self.params.seed is not None:
                self.generator.manual_seed(self.params.seed)
            else:
                self.generator.seed()

    def __call__(self, logits: torch.Tensor) -> int:
        """``logits [vocab]`` → the chosen token id."""
        logits = logits.float()
        if self.params.greedy:
            return int(torch.argmax(logits))
        # in FP64 with the largest logit shifted to 0, so no valid temperature overflows to inf/nan
        logits = (logits.double() - logits.max()) / self.params.temperature
        if self.params.top_k > 0:
            kth = torch.topk(logits, min(self.params.top_k, logits.shape[-1])).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # keep the smallest prefix whose mass reaches top_p (always at least one token)
            drop = sorted_probs.cumsum(-1) - sorted_probs >= self.params.top_p
            drop[..., 0] = False  # (a top_p below float32's smallest value would otherwise drop them all)
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        return int(torch.multinomial(probs.cpu(), 1, generator=self.generator))

"""Sampling parameters: the one type a request's ``sampling_params`` are validated into (``memt_core.protocol``)
and the engine samples with (``memt_core.sampling``). No torch here: the protocol layer imports it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: tokens generated when a caller names no limit: the native client, the session API, the CLI and the proxy
DEFAULT_MAX_NEW_TOKENS = 1024


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens: the protocol's validated ``sampling_params`` and what the engine samples with.
    ``temperature == 0`` (or ``top_k == 1``) is greedy."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no limit
    min_p: float = 0.0  # drop tokens below min_p × the most likely token's probability
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()  # in addition to the model's end-of-sequence tokens
    stop: tuple[str, ...] = ()  # stop strings, checked on decoded text by the server
    frequency_penalty: float = 0.0  # minus penalty × count of the token in the output (OpenAI)
    presence_penalty: float = 0.0  # minus penalty once the token occurs in the output (OpenAI)
    repetition_penalty: float = 1.0  # logits of prompt and output tokens divided (positive) or multiplied (negative)
    min_new_tokens: int = 0  # end tokens are masked until this many tokens were generated
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    logprobs: bool = False  # report the chosen token's log-probability
    top_logprobs: int = 0  # and this many most likely alternatives
    logprob_text: bool = False  # return_text_in_logprobs: the tokens' text beside their log-probabilities
    skip_special_tokens: bool = True  # special tokens left out of the answer's text
    grammar: tuple[str, str] | None = None  # ("json_schema" | "regex" | "ebnf", source), compiled into ``constraint``
    skip_eos: bool = False  # never set by requests (ignore_eos is refused); used by benchmarks
    constraint: Any = field(default=None, compare=False)  # a TokenConstraint, one per request

    def __post_init__(self):
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be a non-negative integer")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError("top_k must be -1 (no limit) or a positive integer")
        if not 0 <= self.min_p <= 1:
            raise ValueError("min_p must be in [0, 1]")
        if not -2 <= self.frequency_penalty <= 2 or not -2 <= self.presence_penalty <= 2:
            raise ValueError("frequency_penalty and presence_penalty must be in [-2, 2]")
        if not 0 < self.repetition_penalty <= 2:
            raise ValueError("repetition_penalty must be in (0, 2]")
        if self.min_new_tokens < 0 or self.top_logprobs < 0:
            raise ValueError("min_new_tokens and top_logprobs must be non-negative")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

"""Sampler edge cases the validation accepts: they must sample, never fail inside the engine (→ 502)."""

from __future__ import annotations

import torch

from memt_core.sampling import Sampler, SamplingParams

LOGITS = torch.tensor([0.0, 3.0, 2.5, 1.0, -1.0, 2.9])


def test_tiny_temperature_behaves_as_greedy():
    for temperature in (1e-30, 1e-45, 1e-320):
        sampler = Sampler(SamplingParams(temperature=temperature, seed=1))
        assert {sampler(LOGITS) for _ in range(20)} == {1}


def test_tiny_top_p_keeps_the_most_likely_token():
    for top_p in (1e-6, 1e-45, 1e-300):
        sampler = Sampler(SamplingParams(temperature=0.7, top_p=top_p, seed=1))
        assert {sampler(LOGITS) for _ in range(20)} == {1}


def test_huge_logits_and_temperatures():
    big = torch.tensor([1e30, -1e30, 3e30])
    assert Sampler(SamplingParams(temperature=1.0, seed=0))(big) == 2
    sampler = Sampler(SamplingParams(temperature=1e300, seed=0))
    assert all(0 <= sampler(LOGITS) < len(LOGITS) for _ in range(20))

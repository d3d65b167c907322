"""SamplingParams validation and the per-request Sampler (greedy, temperature, top-k, top-p, seeds)."""

from __future__ import annotations

import pytest
import torch

from memt_core.sampling import Sampler, SamplingParams

LOGITS = torch.tensor([0.0, 3.0, 2.5, 1.0, -1.0, 2.9])  # ranks: 1, 5, 2, 3, 0, 4


def draws(params: SamplingParams, count: int = 400) -> list[int]:
    sampler = Sampler(params)
    return [sampler(LOGITS) for _ in range(count)]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"max_new_tokens": 2.0}, "max_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -2}, "top_k"),
    ],
)
def test_invalid_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_greedy_forms():
    assert SamplingParams(temperature=0).greedy and SamplingParams(top_k=1).greedy
    assert not SamplingParams().greedy
    assert set(draws(SamplingParams(temperature=0), 5)) == {1}
    assert set(draws(SamplingParams(top_k=1, temperature=2.0), 5)) == {1}
    assert Sampler(SamplingParams(temperature=0)).generator is None


def test_same_seed_same_draws_other_seed_other_draws():
    first = draws(SamplingParams(seed=7), 50)
    assert draws(SamplingParams(seed=7), 50) == first
    assert draws(SamplingParams(seed=8), 50) != first


def test_top_k_keeps_the_k_most_likely():
    assert set(draws(SamplingParams(top_k=2, temperature=5.0, seed=1))) == {1, 5}
    assert set(draws(SamplingParams(top_k=3, temperature=5.0, seed=2))) == {1, 5, 2}


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs = torch.softmax(LOGITS, -1)
    top2 = float(probs[1] + probs[5])
    # p just below the mass of the two best tokens: exactly those two remain
    assert set(draws(SamplingParams(top_p=top2 - 1e-3, seed=3))) == {1, 5}
    # a tiny p keeps only the most likely token
    assert set(draws(SamplingParams(top_p=1e-6, seed=4), 50)) == {1}


def test_temperature_sharpens():
    cold = draws(SamplingParams(temperature=0.05, seed=5))
    hot = draws(SamplingParams(temperature=1.0, seed=5))
    assert cold.count(1) > hot.count(1)
    assert len(set(hot)) >= 4

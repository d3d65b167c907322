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


# ---------------------------------------------------------------------- processors (SGLang / OpenAI sampling fields)


def test_logit_bias_moves_the_choice():
    assert Sampler(SamplingParams(temperature=0))(LOGITS) == 1
    assert Sampler(SamplingParams(temperature=0, logit_bias=((4, 10.0),)))(LOGITS) == 4
    assert Sampler(SamplingParams(temperature=0, logit_bias=((1, -100.0), (5, -100.0))))(LOGITS) == 2


def test_frequency_and_presence_penalties_count_the_output():
    sampler = Sampler(SamplingParams(temperature=0, frequency_penalty=0.3))
    # token 1 (3.0) wins until its count × 0.3 drops it below token 5 (2.9); then they alternate by count
    picks = [sampler(LOGITS) for _ in range(4)]
    assert picks[0] == 1 and picks[1] == 5 and set(picks) <= {1, 5, 2}
    sampler = Sampler(SamplingParams(temperature=0, presence_penalty=2.0))
    assert [sampler(LOGITS) for _ in range(3)] == [1, 5, 2]  # each token is penalised once it appeared
    assert Sampler(SamplingParams(temperature=0, presence_penalty=-2.0))(LOGITS) == 1


def test_repetition_penalty_covers_the_prompt_and_divides_or_multiplies():
    sampler = Sampler(SamplingParams(temperature=0, repetition_penalty=2.0), prompt=(1,))
    assert sampler(LOGITS) == 5  # 3.0 / 2 = 1.5 < 2.9
    logits = torch.tensor([-1.0, -0.5])
    sampler = Sampler(SamplingParams(temperature=0, repetition_penalty=2.0), prompt=(1,))
    assert sampler(logits) == 0  # a negative logit is multiplied: -0.5 × 2 = -1.0 ties, argmax takes the first


def test_min_new_tokens_masks_the_end_tokens():
    params = SamplingParams(temperature=0, min_new_tokens=2)
    sampler = Sampler(params, end_ids=frozenset({1}))
    assert [sampler(LOGITS) for _ in range(3)] == [5, 5, 1]


def test_min_p_drops_unlikely_tokens():
    params = SamplingParams(temperature=1.0, min_p=0.9, seed=3)
    assert set(draws(params, 200)) <= {1, 5}  # p(5)/p(1) = e^-0.1 ≈ 0.905 ≥ 0.9; token 2 (e^-0.5) is dropped


def test_logprobs_are_the_models_own_distribution():
    sampler = Sampler(SamplingParams(temperature=0, logprobs=True, top_logprobs=3, logit_bias=((4, 10.0),)))
    token = sampler(LOGITS)
    expected = torch.log_softmax(LOGITS.double(), dim=-1)
    assert token == 4 and sampler.last.token == 4
    assert sampler.last.logprob == pytest.approx(float(expected[4]))  # the raw distribution, not the biased one
    assert [t for t, _ in sampler.last.top_logprobs] == [1, 5, 2]
    assert [v for _, v in sampler.last.top_logprobs] == pytest.approx([float(expected[i]) for i in (1, 5, 2)])
    assert Sampler(SamplingParams(temperature=0)).last is None


class OnlyEven:
    """A constraint allowing even token ids only, recording what it was told."""

    def __init__(self):
        self.taken, self.budgets = [], []

    def allowed(self, vocab_size, remaining=None):
        self.budgets.append(remaining)
        return torch.arange(vocab_size) % 2 == 0

    def advance(self, token):
        self.taken.append(token)


def test_a_constraint_masks_every_step_and_sees_the_budget():
    constraint = OnlyEven()
    sampler = Sampler(SamplingParams(max_new_tokens=3, temperature=0, constraint=constraint))
    assert [sampler(LOGITS) for _ in range(3)] == [2, 2, 2]
    assert constraint.taken == [2, 2, 2] and constraint.budgets == [3, 2, 1]
    assert set(draws(SamplingParams(temperature=5.0, seed=1, constraint=OnlyEven()), 100)) <= {0, 2, 4}


@pytest.mark.parametrize("kwargs,message", [
    ({"min_p": 1.5}, "min_p"), ({"frequency_penalty": 3}, "penalty"), ({"presence_penalty": -3}, "penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"min_new_tokens": -1}, "min_new_tokens"),
])
def test_invalid_processor_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_one_default_for_max_new_tokens():
    """The native client, the session API, the CLI and the proxy share one default (issue 40: there were five)."""
    import re
    from pathlib import Path

    from memt_core.client.native import query_body
    from memt_core.sampling_params import DEFAULT_MAX_NEW_TOKENS

    root = Path(__file__).resolve().parents[1]
    defined = [str(p.relative_to(root)) for package in ("memt_core", "memt_proxy") for p in (root / package).rglob("*.py")
               if re.search(r"^DEFAULT_MAX_NEW_TOKENS\s*=", p.read_text(), re.M)]
    assert defined == ["memt_core/sampling_params.py"]
    assert SamplingParams().max_new_tokens == DEFAULT_MAX_NEW_TOKENS
    assert query_body("E", "s", "L", [1], None, False, "n")["sampling_params"]["max_new_tokens"] == DEFAULT_MAX_NEW_TOKENS

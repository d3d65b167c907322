"""The chunked gated-delta write (and FLA's kernel on GPU) against the token-by-token reference.

Seeded random grids over (H, K, V), lengths that are and are not multiples of the chunk size, with
and without an initial state and a query; outputs, final states and gradients must agree within
``TOLERANCE`` (relative to the largest reference value) in FP32.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from memt_core.memory.gated_delta import (
    CHUNK_SIZE,
    chunk_gated_delta_rule,
    gated_delta_write,
    read_memory,
    recurrent_gated_delta_rule,
)

TOLERANCE = 1e-4  # FP32, relative to the largest magnitude of the reference

HAS_CUDA = torch.cuda.is_available()
HAS_FLA = importlib.util.find_spec("fla") is not None


def assert_close(name: str, actual: torch.Tensor, expected: torch.Tensor, tol: float = TOLERANCE) -> None:
    """``max |actual − expected| ≤ tol · max |expected|`` (shapes must match exactly)."""
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert torch.isfinite(actual).all(), f"{name}: non-finite values"
    error = (actual.double() - expected.double()).abs().max().item()
    scale = max(expected.double().abs().max().item(), 1e-12)
    assert error <= tol * scale, f"{name}: max |diff| {error:.3e} > {tol:g} × max |ref| {scale:.3e} (ratio {error / scale:.2e})"


def make_inputs(batch, length, heads, key_dim, value_dim, *, seed, decay="mild", device="cpu"):
    """Inputs as a memory module makes them: unit-norm q and k, β ∈ (0, 1), log decay g ≤ 0."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(batch, length, heads, key_dim, generator=gen), dim=-1)
    k = F.normalize(torch.randn(batch, length, heads, key_dim, generator=gen), dim=-1)
    v = torch.randn(batch, length, heads, value_dim, generator=gen)
    shift = {"mild": 4.0, "strong": -2.0}[decay]  # α ≈ 0.98 on average, or α down to e^-5
    g = F.logsigmoid(torch.randn(batch, length, heads, generator=gen) + shift)
    beta = torch.sigmoid(torch.randn(batch, length, heads, generator=gen))
    state = torch.randn(batch, heads, key_dim, value_dim, generator=gen)
    return [t.to(device) for t in (q, k, v, g, beta, state)]


GEOMETRIES = [(1, 8, 8), (2, 16, 32), (3, 32, 16), (4, 64, 64)]  # (H, K, V)
C = CHUNK_SIZE
LENGTHS = [1, 5, C - 1, C, C + 1, 2 * C, 3 * C + 5]  # shorter than a chunk, equal, not and multiple


@pytest.mark.parametrize("heads,key_dim,value_dim", GEOMETRIES)
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("with_query", [True, False], ids=["q", "no-q"])
def test_chunked_equals_reference(heads, key_dim, value_dim, length, with_query):
    seed = ((heads * 101 + key_dim) * 101 + value_dim) * 1009 + length
    q, k, v, g, beta, state = make_inputs(2, length, heads, key_dim, value_dim, seed=seed)
    q = q if with_query else None
    out_ref, final_ref = recurrent_gated_delta_rule(q, k, v, g, beta, state)
    out, final = chunk_gated_delta_rule(q, k, v, g, beta, state)
    assert_close("final state", final, final_ref)
    if with_query:
        assert_close("output", out, out_ref)
    else:
        assert out is None and out_ref is None
    # the initial state is an input, never changed in place
    assert torch.equal(state, make_inputs(2, length, heads, key_dim, value_dim, seed=seed)[-1])


@pytest.mark.parametrize("chunk_size", [1, 8, 16, 64])
@pytest.mark.parametrize("length", [1, 15, 16, 47, 130])
def test_chunked_equals_reference_for_other_chunk_sizes(chunk_size, length):
    q, k, v, g, beta, state = make_inputs(1, length, 2, 16, 24, seed=1000 + 7 * length + chunk_size)
    out_ref, final_ref = recurrent_gated_delta_rule(q, k, v, g, beta, state)
    out, final = chunk_gated_delta_rule(q, k, v, g, beta, state, chunk_size=chunk_size)
    assert_close("output", out, out_ref)
    assert_close("final state", final, final_ref)


@pytest.mark.parametrize("length", [33, 200])
def test_chunked_equals_reference_with_strong_decay(length):
    """Decays down to e^-5 per token: cumulative decays underflow inside a chunk and must stay finite."""
    q, k, v, g, beta, state = make_inputs(2, length, 2, 16, 16, seed=length, decay="strong")
    assert g.min() < -4
    out_ref, final_ref = recurrent_gated_delta_rule(q, k, v, g, beta, state)
    out, final = chunk_gated_delta_rule(q, k, v, g, beta, state)
    assert_close("output", out, out_ref)
    assert_close("final state", final, final_ref)


def test_without_initial_state_starts_from_zeros():
    q, k, v, g, beta, state = make_inputs(1, 40, 2, 16, 16, seed=3)
    zeros = torch.zeros_like(state)
    out_ref, final_ref = recurrent_gated_delta_rule(q, k, v, g, beta, zeros)
    for rule in (recurrent_gated_delta_rule, chunk_gated_delta_rule):
        out, final = rule(q, k, v, g, beta, None)
        assert_close(f"{rule.__name__} output", out, out_ref)
        assert_close(f"{rule.__name__} final state", final, final_ref)


def test_empty_sequence_keeps_the_state():
    q, k, v, g, beta, state = make_inputs(2, 0, 2, 8, 8, seed=4)
    for rule in (recurrent_gated_delta_rule, chunk_gated_delta_rule):
        out, final = rule(q, k, v, g, beta, state)
        assert out.shape == (2, 0, 2, 8)
        assert torch.equal(final, state)


def test_reference_is_the_recurrence():
    """One token by hand: S₁ = α S₀ + β k (v − α S₀ᵀ k)ᵀ and o = S₁ᵀ q."""
    q, k, v, g, beta, state = make_inputs(1, 1, 1, 4, 3, seed=5)
    alpha, b = g[0, 0, 0].exp(), beta[0, 0, 0]
    s0, k1, v1, q1 = state[0, 0], k[0, 0, 0], v[0, 0, 0], q[0, 0, 0]
    expected = alpha * s0 + b * torch.outer(k1, v1 - alpha * s0.T @ k1)
    out, final = recurrent_gated_delta_rule(q, k, v, g, beta, state)
    assert_close("state", final[0, 0], expected, tol=1e-6)
    assert_close("output", out[0, 0, 0], expected.T @ q1, tol=1e-6)


def test_write_of_a_key_then_reading_it_returns_the_value():
    """With α = 1 and β = 1 a write stores v exactly under a unit key (the delta rule's fixed point)."""
    k = F.normalize(torch.randn(1, 1, 1, 8, generator=torch.Generator().manual_seed(6)), dim=-1)
    v = torch.randn(1, 1, 1, 5)
    state = torch.randn(1, 1, 8, 5)
    for rule in (recurrent_gated_delta_rule, chunk_gated_delta_rule):
        _, final = rule(None, k, v, torch.zeros(1, 1, 1), torch.ones(1, 1, 1), state)
        assert_close(rule.__name__, read_memory(k, final)[0, 0, 0], v[0, 0, 0], tol=1e-5)


def test_rejects_an_initial_state_of_the_wrong_shape():
    q, k, v, g, beta, state = make_inputs(1, 4, 2, 8, 8, seed=7)
    for rule in (recurrent_gated_delta_rule, chunk_gated_delta_rule):
        with pytest.raises(ValueError, match="initial_state has shape"):
            rule(q, k, v, g, beta, state[:, :1])


def test_bfloat16_inputs_are_computed_in_float32():
    q, k, v, g, beta, state = make_inputs(1, 40, 2, 16, 16, seed=8)
    low = [t.bfloat16() for t in (q, k, v, g, beta)]
    out_ref, final_ref = recurrent_gated_delta_rule(*[t.float() for t in low], state)
    out, final = chunk_gated_delta_rule(*low, state)
    assert out.dtype == final.dtype == torch.float32
    assert_close("output", out, out_ref)
    assert_close("final state", final, final_ref)


@pytest.mark.parametrize("length", [1, 20, 70])
@pytest.mark.parametrize("with_query", [True, False], ids=["q", "no-q"])
def test_gradients_agree(length, with_query):
    """Training backpropagates through the write: gradients w.r.t. every input agree."""
    inputs = make_inputs(2, length, 2, 16, 8, seed=100 + length)
    cotangents = torch.Generator().manual_seed(200 + length)
    out_weight = torch.randn(2, length, 2, 8, generator=cotangents)
    state_weight = torch.randn(2, 2, 16, 8, generator=cotangents)
    names = ["q", "k", "v", "g", "beta", "initial_state"]

    def gradients(rule):
        leaves = [t.clone().requires_grad_(True) for t in inputs]
        q, k, v, g, beta, state = leaves
        out, final = rule(q if with_query else None, k, v, g, beta, state)
        loss = (final * state_weight).sum()
        if with_query:
            loss = loss + (out * out_weight).sum()
        loss.backward()
        return {name: leaf.grad for name, leaf in zip(names, leaves)}

    expected, actual = gradients(recurrent_gated_delta_rule), gradients(chunk_gated_delta_rule)
    for name in names:
        if not with_query and name == "q":
            assert actual[name] is None and expected[name] is None
            continue
        assert_close(f"d/d{name}", actual[name], expected[name])


def test_read_memory_is_the_einsum_definition():
    """y[b, t, h] = S[b, h]ᵀ q[b, t, h], written out with plain matrix products."""
    gen = torch.Generator().manual_seed(9)
    q = torch.randn(2, 5, 3, 4, generator=gen)
    state = torch.randn(2, 3, 4, 6, generator=gen)
    expected = torch.empty(2, 5, 3, 6)
    for b in range(2):
        for t in range(5):
            for h in range(3):
                expected[b, t, h] = state[b, h].T @ q[b, t, h]
    y = read_memory(q, state)
    assert y.dtype == torch.float32
    assert_close("read", y, expected, tol=1e-6)
    assert_close("read of bf16 q", read_memory(q.bfloat16(), state), read_memory(q.bfloat16().float(), state), tol=0)


def test_read_of_the_final_state_is_the_last_output():
    q, k, v, g, beta, state = make_inputs(1, 9, 2, 8, 8, seed=10)
    out, final = recurrent_gated_delta_rule(q, k, v, g, beta, state)
    assert_close("last output", read_memory(q[:, -1:], final), out[:, -1:], tol=1e-6)
    assert torch.equal(read_memory(q, torch.zeros_like(state)), torch.zeros(1, 9, 2, 8))


def test_gated_delta_write_on_cpu_follows_the_reference():
    _, k, v, g, beta, state = make_inputs(1, 75, 2, 16, 16, seed=11)
    _, expected = recurrent_gated_delta_rule(None, k, v, g, beta, state)
    assert_close("write", gated_delta_write(k, v, g, beta, state), expected)
    _, from_zero = recurrent_gated_delta_rule(None, k, v, g, beta, None)
    assert_close("write from zero", gated_delta_write(k, v, g, beta), from_zero)


@pytest.mark.gpu
@pytest.mark.skipif(
    not (HAS_CUDA and HAS_FLA),
    reason=f"needs a CUDA device (found: {HAS_CUDA}) and flash-linear-attention, "
    f"`pip install fla-core` or the sglang extra (found: {HAS_FLA})",
)
@pytest.mark.parametrize("length", [1, 63, 64, 200])
@pytest.mark.parametrize("with_initial_state", [True, False], ids=["s0", "zero-s0"])
def test_fla_kernel_equals_reference(length, with_initial_state):
    from memt_core.memory import fla

    assert fla.available()
    q, k, v, g, beta, state = make_inputs(2, length, 4, 64, 64, seed=300 + length, device="cuda")
    state = state if with_initial_state else None
    out_ref, final_ref = recurrent_gated_delta_rule(q, k, v, g, beta, state)
    out, final = fla.chunk_gated_delta_rule(q, k, v, g, beta, state)
    # Triton's dot products may run in TF32 on the tensor cores: a looser bound than the CPU tests.
    assert_close("FLA output", out.float(), out_ref, tol=5e-3)
    assert_close("FLA final state", final.float(), final_ref, tol=5e-3)
    assert_close("gated_delta_write on CUDA", gated_delta_write(k, v, g, beta, state).float(), final_ref, tol=5e-3)

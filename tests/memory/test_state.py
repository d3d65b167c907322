"""MemoryState: FP32 [1, H, K, V] tensors per layer, copy-on-write forks, bit-exact equality."""

from __future__ import annotations

import pytest
import torch

from memt_core.memory.state import MemoryState


def tensor(seed: int, shape=(1, 2, 4, 3)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def test_a_new_state_is_empty():
    state = MemoryState()
    assert state.is_empty
    assert list(state.layers()) == []
    assert state.get(1) is None
    assert state.nbytes() == 0
    assert state.equal(MemoryState())


def test_set_and_get_in_layer_order():
    state = MemoryState()
    a, b = tensor(0), tensor(1)
    state.set(3, a)
    state.set(1, b)
    assert not state.is_empty
    assert list(state.layers()) == [1, 3]
    assert state.get(3) is a and state.get(1) is b
    assert state.tensors() == {1: b, 3: a}
    assert state.nbytes() == 2 * 2 * 4 * 3 * 4


@pytest.mark.parametrize(
    "bad",
    [tensor(0).double(), tensor(0).bfloat16(), tensor(0, (2, 4, 3)), tensor(0, (2, 2, 4, 3))],
    ids=["float64", "bfloat16", "3-d", "batch-2"],
)
def test_set_refuses_anything_but_fp32_single_row(bad):
    state = MemoryState()
    with pytest.raises(ValueError, match=r"FP32 \[1, H, K, V\]"):
        state.set(1, bad)
    assert state.is_empty


def test_fork_shares_until_written_and_never_disturbs_the_original():
    original = MemoryState({1: tensor(0), 3: tensor(1)})
    before = {layer: t.clone() for layer, t in original.tensors().items()}
    fork = original.fork()
    assert fork.get(1) is original.get(1)  # shared, not copied
    fork.set(1, tensor(2))
    fork.set(5, tensor(3))
    assert list(original.layers()) == [1, 3]
    assert all(torch.equal(original.get(layer), before[layer]) for layer in before)
    assert not fork.equal(original)


def test_tensors_returns_a_copy_of_the_mapping():
    state = MemoryState({1: tensor(0)})
    state.tensors()[2] = tensor(1)
    assert list(state.layers()) == [1]


def test_equal_is_bit_exact():
    a = MemoryState({1: tensor(0)})
    assert a.equal(MemoryState({1: tensor(0).clone()}))
    nudged = tensor(0).clone()
    nudged.view(-1)[0] = torch.nextafter(nudged.view(-1)[0], torch.tensor(float("inf")))
    assert not a.equal(MemoryState({1: nudged}))
    assert not a.equal(MemoryState({2: tensor(0)}))
    assert not a.equal(MemoryState())
    assert not MemoryState().equal(a)


def test_to_moves_every_tensor_into_a_new_state():
    state = MemoryState({1: tensor(0), 3: tensor(1)})
    moved = state.to("cpu")
    assert moved is not state
    assert moved.equal(state)
    assert "layers=[1, 3]" in repr(state)

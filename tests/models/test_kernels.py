"""A CPU model never reaches a CUDA-only kernel transformers bound for its backbone; its MoE experts
run transformers' grouped_mm eagerly and batched_mm inside a compiled FP32 graph.

With flash-linear-attention installed, transformers binds Qwen3.5's gated delta rule to FLA's
Triton kernel, which refuses CPU tensors (seen on a GPU host: "Pointer argument (at 0) cannot be
accessed from Triton (cpu tensor?)"). FLA needs Triton and a GPU, so here the binding is stood in by
a function that refuses CPU tensors the same way; on a GPU host tests/test_inference.py runs both.
"""

from __future__ import annotations

import functools
import inspect

import pytest
import torch
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe

from memt_core.inference import commit_tokens, memory_batch
from memt_core.memory.state import MemoryState
from memt_core.models.kernels import EXPERTS, KERNEL_FUNCTIONS, route_by_device
from memt_core.models.weights import load_model


class CudaTensor:
    """Enough of a CUDA tensor for the router to choose the kernel."""

    is_cuda = True


def cuda_only_binding(reference, calls: list[str]):
    """What transformers makes when a kernel package imports: a wrapper that always calls the kernel."""

    @functools.wraps(reference)
    def bound(*args, **kwargs):
        calls.append(reference.__name__)
        if not (args[0] if args else next(iter(kwargs.values()))).is_cuda:
            raise ValueError("Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)")
        return "kernel result"

    return bound


@pytest.fixture
def kernels_bound(monkeypatch) -> list[str]:
    """Every kernel function of the modeling module bound to a CUDA-only stand-in; returns the calls they get."""
    calls: list[str] = []
    for name in KERNEL_FUNCTIONS:
        reference = inspect.unwrap(getattr(modeling_qwen3_5_moe, name))
        monkeypatch.setattr(modeling_qwen3_5_moe, name, cuda_only_binding(reference, calls))
    return calls


def test_the_stand_in_fails_a_cpu_model_as_the_real_binding_does(kernels_bound):
    with pytest.raises(ValueError, match="cannot be accessed from Triton"):
        modeling_qwen3_5_moe.torch_chunk_gated_delta_rule(torch.zeros(1, 2, 1, 4), None, None, None, None)


def test_a_cpu_nano_model_runs_its_backbone_in_pytorch_when_kernels_are_bound(kernels_bound, nano_checkpoint, nano_model):
    model = load_model(nano_checkpoint)  # routes the module's functions by device
    ids = torch.randint(0, 500, (1, 40), generator=torch.Generator().manual_seed(0))
    memory = commit_tokens(model, MemoryState(), ids[0].tolist()).memory
    with torch.no_grad():
        logits = model(ids, memory=memory_batch(model, [memory])).logits
        expected = nano_model(ids, memory=memory_batch(nano_model, [memory])).logits
    assert torch.equal(logits, expected)
    assert kernels_bound == []  # no CPU call reached a kernel
    assert memory.equal(commit_tokens(nano_model, MemoryState(), ids[0].tolist()).memory)


def test_cuda_tensors_still_reach_the_kernel(kernels_bound):
    routed = route_by_device(modeling_qwen3_5_moe)
    assert routed == list(KERNEL_FUNCTIONS)  # transformers still defines every function we route
    assert modeling_qwen3_5_moe.torch_chunk_gated_delta_rule(CudaTensor(), None, None, None, None) == "kernel result"
    assert modeling_qwen3_5_moe.causal_conv1d_fn(hidden_states=CudaTensor(), weight=None) == "kernel result"
    assert kernels_bound == ["torch_chunk_gated_delta_rule", "causal_conv1d_fn"]


def test_routing_is_idempotent_and_keeps_the_signature(kernels_bound):
    route_by_device(modeling_qwen3_5_moe)
    once = {name: getattr(modeling_qwen3_5_moe, name) for name in KERNEL_FUNCTIONS}
    route_by_device(modeling_qwen3_5_moe)
    for name, function in once.items():
        assert getattr(modeling_qwen3_5_moe, name) is function
        assert inspect.signature(function) == inspect.signature(inspect.unwrap(function))


def test_names_a_module_lacks_are_skipped():
    class Empty:
        pass

    assert route_by_device(Empty, ("torch_chunk_gated_delta_rule",)) == []


def experts_of(model):
    return next(module for module in model.modules() if type(module).__name__.endswith("Experts"))


def routed_tokens(experts, rows: int):
    generator = torch.Generator().manual_seed(rows)
    hidden = torch.randn(rows, experts.hidden_dim, generator=generator)
    index = torch.stack([torch.randperm(experts.num_experts, generator=generator)[:2] for _ in range(rows)])
    return hidden, index, torch.rand(rows, 2, generator=generator)


def test_backbones_run_their_experts_with_the_project_implementation(nano_model, flash_model):
    for model in (nano_model, flash_model):
        assert experts_of(model).config._experts_implementation == EXPERTS


def test_eager_experts_are_transformers_grouped_mm_exactly(nano_model):
    from transformers.integrations.moe import grouped_mm_experts_forward

    experts = experts_of(nano_model)
    for rows in (1, 5):
        inputs = routed_tokens(experts, rows)
        with torch.no_grad():
            assert torch.equal(experts(*inputs), grouped_mm_experts_forward(experts, *inputs))


@pytest.mark.parametrize("implementation", [EXPERTS, "grouped_mm"])
def test_compiled_fp32_experts_leave_no_python_loop_in_the_graph(nano_checkpoint, implementation):
    """Inside a compiled graph, transformers' grouped_mm with FP32 weights calls its fallback custom op (a Python
    loop over the experts, opaque to the compiler); the project's implementation traces into plain tensor ops
    with the same result. grouped_mm is the control: it shows the check can see the loop."""
    model = load_model(nano_checkpoint)
    model.backbone.set_experts_implementation(implementation)
    experts = experts_of(model)
    graphs = []

    def recording(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    torch._dynamo.reset()
    compiled = torch.compile(experts, backend=recording, fullgraph=True)
    inputs = routed_tokens(experts, 3)
    with torch.no_grad():
        expected = experts(*inputs)
        got = compiled(*inputs)
    torch._dynamo.reset()
    targets = {str(node.target) for graph in graphs for node in graph.graph.nodes if node.op == "call_function"}
    looped = any("grouped_mm_fallback" in target for target in targets)
    assert looped == (implementation == "grouped_mm"), sorted(targets)
    torch.testing.assert_close(got, expected)

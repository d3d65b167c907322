"""Which kernels the backbone's layers call: CUDA-only ones kept away from CPU tensors, and the MoE
experts' implementation chosen for the path the model runs on.

When flash-linear-attention (the ``sglang`` extra) or causal-conv1d can be imported, transformers
binds Qwen3.5's linear-attention functions to their Triton/CUDA kernels for every call, whatever
device the model runs on, and those kernels refuse CPU tensors: a CPU model on a GPU host would
fail its first forward. ``route_by_device`` makes each such function call the kernel for CUDA
tensors and transformers' own PyTorch implementation (the function the kernel replaced) otherwise.

``EXPERTS`` names the experts implementation every backbone is built with (``experts_forward``): see there.
The families name the functions here that their backbones need (``Family.kernels``); ``build_backbone`` calls them.
"""

from __future__ import annotations

import functools
import inspect
from types import ModuleType

import torch
from transformers.integrations.moe import ExpertsInterface, batched_mm_experts_forward, grouped_mm_experts_forward

#: The functions of a Qwen3.5 modeling module that transformers may bind to a CUDA-only kernel.
KERNEL_FUNCTIONS = (
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
    "causal_conv1d_fn",
    "causal_conv1d_update",
)


def route_by_device(module: ModuleType, names: tuple[str, ...] = KERNEL_FUNCTIONS) -> list[str]:
    """Route each named function of ``module`` by the device of its first tensor; returns the names routed.

    Idempotent. A name the module does not define is skipped (and so missing from the result).
    """
    routed = []
    for name in names:
        dispatching = getattr(module, name, None)
        if dispatching is None:
            continue
        if not getattr(dispatching, "_memt_routed", False):
            reference = inspect.unwrap(dispatching)  # the PyTorch implementation the decorator wrapped
            setattr(module, name, _router(dispatching, reference))
        routed.append(name)
    return routed


def _router(dispatching, reference):
    accepted = {
        parameter.name
        for parameter in inspect.signature(reference).parameters.values()
        if parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }

    @functools.wraps(reference)
    def route(*args, **kwargs):
        first = args[0] if args else next(iter(kwargs.values()))  # the input tensor, however it is passed
        if first.is_cuda:
            return dispatching(*args, **kwargs)
        return reference(*args, **{key: value for key, value in kwargs.items() if key in accepted})

    route._memt_routed = True
    return route


def route_qwen3_5_moe(config=None) -> list[str]:
    """``route_by_device`` for transformers' Qwen3.5-MoE modeling module (a family's kernel, called with its config)."""
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe

    return route_by_device(modeling_qwen3_5_moe)


#: The experts implementation (transformers' ``experts_implementation``) the families build backbones with.
EXPERTS = "memt"


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' ``grouped_mm`` experts, except inside a ``torch.compile`` graph whose weights are not BF16
    (our CPU default is FP32): there ``grouped_mm`` falls back to a custom op, opaque to the compiler, that loops
    over the experts in Python on every call (a third of a compiled decode step of the demo model), whereas
    ``batched_mm`` (the chosen experts' weights gathered, one batched matmul) compiles into the graph."""
    if torch.compiler.is_compiling() and self.down_proj.dtype != torch.bfloat16:
        return batched_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)


def use_experts(config) -> None:
    """Make the backbone built from transformers ``config`` run its experts with ``experts_forward``."""
    ExpertsInterface.register(EXPERTS, experts_forward)
    config._experts_implementation = EXPERTS

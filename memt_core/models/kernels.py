"""Keep the backbone's CUDA-only kernels away from CPU tensors.

When flash-linear-attention (the ``sglang`` extra) or causal-conv1d can be imported, transformers
binds Qwen3.5's linear-attention functions to their Triton/CUDA kernels for every call, whatever
device the model runs on, and those kernels refuse CPU tensors: a CPU model on a GPU host would
fail its first forward. ``route_by_device`` makes each such function call the kernel for CUDA
tensors and transformers' own PyTorch implementation (the function the kernel replaced) otherwise.
"""

from __future__ import annotations

import functools
import inspect
from types import ModuleType

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

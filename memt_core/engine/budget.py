"""The serving memory budget and backends, by SGLang's flag names: what an operator may say about how much of a
device the server takes and which kernels run, checked before any weight is read.

=============================  ==========================================================================================
flag                           here
=============================  ==========================================================================================
``--max-total-tokens N``       the KV tokens all running requests may hold together: a query is admitted only when its
                               prompt and ``max_new_tokens`` fit beside the running ones' (it waits in the queue
                               otherwise), and one alone that would outgrow the whole budget stops there ("length")
``--mem-fraction-static F``    on CUDA, the share of the device's memory the server may take: with no
                               ``--max-total-tokens``, the KV budget is what F leaves after the weights and the
                               warm-up, divided by a token's KV bytes; on the CPU it has no device to measure (use
                               ``--max-total-tokens``)
``--max-queued-requests N``    queries waiting for admission; beyond, a new one is refused with 503 and ``Retry-After``
``--kv-cache-dtype``           ``auto`` (the compute dtype); ``bf16`` with ``--dtype bfloat16``; ``fp8_e4m3``: full-attention
                               keys and values in FP8 with a per-tensor scale (``memt_core.engine.fp8_kv``), eager only
``--attention-backend`` …      the kernels this engine has, by SGLang's names; any other is refused by name
``--chunked-prefill-size``     -1 only (the seed keeps chunked prefill off; commits are chunked by ``memt.chunk_tokens``)
``--disable-radix-cache``      accepted: this engine has no radix cache
``--disable-cuda-graph``       accepted (the default); refused beside ``--enable-cuda-graph``
``--kv-pool auto|dynamic|paged``  paged: the full-attention KV in one pool of blocks per layer, allocated at start for
                               the budget (``memt_core.engine.paged_kv``); auto, the default: paged wherever a KV
                               budget is given and the steps are eager in the compute dtype, else dynamic
=============================  ==========================================================================================

With a budget the sessions' memory states take slots allocated at start too (``memt_core.engine.state_slots``).

Pure: argparse and dataclasses only.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

from memt_core.errors import CheckpointError

KV_CACHE_DTYPES = ("auto", "bf16", "fp8_e4m3")
KV_POOLS = ("auto", "dynamic", "paged")
#: per backend flag: the names this engine honours, and what each runs
BACKENDS = {
    "attention_backend": {"torch_native": "transformers' SDPA attention (and the fused decode step's)"},
    "linear_attn_backend": {"torch_native": "the gated delta rule in torch (the CPU's; on CUDA without the fla package)",
                            "triton": "flash-linear-attention's Triton kernels, which the backbone and the memory write "
                                      "take on CUDA when the fla package is installed"},
    "moe_runner_backend": {"torch_native": "the experts as grouped matrix products in torch"},
    "sampling_backend": {"pytorch": "the sampler in torch"},
}


@dataclass(frozen=True)
class Budget:
    """The memory budget and backends of one server (``--max-total-tokens``, ``--mem-fraction-static``, …)."""

    max_total_tokens: int | None = None  # None: no bound beyond --max-running-requests (or from the fraction, CUDA)
    mem_fraction_static: float | None = None
    max_queued_requests: int | None = None  # None: an unbounded queue
    kv_cache_dtype: str = "auto"
    kv_pool: str = "auto"  # paged: the full-attention KV in one pool of blocks allocated at start (auto: ``paged``)
    attention_backend: str | None = None  # None: the engine's default (each flag's first name; linear attention: by device)
    linear_attn_backend: str | None = None
    moe_runner_backend: str | None = None
    sampling_backend: str | None = None
    chunked_prefill_size: int = -1
    disable_radix_cache: bool = False
    disable_cuda_graph: bool = False

    def describe(self) -> dict:
        return asdict(self)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("memory budget and backends (SGLang's flags; see docs/deployment.md)")
    group.add_argument("--max-total-tokens", type=int, default=None, metavar="N", help="KV tokens all running queries may hold together: a query is admitted when its prompt + max_new_tokens fit beside the running ones' (else it waits), and one alone that would outgrow the budget stops there with finish_reason length (default: no bound but --max-running-requests; on CUDA with --mem-fraction-static, what that fraction leaves)")
    group.add_argument("--mem-fraction-static", type=float, default=None, metavar="F", help="CUDA: the share of the device's memory the server may take (0-1]; without --max-total-tokens the KV budget is what it leaves after the weights and the warm-up. No effect on the CPU, which has no device memory to measure")
    group.add_argument("--max-queued-requests", type=int, default=None, metavar="N", help="queries that may wait for admission; a new one beyond is refused with 503 and Retry-After (default: unbounded)")
    group.add_argument("--kv-pool", default="auto", choices=KV_POOLS, help="where full-attention keys and values live: dynamic (each request's cache grows as it goes, within --max-total-tokens), paged (one pool of 16-token blocks per layer, allocated at start for the KV budget: --max-total-tokens, or on CUDA --mem-fraction-static; a request holds a block table and gives its blocks back when it ends; eager steps only, not with an FP8 cache), or auto (the default): paged wherever a KV budget is given and neither --kv-cache-dtype fp8_e4m3, --enable-cuda-graph nor --enable-torch-compile is, else dynamic")
    group.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES, help="the KV cache's dtype: auto (the compute dtype), bf16 (with --dtype bfloat16), fp8_e4m3 (full-attention keys and values stored as float8_e4m3fn with SGLang's per-tensor scale of 1.0, dequantized for attention: half BF16's bytes per token; on the CPU too; not with --enable-cuda-graph or --enable-torch-compile; its agreement with the compute dtype's cache: scripts/bench/kv_dtype.py)")
    for flag, names in BACKENDS.items():
        group.add_argument("--" + flag.replace("_", "-"), default=None, metavar="NAME",
                           help="; ".join(f"{name}: {what}" for name, what in names.items()) + " (default: the engine's; any other name is refused)")
    group.add_argument("--chunked-prefill-size", type=int, default=-1, metavar="N", help="-1 only: chunked prefill stays off, as the seed requires (commits are chunked by memt.chunk_tokens)")
    group.add_argument("--disable-radix-cache", action="store_true", help="accepted for SGLang's command lines: this engine has no radix cache")
    group.add_argument("--disable-cuda-graph", action="store_true", help="accepted for SGLang's command lines: CUDA graphs are off unless --enable-cuda-graph")


def from_args(args: argparse.Namespace) -> Budget:
    return Budget(max_total_tokens=args.max_total_tokens, mem_fraction_static=args.mem_fraction_static,
                  max_queued_requests=args.max_queued_requests, kv_cache_dtype=args.kv_cache_dtype, kv_pool=args.kv_pool,
                  chunked_prefill_size=args.chunked_prefill_size, disable_radix_cache=args.disable_radix_cache,
                  disable_cuda_graph=args.disable_cuda_graph,
                  **{flag: getattr(args, flag) for flag in BACKENDS})


def check(budget: Budget, *, dtype: str, cuda_graphs: bool, min_kv_tokens: int, torch_compile: bool = False) -> None:
    """Refuse what this engine cannot honour, one line naming the flag (``CheckpointError``)."""
    b = budget
    if b.max_total_tokens is not None:
        if b.max_total_tokens < 1:
            raise CheckpointError(f"--max-total-tokens must be at least 1, got {b.max_total_tokens}")
        if b.max_total_tokens < min_kv_tokens:
            raise CheckpointError(f"--max-total-tokens ({b.max_total_tokens}) is below the checkpoint's min_kv_tokens "
                                  f"({min_kv_tokens}): the engine must provide at least that many KV tokens")
    if b.mem_fraction_static is not None and not 0 < b.mem_fraction_static <= 1:
        raise CheckpointError(f"--mem-fraction-static must be in (0, 1], got {b.mem_fraction_static}")
    if b.max_queued_requests is not None and b.max_queued_requests < 1:
        raise CheckpointError(f"--max-queued-requests must be at least 1, got {b.max_queued_requests}")
    if b.kv_cache_dtype == "bf16" and dtype != "bfloat16":
        raise CheckpointError(f"--kv-cache-dtype bf16 keeps the KV cache in the compute dtype: use --dtype bfloat16 (got {dtype}), "
                              "or --kv-cache-dtype auto")
    if b.kv_pool == "paged":
        if b.max_total_tokens is None and b.mem_fraction_static is None:
            raise CheckpointError("--kv-pool paged allocates the KV budget at start: give --max-total-tokens (or, on CUDA, "
                                  "--mem-fraction-static)")
        if b.kv_cache_dtype == "fp8_e4m3" or cuda_graphs or torch_compile:
            raise CheckpointError("--kv-pool paged runs eager steps with the KV in the compute dtype: leave out "
                                  "--kv-cache-dtype fp8_e4m3, --enable-cuda-graph and --enable-torch-compile")
    if b.kv_cache_dtype == "fp8_e4m3" and (cuda_graphs or torch_compile):
        raise CheckpointError("--kv-cache-dtype fp8_e4m3 runs eager steps: leave out --enable-cuda-graph and --enable-torch-compile")
    for flag, names in BACKENDS.items():
        value = getattr(b, flag)
        if value is not None and value not in names:
            raise CheckpointError(f"--{flag.replace('_', '-')} {value}: this engine has {', '.join(names)} "
                                  f"({'; '.join(f'{n}: {w}' for n, w in names.items())})")
    if b.chunked_prefill_size != -1:
        raise CheckpointError(f"--chunked-prefill-size must be -1 (chunked prefill stays off, as the seed requires), got "
                              f"{b.chunked_prefill_size}")
    if b.disable_cuda_graph and cuda_graphs:
        raise CheckpointError("--disable-cuda-graph and --enable-cuda-graph contradict each other: give one")


def paged(budget: Budget, *, cuda_graphs: bool, torch_compile: bool) -> bool:
    """Whether the KV lives in the paged pool: ``--kv-pool paged``, or ``auto`` with a KV budget given, eager steps
    and the KV in the compute dtype (what the pool holds). The pool still needs the budget in tokens at start."""
    if budget.kv_pool != "auto":
        return budget.kv_pool == "paged"
    given = budget.max_total_tokens is not None or budget.mem_fraction_static is not None
    return given and budget.kv_cache_dtype != "fp8_e4m3" and not cuda_graphs and not torch_compile


def check_device(budget: Budget, device: str) -> None:
    """What only the engine's device decides, at load."""
    if budget.linear_attn_backend is not None:
        from memt_core.memory import fla

        triton = str(device).startswith("cuda") and fla.available()
        if budget.linear_attn_backend == "triton" and not triton:
            raise CheckpointError("--linear-attn-backend triton needs a CUDA device and the fla package (pip install -e '.[sglang]'); "
                                  "leave it out or use torch_native")
        if budget.linear_attn_backend == "torch_native" and triton:
            raise CheckpointError("--linear-attn-backend torch_native: on CUDA with the fla package installed the backbone takes "
                                  "its Triton kernels; leave the flag out or use triton")

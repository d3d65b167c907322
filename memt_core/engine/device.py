"""How the torch engine runs on a device: its CPU threads, and compiling a model (options, guards, one architecture
per process)."""

from __future__ import annotations

import hashlib
import os
import weakref

import torch

from memt_core.engine.base import EngineOptions
from memt_core.models.memt import MemTForCausalLM


#: The compiled step's guards leave out the model's own modules (``_compiled``): graphs compiled for one model are
#: taken for another of the same class, so a process compiles models of one architecture only (model → its
#: architecture, while the model lives). Their weights are the graphs' inputs, read at every call.
_COMPILED_ARCHITECTURES: "weakref.WeakKeyDictionary[MemTForCausalLM, str]" = weakref.WeakKeyDictionary()


def cpu_threads(options: EngineOptions) -> int | None:
    """``--torch-threads``, or when unset on the CPU: one fewer than torch's default (a thread per core), at
    least 1, leaving a core to the server's event loop, the proxy and the app. A thread pool whose worker
    waits for a busy core stalls at every op: with one other busy process on 2 cores, a demo answer took
    3.6x as long on 2 threads as on 1 (scripts/bench/demo_turn.py --busy 1). None (torch's default) on a GPU,
    or where ``OMP_NUM_THREADS`` is set (torch's default follows it)."""
    if options.threads is not None:
        return options.threads
    if options.device == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
        return max(1, torch.get_num_threads() - 1)
    return None


def inductor_options(device: torch.device) -> dict:
    """Inductor options of the compiled decode step on ``device``. On the CPU a decode step of a small model is
    mostly the cost of calling its kernels: inductor's C++ wrapper calls them from generated C++ instead of
    generated Python, a demo-model step in about 0.75x the time (scripts/bench/compile.py); elsewhere, the defaults."""
    return {"cpp_wrapper": True} if torch.device(device).type == "cpu" else {}


def architecture(model: MemTForCausalLM) -> str:
    """A digest of what a compiled graph of ``model`` takes from its modules rather than from its inputs: the
    checkpoint's identity, the configuration (with private fields such as the attention and experts
    implementations), every module's type and hooks, and the parameters' shapes, dtypes and devices."""
    parts = [model.checkpoint.identity(), repr(sorted(vars(model.config).items()))]
    parts += [f"{name} {type(module).__qualname__} {len(module._forward_hooks)} {len(module._forward_pre_hooks)}"
              for name, module in model.named_modules()]
    parts += [f"{name} {tuple(p.shape)} {p.dtype} {p.device}" for name, p in model.named_parameters()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def compile_model(options: dict, model: MemTForCausalLM, module_guards: bool):
    """``model`` compiled for the decode step and short prefills. Its guards (the checks run before every call
    that the graph still fits) leave out those on the model's modules: thousands of attribute checks that no call
    can fail (nothing changes a loaded model), which cost a compiled demo-model turn 10-30 % of its time on the CPU
    (scripts/bench/guards.py); those on the step's inputs and on global state stay. ``module_guards`` keeps them
    all (to measure them)."""
    options = dict(options)
    if not module_guards:
        options["guard_filter_fn"] = torch.compiler.skip_guard_on_all_nn_modules_unsafe
    return torch.compile(model, dynamic=True, options=options)


def claim_architecture(model: MemTForCausalLM) -> None:
    """Refuse to compile a model whose architecture differs from another compiled model's in this process
    (see ``_COMPILED_ARCHITECTURES``): their graphs would be taken for each other's."""
    mine = architecture(model)
    if any(theirs != mine for other, theirs in _COMPILED_ARCHITECTURES.items() if other is not model):
        raise RuntimeError(
            "this process already serves a compiled model of another architecture (modules, configuration or "
            "parameter shapes): torch.compile's graphs of one would be taken for the other's; compile one "
            "architecture per process (or leave out --enable-torch-compile)"
        )
    _COMPILED_ARCHITECTURES[model] = mine


def _linear_layers(config) -> int:
    """How many decoder layers are linear attention (``layer_types``; 0 where the backbone names none)."""
    return sum(kind == "linear_attention" for kind in getattr(config, "layer_types", None) or ())


def kv_token_bytes(model: MemTForCausalLM) -> int:
    """Bytes one token's keys and values take in the KV cache: every decoder layer but the linear-attention ones
    (which keep a fixed state instead, ``recurrent_state_bytes``), counted as full attention (an upper bound for
    layers that keep less, e.g. a sliding window)."""
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    size = next(model.parameters()).element_size()
    return 2 * (int(config.num_hidden_layers) - _linear_layers(config)) * int(heads) * int(head_dim) * size


def recurrent_state_bytes(model: MemTForCausalLM) -> int:
    """Bytes of one request's linear-attention states, whatever its length: per linear-attention layer the causal
    convolution's window (the compute dtype) and the gated delta rule's FP32 matrix; 0 for a backbone without."""
    config = model.config
    layers = _linear_layers(config)
    if not layers:
        return 0
    key_heads, key_dim = config.linear_num_key_heads, config.linear_key_head_dim
    value_heads, value_dim = config.linear_num_value_heads, config.linear_value_head_dim
    window = (2 * key_heads * key_dim + value_heads * value_dim) * config.linear_conv_kernel_dim
    return layers * (window * next(model.parameters()).element_size() + 4 * value_heads * key_dim * value_dim)


def memory_state_bytes(model: MemTForCausalLM) -> int:
    """Bytes of one session's memory state: every memory layer's ``[1, H, K, V]`` FP32 matrix (all heads: on a rank,
    an upper bound)."""
    heads, keys, values = model.checkpoint.memory.state_shape()[1:]
    return 4 * heads * keys * values * len(model.checkpoint.memory.memory_layers)


#: where the activation peak cannot be measured (several ranks: a forward pass needs them all), the share of what
#: the fraction leaves that is kept for activations
ACTIVATION_SHARE = 0.2


def kv_budget_tokens(fraction: float, total: int, used: int, token_bytes: int, *, activation: int | None, states: int = 0) -> int:
    """The KV tokens ``--mem-fraction-static`` allows on a device of ``total`` bytes: what the fraction leaves after
    ``used`` (the weights), the ``states`` bytes (the sessions' memory states, the running requests' recurrent
    states) and the ``activation`` peak the profile measured (None: ``ACTIVATION_SHARE`` of the rest), divided by
    one token's KV bytes."""
    free = fraction * total - used - states
    free = free * (1 - ACTIVATION_SHARE) if activation is None else free - activation
    return int(max(0.0, free) // max(token_bytes, 1))


def activation_peak(model: MemTForCausalLM, tokens: int) -> int:
    """CUDA: the most bytes beyond what is allocated now that a prompt of ``tokens`` tokens and a commit of as many
    take (the forward passes of the engine's largest served shape; the prompt's own KV excluded), measured."""
    from memt_core.engine.fp8_kv import new_cache
    from memt_core.memory.state import MemoryState
    from memt_core.models.passes import commit_batch, memory_batch

    device = next(model.parameters()).device
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    ids = torch.zeros(1, tokens, dtype=torch.long, device=device)
    with torch.no_grad():
        model(ids, memory=memory_batch(model, [None]), past_key_values=new_cache(model.config, "auto"), use_cache=True,
              logits_to_keep=1)
        commit_batch(model, [MemoryState()], [ids[0]])
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.max_memory_allocated(device) - base - tokens * kv_token_bytes(model))


#: the prompt length the activation peak is measured at, at most (``--context-length`` when shorter): prompts are
#: prefilled whole, so a longer one's activations go beyond the measured peak
PROFILE_TOKENS = 8192


def cuda_kv_budget(model: MemTForCausalLM, fraction: float | None, *, profile_tokens: int, state_slots: int,
                   rows: int, ranks: int = 1) -> int | None:
    """On CUDA with ``--mem-fraction-static``: the KV budget in tokens, sized once from the measured activation peak
    of a ``profile_tokens`` prompt (one rank; on several, whose forward passes need every rank, a fixed share),
    ``state_slots`` sessions' memory states and ``rows`` running requests' recurrent states (logged); else None."""
    device = next(model.parameters()).device
    if fraction is None or device.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    activation = activation_peak(model, profile_tokens) if ranks == 1 else None
    states = state_slots * memory_state_bytes(model) + rows * recurrent_state_bytes(model)
    weights = torch.cuda.memory_allocated(device)
    tokens = kv_budget_tokens(fraction, total, weights, kv_token_bytes(model), activation=activation, states=states)
    import logging

    logging.getLogger("memt.engine").info(
        "--mem-fraction-static %.2f of %.1f GB: weights %.2f GB, activations %s, %d memory state slots and %d "
        "requests' recurrent states %.2f GB: a KV "
        "budget of %d tokens (%d bytes each)", fraction, total / 1e9, weights / 1e9,
        f"{ACTIVATION_SHARE:.0%} of the rest (several ranks)" if activation is None
        else f"{activation / 1e9:.2f} GB (a {profile_tokens}-token prompt and commit, measured)",
        state_slots, rows, states / 1e9, tokens, kv_token_bytes(model))
    return tokens


def memory_budget(model: MemTForCausalLM, kv_tokens: int | None, kv_cache_dtype: str = "auto", pool=None, slots=None,
                  recurrent=None, retained=None) -> dict:
    """What the server may hold, in ``/memt/capabilities``: the KV budget in tokens and bytes (None: unbounded), the
    paged pool's blocks (``--kv-pool paged``), the bytes of one session's memory state (every memory layer's
    ``[1, H, K, V]`` FP32 matrix) and the slots allocated for them at start (``memt_core.engine.state_slots``;
    "as made" without a budget)."""
    per_token = kv_token_bytes(model)
    if kv_cache_dtype == "fp8_e4m3":
        per_token //= next(model.parameters()).element_size()
    return {"kv_tokens": kv_tokens, "kv_bytes_per_token": per_token, "kv_bytes": None if kv_tokens is None else kv_tokens * per_token,
            "kv_cache_dtype": kv_cache_dtype, "memory_state_bytes": memory_state_bytes(model),
            "memory_state_slots": slots.describe() if slots is not None else "as made",
            "recurrent_state_bytes": recurrent_state_bytes(model),  # one running request's linear-attention states
            "recurrent_slots": recurrent.describe() if recurrent is not None else "as made",
            "retained_slots": retained.describe() if retained is not None else "as made",
            "kv_pool": pool.describe() if pool is not None else "dynamic"}

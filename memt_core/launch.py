"""``python -m memt_core.launch``: validate a MemT checkpoint and serve it over memt-http-v1.

The model family (Nano or Flash) comes from ``config.json``; there is no model flag. ``--engine``
chooses the implementation of ``memt_core.engine.Engine`` (``torch`` for now), which checks the
engine flags it takes and refuses the ones it cannot honour. Runtime limits
merge in this order: defaults → the checkpoint's ``memt_runtime`` → ``--json-model-override-args`` →
explicit flags. ``--dry-run`` validates and prints the launch identity and the engine arguments it
would use, without loading weights. Checkpoint Python code is never executed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import socket
import sys
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from memt_core import __version__
from memt_core.bundled import BUNDLED_MODEL
from memt_core.checkpoint import Checkpoint, RuntimeConfig, parse_override_args, read_checkpoint
from memt_core.engine import ENGINES, Engine, EngineOptions, engine_class
from memt_core.errors import CheckpointError
from memt_core.help_format import DefaultsOnce
from memt_core.engine import budget
from memt_core.parallel import plan as parallel
from memt_core.tokenizer import load_tokenizer

HEADER_OVERRIDES = "SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m memt_core.launch",
        description="Serve a MemT checkpoint (Nano or Flash, identified from config.json) over the native memt-http-v1 protocol.",
        formatter_class=DefaultsOnce,
    )
    model = parser.add_argument_group("model")
    model.add_argument("--model-path", default=None, help="local checkpoint directory (config.json, BF16 safetensors, tokenizer); without it the bundled tiny demo model is served, with a warning")
    model.add_argument("--json-model-override-args", default=None, help='JSON overriding runtime limits only: {"memt_runtime": {...}}')
    model.add_argument("--trust-remote-code", action="store_true", help="refused: checkpoint Python code is never executed")
    model.add_argument("--config", default=None, help="refused: configuration merging is not supported; model structure comes from config.json")
    runtime = parser.add_argument_group("runtime limits (override memt_runtime)")
    runtime.add_argument("--max-sessions-per-rank", type=int, default=None, help="sessions this server holds at once (beyond: 429)")
    runtime.add_argument("--max-inflight-commits-per-rank", type=int, default=None, help="commits executing at once (beyond: 429)")
    runtime.add_argument("--min-kv-tokens", type=int, default=None, help="minimum KV-cache tokens the engine must provide")
    engine = parser.add_argument_group("engine")
    engine.add_argument("--engine", default="torch", choices=sorted(ENGINES), help="engine implementation (torch: CPU or one GPU, continuous batching)")
    engine.add_argument("--device", default="auto", help="'cpu', 'cuda', 'cuda:N' or 'auto' (CUDA when available)")
    engine.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float64"], help="compute dtype (auto: float32 on CPU, bfloat16 on GPU)")
    engine.add_argument("--max-prefill-tokens", type=int, default=16384, help="longest accepted input_ids list; at least memt.chunk_tokens")
    engine.add_argument("--max-running-requests", type=int, default=32, help="queries decoded concurrently (more wait in a queue)")
    engine.add_argument("--context-length", type=int, default=None, help="prompt + max_new_tokens limit (default: the model's max_position_embeddings)")
    engine.add_argument("--enable-torch-compile", action="store_true", help="compile the decode step, and the prefill of prompts of 3-256 tokens, with torch.compile (inductor; needs a C++ compiler on CPU, Triton on GPU): on CPU a demo-model turn takes 0.3-0.55x the time, its kernels called from inductor's C++ wrapper (scripts/bench/compile.py); the server compiles before it reports healthy (about a minute, longer on a busy machine; later starts reuse the compiled code from TORCHINDUCTOR_CACHE_DIR)")
    engine.add_argument("--torch-threads", type=int, default=None, metavar="N", help="CPU threads torch computes with (default on the CPU: one fewer than the cores torch would use, at least 1, leaving a core to the server's event loop, the proxy and the app: a thread pool that waits for a busy core stalls, and on 2 cores a demo-model turn takes 0.5-0.75x the time with 1 thread than with 2, scripts/bench/flags.py; on a GPU, or with OMP_NUM_THREADS set: torch's default)")
    engine.add_argument("--disable-fused-decode", action="store_true", help="decode with the model's own modules (transformers') instead of the fused decode step (memt_core/models/decode.py: the same arithmetic in fewer kernel launches; on the CPU a demo-model decode step in 0.35-0.45x the time, scripts/bench/decode_paths.py): for comparisons and diagnosis")
    engine.add_argument("--enable-cuda-graph", action="store_true", help="replay the fused decode step from CUDA graphs, captured at start for every batch-size and context bucket (1, 2, 4, … rows up to --max-running-requests; 128, 256, … tokens up to --cuda-graph-max-tokens): one launch a step instead of ~180 (Nano widths, 4 layers); costs static buffers for that many rows and tokens, the captures at start (before /health answers 200), and attention over the context bucket rather than the exact length; a batch beyond them decodes eagerly. GPU only; default off (eager steps)")
    engine.add_argument("--cuda-graph-max-tokens", type=int, default=4096, metavar="N", help="the longest batch context the CUDA graphs hold (default: %(default)s)")
    engine.add_argument("--warmup", default="auto", choices=["auto", "on", "off"], help="before /health reports ready, run a prompt's prefill and a commit at each warm-up length and a decode step at each batch size, so that no request pays a kernel's first call (Triton compiles and autotunes on a GPU): auto (default) on a GPU only, on, off")
    engine.add_argument("--warmup-lengths", type=_counts, default=None, metavar="N,N", help="the prompt and commit lengths warmed up (default: 1, 3, 7, then 16, 17, 32, 33, … up to 8192 or the context length)")
    engine.add_argument("--warmup-batch-sizes", type=_counts, default=None, metavar="N,N", help="the decode batch sizes warmed up (default: 1, 2, 4, … up to --max-running-requests)")
    engine.add_argument("--enable-streaming-session", action="store_true", help="allow sessions created with retain_kv (native context kept between queries)")
    engine.add_argument("--deterministic-communication", action="store_true", help="fixed collective settings for reproducibility: every all-reduce sums the ranks' parts in rank order, so a multi-rank engine gives the same bits for the same batch on every run (multi-rank engines only)")
    budget.add_arguments(parser)
    ranks = parser.add_argument_group("parallel serving (SGLang's flags; see docs/deployment.md)")
    ranks.add_argument("--tp-size", type=int, default=1, help="tensor-parallel ranks, one process each (CUDA: one per visible GPU; CPU: processes on this machine): attention, MLP, the gated-delta and latent-memory heads and lm_head are split over them")
    ranks.add_argument("--ep-size", type=int, default=1, help="expert-parallel ranks among the TP ranks: the routed experts are split between them (each expert's intermediate size over the rest); must divide --tp-size and the expert count")
    ranks.add_argument("--dp-size", type=int, default=1, help="data-parallel attention groups (with --enable-dp-attention): each runs attention and latent memory for its own sessions at attention TP = tp/dp")
    ranks.add_argument("--enable-dp-attention", action="store_true", help="data-parallel attention (Flash, as the seed serves it: --tp-size 8 --ep-size 8 --dp-size 8); refused for Nano")
    ranks.add_argument("--dist-backend", default="auto", choices=list(parallel.BACKENDS), help="collective backend between ranks: auto (NCCL on CUDA, gloo on the CPU), nccl or gloo")
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to bind")
    server.add_argument("--port", type=int, default=30000, help="port to bind")
    server.add_argument("--state-directory", default=None, help="server-owned snapshot directory; required for export/import")
    server.add_argument("--snapshot-store", default=None, help="directory (e.g. shared by several servers) that keeps every session's latest published memory; a session created under a name the store knows starts from it; a full server makes room for a new session by unloading the one given up longest ago instead of answering 429")
    server.add_argument("--ownership", default=None, help="redis:// URL: one owner per session among servers sharing --snapshot-store (a lease with a fencing token)")
    server.add_argument("--ownership-ttl", type=float, default=30.0, help="seconds a session's ownership lease lasts unless renewed")
    server.add_argument("--unload-idle", type=float, default=None, help="with --snapshot-store: unload a session left without a lease for this many seconds (its memory stays in the store, its ownership is given up), so that a router's new choice of server can take it over; a later request here restores it (default: 60 with --ownership, else never)")
    server.add_argument("--node-id", default=None, help="this server's name as a session owner (default: host:port)")
    server.add_argument("--ack-timeout", type=float, default=120.0, help="seconds the engine has to acknowledge a commit or start a query before the server answers 503 (the outcome is then unknown: status/recover)")
    server.add_argument("--header-timeout", type=float, default=10.0, help="seconds a client has to send a request's headers (the connection is closed after)")
    server.add_argument("--body-timeout", type=float, default=60.0, help="seconds a client has to send a request's body (408 after)")
    server.add_argument("--max-request-bytes", type=int, default=8 * 1024 * 1024, help="largest request body accepted (413 beyond)")
    server.add_argument("--api-key", default=None, help="require 'Authorization: Bearer <key>' on every route but /health")
    server.add_argument("--spec-strict", action="store_true", help="answer with only what the memt-http-v1 spec promises (no error 'code', no extension fields, spec statuses): for testing clients against the spec")
    server.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log verbosity")
    parser.add_argument("--dry-run", action="store_true", help="validate and print the launch identity and engine arguments without loading weights")
    return parser


@dataclass
class LaunchPlan:
    """Everything the launcher decided before loading weights."""

    checkpoint: Checkpoint
    runtime: RuntimeConfig
    engine: str
    device: str
    dtype: str
    max_prefill_tokens: int
    max_running_requests: int
    context_length: int
    enable_streaming_session: bool
    deterministic_communication: bool
    host: str
    port: int
    state_directory: str | None
    ack_timeout: float
    max_request_bytes: int
    header_timeout: float
    body_timeout: float
    snapshot_store: str | None
    ownership: str | None
    ownership_ttl: float
    node_id: str
    api_key: str | None
    log_level: str
    defaulted_model: bool = False  # no --model-path was given: the bundled demo model is served
    spec_strict: bool = False  # only what the spec promises on the wire (--spec-strict)
    unload_idle: float | None = None  # seconds without a lease before a durable session is unloaded
    torch_compile: bool = False  # --enable-torch-compile
    torch_threads: int | None = None  # --torch-threads
    fused_decode: bool = True  # not --disable-fused-decode
    cuda_graphs: bool = False  # --enable-cuda-graph
    cuda_graph_max_tokens: int = 4096
    warmup: str = "auto"
    warmup_lengths: tuple[int, ...] | None = None
    warmup_batch_sizes: tuple[int, ...] | None = None
    parallel: parallel.Parallel = parallel.Parallel()  # --tp-size, --ep-size, --dp-size, --enable-dp-attention, --dist-backend
    budget: budget.Budget = budget.Budget()  # --max-total-tokens, --mem-fraction-static, --kv-cache-dtype, the backends, …

    @property
    def engine_class(self) -> type[Engine]:
        return engine_class(self.engine)

    def engine_options(self) -> EngineOptions:
        return EngineOptions(
            device=self.device, dtype=self.dtype, max_running_requests=self.max_running_requests,
            max_commit_batch=self.runtime.max_inflight_commits_per_rank, context_length=self.context_length,
            min_kv_tokens=self.runtime.min_kv_tokens, max_sessions=self.runtime.max_sessions_per_rank,
            enable_streaming_session=self.enable_streaming_session,
            torch_compile=self.torch_compile, threads=self.torch_threads, fused_decode=self.fused_decode,
            cuda_graphs=self.cuda_graphs, cuda_graph_max_tokens=self.cuda_graph_max_tokens, warmup=self.warmup,
            warmup_lengths=self.warmup_lengths, warmup_batch_sizes=self.warmup_batch_sizes,
            deterministic_communication=self.deterministic_communication, state_directory=self.state_directory,
            snapshot_store=self.snapshot_store, ownership=self.ownership, ownership_ttl=self.ownership_ttl, node_id=self.node_id,
            parallel=self.parallel, budget=self.budget,
        )

    @property
    def bundled_demo(self) -> bool:
        """Whether this serves the bundled demo model because no --model-path was given."""
        return self.checkpoint.path.resolve() == BUNDLED_MODEL.resolve()

    def identity(self, engine: dict | None = None) -> dict:
        """``/memt/identity``: the spec's fields at the top (``sglang_version`` is null: no SGLang runs
        here), everything this server adds under ``extra``."""
        engine = engine or {"engine": f"memt-{self.engine}", "engine_version": __version__}
        described = self.checkpoint.describe()
        return {
            "model": described["model"],
            "config_sha256": described["config_sha256"],
            "checkpoint_id": described["checkpoint_id"],
            "sglang_version": None,
            "memt_runtime": asdict(self.runtime),
            "extra": {
                **{key: value for key, value in described.items() if key not in ("model", "config_sha256", "checkpoint_id")},
                **engine,
                "checkpoint_path": str(self.checkpoint.path),
                "bundled_demo_model": self.bundled_demo,
            },
        }

    def engine_args(self) -> dict:
        return {
            "engine": self.engine,
            "max_prefill_tokens": self.max_prefill_tokens,
            "max_sessions_per_rank": self.runtime.max_sessions_per_rank,
            "max_inflight_commits_per_rank": self.runtime.max_inflight_commits_per_rank,
            "enable_streaming_session": self.enable_streaming_session,
            "state_directory": self.state_directory,
            "host": self.host,
            "port": self.port,
            **self.engine_class.settings(self.engine_options()),
        }

    def parallel_plan(self) -> dict:
        """``--dry-run``'s parallel plan: the settings, the backend, and per rank its device, what it holds and its
        share of the weights (from the safetensors headers; none read when they cannot be)."""
        p, checkpoint = self.parallel, self.checkpoint
        described = {**p.describe(), "dist_backend": p.backend_for(self.device), "world_size": p.world}
        try:
            from memt_core.models.weights import scan_weights

            header = scan_weights(checkpoint)
        except Exception as exc:  # a dry run still prints the plan without the sizes
            return {**described, "ranks": None, "weights_unread": f"{type(exc).__name__}: {exc}"}
        split = checkpoint.family.tensor_split
        if split is None:
            return {**described, "ranks": None}
        from memt_core.families.base import resolve

        described["ranks"] = parallel.rank_shares(header, p, backbone=checkpoint.backbone, memory_heads=_memory_heads(checkpoint),
                                                  device=self.device, split_of=resolve(split))
        return described


def _counts(text: str) -> tuple[int, ...]:
    """A comma-separated list of positive counts (``--warmup-lengths 16,64,256``)."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"wants positive counts separated by commas, e.g. 16,64,256; got {text!r}")
    return values


def plan_launch(args: argparse.Namespace, environ=os.environ) -> LaunchPlan:
    """Validate arguments and the checkpoint; raises ``CheckpointError`` or ``SystemExit`` with the reason."""
    if args.trust_remote_code:
        raise CheckpointError("--trust-remote-code is refused: MemT serve never executes checkpoint Python code")
    if args.config:
        raise CheckpointError("--config merging is refused: model structure comes from the checkpoint's config.json")
    if environ.get(HEADER_OVERRIDES, "").strip().lower() not in ("", "0", "false", "no", "off"):
        raise CheckpointError(f"{HEADER_OVERRIDES} must remain disabled (it lets requests override server settings)")
    path = Path(args.model_path) if args.model_path else BUNDLED_MODEL
    if args.model_path is None and not (path / "config.json").is_file():
        raise CheckpointError(f"no --model-path given and the bundled demo model is missing at {path}")
    checkpoint = read_checkpoint(path)
    runtime = RuntimeConfig.merge(
        checkpoint.runtime,
        parse_override_args(args.json_model_override_args),
        {
            "max_sessions_per_rank": args.max_sessions_per_rank,
            "max_inflight_commits_per_rank": args.max_inflight_commits_per_rank,
            "min_kv_tokens": args.min_kv_tokens,
        },
    )
    chunk = checkpoint.memory.chunk_tokens
    if args.max_prefill_tokens < chunk:
        raise CheckpointError(f"--max-prefill-tokens ({args.max_prefill_tokens}) must be at least memt.chunk_tokens ({chunk})")
    if not args.ownership_ttl > 0:
        raise CheckpointError("--ownership-ttl must be a positive number of seconds")
    if args.max_request_bytes < 1024:
        raise CheckpointError("--max-request-bytes must be at least 1024")
    if not (args.header_timeout > 0 and args.body_timeout > 0):
        raise CheckpointError("--header-timeout and --body-timeout must be positive numbers of seconds")
    if not args.ack_timeout > 0:
        raise CheckpointError("--ack-timeout must be a positive number of seconds")
    if args.max_running_requests < 1:
        raise CheckpointError("--max-running-requests must be at least 1")
    if args.torch_threads is not None and args.torch_threads < 1:
        raise CheckpointError("--torch-threads must be at least 1")
    model_limit = int(checkpoint.backbone.get("max_position_embeddings") or 32768)
    context = args.context_length or model_limit
    if context < 1 or context > model_limit:
        raise CheckpointError(f"--context-length must be between 1 and the model's max_position_embeddings ({model_limit})")
    device = args.device
    if device == "auto":
        device = "cuda" if _cuda_available() else "cpu"
    dtype = args.dtype if args.dtype != "auto" else ("float32" if device == "cpu" else "bfloat16")
    ranks = parallel.Parallel(tp=args.tp_size, ep=args.ep_size, dp=args.dp_size, dp_attention=args.enable_dp_attention,
                              backend=args.dist_backend)
    parallel.check(ranks, backbone=checkpoint.backbone, memory_heads=_memory_heads(checkpoint), family=checkpoint.family,
                   device=device, visible_gpus=_visible_gpus() if device.startswith("cuda") and ranks.world > 1 else None,
                   deterministic_communication=args.deterministic_communication)
    limits = budget.from_args(args)
    budget.check(limits, dtype=dtype, cuda_graphs=args.enable_cuda_graph, min_kv_tokens=runtime.min_kv_tokens,
                 torch_compile=args.enable_torch_compile)
    plan = LaunchPlan(
        checkpoint=checkpoint, runtime=runtime, engine=args.engine, device=device, dtype=dtype,
        max_prefill_tokens=args.max_prefill_tokens, max_running_requests=args.max_running_requests,
        context_length=context, enable_streaming_session=args.enable_streaming_session,
        deterministic_communication=args.deterministic_communication, host=args.host, port=args.port,
        defaulted_model=args.model_path is None,
        state_directory=args.state_directory, ack_timeout=args.ack_timeout, max_request_bytes=args.max_request_bytes,
        header_timeout=args.header_timeout, body_timeout=args.body_timeout,
        snapshot_store=args.snapshot_store, ownership=args.ownership, ownership_ttl=args.ownership_ttl,
        node_id=args.node_id or f"{socket.gethostname()}:{args.port}", api_key=args.api_key, log_level=args.log_level,
        spec_strict=args.spec_strict, unload_idle=_unload_idle(args), torch_compile=args.enable_torch_compile,
        torch_threads=args.torch_threads, fused_decode=not args.disable_fused_decode,
        cuda_graphs=args.enable_cuda_graph, cuda_graph_max_tokens=args.cuda_graph_max_tokens, warmup=args.warmup,
        warmup_lengths=args.warmup_lengths, warmup_batch_sizes=args.warmup_batch_sizes, parallel=ranks, budget=limits,
    )
    plan.engine_class.check_options(plan.engine_options())
    return plan


def _memory_heads(checkpoint: Checkpoint) -> int:
    return int(checkpoint.memory.state_shape()[1])  # [1, H, K, V]


def _visible_gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count()


def _unload_idle(args: argparse.Namespace) -> float | None:
    if args.unload_idle is None:
        return 60.0 if args.ownership else None
    if args.unload_idle <= 0 or args.snapshot_store is None:
        raise CheckpointError("--unload-idle must be a positive number of seconds, and needs --snapshot-store")
    return args.unload_idle


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def build_app(plan: LaunchPlan):
    """Load the chosen engine and the tokenizer, then assemble the server around them."""
    tokenizer = None
    if (plan.checkpoint.path / "tokenizer.json").is_file():
        tokenizer = load_tokenizer(plan.checkpoint.path)
    engine = plan.engine_class.load(plan.checkpoint, plan.engine_options())
    return assemble(plan, engine, tokenizer=tokenizer)


def assemble(plan: LaunchPlan, engine: Engine, *, tokenizer=None):
    """Protocol, service and HTTP app around a loaded engine; the engine starts and stops with the app."""
    from memt_core.protocol import Limits, MemTProtocol
    from memt_core.server.app import create_app
    from memt_core.server.service import MemTService

    native = plan.checkpoint.native_encoding()["name"]
    protocol = MemTProtocol(
        epoch=uuid.uuid4().hex,
        limits=Limits(
            max_sessions=plan.runtime.max_sessions_per_rank * plan.parallel.session_ranks,  # DP attention: on each rank
            max_inflight_commits=plan.runtime.max_inflight_commits_per_rank * plan.parallel.session_ranks,
            retain_kv_enabled=plan.enable_streaming_session,
            native_encoding=native,
            durable=plan.snapshot_store is not None,
            unload_idle=plan.unload_idle,
        ),
    )
    service = MemTService(
        engine, protocol, tokenizer=tokenizer,
        max_prefill_tokens=plan.max_prefill_tokens, context_length=plan.context_length, ack_timeout=plan.ack_timeout,
        extensions=not plan.spec_strict,
    )
    capabilities = {
        "protocol": "memt-http-v1",
        "snapshot_format": "memt-memory-v1",
        "model": plan.checkpoint.model,
        "identity": plan.checkpoint.identity(),
        "native_encoding": native,
        "chunk_tokens": plan.checkpoint.memory.chunk_tokens,
        "max_prefill_tokens": plan.max_prefill_tokens,
        "max_sessions_per_rank": plan.runtime.max_sessions_per_rank,  # an extension: clients may leave others room
        "context_length": plan.context_length,
        "streaming": {"format": "sse", "text": "cumulative", "finish_reason": True, "done": "data: [DONE]"},
        "retain_kv": plan.enable_streaming_session,
        "snapshots": plan.state_directory is not None,
        "durable_memory": plan.snapshot_store is not None,
        "ownership": plan.ownership is not None,
        "auth": plan.api_key is not None,
        "engine": {"name": engine.name, **engine.capabilities()},
    }
    app = create_app(service, identity=plan.identity(engine.identity()), capabilities=capabilities, api_key=plan.api_key,
                     max_body_bytes=plan.max_request_bytes, body_timeout=plan.body_timeout, spec_strict=plan.spec_strict)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine.start()

        interval = min(5.0, plan.ownership_ttl / 4)  # ownership leases are renewed well before they lapse

        async def reaper():
            while True:
                await asyncio.sleep(interval)
                try:
                    await service.reap()
                    await engine.housekeeping()
                except Exception:  # upkeep must outlive a passing failure (e.g. the coordination service away)
                    logging.getLogger("memt_core.launch").exception("housekeeping failed")

        task = asyncio.create_task(reaper())
        try:
            yield
        finally:
            task.cancel()
            engine.stop()

    app.router.lifespan_context = lifespan
    return app, service


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        plan = plan_launch(args)
    except CheckpointError as exc:
        print(f"memt_core.launch: refused: {exc}", file=sys.stderr)
        return 2
    if plan.defaulted_model:
        print(f"memt_core.launch: WARNING: no --model-path given: using the BUNDLED TINY DEMO MODEL at {plan.checkpoint.path} "
              "(a few MB, synthetic skills only); pass --model-path CHECKPOINT to serve a real model", file=sys.stderr, flush=True)
    if plan.checkpoint.unknown_keys:
        logging.getLogger("memt_core.launch").warning(
            "config.json carries keys this version does not read (kept, unused): %s", ", ".join(plan.checkpoint.unknown_keys)
        )
    if args.dry_run:
        report = {"launch_identity": plan.identity(), "engine_args": plan.engine_args(), "parallel": plan.parallel_plan(),
                  "unknown_config_keys": plan.checkpoint.unknown_keys}
        print(json.dumps(report, indent=2))
        return 0
    import uvicorn

    try:
        sock = bind(plan.host, plan.port)  # before loading the model, so a taken port fails at once
    except OSError as exc:
        print(f"memt_core.launch: refused: cannot listen on {plan.host}:{plan.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        app, _ = build_app(plan)
    except CheckpointError as exc:  # what only loading can tell (e.g. an engine that cannot run these settings)
        sock.close()
        print(f"memt_core.launch: refused: {exc}", file=sys.stderr)
        return 2
    print(f"memt_core: serving {plan.checkpoint.served_name} (a {plan.checkpoint.model} checkpoint) from {plan.checkpoint.path} "
          f"on http://{plan.host}:{plan.port}", flush=True)
    # what start-up made (torch, transformers, the model) is not traversed again by the garbage collector: a
    # request that makes 100,000s of objects (a 3 MB JSON body) then pauses the event loop ~0.03 s, not ~0.14 s
    gc.freeze()
    from memt_core.server.slow_clients import header_timeout_protocol

    config = uvicorn.Config(app, host=plan.host, port=plan.port, log_level=plan.log_level, timeout_graceful_shutdown=5,
                            http=header_timeout_protocol(plan.header_timeout))
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on ``host``:``port`` (``OSError`` when the address is taken or invalid)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Time the torch engine: commit vs plain prefill, and batched decode with many sessions vs one.

Both measurements run through ``TorchEngine`` itself (its worker thread, its batching) in one run,
side by side, after a warm-up, as medians of interleaved repetitions:

(a) commit throughput — tokens/s of ``engine.commit`` (one forward pass reading the session's memory,
    collecting the write inputs, then the gated-delta write events) against plain prefill — tokens/s
    of a query over the same tokens and memory that stops after its first token (the same forward
    pass, no write). Target: commit ≥ 0.8× prefill.
(b) decode throughput — aggregate generated tokens/s while 16 sessions (each with its own memory)
    decode at once, against one session alone; counted from the moment every request has its first
    token until the last finishes, so prefill is excluded. Target: ≥ 4×.

Without ``--model-path`` a tiny random Nano checkpoint is written to a temporary directory (its
``chunk_tokens`` set by ``--chunk-tokens``, 2048 like the released models).

    PYTHONPATH=. python scripts/bench/engine.py
    PYTHONPATH=. python scripts/bench/engine.py --device cuda --commit-tokens 2048,8192 --sessions 16
    PYTHONPATH=. python scripts/bench/engine.py --model-path /models/MemT-1.0-Nano --device cuda --dtype bfloat16
    PYTHONPATH=. python scripts/bench/engine.py --model-path /tmp/nano-widths --device cuda --decode-modes eager,cuda-graph

``--decode-modes`` measures (b) once per decode path, each an engine of its own on the same weights: ``eager`` (the
engine's default: the fused decode step where the family has one), ``reference`` (the model's own modules,
``--disable-fused-decode``) and ``cuda-graph`` (``--enable-cuda-graph``; GPU only). With a GPU the table also gives
one session's decode rate as a fraction of the bandwidth bound (the bytes of the weights one token reads, in the
compute dtype, against ``--bandwidth`` GB/s: 4,800 for an H200).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from memt_core import families
from memt_core.engine import TorchEngine
from memt_core.protocol import effects as fx
from memt_core.sampling import SamplingParams

COMMIT_TARGET = 0.8
DECODE_TARGET = 4.0


def counts(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part]
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError("wants positive token counts, e.g. 512,2048")
    return values


def tokens(n: int, seed: int, vocab: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (n,), generator=generator).tolist()


class Bench:
    def __init__(self, engine: TorchEngine, device: torch.device, vocab: int):
        self.engine, self.device, self.vocab = engine, device, vocab
        self.serial = 0

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def rid(self) -> str:
        self.serial += 1
        return f"bench-{self.serial}"

    async def session(self, name: str, memory_tokens: int, seed: int) -> None:
        """A session with published memory (one commit of ``memory_tokens``) and an open candidate."""
        await self.engine.apply(fx.NewMemory(name))
        await self.engine.apply(fx.ForkCandidate(name, transaction="setup"))
        await self.engine.commit(name, "setup", "setup", tokens(memory_tokens, seed, self.vocab))
        await self.engine.apply(fx.PublishCandidate(name, transaction="setup"))
        await self.engine.apply(fx.ForkCandidate(name, transaction="bench"))

    async def commit(self, session: str, ids: list[int]) -> float:
        start = time.perf_counter()
        await self.engine.commit(session, "bench", self.rid(), ids)
        self.sync()
        return time.perf_counter() - start

    async def prefill(self, session: str, ids: list[int]) -> float:
        start = time.perf_counter()
        async for event in self.engine.query(self.rid(), ids, SamplingParams(max_new_tokens=1, temperature=0, skip_eos=True), session=session):
            if event.error is not None:
                raise event.error
        self.sync()
        return time.perf_counter() - start

    async def decode(self, sessions: list[str], prompt: list[int], new_tokens: int) -> tuple[float, float, int]:
        """Run one query per session at once; returns (decode tokens/s, end-to-end tokens/s, tokens)."""
        params = SamplingParams(max_new_tokens=new_tokens, temperature=0, skip_eos=True)
        arrivals: list[list[float]] = [[] for _ in sessions]
        start = time.perf_counter()

        async def run(i: int, session: str) -> None:
            async for event in self.engine.query(self.rid(), prompt, params, session=session):
                if event.error is not None:
                    raise event.error
                if event.token is not None:
                    arrivals[i].append(time.perf_counter())

        await asyncio.gather(*(run(i, s) for i, s in enumerate(sessions)))
        end = max(times[-1] for times in arrivals)
        decode_from = max(times[0] for times in arrivals)  # every request is past its prefill
        decoded = sum(1 for times in arrivals for t in times if t > decode_from)
        total = sum(len(times) for times in arrivals)
        return decoded / max(end - decode_from, 1e-9), total / (end - start), total


def active_bytes(model) -> float:
    """Bytes of the weights one token's decode reads: every parameter but the routed experts, and of those the
    share a token is routed to (top-k of the experts), in the model's dtype."""
    config = model.config
    experts, top_k = getattr(config, "num_experts", None), getattr(config, "num_experts_per_tok", None)
    total = 0.0
    for name, param in model.named_parameters():
        size = param.numel() * param.element_size()
        if experts and top_k and ".experts." in name:
            size *= top_k / experts
        if "embed_tokens" in name:
            size = param.shape[-1] * param.element_size()  # one row is read
        total += size
    return total


def median_interleaved(runs: dict, repeats: int, warmup: int, loop) -> dict[str, float]:
    """Median seconds of each run; repetitions interleave the runs so a busy machine slows all alike."""
    for _ in range(warmup):
        for run in runs.values():
            loop.run_until_complete(run())
    times: dict[str, list] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(loop.run_until_complete(run()))
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None, help="checkpoint directory (default: a tiny random Nano made in a temp dir)")
    parser.add_argument("--family", choices=families.names(), default=families.DEFAULT, help="family of the tiny checkpoint")
    parser.add_argument("--chunk-tokens", type=int, default=2048, help="memt.chunk_tokens of the tiny checkpoint (default 2048)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto", help="auto: float32 on CPU, bfloat16 on GPU")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--commit-tokens", type=counts, default=[512, 2048], metavar="N,N", help="commit/prefill lengths (default 512,2048)")
    parser.add_argument("--memory-tokens", type=int, default=256, help="tokens committed to each session's memory first")
    parser.add_argument("--sessions", type=int, default=16, help="concurrent sessions of the decode measurement (default 16)")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="prompt length of the decode measurement")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per request in the decode measurement")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions, median taken (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    parser.add_argument("--decode-modes", default="eager", help="decode paths measured in (b): eager, reference, cuda-graph (comma-separated)")
    parser.add_argument("--cuda-graph-max-tokens", type=int, default=1024, help="context the CUDA graphs hold (default 1024)")
    parser.add_argument("--bandwidth", type=float, default=4800.0, help="GB/s of the GPU's memory, for the bandwidth bound (default 4800: H200)")
    args = parser.parse_args()
    modes = [mode for mode in args.decode_modes.split(",") if mode]
    unknown = set(modes) - {"eager", "reference", "cuda-graph"}
    if unknown or not modes:
        parser.error(f"--decode-modes takes eager, reference, cuda-graph; got {args.decode_modes!r}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    dtype = {"auto": torch.float32 if device.type == "cpu" else torch.bfloat16, "float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]

    from memt_core.models.weights import load_model

    with tempfile.TemporaryDirectory(prefix="memt-bench-") as scratch:
        if args.model_path is None:
            from memt_core.tiny import make_tiny_checkpoint

            path = make_tiny_checkpoint(Path(scratch) / "tiny", args.family, chunk_tokens=args.chunk_tokens)
            source = f"tiny random {args.family} (chunk_tokens {args.chunk_tokens})"
        else:
            path, source = Path(args.model_path), args.model_path
        model = load_model(path, device=device, dtype=dtype)
        vocab = model.config.vocab_size
        sessions = [f"s{i}" for i in range(max(args.sessions, 1))]
        engines = {}
        for mode in modes:
            engines[mode] = TorchEngine(
                model, max_running_requests=max(args.sessions, 1), max_commit_batch=1, fused_decode=mode != "reference",
                cuda_graphs=mode == "cuda-graph", cuda_graph_max_tokens=args.cuda_graph_max_tokens,
            ).start()
        engine = engines[modes[0]]
        bench = Bench(engine, device, vocab)
        loop = asyncio.new_event_loop()
        try:
            print(
                f"torch engine on {device} ({dtype}, {torch.get_num_threads()} CPU thread(s)), model: {source}, "
                f"memory layers {list(model.memory_layers)}, chunk_tokens {model.checkpoint.memory.chunk_tokens}; "
                f"median of {args.repeats} interleaved runs after {args.warmup} warm-up; torch {torch.__version__}"
                + (f"; {torch.cuda.get_device_name(device)}" if device.type == "cuda" else "")
            )
            for mode_engine in engines.values():
                bench.engine = mode_engine
                for i, name in enumerate(sessions):
                    loop.run_until_complete(bench.session(name, args.memory_tokens, seed=1000 + i))
            bench.engine = engine

            print(f"\n(a) commit (forward + memory write) vs plain prefill (the same forward, no write; {modes[0]} engine)")
            header = f"{'tokens':>7}  {'commit tok/s':>13}  {'prefill tok/s':>14}  {'commit/prefill':>14}"
            print(header)
            print("-" * len(header))
            ratios = {}
            for n in args.commit_tokens:
                ids = tokens(n, seed=n, vocab=vocab)
                timed = median_interleaved(
                    {"commit": lambda: bench.commit("s0", ids), "prefill": lambda: bench.prefill("s0", ids)},
                    args.repeats, args.warmup, loop,
                )
                commit_rate, prefill_rate = n / timed["commit"], n / timed["prefill"]
                ratios[n] = commit_rate / prefill_rate
                print(f"{n:>7}  {commit_rate:>13,.0f}  {prefill_rate:>14,.0f}  {ratios[n]:>13.2f}×", flush=True)

            active = active_bytes(model)
            bound = args.bandwidth * 1e9 / active if device.type == "cuda" else None
            print(f"\n(b) decode: {len(sessions)} concurrent sessions vs 1 (prompt {args.prompt_tokens}, {args.new_tokens} new tokens each, greedy)"
                  + (f"; one token reads {active / 1e9:.2f} GB of weights: bandwidth bound {bound:,.0f} tok/s for one session at "
                     f"{args.bandwidth:,.0f} GB/s" if bound else ""))
            prompt = tokens(args.prompt_tokens, seed=7, vocab=vocab)
            header = f"{'decode path':>12}  {'':>24}  {'1 session':>10}  {f'{len(sessions)} sessions':>12}  {'ratio':>7}" + (f"  {'1 session/bound':>15}" if bound else "")
            print(header)
            print("-" * len(header))
            decode_ratio = None
            for mode, mode_engine in engines.items():
                bench.engine = mode_engine
                results: dict[str, list] = {"one": [], "many": []}
                for _ in range(args.warmup):
                    loop.run_until_complete(bench.decode(sessions[:1], prompt, args.new_tokens))
                    loop.run_until_complete(bench.decode(sessions, prompt, args.new_tokens))
                for _ in range(args.repeats):
                    results["one"].append(loop.run_until_complete(bench.decode(sessions[:1], prompt, args.new_tokens)))
                    results["many"].append(loop.run_until_complete(bench.decode(sessions, prompt, args.new_tokens)))
                one_decode = statistics.median(r[0] for r in results["one"])
                many_decode = statistics.median(r[0] for r in results["many"])
                one_e2e = statistics.median(r[1] for r in results["one"])
                many_e2e = statistics.median(r[1] for r in results["many"])
                ratio = many_decode / one_decode
                decode_ratio = ratio if decode_ratio is None else decode_ratio
                fraction = f"  {one_decode / bound:>14.1%}" if bound else ""
                print(f"{mode:>12}  {'decode tok/s (aggregate)':>24}  {one_decode:>10,.0f}  {many_decode:>12,.0f}  {ratio:>6.2f}×{fraction}")
                print(f"{'':>12}  {'end-to-end tok/s':>24}  {one_e2e:>10,.0f}  {many_e2e:>12,.0f}  {many_e2e / one_e2e:>6.2f}×", flush=True)
                stats = mode_engine.stats
                graphs = mode_engine.runner.graphs
                print(f"{'':>12}  engine: {stats.decode_steps} decode steps for {stats.decode_rows} rows (mean batch "
                      f"{stats.decode_rows / max(stats.decode_steps, 1):.1f})" + (f"; CUDA graphs {graphs.stats}" if graphs else ""))
        finally:
            for mode_engine in engines.values():
                mode_engine.stop()
            loop.close()

    print()
    worst = min(ratios, key=ratios.get)
    print(f"target (a): commit ≥ {COMMIT_TARGET:g}× plain prefill throughput: "
          f"{'met' if ratios[worst] >= COMMIT_TARGET else 'NOT met'} (lowest {ratios[worst]:.2f}× at {worst} tokens)")
    if len(sessions) == 16:
        print(f"target (b): 16 sessions ≥ {DECODE_TARGET:g}× the aggregate decode tokens/s of 1: "
              f"{'met' if decode_ratio >= DECODE_TARGET else 'NOT met'} (measured {decode_ratio:.2f}×)")
    else:
        print(f"target (b): defined for 16 sessions; measured {decode_ratio:.2f}× with {len(sessions)} (not comparable)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

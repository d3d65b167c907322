"""One rank of the equality tests, run as its own process: ``python tests/parallel/rank_worker.py RANK WORLD ADDRESS
CHECKPOINT OUT [--ep N] [--deterministic] [--dp-attention]``.

Every rank builds its share of the model (``memt_core.parallel.shard``), joins the gloo group and runs the same
work: a commit into empty memory (each rank writes its own heads), a query's logits reading that memory, and a
greedy generation of ``TOKENS`` tokens reading it. Rank 0 saves what it saw, the memory's heads gathered from every
rank, to ``OUT`` (torch.save) for the test to compare with one device.

With ``--dp-attention`` each rank runs its own sessions' work, whole, as under DP attention: rank r runs
``WORK[r % len(WORK)]`` (rank 1 a shorter turn and prompt, so the ranks' forward passes do not line up), then joins
idle rounds until every rank is done; each rank saves what it saw to ``OUT.rank<r>``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TURN = list(range(20, 60))
PROMPT = [17, 42, 99, 123, 5, 6]
TOKENS = 8
#: (turn, prompt, tokens) of each rank under DP attention
WORK = [(TURN, PROMPT, TOKENS), (list(range(70, 83)), [9, 8, 7], 3)]


def run(model, group=None, turn=TURN, prompt=PROMPT, tokens=TOKENS) -> dict:
    """The work every rank does (and one device does alone), and what rank 0 reports."""
    from transformers import DynamicCache

    from memt_core.memory.state import MemoryState
    from memt_core.models.passes import commit_batch, memory_batch

    with torch.no_grad():
        memory = commit_batch(model, [MemoryState()], [turn])[0].memory
        read = memory_batch(model, [memory])
        logits = model(torch.tensor([prompt]), memory=read).logits[0]
        cache = DynamicCache(config=model.config)
        out = model(torch.tensor([prompt]), memory=read, past_key_values=cache, use_cache=True, logits_to_keep=1)
        count, tokens = tokens, [int(out.logits[0, -1].argmax())]
        for _ in range(count - 1):
            out = model(torch.tensor([[tokens[-1]]]), memory=read, past_key_values=out.past_key_values, use_cache=True,
                        logits_to_keep=1)
            tokens.append(int(out.logits[0, -1].argmax()))
    states = {layer: memory.get(layer) for layer in memory.layers()}
    if group is not None:
        states = {layer: group.gather_dim(state, 1) for layer, state in states.items()}  # [1, H/tp, K, V] → [1, H, K, V]
    return {"memory": states, "logits": logits, "tokens": tokens}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("rank", type=int)
    parser.add_argument("world", type=int)
    parser.add_argument("address")
    parser.add_argument("checkpoint")
    parser.add_argument("out")
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--deterministic", action="store_true", help="sums in rank order (--deterministic-communication)")
    parser.add_argument("--dp-attention", action="store_true", help="each rank its own work, attention whole (TP = EP = DP = WORLD)")
    parser.add_argument("--idle", type=float, default=None,
                        help="no model: with a --timeout bound on collectives, rank 0 idles this long, then calls the others")
    parser.add_argument("--timeout", type=float, default=60.0, help="the group's bound on the meeting and a step's collectives")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from memt_core.checkpoint import read_checkpoint
    from memt_core.parallel.group import RankGroup
    from memt_core.parallel.plan import Parallel
    from memt_core.parallel.shard import build_rank_model

    with RankGroup.joined(args.rank, args.world, backend="gloo", address=args.address, deterministic=args.deterministic,
                          timeout_s=args.timeout) as group:
        if args.idle is not None:
            return idle_then_call(group, args)
        if args.dp_attention:
            parallel = Parallel(tp=args.world, ep=args.world, dp=args.world, dp_attention=True)
            model = build_rank_model(read_checkpoint(args.checkpoint), parallel, group)
            turn, prompt, tokens = WORK[args.rank % len(WORK)]
            seen = run(model, None, turn, prompt, tokens)
            model.exchange.drain()
            seen["rounds"] = model.exchange.rounds
            torch.save(seen, f"{args.out}.rank{args.rank}")
            return 0
        model = build_rank_model(read_checkpoint(args.checkpoint), Parallel(tp=args.world, ep=args.ep), group)
        seen = run(model, group)
        if args.rank == 0:
            seen["traffic"] = {"collectives": group.traffic.collectives, "bytes": group.traffic.bytes}
            torch.save(seen, args.out)
    return 0


def idle_then_call(group, args) -> int:
    """Rank 0 idles longer than the group's bound, then calls the others, as a serving rank 0 does between requests;
    every rank then joins a step's collective. Rank 0 saves the sum it saw."""
    import time

    import torch.distributed as dist

    call = ["step"]
    if args.rank == 0:
        time.sleep(args.idle)  # the subject of the test: a server with no request for longer than the bound
    dist.broadcast_object_list(call, src=0, group=group.calls)
    total = group.all_reduce(torch.ones(1) * (args.rank + 1))
    if args.rank == 0:
        torch.save({"call": call[0], "sum": float(total)}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m memt_core.parallel.worker RANK SPEC``: one rank of a multi-rank engine (ranks 1 … N-1).

Started by rank 0 (``memt_core.parallel.ranks.start``) with a JSON ``SPEC``: the checkpoint, the parallel settings,
device and dtype, the runner's options, the group's address and backend. It joins the group, builds its share of
the model (``memt_core.parallel.shard``) and replays rank 0's runner calls (``ranks.serve``) until told to stop. It
exits non-zero when anything fails; rank 0 notices and stops the server.
"""

from __future__ import annotations

import json
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m memt_core.parallel.worker",
        description="One rank (1 … N-1) of a multi-rank engine. The server starts these itself (python -m "
                    "memt_core.launch --tp-size N); there is nothing to run by hand.",
    )
    parser.add_argument("rank", type=int, help="this process's rank, 1 … N-1")
    parser.add_argument("spec", type=json.loads, help="the JSON rank 0 hands over (checkpoint, parallel settings, group address)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    rank, spec = args.rank, args.spec
    logging.basicConfig(level="WARNING", format=f"%(asctime)s rank {rank} %(levelname)s %(name)s: %(message)s")
    import torch

    from memt_core.checkpoint import read_checkpoint
    from memt_core.parallel import ranks
    from memt_core.parallel.dp import rank_runner
    from memt_core.parallel.group import RankGroup
    from memt_core.parallel.plan import Parallel
    from memt_core.parallel.shard import build_rank_model

    torch.set_num_threads(spec["threads"] or 1)
    torch.set_grad_enabled(False)
    parallel = Parallel(**spec["parallel"])
    device = parallel.device_of(rank, spec["device"])
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    with RankGroup.joined(rank, parallel.world, backend=spec["backend"], address=spec["address"],
                          deterministic=spec["deterministic"]) as group:
        model = build_rank_model(read_checkpoint(spec["checkpoint"]), parallel, group, device=device,
                                 dtype=ranks._dtype(spec["dtype"]))
        ranks.serve(rank_runner(model, group, **spec["runner"]), group)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Write a random MemT checkpoint (any registered family: Nano, Flash) for tests, examples and benches.

Tiny by default (a few MB, written in seconds). ``--widths nano`` writes a Nano checkpoint at the released
model's widths (hidden 2048; 16 query / 2 KV heads of 256; linear attention 16 key / 32 value heads of 128;
top-8 experts 512 wide plus a shared expert; memory 16 heads of 128 × 128 beside each full-attention layer)
with ``--layers`` layers (three linear, then one full, repeated) and ``--experts`` experts: at 4 layers and
32 experts 567 M parameters (about 265 M active per token), 1.1 GB of BF16, about a minute on a CPU.

    python scripts/make_tiny_checkpoint.py /tmp/tiny-nano
    python scripts/make_tiny_checkpoint.py /tmp/nano-widths --widths nano --layers 4 --experts 32
"""

import argparse
import sys
import time

from memt_core import families
from memt_core.tiny import make_tiny_checkpoint


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", help="where to write the checkpoint (created if missing)")
    parser.add_argument("--family", choices=families.names(), default=families.DEFAULT, help="architecture (default: %(default)s)")
    parser.add_argument("--widths", default="tiny", help="tiny (default), or a family's named widths: nano (memt-nano)")
    parser.add_argument("--layers", type=int, default=None, help="layers at named widths (default 4: three linear, one full)")
    parser.add_argument("--experts", type=int, default=None, help="routed experts at named widths (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the weights (default: %(default)s)")
    parser.add_argument("--chunk-tokens", type=int, default=None,
                        help="memt.chunk_tokens, the write-event size (default: 32 tiny, 2048 at named widths)")
    parser.add_argument("--shard-bytes", type=int, default=None, help="split weights into shards of at most this many bytes, with an index")
    args = parser.parse_args()
    widths = None if args.widths == "tiny" else args.widths
    chunk = args.chunk_tokens or (32 if widths is None else 2048)
    started = time.monotonic()
    try:
        path = make_tiny_checkpoint(
            args.directory, args.family, seed=args.seed, chunk_tokens=chunk, max_shard_bytes=args.shard_bytes,
            widths=widths, layers=args.layers, experts=args.experts,
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(f"wrote a random {args.family} checkpoint ({args.widths} widths) to {path} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

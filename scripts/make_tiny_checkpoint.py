#!/usr/bin/env python
"""Write a tiny random MemT checkpoint (any registered family: Nano, Flash) for tests and examples."""

import argparse

from memt_core import families
from memt_core.tiny import make_tiny_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("directory", help="where to write the checkpoint (created if missing)")
    parser.add_argument("--family", choices=families.names(), default=families.DEFAULT, help="architecture (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the weights (default: %(default)s)")
    parser.add_argument("--chunk-tokens", type=int, default=32, help="memt.chunk_tokens, the write-event size (default: %(default)s)")
    parser.add_argument("--shard-bytes", type=int, default=None, help="split weights into shards of at most this many bytes, with an index")
    args = parser.parse_args()
    path = make_tiny_checkpoint(args.directory, args.family, seed=args.seed, chunk_tokens=args.chunk_tokens, max_shard_bytes=args.shard_bytes)
    print(f"wrote a tiny {args.family} checkpoint to {path}")


if __name__ == "__main__":
    main()

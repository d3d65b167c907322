"""Serving one model on several ranks: the parallel plan (SGLang's flags, their checks, what each rank holds).

``plan`` is pure (no torch): the launcher validates and prints a plan before anything is loaded.
"""

from memt_core.parallel.plan import BACKENDS, Parallel, check, rank_shares, share, split_of

__all__ = ["BACKENDS", "Parallel", "check", "rank_shares", "share", "split_of"]

"""The bundled demo model: synthetic data, training and evaluation of a tiny Nano-architecture MemT.

``values`` generates open-vocabulary values and defines the held-out split, ``episodes`` draws
synthetic conversations (personal facts, documents, tool calls, repetition), ``format`` turns them into
token ids exactly as the client and proxy encode them, ``train`` trains a tiny checkpoint through the
engine's commit and read paths, and ``eval`` measures recall from latent memory alone, in distribution
and on the held-out split. Importing this package imports neither torch nor transformers.
"""

from memt_core.bundled import BUNDLED_MODEL

__all__ = ["BUNDLED_MODEL"]

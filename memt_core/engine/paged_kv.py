"""A paged KV pool (``--kv-pool paged``): every full-attention layer's keys and values live in one tensor allocated
once at start, in fixed-size blocks; a request holds a block table per layer and gives its blocks back when its
cache is dropped.

The pool is sized from the KV budget (``--max-total-tokens``): ``ceil(budget / block)`` blocks, plus one partial block
for each row that can run at once and for each retained context. Admission (``memt_core.engine.admission``) keeps
the reserved tokens within the budget, so the pool is not exhausted by queries that were admitted; one that still
finds no free block fails alone (``PoolExhausted``), never the engine.

To attention a ``PagedLayer`` looks like transformers' ``DynamicLayer``: ``update`` writes the new tokens into the
rows' blocks and returns the rows' keys and values gathered, left-padded to the batch's width (as the batched
``DynamicLayer`` holds them, ``memt_core.engine.kv``). Joining two batches or dropping rows moves block tables, not
tensors. A step stores every row's new keys in one indexed write and reads the batch back in one gather through
the layer's slot index, which costs what ``DynamicLayer``'s concatenation costs (one copy of the context a step);
the pool bounds the memory, a paged-attention kernel would read the blocks in place (not built: SDPA reads
contiguous tensors).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from transformers.cache_utils import CacheLayerMixin, DynamicCache, DynamicLayer

from memt_core.errors import MemTError

BLOCK = 16  # tokens per block


class PoolExhausted(MemTError):
    """No free block is left in the KV pool (503): the request fails, the engine goes on."""

    status = 503


class LayerPool:
    """One layer's blocks: keys and values ``[blocks × BLOCK + 1, heads, dim]`` (the last slot stays zero: what a
    row's left padding reads), and the free list."""

    def __init__(self, blocks: int, heads: int, dim: int, *, dtype, device):
        self.keys = torch.zeros(blocks * BLOCK + 1, heads, dim, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.zero = blocks * BLOCK
        self.free = list(range(blocks - 1, -1, -1))
        self.blocks = blocks

    def take(self) -> int:
        if not self.free:
            raise PoolExhausted(f"the KV pool's {self.blocks} blocks of {BLOCK} tokens are all in use (--max-total-tokens)")
        return self.free.pop()

    def write(self, slots: list[int], keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Store ``[N, heads, dim]`` keys and values at ``slots``; returns the slots as a tensor."""
        index = torch.tensor(slots, dtype=torch.long, device=self.keys.device)
        self.keys[index] = keys.to(self.keys.dtype)
        self.values[index] = values.to(self.values.dtype)
        return index

    @property
    def used(self) -> int:
        return self.blocks - len(self.free)


class Table:
    """One row's blocks in one layer, and how many tokens they hold; the blocks go back when the table is dropped."""

    def __init__(self, pool: LayerPool):
        self.pool, self.blocks, self.length = pool, [], 0

    def grow(self, count: int) -> list[int]:
        """The pool slots of the row's next ``count`` tokens (blocks taken as needed); the row then holds them."""
        while len(self.blocks) * BLOCK < self.length + count:
            self.blocks.append(self.pool.take())
        slots = self.slots(range(self.length, self.length + count))
        self.length += count
        return slots

    def slots(self, positions: range | None = None) -> list[int]:
        """The pool slots of the row's ``positions`` (default: every token it holds)."""
        return [self.blocks[p // BLOCK] * BLOCK + p % BLOCK for p in (positions if positions is not None else range(self.length))]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write ``[heads, T, dim]`` keys and values after the row's tokens."""
        self.pool.write(self.grow(keys.shape[1]), keys.transpose(0, 1), values.transpose(0, 1))

    def release(self) -> None:
        """Give the blocks back now (a failed request's cache may live on in its error's traceback)."""
        if self.blocks:
            self.pool.free.extend(reversed(self.blocks))
            self.blocks, self.length = [], 0

    __del__ = release


class PagedLayer(CacheLayerMixin):
    """A full-attention layer's cache for a batch of rows, each a ``Table`` in the pool; ``width``: the batch's
    left-padded length; ``index [rows, width]``: the pool slot of every position (padding: the zero slot), so that a
    step writes every row's new tokens in one store and reads the batch in one gather."""

    is_compileable = False
    fused_decode = True  # ``update`` returns the batch's keys and values as DynamicLayer's does (memt_core.models.decode)

    def __init__(self, pool: LayerPool, rows: list[Table] | None = None, width: int = 0, index: torch.Tensor | None = None):
        super().__init__()
        self.pool, self.rows, self.width = pool, rows or [], width
        self.dtype, self.device = pool.keys.dtype, pool.keys.device
        self.is_initialized = bool(self.rows)
        if index is None:
            index = torch.tensor([[pool.zero] * (width - row.length) + row.slots() for row in self.rows],
                                 dtype=torch.long, device=self.device).reshape(len(self.rows), width)
        self.index = index

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.rows = [Table(self.pool) for _ in range(key_states.shape[0])]
        self.index = torch.empty(len(self.rows), 0, dtype=torch.long, device=self.pool.keys.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.dtype = key_states.dtype
        rows, heads, count, dim = key_states.shape
        slots = [slot for row in self.rows for slot in row.grow(count)]
        new = self.pool.write(slots, key_states.transpose(1, 2).reshape(rows * count, heads, dim),
                              value_states.transpose(1, 2).reshape(rows * count, heads, dim))
        self.index = torch.cat([self.index, new.view(rows, count)], dim=1)
        self.width += count
        return self.gather()

    def gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' keys and values ``[rows, heads, width, dim]``, each right-aligned (left padding zero)."""
        keys = self.pool.keys[self.index].transpose(1, 2).to(self.dtype)
        values = self.pool.values[self.index].transpose(1, 2).to(self.dtype)
        return keys, values

    def get_seq_length(self) -> int:
        return self.width

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.width + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def joined(self, other: "PagedLayer") -> "PagedLayer":
        width = max(self.width, other.width)
        index = torch.cat([F.pad(self.index, (width - self.width, 0), value=self.pool.zero),
                           F.pad(other.index, (width - other.width, 0), value=self.pool.zero)])
        return PagedLayer(self.pool, self.rows + other.rows, width, index)

    def selected(self, rows: list[int], start: int) -> "PagedLayer":
        index = self.index[torch.tensor(rows, dtype=torch.long, device=self.index.device), start:]
        return PagedLayer(self.pool, [self.rows[i] for i in rows], self.width - start, index)


class KVPool:
    """The pools of a model's full-attention layers (``DynamicLayer`` in transformers' cache for its config)."""

    def __init__(self, config, tokens: int, *, rows: int, dtype, device):
        self.config = config
        self.blocks = math.ceil(tokens / BLOCK) + rows
        text = config.get_text_config(decoder=True)
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        template = DynamicCache(config=config).layers
        self.layers = {i: LayerPool(self.blocks, int(heads), int(dim), dtype=dtype, device=device)
                       for i, layer in enumerate(template) if type(layer) is DynamicLayer}

    @staticmethod
    def release(cache) -> None:
        """Give back every block ``cache`` holds (it must not be used again)."""
        for layer in getattr(cache, "layers", ()):
            if type(layer) is PagedLayer:
                for row in layer.rows:
                    row.release()

    def new_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.config)
        cache.layers = [PagedLayer(self.layers[i]) if i in self.layers else layer for i, layer in enumerate(cache.layers)]
        return cache

    def used_tokens(self) -> int:
        """Token slots of the blocks in use (the fullest layer's)."""
        return BLOCK * max((pool.used for pool in self.layers.values()), default=0)

    def describe(self) -> dict:
        pool = next(iter(self.layers.values()), None)
        per_block = 0 if pool is None else 2 * BLOCK * pool.keys.shape[1] * pool.keys.shape[2] * pool.keys.element_size()
        return {"blocks": self.blocks, "block_tokens": BLOCK, "layers": len(self.layers),
                "bytes": per_block * self.blocks * len(self.layers),
                "blocks_used": max((pool.used for pool in self.layers.values()), default=0)}

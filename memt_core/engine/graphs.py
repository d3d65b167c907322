"""CUDA-graph decode (opt-in: ``--enable-cuda-graph``): the fused decode step captured once per shape, then replayed.

An eager decode step launches each of its ~180 kernels (Nano widths, 4 layers) from Python; a CUDA graph launches
them all at once, so a step costs the GPU's time rather than the host's. A graph replays fixed addresses and shapes,
so ``GraphDecode`` keeps the batch in static buffers — per full-attention layer keys and values ``[R, Hkv, T, d]``,
per linear-attention layer its convolution window and recurrent state, per memory layer the rows' reads, the input
ids, positions and attention mask — for up to ``R`` rows (``--max-running-requests``) and ``T`` tokens of context
(``--cuda-graph-max-tokens``). A graph is captured for every bucket of rows (1, 2, 4, … up to R) and of context
(128, 256, … up to T) over views of those buffers, all at start (``capture_all``), none on a request's path.

Each step copies the new ids, positions and mask in, sets the column the new key and value go to, and replays
the graph of the smallest buckets that hold the batch (rows past the batch's are padding: masked out, ignored).
The engine keeps its batch as before: ``step`` hands back a ``DynamicCache`` whose tensors are views of the
buffers, so joining, selecting and retaining rows (``memt_core.engine.kv``) work unchanged; a cache the engine made
itself (rows joined or left) is copied into the buffers first. A batch beyond R rows or T tokens, or a step
before capture, runs the eager fused step instead.

Costs: the buffers (Nano widths, 4 layers, 32 rows × 4,096 tokens: 256 MiB of keys and values and 200 MiB of
linear-attention states), the captures at start (two warm-up runs and a capture per graph: 36 graphs for 32 rows
and 4,096 tokens), attention over the context bucket rather than the exact length (at most twice the columns), and
a copy of the batch into the buffers whenever its rows change. With ``capture=False`` the same buffers and steps run eagerly: the CPU
tests check the buffer handling that way (tests/engine/test_graphs.py); the replayed graphs are checked on a GPU.
"""

from __future__ import annotations

import logging

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, LinearAttentionLayer

from memt_core.models.decode import FusedDecode, _FullAttention, _LinearAttention
from memt_core.models.memt import MemTOutput

log = logging.getLogger("memt.engine")

#: The smallest context bucket; buckets double from here to the largest.
MIN_TOKENS = 128
#: What ``GraphDecode.read`` holds when no read is in the buffers for the present rows.
_UNSET = object()


def buckets(largest: int, smallest: int = 1) -> list[int]:
    """Powers of two from ``smallest`` while below ``largest``, then ``largest`` itself."""
    sizes, size = [], smallest
    while size < largest:
        sizes.append(size)
        size *= 2
    return sizes + [largest]


class _StaticFull:
    """A full-attention layer's keys and values in static buffers; ``update`` writes the new column in place."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, column: torch.Tensor):
        self.keys, self.values, self.column = keys, values, column

    def update(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys.index_copy_(2, self.column, keys.to(self.keys.dtype))
        self.values.index_copy_(2, self.column, values.to(self.values.dtype))
        return self.keys, self.values


class _StaticLinear:
    """A linear-attention layer's convolution window and recurrent state in static buffers (updated in place)."""

    def __init__(self, conv: torch.Tensor, recurrent: torch.Tensor):
        self.conv_states, self.recurrent_states = {0: conv}, {0: recurrent}


class _StaticCache:
    def __init__(self, layers):
        self.layers = layers


class GraphDecode:
    """The fused decode step over static buffers, replayed from CUDA graphs (``capture``) or run eagerly."""

    def __init__(self, fused: FusedDecode, *, max_rows: int, max_tokens: int, capture: bool = True):
        self.fused, self.capture = fused, capture
        model = fused.model
        self.device = next(model.parameters()).device
        if capture and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.row_buckets = buckets(1 << (max(1, max_rows) - 1).bit_length())
        self.token_buckets = buckets(max(max_tokens, MIN_TOKENS), MIN_TOKENS)
        self.rows, self.tokens = self.row_buckets[-1], self.token_buckets[-1]
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.buffers: dict | None = None  # allocated with the first batch (its caches' dtypes)
        self.handed: DynamicCache | None = None  # the cache the engine holds now, views of the buffers
        self.read: object = _UNSET  # the memory read the buffers hold (the engine's dict, by identity)
        # replays of graphs; steps over the buffers without graphs (capture=False); steps left to the eager step;
        # batches copied into the buffers; graphs captured
        self.stats = {"replays": 0, "uncaptured": 0, "eager": 0, "loads": 0, "captures": 0}

    # ------------------------------------------------------------------ buffers

    def _allocate(self, dtypes: dict[str, torch.dtype]) -> None:
        model, rows, tokens, device = self.fused.model, self.rows, self.tokens, self.device
        memory = model.checkpoint.memory
        buffers = {
            "ids": torch.zeros(rows, 1, dtype=torch.long, device=device),
            "positions": torch.zeros(rows, 1, dtype=torch.long, device=device),
            "mask": torch.zeros(rows, tokens, dtype=torch.long, device=device),
            "column": torch.zeros(1, dtype=torch.long, device=device),
            "reads": {layer: torch.zeros(rows, memory.num_heads, memory.key_dim, memory.value_dim, device=device)
                      for layer in model.memory_layers},
            "layers": [],
        }
        for layer in self.fused.layers:
            p = layer.mixer
            if isinstance(p, _FullAttention):
                shape = (rows, p.kv_heads, tokens, p.head_dim)
                buffers["layers"].append((torch.zeros(shape, dtype=dtypes["kv"], device=device),
                                          torch.zeros(shape, dtype=dtypes["kv"], device=device)))
            else:
                conv = (rows, 2 * p.key_heads * p.key_dim + p.value_heads * p.value_dim, p.conv_weight.shape[-1])
                buffers["layers"].append((torch.zeros(conv, dtype=dtypes["conv"], device=device),
                                          torch.zeros(rows, p.value_heads, p.key_dim, p.value_dim, dtype=dtypes["recurrent"], device=device)))
        self.buffers = buffers

    def _default_dtypes(self) -> dict[str, torch.dtype]:
        dtype = next(self.fused.model.parameters()).dtype
        return {"kv": dtype, "conv": dtype, "recurrent": torch.float32}

    def _static(self, rows: int, tokens: int) -> _StaticCache:
        """The static cache of the bucket: views of the buffers."""
        b = self.buffers
        layers = []
        for layer, (first, second) in zip(self.fused.layers, b["layers"]):
            if isinstance(layer.mixer, _FullAttention):
                layers.append(_StaticFull(first[:rows, :, :tokens], second[:rows, :, :tokens], b["column"]))
            else:
                layers.append(_StaticLinear(first[:rows], second[:rows]))
        return _StaticCache(layers)

    def _run(self, rows: int, tokens: int) -> torch.Tensor:
        b = self.buffers
        out = self.fused(
            b["ids"][:rows], memory={layer: read[:rows] for layer, read in b["reads"].items()} or None,
            past_key_values=self._static(rows, tokens), attention_mask=b["mask"][:rows, :tokens], position_ids=b["positions"][:rows],
        )
        return out.logits

    # ------------------------------------------------------------------ capture

    def capture_all(self) -> None:
        """Capture every bucket's graph now (the buffers hold no batch yet: warm-up runs may write them)."""
        if not self.capture:
            return
        if self.buffers is None:
            self._allocate(self._default_dtypes())
        for rows in self.row_buckets:
            for tokens in self.token_buckets:
                self._capture(rows, tokens)
        self._clear()

    def _capture(self, rows: int, tokens: int) -> None:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(2):  # kernels' first calls (autotuning, workspaces) outside the graph
                self._run(rows, tokens)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the server's other threads may use the device meanwhile (a new session's memory)
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"), torch.no_grad():
            logits = self._run(rows, tokens)
        self.graphs[(rows, tokens)] = (graph, logits)
        self.stats["captures"] += 1

    def _clear(self) -> None:
        """Zero every buffer (what warm-up runs left there) and forget the batch."""
        b = self.buffers
        for tensor in (b["ids"], b["positions"], b["mask"], *b["reads"].values()):
            tensor.zero_()
        for first, second in b["layers"]:
            first.zero_()
            second.zero_()
        self.handed, self.read = None, _UNSET

    # ------------------------------------------------------------------ steps

    def step(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, read: dict | None, cache) -> MemTOutput | None:
        """One decode step of the engine's batch (``TorchEngine._decode``'s arguments), or None where the batch does
        not fit the buffers or a graph is missing: then the caller runs the eager step."""
        rows, length = mask.shape
        if rows > self.rows or length > self.tokens or (cache is not self.handed and not self.fused.can_run(ids, cache)):
            return self._eager(cache)
        row_bucket = next(size for size in self.row_buckets if size >= rows)
        token_bucket = next(size for size in self.token_buckets if size >= length)
        if self.buffers is None:
            self._allocate(self._dtypes(cache))
        if self.capture and (row_bucket, token_bucket) not in self.graphs:
            if cache is self.handed:  # the buffers hold the batch: a capture's warm-up runs would write over it
                return self._eager(cache)
            self._clear()
            self._capture(row_bucket, token_bucket)
            self._clear()
        b = self.buffers
        if cache is not self.handed:
            self._load(cache, rows, length - 1)
        if read is not self.read:
            for layer, buffer in b["reads"].items():
                if read is None or layer not in read:
                    buffer[:rows].zero_()
                else:
                    buffer[:rows].copy_(read[layer])
            self.read = read
        b["ids"][:rows].copy_(ids)
        b["positions"][:rows].copy_(positions)
        b["mask"][:rows, :length].copy_(mask)
        b["column"].fill_(length - 1)
        if self.capture:
            graph, logits = self.graphs[(row_bucket, token_bucket)]
            graph.replay()
            self.stats["replays"] += 1
        else:
            with torch.no_grad():
                logits = self._run(row_bucket, token_bucket)
            self.stats["uncaptured"] += 1
        self._advance(rows, length)
        return MemTOutput(logits=logits[:rows], past_key_values=self.handed)

    def _eager(self, cache) -> None:
        """Leave this step to the eager step. It advances the cache it is given in its own way (keys and values
        concatenated anew), so a cache handed out here no longer mirrors the buffers: the next step loads it again."""
        if cache is self.handed and cache is not None:
            self.handed = None
        self.stats["eager"] += 1
        return None

    def _dtypes(self, cache) -> dict[str, torch.dtype]:
        dtypes = self._default_dtypes()
        for layer in cache.layers:
            if isinstance(layer, LinearAttentionLayer):
                dtypes["conv"], dtypes["recurrent"] = layer.conv_states[0].dtype, layer.recurrent_states[0].dtype
            elif isinstance(layer, DynamicLayer) and layer.is_initialized:
                dtypes["kv"] = layer.keys.dtype
        return dtypes

    def _load(self, cache, rows: int, length: int) -> None:
        """Copy the engine's batch (``length`` columns of keys and values) into the buffers; padding rows masked out."""
        b = self.buffers
        for layer, cached, (first, second) in zip(self.fused.layers, cache.layers, b["layers"]):
            if isinstance(layer.mixer, _LinearAttention):
                first[:rows].copy_(cached.conv_states[0])
                second[:rows].copy_(cached.recurrent_states[0])
            else:
                first[:rows, :, :length].copy_(cached.keys)
                second[:rows, :, :length].copy_(cached.values)
        b["mask"].zero_()  # columns past the batch's, and the padding rows: masked out
        self.read = _UNSET  # the rows changed: their reads are copied again
        self.handed = DynamicCache(config=self.fused.model.config)
        self.handed.layers = [self._view(layer, pair, rows, length) for layer, pair in zip(self.fused.layers, b["layers"])]
        self.stats["loads"] += 1

    @staticmethod
    def _view(layer, pair, rows: int, length: int):
        first, second = pair
        if isinstance(layer.mixer, _LinearAttention):
            view = LinearAttentionLayer()
            view.conv_states[0], view.recurrent_states[0] = first[:rows], second[:rows]
            view.is_conv_states_initialized[0] = view.is_recurrent_states_initialized[0] = view.has_previous_state[0] = True
            view.conv_kernel_size[0] = first.shape[-1]
            view.dtype, view.device = first.dtype, first.device
            return view
        view = DynamicLayer()
        view.keys, view.values = first[:rows, :, :length], second[:rows, :, :length]
        view.dtype, view.device, view.is_initialized = first.dtype, first.device, True
        return view

    def _advance(self, rows: int, length: int) -> None:
        """The handed cache's keys and values now reach the new column."""
        for layer, view, (first, second) in zip(self.fused.layers, self.handed.layers, self.buffers["layers"]):
            if isinstance(layer.mixer, _FullAttention):
                view.keys, view.values = first[:rows, :, :length], second[:rows, :, :length]

"""``memt_core.engine.kv``: joined, selected and extracted caches keep every row equal to its own
unbatched cache, so batched greedy decoding gives exactly the tokens of one-at-a-time decoding.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from memt_core.engine import kv
from memt_core.inference import memory_batch
from memt_core.memory.state import MemoryState

PROMPTS = [[17, 42, 99], [5, 6, 7, 8, 9, 10, 11], [300, 12] * 6, [77]]  # lengths 3, 7, 12, 1
STEPS = 8


def _prefill(model, ids, memory=None):
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        out = model(torch.tensor([ids]), memory=memory_batch(model, [memory]), past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.past_key_values, out.logits[0, -1]


def _single_decode(model, ids, steps, memory=None):
    """Reference: one request alone; returns the greedy tokens and the logits of every step."""
    cache, logits = _prefill(model, ids, memory)
    tokens, all_logits = [int(logits.argmax())], [logits]
    for _ in range(steps):
        with torch.no_grad():
            out = model(torch.tensor([[tokens[-1]]]), memory=memory_batch(model, [memory]), past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        all_logits.append(out.logits[0, -1])
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens, all_logits


class Batch:
    """A decode batch run the way the engine runs it: left-padded caches, a mask, explicit positions."""

    def __init__(self, model):
        self.model, self.cache, self.mask = model, None, None
        self.rows: list[dict] = []

    def add(self, ids, memory=None):
        cache, logits = _prefill(self.model, ids, memory)
        mask = torch.ones(1, len(ids), dtype=torch.long)
        if self.cache is None:
            self.cache, self.mask = cache, mask
        else:
            self.cache, self.mask = kv.join(self.cache, self.mask, cache, mask)
        self.rows.append({"fed": len(ids), "tokens": [int(logits.argmax())], "logits": [logits], "memory": memory})

    def step(self):
        ids = torch.tensor([[row["tokens"][-1]] for row in self.rows])
        positions = torch.tensor([[row["fed"]] for row in self.rows])
        mask = torch.cat([self.mask, torch.ones(len(self.rows), 1, dtype=torch.long)], dim=1)
        with torch.no_grad():
            out = self.model(ids, memory=memory_batch(self.model, [row["memory"] for row in self.rows]), past_key_values=self.cache,
                             use_cache=True, attention_mask=mask, position_ids=positions, logits_to_keep=1)
        self.cache, self.mask = out.past_key_values, mask
        for i, row in enumerate(self.rows):
            row["fed"] += 1
            row["logits"].append(out.logits[i, -1])
            row["tokens"].append(int(out.logits[i, -1].argmax()))

    def keep(self, rows: list[int]):
        self.cache, self.mask = kv.select(self.cache, self.mask, rows)
        self.rows = [self.rows[i] for i in rows]


def _full_attention_lengths(cache) -> list[int]:
    return [layer.keys.shape[2] for layer in cache.layers if type(layer) is DynamicLayer and layer.is_initialized]


def test_nano_caches_are_batchable_flash_caches_are_not(nano_model, flash_model):
    assert kv.batchable(_prefill(nano_model, [1, 2, 3])[0])
    assert not kv.batchable(_prefill(flash_model, [1, 2, 3])[0])


def test_join_and_batched_decode_equal_single_decode(nano_model):
    reference = [_single_decode(nano_model, ids, STEPS) for ids in PROMPTS]
    batch = Batch(nano_model)
    for ids in PROMPTS:
        batch.add(ids)
    assert batch.mask.shape == (len(PROMPTS), max(map(len, PROMPTS)))
    assert batch.mask.sum(dim=1).tolist() == [len(ids) for ids in PROMPTS]
    for _ in range(STEPS):
        batch.step()
    for row, (tokens, logits) in zip(batch.rows, reference):
        assert row["tokens"] == tokens
        torch.testing.assert_close(torch.stack(row["logits"]), torch.stack(logits), rtol=1e-4, atol=1e-4)


def test_rows_joining_and_leaving_between_steps(nano_model):
    """Continuous batching: rows join mid-way, finished rows are selected out, a row is extracted alone."""
    reference = [_single_decode(nano_model, ids, STEPS) for ids in PROMPTS]
    batch = Batch(nano_model)
    batch.add(PROMPTS[0])
    batch.add(PROMPTS[1])
    batch.step()
    batch.step()
    batch.add(PROMPTS[2])  # joins two steps late, longer than the others
    batch.step()
    batch.keep([1, 2])  # row 0 leaves
    batch.add(PROMPTS[3])
    for _ in range(3):
        batch.step()
    # extract one row as its own unpadded cache and keep decoding it alone
    row = batch.rows[1]
    single = kv.extract(batch.cache, batch.mask, 1)
    assert set(_full_attention_lengths(single)) == {row["fed"]}
    tokens = list(row["tokens"])
    cache = single
    while len(tokens) < STEPS + 1:
        with torch.no_grad():
            out = nano_model(torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        tokens.append(int(out.logits[0, -1].argmax()))
    assert tokens == reference[2][0]
    # the rest of the batch is unaffected by the extraction
    batch.keep([0, 2])
    assert set(_full_attention_lengths(batch.cache)) == {batch.mask.shape[1]}
    while len(batch.rows[1]["tokens"]) < STEPS + 1:
        batch.step()
    assert batch.rows[0]["tokens"][: STEPS + 1] == reference[1][0]
    assert batch.rows[1]["tokens"][: STEPS + 1] == reference[3][0]


def test_select_drops_columns_that_are_padding_for_every_kept_row(nano_model):
    batch = Batch(nano_model)
    batch.add([1, 2])
    batch.add(list(range(10, 22)))
    assert batch.mask.shape[1] == 12
    batch.keep([0])
    assert batch.mask.shape == (1, 2) and bool(batch.mask.all())
    assert set(_full_attention_lengths(batch.cache)) == {2}


def test_each_row_reads_its_own_memory(nano_model):
    from memt_core.inference import commit_tokens

    with torch.no_grad():
        memory_a = commit_tokens(nano_model, MemoryState(), list(range(20, 60))).memory
        memory_b = commit_tokens(nano_model, MemoryState(), list(range(200, 260))).memory
    prompt = [17, 42, 99, 123]
    ref_a = _single_decode(nano_model, prompt, STEPS, memory_a)[0]
    ref_b = _single_decode(nano_model, prompt, STEPS, memory_b)[0]
    ref_none = _single_decode(nano_model, prompt, STEPS)[0]
    assert len({tuple(ref_a), tuple(ref_b), tuple(ref_none)}) == 3, "the memories should change the answers"
    batch = Batch(nano_model)
    for memory in (memory_a, None, memory_b, memory_a):
        batch.add(prompt, memory)
    for _ in range(STEPS):
        batch.step()
    assert [row["tokens"] for row in batch.rows] == [ref_a, ref_none, ref_b, ref_a]


@pytest.mark.parametrize("rows", [[0], [1, 2], [2, 0]])
def test_select_keeps_row_order_and_contents(nano_model, rows):
    reference = [_single_decode(nano_model, ids, 4) for ids in PROMPTS[:3]]
    batch = Batch(nano_model)
    for ids in PROMPTS[:3]:
        batch.add(ids)
    batch.step()
    batch.keep(rows)
    for _ in range(3):
        batch.step()
    assert [row["tokens"] for row in batch.rows] == [reference[i][0] for i in rows]

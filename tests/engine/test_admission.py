"""Admission against the KV budget (``--max-total-tokens``) and the queue's bound (``--max-queued-requests``): the
bookkeeping alone (``memt_core.engine.admission``), then a torch engine under a burst larger than its budget. Every
admitted query answers what it answers alone; the reserved KV never passes the budget; a query that alone would
outgrow it stops there; beyond the queue's bound a query is refused with ``EngineBusy`` and changes nothing."""

from __future__ import annotations

import asyncio

import pytest
import torch

from memt_core.engine import TorchEngine
from memt_core.engine.admission import Admission
from memt_core.errors import EngineBusy, InvalidRequest
from memt_core.inference import generate
from memt_core.sampling import SamplingParams

pytestmark = pytest.mark.timeout(300)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0, skip_eos=True)


def alone(model, prompt: list[int], n: int) -> list[int]:
    return generate(model, prompt, memory=None, params=greedy(n)).output_ids


async def answer(engine, rid: str, prompt: list[int], n: int) -> tuple[list[int], str]:
    tokens, finish = [], None
    async for event in engine.query(rid, prompt, greedy(n)):
        assert event.error is None, event.error
        tokens += [event.token] if event.token is not None else []
        finish = event.finish_reason or finish
    return tokens, finish


# ---------------------------------------------------------------------- the bookkeeping


def test_reservations_fit_the_budget_and_one_alone_always_starts():
    a = Admission(budget=100)
    assert a.need(30, 50) == 80 and a.need(30, 500) == 100  # at most the whole budget
    assert a.fits(80, alone=False)
    a.admit(80)
    assert not a.fits(30, alone=False) and a.fits(20, alone=False)
    assert a.fits(100, alone=True)  # nothing else runs: it starts, and stops at the budget
    a.release(80)
    assert a.reserved == 0 and a.peak == 80
    assert Admission().need(30, 50) == 0 and Admission().fits(10**9, alone=False)  # no budget, no bound


def test_a_padded_batch_is_admitted_by_its_longest_row():
    """The growing cache pads every running row to the longest: two queries reserving 20 and 60 hold 2 × 60, not 80.
    A paged pool holds each row's own."""
    padded, paged = Admission(budget=100, padded=True), Admission(budget=100)
    for a in (padded, paged):
        a.admit(20)
    assert padded.room(60) == 20 and paged.room(60) == 0
    assert padded.room(50) == 0  # 2 × 50
    padded.admit(50)
    assert padded.peak == 100
    padded.release(20)
    assert padded.room(30) == 0 and padded.room(60) == 20  # 2 × 50 fits; 2 × 60 does not
    padded.release(50)
    assert padded.reserved == 0 and padded.room(100) == 0
    assert Admission(budget=100, block=16).need(4, 20) == 32 and Admission(budget=100, block=16).need(90, 20) == 100


def test_the_paged_pool_is_the_default_wherever_a_budget_is_given_and_it_can_hold_the_kv():
    from memt_core.engine.budget import Budget, paged

    eager = {"cuda_graphs": False, "torch_compile": False}
    assert not paged(Budget(), **eager)  # no budget: the growing cache
    assert paged(Budget(max_total_tokens=4096), **eager) and paged(Budget(mem_fraction_static=0.6), **eager)
    assert not paged(Budget(max_total_tokens=4096, kv_cache_dtype="fp8_e4m3"), **eager)
    assert not paged(Budget(max_total_tokens=4096), cuda_graphs=True, torch_compile=False)
    assert not paged(Budget(max_total_tokens=4096), cuda_graphs=False, torch_compile=True)
    assert not paged(Budget(max_total_tokens=4096, kv_pool="dynamic"), **eager)
    assert paged(Budget(max_total_tokens=4096, kv_pool="paged"), **eager)


def test_the_queue_is_bounded_and_a_prompt_that_fills_the_budget_is_refused():
    a = Admission(budget=100, max_queued=2)
    a.enter(10)
    a.enter(10)
    with pytest.raises(EngineBusy) as busy:
        a.enter(10)
    assert busy.value.status == 503 and busy.value.retry_after == 1
    assert a.queued == 2 and a.refused == 1
    a.left_queue()
    a.enter(10)  # room again
    with pytest.raises(InvalidRequest, match="--max-total-tokens"):
        a.enter(100)
    assert a.queued == 2


# ---------------------------------------------------------------------- an engine under a burst


def test_a_burst_larger_than_the_budget_waits_its_turn_and_answers_as_alone(nano_model):
    prompts = [[10 + i, 42, 99, 123, 5, 6, 7, 8] * 2 for i in range(6)]  # 16 tokens each; 16 + 20 = 36 reserved
    expected = [alone(nano_model, prompt, 20) for prompt in prompts]
    engine = TorchEngine(nano_model, max_running_requests=8, max_total_tokens=80).start()  # two at a time, not three
    try:
        async def burst():
            return await asyncio.gather(*(answer(engine, f"q{i}", prompt, 20) for i, prompt in enumerate(prompts)))

        results = asyncio.run(burst())
        assert [tokens for tokens, _ in results] == expected
        assert all(finish == "length" for _, finish in results)
        stats = engine.stats
        assert stats.kv_reserved_peak == 72 <= stats.kv_budget == 80  # two running at once at most
        assert stats.kv_reserved == 0 and stats.queued == 0
    finally:
        engine.stop()


@pytest.mark.parametrize("pool", ["dynamic", "paged"])
def test_the_caches_never_hold_more_than_the_budget_measured(nano_model, pool):
    """Short and long prompts in one burst: the KV the caches actually hold after every step (the growing cache's
    padding included; the paged pool's blocks in use) stays within ``--max-total-tokens``, and each answers as alone."""
    budget = 100
    prompts = [[17, 42, 99, 5], [10 + i for i in range(40)], [7, 8, 9, 10, 11], [20 + i for i in range(36)]] * 2
    expected = [alone(nano_model, prompt, 20) for prompt in prompts]
    engine = TorchEngine(nano_model, max_running_requests=8, max_total_tokens=budget,
                         kv_pool_tokens=budget if pool == "paged" else None).start()
    try:
        async def burst():
            return await asyncio.gather(*(answer(engine, f"q{i}", prompt, 20) for i, prompt in enumerate(prompts)))

        assert [tokens for tokens, _ in asyncio.run(burst())] == expected
        stats = engine.stats
        assert 0 < stats.kv_held_peak <= budget  # a paged query reserves whole blocks
        assert stats.kv_reserved_peak <= budget
    finally:
        engine.stop()


def test_a_query_that_alone_outgrows_the_budget_stops_at_it(nano_model):
    prompt = [17, 42, 99, 123, 5, 6, 7, 8, 9, 10]
    engine = TorchEngine(nano_model, max_total_tokens=40).start()
    try:
        tokens, finish = asyncio.run(answer(engine, "long", prompt, 100))
        assert finish == "length" and len(prompt) + len(tokens) == 40
        assert tokens == alone(nano_model, prompt, 30)
        async def too_long():
            engine.query("too-long", list(range(40)), greedy(1))

        with pytest.raises(InvalidRequest, match="no room to generate"):
            asyncio.run(too_long())
        assert engine.stats.queued == 0
    finally:
        engine.stop()


def test_beyond_the_queues_bound_a_query_is_refused_and_the_others_answer(nano_model):
    first, second = [17, 42, 99, 123], [5, 6, 7, 8]
    engine = TorchEngine(nano_model, max_total_tokens=304, max_queued_requests=1).start()
    try:
        async def scenario():
            running = engine.query("a", first, greedy(300))  # holds the whole budget for 300 steps
            arrived = await running.__anext__()
            assert arrived.token is not None  # admitted and running: the next query must wait
            waiting = engine.query("b", second, greedy(5))  # queued: 1, the bound
            with pytest.raises(EngineBusy):
                engine.query("c", second, greedy(5))
            assert engine.stats.refused_queue_full == 1
            rest = [event.token async for event in running if event.token is not None]
            later = [event.token async for event in waiting if event.token is not None]
            return [arrived.token, *rest], later

        tokens_a, tokens_b = asyncio.run(scenario())
        assert tokens_a == alone(nano_model, first, 300)
        assert tokens_b == alone(nano_model, second, 5)
        assert engine.stats.queued == 0 and engine.stats.kv_reserved == 0
    finally:
        engine.stop()


def test_the_fraction_of_a_device_becomes_a_kv_budget(nano_model):
    """``--mem-fraction-static`` on CUDA: what the fraction leaves after the weights, the measured activation peak and
    the sessions' memory state slots, divided by one token's KV bytes (every layer counted as full attention: an
    upper bound per token)."""
    from memt_core.engine.device import kv_budget_tokens, kv_token_bytes, memory_state_bytes

    config = nano_model.config
    per_token = kv_token_bytes(nano_model)
    full = sum(kind == "full_attention" for kind in config.layer_types)  # the linear-attention layers keep a state
    assert 0 < full < config.num_hidden_layers
    assert per_token == 2 * full * config.num_key_value_heads * config.head_dim * 4  # FP32
    assert kv_budget_tokens(0.5, 100_000_000, 10_000_000, 1000, activation=5_000_000) == 35_000
    assert kv_budget_tokens(0.5, 100_000_000, 10_000_000, 1000, activation=5_000_000, states=64 * 100_000) == 28_600
    assert kv_budget_tokens(0.1, 100_000_000, 20_000_000, 1000, activation=0) == 0  # the weights alone pass the fraction
    assert kv_budget_tokens(0.5, 100_000_000, 10_000_000, 1000, activation=None) == 32_000  # several ranks: a fixed share
    heads, keys, values = nano_model.checkpoint.memory.state_shape()[1:]
    assert memory_state_bytes(nano_model) == 4 * heads * keys * values * len(nano_model.memory_layers)
    # one request's linear-attention states, as a forward pass leaves them in its cache
    from memt_core.engine.device import recurrent_state_bytes
    from memt_core.engine.fp8_kv import new_cache
    from memt_core.models.passes import memory_batch

    with torch.no_grad():
        cache = nano_model(torch.tensor([[5, 6, 7]]), memory=memory_batch(nano_model, [None]),
                           past_key_values=new_cache(nano_model.config, "auto"), use_cache=True).past_key_values
    held = sum(t.numel() * t.element_size() for layer in cache.layers if hasattr(layer, "recurrent_states")
               for states in (layer.conv_states, layer.recurrent_states) for t in states.values() if t is not None)
    assert recurrent_state_bytes(nano_model) == held > 0


@pytest.mark.gpu
def test_the_fraction_is_sized_from_a_measured_activation_peak_on_cuda(nano_checkpoint):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from memt_core.engine.device import activation_peak, cuda_kv_budget
    from memt_core.models.weights import load_model

    model = load_model(nano_checkpoint, device="cuda", dtype=torch.bfloat16)
    short, long = activation_peak(model, 64), activation_peak(model, 2048)
    assert 0 < short < long  # a longer prompt's forward passes take more
    small = cuda_kv_budget(model, 0.5, profile_tokens=2048, state_slots=64, rows=8)
    assert 0 < small < cuda_kv_budget(model, 0.9, profile_tokens=2048, state_slots=64, rows=8)
    engine = TorchEngine(model, max_total_tokens=small, kv_pool_tokens=min(small, 65_536), memory_state_slots=64)
    assert engine.capabilities()["memory_budget"]["memory_state_slots"]["slots"] == 64


def test_retained_contexts_count_against_the_budget_and_are_evicted_first(nano_model):
    """A streaming session's retained context holds KV after its query; a query that needs that room frees it (the
    session's next query is then prefilled whole, with the same answer) instead of waiting for it forever."""
    from memt_core.protocol import effects as fx

    first, other = [17, 42, 99, 123, 5, 6], [7, 8, 9, 10]
    engine = TorchEngine(nano_model, max_total_tokens=40).start()
    try:
        async def scenario():
            await engine.apply(fx.NewMemory("s"))
            held = [e.token async for e in engine.query("r1", first, greedy(10), session="s", retain=True) if e.token is not None]
            assert engine.store.retained_tokens() == len(first) + 9  # the prompt and the tokens fed back
            plain = [e.token async for e in engine.query("p", other, greedy(30)) if e.token is not None]  # 34 of 40
            assert engine.store.retained_tokens() == 0 and engine.store.sessions["s"].retained is None
            return held, plain

        held, plain = asyncio.run(scenario())
        assert held == alone(nano_model, first, 10) and plain == alone(nano_model, other, 30)
        assert engine.stats.kv_reserved_peak <= 40
    finally:
        engine.stop()


def test_capabilities_state_the_budget_in_tokens_and_bytes(nano_model):
    engine = TorchEngine(nano_model, max_total_tokens=512, kv_cache_dtype="fp8_e4m3")
    budget = engine.capabilities()["memory_budget"]
    from memt_core.engine.device import kv_token_bytes

    assert budget["kv_tokens"] == 512 and budget["kv_bytes_per_token"] == kv_token_bytes(nano_model) // 4  # FP32 → FP8
    assert budget["kv_bytes"] == 512 * budget["kv_bytes_per_token"]
    heads, keys, values = nano_model.checkpoint.memory.state_shape()[1:]
    assert budget["memory_state_bytes"] == 4 * heads * keys * values * len(nano_model.memory_layers)
    assert budget["memory_state_slots"] == "as made"  # no slots given: each state allocated as it is made
    assert TorchEngine(nano_model).capabilities()["memory_budget"]["kv_tokens"] is None

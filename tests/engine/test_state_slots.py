"""Memory state slots (``memt_core.engine.state_slots``): with a budget the sessions' memory states live in tensors
allocated at start. A fork shares its source's slot, a commit's new state takes its own, a slot comes back when no
handle names it; a commit batch that finds too few free slots fails whole and changes nothing; an engine on slots
answers and remembers exactly as one that allocates each state as it is made. A put is never refused (on several
ranks it is replayed where no error reaches a client): with no slot free the state is held beside them, counted."""

from __future__ import annotations

import asyncio

import pytest
import torch

from memt_core.engine import TorchEngine
from memt_core.engine.state_slots import SlotsFull, StateSlots, slots_for
from memt_core.memory.state import MemoryState
from memt_core.protocol import effects as fx
from memt_core.sampling import SamplingParams

pytestmark = pytest.mark.timeout(300)

TURN = list(range(20, 60))


def state(value: float) -> MemoryState:
    return MemoryState({1: torch.full((1, 2, 3, 3), value), 3: torch.full((1, 2, 3, 3), -value)})


def test_forks_share_a_slot_commits_take_their_own_and_slots_come_back():
    slots = StateSlots((1, 3), (2, 3, 3), 3, device="cpu")
    original = state(1.0)
    held = slots.put(10, original)
    assert held.equal(original) and held.get(1).data_ptr() == slots.slabs[1].data_ptr()  # a slot's rows, copied
    slots.share(10, 11)  # a fork
    assert slots.used == 1
    [new] = slots.replace({11: state(2.0)}).values()  # the fork's commit: a slot of its own
    assert slots.used == 2 and new.equal(state(2.0)) and held.equal(original)  # the source is untouched
    slots.drop(10)
    assert slots.used == 1
    slots.drop(11)
    assert slots.used == 0
    assert slots.put(12, MemoryState()).is_empty and slots.used == 0  # the empty memory takes none


def test_a_refused_replace_changes_nothing():
    slots = StateSlots((1, 3), (2, 3, 3), 2, device="cpu")
    a = slots.put(1, state(1.0))
    slots.put(2, state(2.0))
    with pytest.raises(SlotsFull, match="memory state slots"):
        slots.replace({1: state(5.0)})
    assert slots.used == 2 and a.equal(state(1.0))
    beside = slots.put(3, state(3.0))  # a put is never refused: held beside the slots, counted
    assert beside.equal(state(3.0)) and slots.overflow == 1 and slots.used == 2
    slots.drop(3)  # it names no slot
    assert slots.used == 2
    slots.drop(2)
    [b] = slots.replace({1: state(5.0)}).values()  # one free slot: taken, then the old one comes back
    assert b.equal(state(5.0)) and slots.used == 1
    assert SlotsFull.status == 503 and slots_for(4, 2) == 2 * 4 + 2 + 8


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0, skip_eos=True)


async def remember(engine, sessions: int) -> list[list[int]]:
    """Each session: a turn committed and published, a fork queried; the answers."""
    out = []
    for i in range(sessions):
        name = f"s{i}"
        await engine.apply(fx.NewMemory(name))
        await engine.apply(fx.ForkCandidate(name, transaction="t"))
        await engine.commit(name, "t", "n", [t + i for t in TURN])
        await engine.apply(fx.PublishCandidate(name, transaction="t"))
        out.append([e.token async for e in engine.query(f"q{i}", [17, 42, 99], greedy(8), session=name) if e.token is not None])
    return out


def test_an_engine_on_slots_remembers_as_one_without_and_gives_them_back(nano_model):
    plain = TorchEngine(nano_model).start()
    slotted = TorchEngine(nano_model, memory_state_slots=slots_for(3, 1)).start()
    try:
        expected = asyncio.run(remember(plain, 3))
        assert asyncio.run(remember(slotted, 3)) == expected
        slots = slotted.runner.slots
        assert slots.used == 3  # one published state per session (the pins were let go)

        async def drop_all():
            for i in range(3):
                await slotted.apply(fx.DropSession(f"s{i}"))
            [e async for e in slotted.query("after", [5, 6], greedy(2))]  # its steps free what was let go

        asyncio.run(drop_all())
        assert slots.used == 0
        memory_budget = slotted.capabilities()["memory_budget"]
        assert memory_budget["memory_state_slots"]["slots"] == slots_for(3, 1)
        assert memory_budget["memory_state_slots"]["bytes"] == slots_for(3, 1) * memory_budget["memory_state_bytes"]
    finally:
        plain.stop()
        slotted.stop()


def test_a_commit_that_finds_no_free_slot_fails_and_the_engine_goes_on(nano_model):
    engine = TorchEngine(nano_model, memory_state_slots=2).start()
    try:
        async def scenario():
            for name in ("a", "b"):
                await engine.apply(fx.NewMemory(name))
                await engine.apply(fx.ForkCandidate(name, transaction="t"))
            await engine.commit("a", "t", "n", TURN)
            await engine.apply(fx.PublishCandidate("a", transaction="t"))
            await engine.commit("b", "t", "n", TURN)  # the second slot
            await engine.apply(fx.ForkCandidate("a", transaction="u"))  # shares a's slot
            with pytest.raises(SlotsFull):
                await engine.commit("a", "u", "m", TURN)  # its new state finds none
            await engine.apply(fx.DropCandidate("a", transaction="u"))
            return [e.token async for e in engine.query("q", [17, 42, 99], greedy(4), session="a") if e.token is not None]

        assert len(asyncio.run(scenario())) == 4 and engine.alive
    finally:
        engine.stop()


def test_the_batch_keeps_its_recurrent_states_in_slots_and_answers_as_without(nano_model):
    """Requests of several lengths join and leave the decode batch: with slots its linear-attention states are the
    slots' first rows (made once, ``--max-running-requests`` rows), and every answer is the one without slots."""
    prompts = [[17, 42, 99], [5, 6, 7, 8, 9, 10, 11], [300, 12] * 6, list(range(100, 140))]
    lengths = [4, 12, 7, 9]  # rows leave the batch at different steps, the others move up

    async def answers(engine):
        async def one(i):
            return [e.token async for e in engine.query(f"q{i}", prompts[i], greedy(lengths[i])) if e.token is not None]

        return await asyncio.gather(*(one(i) for i in range(len(prompts))))

    plain = TorchEngine(nano_model, max_running_requests=4).start()
    slotted = TorchEngine(nano_model, max_running_requests=4, memory_state_slots=slots_for(1, 1)).start()
    try:
        expected = asyncio.run(answers(plain))
        for _ in range(2):
            assert asyncio.run(answers(slotted)) == expected
        recurrent = slotted.runner.recurrent
        assert recurrent.slabs and all(slab.shape[0] == 4 for slab in recurrent.slabs.values())
        assert slotted.capabilities()["memory_budget"]["recurrent_slots"]["bytes"] == recurrent.bytes() > 0
    finally:
        plain.stop()
        slotted.stop()


def test_joining_and_selecting_rows_keep_the_states_in_the_slots(nano_model):
    from memt_core.engine import kv
    from memt_core.engine.runner import ModelRunner
    from memt_core.engine.state_slots import RecurrentSlots

    runner = ModelRunner(nano_model, max_rows=3)
    slots = RecurrentSlots(3)
    caches = []
    with torch.no_grad():
        for prompt in ([17, 42, 99], [5, 6, 7, 8], [9, 10]):
            caches.append((runner.forward_prompt(torch.tensor([prompt]), None, runner.new_cache()).past_key_values,
                           torch.ones(1, len(prompt), dtype=torch.long)))
    states = [[layer.recurrent_states[0].clone() for layer in c.layers if hasattr(layer, "recurrent_states")] for c, _ in caches]
    batch, mask = caches[0]
    for cache, own in caches[1:]:
        batch, mask = kv.join(batch, mask, cache, own, slots)
    held = [layer.recurrent_states[0] for layer in batch.layers if hasattr(layer, "recurrent_states")]
    assert all(slots.held(t) and t.shape[0] == 3 for t in held)
    for layer, tensor in enumerate(held):
        assert all(torch.equal(tensor[row], states[row][layer][0]) for row in range(3))
    batch, mask = kv.select(batch, mask, [0, 2], slots)  # the middle row leaves: the last moves up
    held = [layer.recurrent_states[0] for layer in batch.layers if hasattr(layer, "recurrent_states")]
    assert all(slots.held(t) and t.shape[0] == 2 for t in held)
    for layer, tensor in enumerate(held):
        assert torch.equal(tensor[0], states[0][layer][0]) and torch.equal(tensor[1], states[2][layer][0])
    assert kv.join(batch, mask, *caches[1], RecurrentSlots(2))[0] is not None  # beyond the rows: concatenated


def test_a_retained_context_keeps_its_recurrent_states_in_a_slot_and_answers_as_without(nano_model):
    """A streaming session's context, kept after its query (``retain_kv``): its linear-attention states wait in the
    retained slots, and its next query, which extends the context, answers as on an engine without slots."""
    first, more = [17, 42, 99, 123, 5, 6], [7, 8, 9]

    async def conversation(engine):
        await engine.apply(fx.NewMemory("s"))
        one = [e.token async for e in engine.query("r1", first, greedy(6), session="s", retain=True) if e.token is not None]
        kept = engine.store.sessions["s"].retained
        assert kept is not None and list(kept.acknowledged) == first + one
        two = [e.token async for e in engine.query("r2", first + one + more, greedy(6), session="s", retain=True)
               if e.token is not None]
        return one, two

    plain = TorchEngine(nano_model).start()
    slotted = TorchEngine(nano_model, memory_state_slots=slots_for(2, 1)).start()
    try:
        expected = asyncio.run(conversation(plain))
        assert asyncio.run(conversation(slotted)) == expected

        async def next_step():  # a step after the last one: the finished query has left, its context kept
            [e async for e in slotted.query("sync", [5, 6], greedy(1))]

        asyncio.run(next_step())
        retained = slotted.runner.retained
        assert retained.describe()["rows_used"] == 1 and retained.slabs  # the second query's context, kept
        handle = slotted.store.sessions["s"].retained.kv
        states = [t for _, d, i in retained._states(slotted.runner.caches[handle]) for t in [d[i]]]
        assert states and all(any(t.data_ptr() == slab[row:].data_ptr() for slab in retained.slabs.values()
                                  for row in range(retained.rows)) for t in states)

        async def let_go():
            await slotted.apply(fx.DropSession("s"))
            [e async for e in slotted.query("after", [5, 6], greedy(2))]  # its steps free what was let go

        asyncio.run(let_go())
        assert retained.describe()["rows_used"] == 0
    finally:
        plain.stop()
        slotted.stop()

"""``TorchEngine`` in-process (asyncio): continuous batching equals one-at-a-time generation, each row
reads its own session's memory, commits equal the in-process reference, cancel, max_new_tokens 0,
and Flash rows (caches that cannot be batched) still run concurrently.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from memt_core.engine import EngineOptions, TorchEngine
from memt_core.engine.torch_engine import COMPILED_PREFILL_TOKENS
from memt_core.inference import commit_tokens, generate
from memt_core.memory.state import MemoryState
from memt_core.protocol import effects as fx
from memt_core.sampling import SamplingParams

pytestmark = pytest.mark.timeout(300)

PROMPTS = [[17, 42, 99], [5, 6, 7, 8, 9, 10, 11], [300, 12] * 6, [77], list(range(100, 120))]
TURN_A = list(range(20, 60))
TURN_B = list(range(200, 260))


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0, skip_eos=True)


@pytest.fixture
def nano_engine(nano_model):
    engine = TorchEngine(nano_model, max_running_requests=16).start()
    yield engine
    engine.stop()


@pytest.fixture
def flash_engine(flash_model):
    engine = TorchEngine(flash_model, max_running_requests=16).start()
    yield engine
    engine.stop()


async def drain(events, log: list | None = None, tag=None) -> tuple[list[int], str]:
    """All tokens of one request and its finish reason (``log`` records (tag, token) arrivals)."""
    tokens, finish = [], None
    async for event in events:
        assert event.error is None, event.error
        if event.token is not None:
            tokens.append(event.token)
            if log is not None:
                log.append((tag, event.token))
        if event.finish_reason is not None:
            finish = event.finish_reason
    return tokens, finish


async def new_session(engine: TorchEngine, name: str, *turns: list[int]) -> None:
    """A session whose published memory holds ``turns``, made through the engine's own effects and commits."""
    await engine.apply(fx.NewMemory(name))
    if turns:
        await engine.apply(fx.ForkCandidate(name, transaction="t"))
        for i, turn in enumerate(turns):
            await engine.commit(name, "t", f"n{i}", turn)
        await engine.apply(fx.PublishCandidate(name, transaction="t"))


def settled(engine: TorchEngine, timeout: float = 10.0) -> bool:
    """Whether the worker reports no running request within ``timeout`` (it updates its gauges after
    posting the final events, so a reader can briefly see the previous value)."""
    deadline = time.monotonic() + timeout
    while engine.stats.running or engine.stats.waiting:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def reference(model, prompt, n, *turns):
    memory = MemoryState()
    with torch.no_grad():
        for turn in turns:
            memory = commit_tokens(model, memory, turn).memory
    return generate(model, prompt, memory=None if memory.is_empty else memory, params=greedy(n)).output_ids


def test_concurrent_queries_equal_one_at_a_time(nano_engine, nano_model):
    n = 10
    expected = [reference(nano_model, p, n) for p in PROMPTS]

    async def main():
        before = (nano_engine.stats.decode_steps, nano_engine.stats.decode_rows)
        results = await asyncio.gather(*(drain(nano_engine.query(f"r{i}", p, greedy(n))) for i, p in enumerate(PROMPTS)))
        steps = nano_engine.stats.decode_steps - before[0]
        rows = nano_engine.stats.decode_rows - before[1]
        return results, steps, rows

    results, steps, rows = asyncio.run(main())
    assert [tokens for tokens, _ in results] == expected
    assert all(finish == "length" for _, finish in results)
    assert rows == len(PROMPTS) * (n - 1)
    assert steps < rows, "decode steps should have been shared between rows"
    assert settled(nano_engine)


def test_each_row_reads_its_own_session_memory(nano_engine, nano_model):
    prompt, n = [17, 42, 99, 123], 10
    ref_a = reference(nano_model, prompt, n, TURN_A)
    ref_b = reference(nano_model, prompt, n, TURN_B)
    ref_none = reference(nano_model, prompt, n)
    assert len({tuple(ref_a), tuple(ref_b), tuple(ref_none)}) == 3

    async def main():
        await new_session(nano_engine, "a", TURN_A)
        await new_session(nano_engine, "b", TURN_B)
        await new_session(nano_engine, "empty")
        jobs = [
            nano_engine.query("qa", prompt, greedy(n), session="a"),
            nano_engine.query("qb", prompt, greedy(n), session="b"),
            nano_engine.query("qe", prompt, greedy(n), session="empty"),
            nano_engine.query("qa-off", prompt, greedy(n), session="a", memory_read=False),
            nano_engine.query("plain", prompt, greedy(n)),
        ]
        first = [tokens for tokens, _ in await asyncio.gather(*(drain(job) for job in jobs))]
        # swap the two sessions' published memories: their answers swap
        store = nano_engine.store.sessions
        store["a"].published, store["b"].published = store["b"].published, store["a"].published
        swapped = await asyncio.gather(
            drain(nano_engine.query("qa2", prompt, greedy(n), session="a")),
            drain(nano_engine.query("qb2", prompt, greedy(n), session="b")),
        )
        return first, [tokens for tokens, _ in swapped]

    first, swapped = asyncio.run(main())
    assert first == [ref_a, ref_b, ref_none, ref_none, ref_none]
    assert swapped == [ref_b, ref_a]


def test_a_row_that_takes_a_finished_rows_place_reads_its_own_memory(nano_model):
    """The batch's stacked memory read is kept across steps while its rows stay the same: when a query waiting
    for room joins as another finishes (the batch keeps its size), each row still reads its own session's memory."""
    prompt = [17, 42, 99, 123]
    engine = TorchEngine(nano_model, max_running_requests=2).start()
    try:
        async def main():
            await new_session(engine, "a", TURN_A)
            await new_session(engine, "b", TURN_B)
            jobs = [engine.query("short", prompt, greedy(2), session="a"), engine.query("long", prompt, greedy(10), session="b"),
                    engine.query("waiting", prompt, greedy(10), session="a")]
            return [tokens for tokens, _ in await asyncio.gather(*(drain(job) for job in jobs))]

        answers = asyncio.run(main())
    finally:
        engine.stop()
    assert answers == [reference(nano_model, prompt, 2, TURN_A), reference(nano_model, prompt, 10, TURN_B),
                       reference(nano_model, prompt, 10, TURN_A)]


def test_compiled_decode_gives_the_eager_answers(nano_model):
    """``--enable-torch-compile``: compiled before serving (one row and several, after prompts of one token and
    of more, and short prompts' prefills), then the same greedy tokens as the eager reference, alone and batched,
    with rows reading their own memory, another's, or none, and for prompts prefilled compiled (4 and 40 tokens)
    and eager (1 token, and one longer than ``COMPILED_PREFILL_TOKENS``); no request waits for the compiler."""
    prompt, n = [17, 42, 99, 123], 8
    longer = {size: [(7 * i + 3) % 500 + 5 for i in range(size)] for size in (40, COMPILED_PREFILL_TOKENS[1] + 20)}
    expected_longer = {size: reference(nano_model, ids, n, TURN_A) for size, ids in longer.items()}
    expected = {name: reference(nano_model, prompt, n, *turns) for name, turns in (("a", [TURN_A]), ("b", [TURN_B]), ("none", []))}
    one_token = {name: reference(nano_model, [17], n, *turns) for name, turns in (("a", [TURN_A]), ("none", []))}
    engine = TorchEngine(nano_model, max_running_requests=16, torch_compile=True)
    assert engine.compiled and engine.runner.decoder is not nano_model
    assert engine.runner.compile_options == {"cpp_wrapper": True}, "on the CPU the kernels are called from C++"
    engine.start()
    from torch._dynamo.utils import counters

    compiled_graphs = counters["stats"]["unique_graphs"]
    assert compiled_graphs > 0
    try:
        async def main():
            await new_session(engine, "a", TURN_A)
            await new_session(engine, "b", TURN_B)
            alone = await drain(engine.query("alone", prompt, greedy(n), session="a"))
            batched = await asyncio.gather(
                drain(engine.query("qa", prompt, greedy(n), session="a")),
                drain(engine.query("qb", prompt, greedy(n), session="b")),
                drain(engine.query("plain", prompt, greedy(n))),
            )
            short = [await drain(engine.query("one", [17], greedy(n), session="a"))]
            short += await asyncio.gather(drain(engine.query("one-a", [17], greedy(n), session="a")), drain(engine.query("one-none", [17], greedy(n))))
            long = {size: (await drain(engine.query(f"long-{size}", ids, greedy(n), session="a")))[0] for size, ids in longer.items()}
            return alone[0], [tokens for tokens, _ in batched], [tokens for tokens, _ in short], long

        alone, batched, short, long = asyncio.run(main())
    finally:
        engine.stop()
    assert alone == expected["a"]
    assert batched == [expected["a"], expected["b"], expected["none"]]
    assert short == [one_token["a"], one_token["a"], one_token["none"]]
    assert long == expected_longer
    assert engine.runner.prefill_compiled, "short prompts are prefilled by the compiled step"
    assert counters["stats"]["unique_graphs"] == compiled_graphs, "a request waited for the compiler"
    settings = TorchEngine.settings(EngineOptions(torch_compile=True))
    assert settings["torch_compile"] is True and settings["inductor_options"] == {"cpp_wrapper": True}
    assert TorchEngine.settings(EngineOptions())["inductor_options"] is None


def test_compiled_models_of_one_architecture_share_its_graphs_each_with_its_own_weights(nano_model, tmp_path):
    """The compiled step's guards leave out the model's modules, so a second model of the same architecture (other
    weights) is served by the graphs already compiled: with its own weights (its eager answers, not the first's),
    and nothing compiled again. A model of another architecture (another configuration, or the same one with
    another experts implementation) is refused before anything is compiled for it."""
    from memt_core.families import NANO
    from memt_core.models.weights import load_model
    from memt_core.tiny import make_tiny_checkpoint
    from torch._dynamo.utils import counters

    other = load_model(make_tiny_checkpoint(tmp_path / "other", NANO, seed=1))
    assert other.checkpoint.identity() == nano_model.checkpoint.identity()
    prompt, n = [17, 42, 99, 123], 8
    expected = {model: (reference(model, prompt, n, TURN_A), reference(model, prompt, n)) for model in (nano_model, other)}
    assert expected[nano_model] != expected[other], "the weights must change the answers for this test to tell them apart"

    first = TorchEngine(nano_model, torch_compile=True).start()
    compiled_graphs = counters["stats"]["unique_graphs"]
    second = TorchEngine(other, torch_compile=True).start()
    try:
        assert counters["stats"]["unique_graphs"] == compiled_graphs, "the second model's warm-up compiled again"

        async def answers(engine):
            await new_session(engine, "a", TURN_A)
            read, _ = await drain(engine.query("read", prompt, greedy(n), session="a"))
            plain, _ = await drain(engine.query("plain", prompt, greedy(n)))
            return read, plain

        async def main():
            return await asyncio.gather(answers(first), answers(second))

        found = asyncio.run(main())
    finally:
        first.stop()
        second.stop()
    assert found == [expected[nano_model], expected[other]]

    another = load_model(make_tiny_checkpoint(tmp_path / "another", NANO, chunk_tokens=16))
    assert another.checkpoint.identity() != nano_model.checkpoint.identity()
    other.backbone.set_experts_implementation("grouped_mm")  # the same checkpoint, another code path
    for refused in (another, other):
        with pytest.raises(RuntimeError, match="another architecture"):
            TorchEngine(refused, torch_compile=True).start()
    assert counters["stats"]["unique_graphs"] == compiled_graphs


def test_compiling_a_model_whose_rows_decode_alone_changes_nothing(flash_model):
    """Flash's caches are not batched: its one-row decode stays eager, and the engine starts and answers as before."""
    prompt, n = [17, 42, 99, 123], 6
    engine = TorchEngine(flash_model, torch_compile=True).start()
    try:
        async def main():
            return await drain(engine.query("q", prompt, greedy(n)))

        tokens, _ = asyncio.run(main())
    finally:
        engine.stop()
    assert tokens == reference(flash_model, prompt, n)


def test_torch_threads_reach_the_worker(nano_model):
    """``--torch-threads N``: the worker, which runs every prefill, decode step and commit, computes with N
    threads (torch's count is per thread: it takes the one set when the engine starts); answers are unchanged."""
    prompt, n = [17, 42, 99, 123], 4
    expected = reference(nano_model, prompt, n, TURN_A)
    caller = torch.get_num_threads()
    wanted = caller + 1  # differs from the default whatever the machine's cores
    seen: list[tuple[str, int]] = []
    hook = nano_model.register_forward_pre_hook(lambda module, args: seen.append((threading.current_thread().name, torch.get_num_threads())))
    engine = TorchEngine(nano_model, threads=wanted).start()
    try:
        async def main():
            await new_session(engine, "a", TURN_A)
            return await drain(engine.query("q", prompt, greedy(n), session="a"))

        tokens, _ = asyncio.run(main())
    finally:
        engine.stop()
        hook.remove()
        torch.set_num_threads(caller)
    assert tokens == expected
    assert seen and set(seen) == {("memt-engine", wanted)}
    assert TorchEngine.settings(EngineOptions(threads=3))["torch_threads"] == 3


def test_cpu_threads_leave_a_core_to_the_server_unless_told(monkeypatch):
    """Unset, ``--torch-threads`` on the CPU is one fewer than torch's default (at least 1): the server's own
    threads need a core; on a GPU, or with ``OMP_NUM_THREADS`` set, torch's default stands; a given count always stands."""
    from memt_core.engine.torch_engine import cpu_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    default = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        assert cpu_threads(EngineOptions()) == 3
        torch.set_num_threads(1)
        assert cpu_threads(EngineOptions()) == 1
    finally:
        torch.set_num_threads(default)
    assert cpu_threads(EngineOptions(threads=2)) == 2
    assert cpu_threads(EngineOptions(device="cuda")) is None
    assert cpu_threads(EngineOptions(device="cuda", threads=3)) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert cpu_threads(EngineOptions()) is None and cpu_threads(EngineOptions(threads=2)) == 2


def test_batched_commits_equal_single_commits(nano_engine, nano_model):
    turns = [TURN_A, TURN_B, list(range(5, 12)), list(range(300, 400))]  # 40, 60, 7, 100 tokens

    async def main():
        for i in range(len(turns)):
            await nano_engine.apply(fx.NewMemory(f"c{i}"))
            await nano_engine.apply(fx.ForkCandidate(f"c{i}", transaction="t"))
        infos = await asyncio.gather(*(nano_engine.commit(f"c{i}", "t", "n", turn) for i, turn in enumerate(turns)))
        return infos, [nano_engine.store.candidate(f"c{i}", "t") for i in range(len(turns))]

    infos, candidates = asyncio.run(main())
    assert [(info.tokens, info.write_events) for info in infos] == [(40, 2), (60, 2), (7, 1), (100, 4)]
    for turn, candidate in zip(turns, candidates):
        with torch.no_grad():
            expected = commit_tokens(nano_model, MemoryState(), turn).memory
        assert candidate.applied == ["n"]
        for layer in nano_model.memory_layers:
            torch.testing.assert_close(nano_engine.runner.memory(candidate.memory).get(layer), expected.get(layer), rtol=1e-4, atol=1e-5)


def test_cancel_by_rid(nano_engine):
    async def main():
        events = nano_engine.query("long", [1, 2, 3], greedy(100_000))
        other = asyncio.ensure_future(drain(nano_engine.query("short", [4, 5], greedy(6))))
        tokens = []
        async for event in events:
            if event.token is not None:
                tokens.append(event.token)
            if len(tokens) == 3 and event.token is not None:
                assert nano_engine.cancel("long") is True
            if event.finish_reason is not None:
                finish = event.finish_reason
                break
        short = await other
        return tokens, finish, short

    tokens, finish, short = asyncio.run(main())
    assert finish == "abort" and 3 <= len(tokens) < 100
    assert short[1] == "length" and len(short[0]) == 6  # the other row was not disturbed
    assert nano_engine.cancel("long") is False  # finished requests are forgotten
    assert nano_engine.cancel("never-existed") is False
    assert settled(nano_engine)


def test_cancel_before_admission_and_consumer_leaving(nano_engine):
    async def main():
        events = nano_engine.query("early", [1, 2, 3], greedy(50))
        nano_engine.cancel("early")
        early = await drain(events)
        # a consumer that stops reading cancels its request
        events = nano_engine.query("leaver", [1, 2, 3], greedy(100_000))
        async for event in events:
            if event.token is not None:
                break
        await events.aclose()
        while "leaver" in nano_engine._by_rid:  # the worker notices at its next step
            await asyncio.sleep(0.01)
        return early

    early = asyncio.run(main())
    assert early[1] == "abort" and len(early[0]) <= 1
    assert settled(nano_engine) and nano_engine.cancel("leaver") is False


def test_a_non_incremental_query_gets_its_tokens_with_the_last_event(nano_engine, nano_model):
    """``incremental=False``: the first token comes at once (it acknowledges the request), every later event
    only once the generation is over (one wake-up of the loop); the tokens are the incremental query's."""
    n = 12
    expected = reference(nano_model, PROMPTS[1], n)

    async def main():
        arrivals = []  # (token, whether the worker was still generating when the event arrived)
        async for event in nano_engine.query("held", PROMPTS[1], greedy(n), incremental=False):
            arrivals.append((event.token, "held" in nano_engine._by_rid))
        streamed = await drain(nano_engine.query("each", PROMPTS[1], greedy(n)))
        # a held query can still be cancelled, and its abort comes with the tokens made before it
        events = nano_engine.query("cancelled", [1, 2, 3], greedy(100_000), incremental=False)
        first = await anext(events)
        assert nano_engine.cancel("cancelled") is True
        rest = [event async for event in events]
        return arrivals, streamed, first, rest

    arrivals, streamed, first, rest = asyncio.run(main())
    assert [token for token, _ in arrivals if token is not None] == expected == streamed[0]
    assert all(not running for _, running in arrivals[1:]), "an event after the first arrived while generating"
    assert first.token is not None and rest[-1].finish_reason == "abort" and all(e.token is not None for e in rest[:-1])
    assert settled(nano_engine)


def test_max_new_tokens_zero(nano_engine):
    async def main():
        before = nano_engine.stats.prompt_tokens
        result = await drain(nano_engine.query("zero", [1, 2, 3], greedy(0)))
        return result, nano_engine.stats.prompt_tokens - before

    (tokens, finish), prefilled = asyncio.run(main())
    assert tokens == [] and finish == "length" and prefilled == 0


def test_stop_token_ids_and_eos(nano_engine, nano_model):
    full = reference(nano_model, PROMPTS[1], 12)
    stop = full[4]

    async def main():
        params = SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=(stop,))
        return await drain(nano_engine.query("stop", PROMPTS[1], params))

    tokens, finish = asyncio.run(main())
    assert finish == "stop" and tokens == full[: full.index(stop) + 1]


def test_flash_rows_run_concurrently(flash_engine, flash_model):
    n = 8
    prompts = PROMPTS[:3]
    expected = [reference(flash_model, p, n) for p in prompts]

    async def main():
        log: list = []
        results = await asyncio.gather(*(drain(flash_engine.query(f"f{i}", p, greedy(n)), log, i) for i, p in enumerate(prompts)))
        return results, log

    results, log = asyncio.run(main())
    assert [tokens for tokens, _ in results] == expected
    order = [tag for tag, _ in log]
    # no request ran to its end before the others started: their tokens interleave
    last_of = {tag: max(i for i, t in enumerate(order) if t == tag) for tag in range(len(prompts))}
    first_of = {tag: order.index(tag) for tag in range(len(prompts))}
    assert max(first_of.values()) < min(last_of.values()), order
    assert settled(flash_engine)


def test_flash_rows_read_their_own_memory(flash_engine, flash_model):
    prompt, n = [17, 42, 99, 123], 8
    ref_a = reference(flash_model, prompt, n, TURN_A)
    ref_b = reference(flash_model, prompt, n, TURN_B)
    assert ref_a != ref_b

    async def main():
        await new_session(flash_engine, "fa", TURN_A)
        await new_session(flash_engine, "fb", TURN_B)
        results = await asyncio.gather(
            drain(flash_engine.query("qa", prompt, greedy(n), session="fa")),
            drain(flash_engine.query("qb", prompt, greedy(n), session="fb")),
        )
        return [tokens for tokens, _ in results]

    assert asyncio.run(main()) == [ref_a, ref_b]

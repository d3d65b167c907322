"""The engine's warm-up (``memt_core.engine.warmup``): what it runs, and ``/health`` saying "warming up" until it is done."""

from __future__ import annotations

import asyncio
import threading

import pytest

from memt_core.engine import warmup
from memt_core.engine.warmup import WarmupPlan


def test_the_default_plan_is_buckets_on_a_gpu_and_nothing_on_a_cpu():
    assert warmup.default_lengths(100) == (1, 3, 7, 16, 17, 32, 33, 64, 65)
    assert warmup.default_lengths()[-3:] == (4096, 4097, 8192)
    assert warmup.default_batch_sizes(32) == (1, 2, 4, 8, 16, 32) and warmup.default_batch_sizes(12) == (1, 2, 4, 8, 12)
    assert warmup.plan("auto", "cpu", max_rows=32, context_length=32768) is None  # CPU servers start at once
    assert warmup.plan("off", "cuda", max_rows=32, context_length=32768) is None
    gpu = warmup.plan("auto", "cuda", max_rows=8, context_length=1000)
    assert gpu.lengths[-2:] == (512, 513) and gpu.batch_sizes == (1, 2, 4, 8)
    told = warmup.plan("on", "cpu", max_rows=4, context_length=1000, lengths=[40, 8, 8], batch_sizes=[1, 16])
    assert told == WarmupPlan(lengths=(8, 40), batch_sizes=(1,))  # batch sizes beyond the engine's rows are left out
    with pytest.raises(ValueError, match="one of auto, on, off"):
        warmup.plan("always", "cpu", max_rows=1, context_length=10)


def test_health_answers_warming_up_until_the_engine_ran_its_shapes(nano_checkpoint, tmp_path):
    """A server whose engine warms up answers 503 with its progress, then 200; a query sent meanwhile waits."""
    from fastapi.testclient import TestClient

    from memt_core.engine import EngineOptions, TorchEngine
    from memt_core.launch import assemble, build_parser, plan_launch
    from memt_core.models.weights import load_model

    args = build_parser().parse_args(["--model-path", str(nano_checkpoint), "--device", "cpu", "--warmup", "on",
                                      "--warmup-lengths", "3,17,40", "--warmup-batch-sizes", "1,2"])
    plan = plan_launch(args)
    options: EngineOptions = plan.engine_options()
    engine = TorchEngine(load_model(nano_checkpoint), warmup=warmup.plan(options.warmup, "cpu", max_rows=4, context_length=512,
                                                                          lengths=options.warmup_lengths, batch_sizes=options.warmup_batch_sizes))
    assert engine.warmup == WarmupPlan(lengths=(3, 17, 40), batch_sizes=(1, 2))
    release, reached = threading.Event(), threading.Event()
    original = engine.runner.forward_prompt

    def held(*a, **k):  # the warm-up's first prefill waits until the test has seen "warming up"
        reached.set()
        release.wait(60)
        return original(*a, **k)

    engine.runner.forward_prompt = held
    app, _ = assemble(plan, engine)
    with TestClient(app) as http:
        assert reached.wait(60)
        warming = http.get("/health")
        assert warming.status_code == 503
        assert "warming up" in warming.json()["error"]["message"] and "length 3" in warming.json()["error"]["message"]
        engine.runner.forward_prompt = original
        release.set()
        for _ in range(600):
            if http.get("/health").status_code == 200:
                break
            threading.Event().wait(0.05)
        assert http.get("/health").json() == {"status": "ok"}
        assert engine.ready and engine.warmup_progress()["phase"] == "done"
        assert engine.stats.prompt_tokens == 0 and engine.stats.commits == 0  # warm-up work is not counted as served


def test_a_query_sent_during_warm_up_is_answered_after_it(nano_model):
    from memt_core.engine import TorchEngine
    from memt_core.sampling import SamplingParams

    engine = TorchEngine(nano_model, warmup=WarmupPlan(lengths=(5, 33), batch_sizes=(1, 3)))
    engine.start()
    try:
        async def ask():
            params = SamplingParams(max_new_tokens=4, temperature=0, skip_eos=True)
            return [e.token async for e in engine.query("q", [4, 5, 6], params) if e.token is not None]

        assert len(asyncio.run(ask())) == 4 and engine.ready
    finally:
        engine.stop()

"""The engine seam: the native server runs over any ``Engine``, and streamed text costs O(1) decoding per token.

A pure-Python ``FakeEngine`` (``fake_engine.py``) is assembled into the real server by the launcher's
``assemble`` and served by uvicorn on 127.0.0.1; the tests speak the wire protocol over httpx.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from pathlib import Path

import httpx
import pytest
import uvicorn
from transformers import PreTrainedTokenizerFast

from e2e.servers import free_port
from e2e.wire import Wire, assert_error, metric, parse_frames, sse_frames
from fake_engine import FakeEngine
from memt_core.detokenize import decode_all
from memt_core.engine import ENGINES
from memt_core.launch import assemble, build_parser, plan_launch


class CountingTokenizer:
    """A real tokenizer that records the length of every ``decode`` call."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.decoded: list[int] = []

    def decode(self, ids, skip_special_tokens=False):
        self.decoded.append(len(ids))
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def encode(self, text, add_special_tokens=False):
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def get_vocab(self):
        return self.tokenizer.get_vocab()


class Served:
    """The assembled app on an ephemeral port, in a thread; stopped at the end of the test."""

    def __init__(self, app):
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> httpx.Client:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:  # set by uvicorn once the lifespan ran and the socket listens
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            self.thread.join(0.05)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60)
        return self.http

    def __exit__(self, *exc) -> None:
        self.http.close()
        self.server.should_exit = True
        self.thread.join(30)


@contextmanager
def serve_fake(checkpoint, state: Path, *flags: str):
    args = build_parser().parse_args(["--model-path", str(checkpoint), "--device", "cpu", "--state-directory", str(state), *flags])
    plan = plan_launch(args)
    engine = FakeEngine.load(plan.checkpoint, plan.engine_options())
    tokenizer = CountingTokenizer(PreTrainedTokenizerFast.from_pretrained(str(checkpoint)))
    app, _ = assemble(plan, engine, tokenizer=tokenizer)
    with Served(app) as http:
        yield Wire(http), engine, tokenizer


@pytest.fixture
def fake_server(nano_checkpoint, tmp_path):
    with serve_fake(nano_checkpoint, tmp_path) as served:
        yield served


def until(predicate, what: str, timeout: float = 60.0) -> None:
    """Wait for a state to be reached (polling the server), failing after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_native_routes_run_over_any_engine(fake_server):
    wire, engine, tokenizer = fake_server
    assert "fake" not in ENGINES  # registered nowhere: the server knows only the interface
    identity = wire.http.get("/memt/identity").json()
    assert identity["extra"]["engine"] == "memt-fake" and identity["sglang_version"] is None
    assert wire.capabilities["engine"] == {"name": "fake"}

    handle = wire.open()
    wire.write(handle, [11, 12], [13])
    assert engine.sessions[handle.session].published == (11, 12, 13)
    answer = wire.query(handle, [5], max_new_tokens=5)
    assert answer["output_ids"] == [11, 12, 13, 11, 12]  # generated from what was published
    assert answer["text"] == tokenizer.decode([11, 12, 13, 11, 12])

    exported = wire.export(handle, "seam.safetensors")
    wire.ctl("reset", handle)
    assert wire.query(handle, [5], max_new_tokens=3)["output_ids"] == [6, 7, 8]  # empty memory
    wire.ctl("begin", handle, transaction="t-import")
    wire.ctl("import", handle, transaction="t-import", file=exported.get("file", "seam.safetensors"), encoding=wire.encoding)
    wire.ctl("publish", handle, transaction="t-import")
    assert wire.query(handle, [5], max_new_tokens=3)["output_ids"] == [11, 12, 13]
    assert {"NewMemory", "ForkCandidate", "PublishCandidate", "ExportSnapshot", "ClearMemory", "ImportSnapshot"} <= set(engine.effects)

    metrics = wire.http.get("/metrics").text
    assert metric(metrics, "memt_commits_total") == 2 and metric(metrics, "memt_commit_tokens_total") == 3
    assert wire.http.get("/health").status_code == 200
    engine.stop()
    assert wire.http.get("/health").status_code == 503


def test_only_streams_and_stop_strings_ask_the_engine_for_each_token(fake_server):
    """A plain (non-streamed) answer without stop strings lets the engine hand over its tokens at the end."""
    wire, engine, tokenizer = fake_server
    handle = wire.open()
    wire.write(handle, tokenizer.encode("one two three four five six"))
    engine.incremental.clear()
    plain = wire.query(handle, [5], max_new_tokens=6)
    status, frames = sse_frames(wire.http, wire.query_body(handle, [5], 6, stream=True))
    assert status == 200 and parse_frames(frames)[-1]["output_ids"] == plain["output_ids"]
    stop = tokenizer.decode(plain["output_ids"][2:4])
    cut = wire.query(handle, [5], max_new_tokens=6, stop=[stop])
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop} and stop not in cut["text"]
    wire.plain([5], 4)
    wire.plain([5], 4, stop=["never said"])
    assert engine.incremental == [False, True, True, False, True]


def test_streaming_decodes_a_bounded_window_per_token(fake_server):
    wire, engine, tokenizer = fake_server
    handle = wire.open()
    sentence = tokenizer.encode("the quick brown fox jumps over the lazy dog, again and again. ")
    wire.write(handle, sentence)
    tokenizer.decoded.clear()
    status, frames = sse_frames(wire.http, wire.query_body(handle, [5], 1000, stream=True))
    assert status == 200
    bodies = parse_frames(frames)
    final = bodies[-1]
    assert len(final["output_ids"]) == 1000
    assert final["text"] == decode_all(tokenizer.tokenizer, final["output_ids"])
    texts = [body["text"] for body in bodies]
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:]))  # cumulative, append-only
    # O(1) per token: at most two short decodes per token, never the whole answer again
    assert len(tokenizer.decoded) <= 2 * 1000 + 2
    assert max(tokenizer.decoded) <= 4


def test_an_unacknowledged_commit_answers_503_and_its_receipt_stays_exact(nano_checkpoint, tmp_path):
    with serve_fake(nano_checkpoint, tmp_path, "--ack-timeout", "0.3") as (wire, engine, _):
        handle = wire.open()
        wire.ctl("begin", handle, transaction="t")
        engine.hold = threading.Event()  # the worker is stuck
        body = wire.commit_body(handle, "t", [4, 5, 6])
        assert_error(wire.post_generate(body), 503, match="did not acknowledge commit.*status, then recover")
        assert wire.ctl("status", handle)["receipts"]["t"]["commits"][0]["status"] == "pending"
        wire.ctl("recover", handle, expect=409)  # busy until the engine finishes the commit
        engine.hold.set()
        until(lambda: wire.ctl("status", handle)["in_flight"] == [], "the commit to finish")
        assert wire.ctl("status", handle)["receipts"]["t"]["commits"][0]["status"] == "applied"
        wire.ctl("recover", handle)
        wire.ctl("publish", handle, transaction="t")
        assert engine.sessions[handle.session].published == (4, 5, 6)


def test_a_query_the_engine_does_not_start_answers_503_and_is_cancelled(nano_checkpoint, tmp_path):
    with serve_fake(nano_checkpoint, tmp_path, "--ack-timeout", "0.3") as (wire, engine, _):
        handle = wire.open()
        engine.hold = threading.Event()
        assert_error(wire.post_generate(wire.query_body(handle, [5], 3)), 503, match="did not start request")
        status, frames = sse_frames(wire.http, wire.query_body(handle, [5], 3, stream=True))
        assert status == 503 and "did not start request" in frames[0]
        assert wire.ctl("status", handle)["in_flight"] == []  # nothing left running or holding the session
        engine.hold.set()
        assert wire.query(handle, [5], max_new_tokens=2)["output_ids"] == [6, 7]


def test_the_client_treats_a_503_to_a_write_as_uncertain_and_recovers(nano_checkpoint, tmp_path):
    """The spec's 503: worker communication failed or acknowledgement timed out; the session may be uncertain."""
    from memt_core.client import MemTClientError, NativeClient

    with serve_fake(nano_checkpoint, tmp_path, "--ack-timeout", "0.3") as (wire, engine, _):
        client = NativeClient(str(wire.http.base_url))
        session = client.control("create")["session"]
        lease = client.control("acquire", session)["lease"]
        client.control("begin", session, lease=lease, transaction="t")
        engine.hold = threading.Event()
        with pytest.raises(MemTClientError) as info:
            client.commit(session, lease, "t", [4, 5])
        assert info.value.uncertain is True and info.value.status == 503 and "uncertain" in info.value.message
        engine.hold.set()
        until(lambda: client.control("status", session, lease=lease)["in_flight"] == [], "the commit to land")
        receipt = client.control("status", session, lease=lease)["receipts"]["t"]
        assert [c["status"] for c in receipt["commits"]] == ["applied"]  # never replayed blindly: the receipt says it landed
        client.control("recover", session, lease=lease)
        client.control("publish", session, lease=lease, transaction="t")
        with pytest.raises(MemTClientError) as refused:
            client.control("begin", session, lease="wrong", transaction="t2")
        assert refused.value.uncertain is False and refused.value.status == 409  # other errors stay certain
        client.close()

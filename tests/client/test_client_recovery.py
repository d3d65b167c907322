"""Uncertain writes: a commit whose response is lost after it landed, and a server killed while a
commit is in flight. Live servers; the failures are produced on the real connection.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from client.scripted import ANSWERS, PLAIN_FIRST, PLAIN_SECOND
from client.support import API_KEY, Live, RecordingTransport
from e2e.wire import metric
from safetensors import safe_open

from memt_core.client import MemTClientError, MemTSession, NativeClient, load_chat_format, load_tokenizer

pytestmark = pytest.mark.timeout(300)


def _commits_applied(live: Live) -> float:
    with live.server.client() as http:
        return metric(http.get("/metrics").text, "memt_commits_total")


def _snapshot(path) -> tuple[dict, dict]:
    with safe_open(str(path), "pt") as f:
        return f.metadata(), {name: f.get_tensor(name) for name in f.keys()}


def _two_turns(session: MemTSession) -> list[list[int]]:
    first = session.chat(PLAIN_FIRST, max_new_tokens=32, return_dict=True)
    second = session.chat(PLAIN_SECOND, max_new_tokens=32, return_dict=True)
    assert (first["answer"], second["answer"]) == (ANSWERS["first"], ANSWERS["second"])
    return [first["output_ids"], second["output_ids"]]


def test_lost_commit_response_is_recovered_from_receipts(live: Live):
    """The first commit reaches the server and lands, but its response never reaches the client.

    The transport forwards the request to the real server, waits for the real response, closes it
    and raises ``httpx.ReadError`` instead — what a connection dropped at that moment looks like.
    The client must report the write as uncertain, ``status()`` must show the receipt as applied,
    and ``recover()`` must publish without sending that commit again. Memory then equals that of a
    clean session that committed the same turns once (exported snapshots compared tensor by tensor).
    """
    # A clean session: the same two turns, committed once.
    clean_client, _ = live.client()
    with live.session(clean_client) as clean:
        clean_outputs = _two_turns(clean)
        clean.commit_history()
        clean_snapshot = clean.save_state(f"clean-{live.family}.safetensors")["path"]

    client, rec = live.client()
    lost = []

    def lose_first_commit_response(record, response: httpx.Response) -> None:
        if record.operation == "commit" and not lost:
            response.read()
            response.close()
            lost.append(record.body["rid"].split("|")[3])
            raise httpx.ReadError("connection reset after the commit was sent (test)")

    session = live.session(client)
    assert _two_turns(session) == clean_outputs  # same prompts, same greedy replies
    before = _commits_applied(live)
    rec.after = lose_first_commit_response
    mark = rec.mark()
    with pytest.raises(MemTClientError) as info:
        session.commit_history()
    error = info.value
    assert error.uncertain is True and error.stage == "commit" and error.transaction
    assert rec.since(mark) == ["acquire", "begin", "commit"]  # stopped at the uncertain write; lease kept
    transaction = error.transaction

    # Further writes are refused until the outcome is reconciled; nothing is sent.
    mark = rec.mark()
    for attempt in (lambda: session.chat("More?", max_new_tokens=2), session.commit_history, session.save_state):
        with pytest.raises(MemTClientError) as refused:
            attempt()
        assert refused.value.uncertain and "recover" in str(refused.value)
    assert rec.since(mark) == []

    status = session.status()
    assert rec.since(mark) == ["status"]  # with the kept lease
    assert status["uncertain"] is True and status["uncertain_stage"] == "commit"
    assert status["uncertain_transaction"] == transaction and status["uncommitted_turns"] == 2
    receipt = status["receipts"][transaction]
    assert receipt["state"] == "open"
    assert [(c["nonce"], c["status"]) for c in receipt["commits"]] == [(lost[0], "applied")]

    mark = rec.mark()
    result = session.recover()
    assert rec.since(mark) == ["recover", "status", "commit", "publish", "release"]
    assert result["state"] == "published" and result["landed_commits"] == 1 and result["resent_commits"] == 1
    assert result["committed_turns"] == [1, 2]
    sent = [r.body["rid"].split("|")[3] for r in rec.records if r.operation == "commit"]
    assert len(sent) == 2 and sent[0] == lost[0] and sent[1] != lost[0]  # the landed commit was not resent
    assert _commits_applied(live) - before == 2  # each turn written exactly once
    assert session.messages == [] and session.status()["uncertain"] is False

    receipt = session.status()["receipts"][transaction]
    assert receipt["state"] == "published" and [c["status"] for c in receipt["commits"]] == ["applied", "applied"]
    recovered_snapshot = session.save_state(f"recovered-{live.family}.safetensors")["path"]
    session.close()

    clean_meta, clean_tensors = _snapshot(live.server.state_directory / clean_snapshot)
    meta, tensors = _snapshot(live.server.state_directory / recovered_snapshot)
    assert meta == clean_meta and clean_tensors.keys() == tensors.keys() and tensors
    for name, tensor in tensors.items():
        assert tensor.equal(clean_tensors[name]), name
    # and nothing of it is a default: memory was really written
    assert any(t.abs().sum() > 0 for t in tensors.values())


def test_recover_without_uncertainty_does_nothing(live_nano: Live):
    client, rec = live_nano.client()
    with live_nano.session(client) as session:
        mark = rec.mark()
        assert session.recover() == {"recovered": False, "reason": "nothing uncertain"}
        assert rec.since(mark) == []


def test_server_killed_during_a_commit(keyed_server, long_chunk_checkpoint):
    """SIGKILL while an ingestion commit runs: the client reports an uncertain write, and after the
    crash the old session cannot be reached (a new epoch needs a new session and a snapshot)."""
    tokenizer = load_tokenizer(long_chunk_checkpoint)
    chat_format, parser = load_chat_format(long_chunk_checkpoint, tokenizer=tokenizer)
    rec = RecordingTransport()
    client = NativeClient(keyed_server.url, api_key=API_KEY, transport=rec)
    session = MemTSession(client, chat_format, parser)
    assert session.chunk_tokens == 4096
    words = "The quick brown fox jumps over the lazy dog and a small town by the sea. "
    document = words * 400
    total = len(chat_format.document_ids(document))
    assert total > session.chunk_tokens  # two commits, the first of 4096 tokens

    killed = threading.Event()

    def kill_when_a_commit_is_in_flight() -> None:
        with keyed_server.client(timeout=5) as http:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if metric(http.get("/metrics").text, "memt_inflight_commits") >= 1:
                        keyed_server.kill()
                        killed.set()
                        return
                except httpx.HTTPError:
                    return
                time.sleep(0.005)

    progress = []
    watcher = threading.Thread(target=kill_when_a_commit_is_in_flight, daemon=True)
    watcher.start()
    try:
        with pytest.raises(MemTClientError) as info:
            session.ingest(document, progress=lambda done, n: progress.append((done, n)))
    finally:
        watcher.join(30)
    assert killed.is_set(), "the commit finished before the watcher saw it in flight"
    error = info.value
    assert error.uncertain is True and error.stage == "commit" and error.transaction
    assert "uncertain" in str(error) and "recover" in str(error)
    assert progress[0] == (0, 2)
    assert rec.since(0)[-3:] == ["acquire", "begin", "commit"]
    status_error = None
    try:
        session.status()
    except MemTClientError as exc:
        status_error = exc
    assert status_error is not None and not status_error.uncertain  # cannot connect: nothing was sent
    client.close()

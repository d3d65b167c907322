"""Server restarts: a new epoch refuses old requests; snapshots survive a restart and a SIGKILL in the
middle of a commit — every ``*.safetensors`` left in the state directory is whole and imports, and
temporary files are only ever ``.tmp-*.partial``.
"""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest
from e2e.servers import MemTServer
from e2e.wire import Wire, assert_error, metric, unique
from safetensors import safe_open

pytestmark = pytest.mark.timeout(400)

PROMPT = [17, 42, 99, 123, 7]
TURN = list(range(20, 60))
OTHER_TURN = list(range(200, 230))
LONG_COMMIT = 16000


@pytest.fixture(scope="module")
def server(nano_checkpoint, tmp_path_factory):
    server = MemTServer(nano_checkpoint, state_directory=tmp_path_factory.mktemp("restart-state")).start()
    yield server
    server.close()


def tensors(path) -> tuple[dict, dict]:
    with safe_open(str(path), framework="numpy") as handle:
        return handle.metadata(), {name: handle.get_tensor(name) for name in handle.keys()}


def test_restart_new_epoch_refuses_old_requests_and_snapshot_restores(server):
    with server.client() as http:
        wire = Wire(http)
        h = wire.open()
        wire.write(h, TURN, OTHER_TURN)
        remembered = wire.query(h, PROMPT, 16)["output_ids"]
        assert remembered != wire.plain(PROMPT, 16)["output_ids"]
        wire.export(h, "keep.safetensors")
        old_epoch = wire.epoch

    server.restart()

    with server.client() as http:
        wire = Wire(http)
        assert wire.epoch != old_epoch
        stale = {"session": h.session, "lease": h.lease, "epoch": old_epoch}
        for action, fields in [("begin", {"transaction": "t"}), ("inspect", {}), ("renew", {}), ("close", {}),
                               ("export", {"encoding": wire.encoding})]:
            body = {"action": action, **stale, **fields}
            if action == "inspect":
                body.pop("lease")
            assert_error(wire.post_control(body), 409, match="epoch")
        query = wire.query_body(h, PROMPT, 4)
        assert_error(wire.post_generate({**query, "memt_epoch": old_epoch}), 409, match="epoch")
        assert_error(wire.post_generate({k: v for k, v in query.items() if k != "memt_epoch"}), 409)  # the session is gone
        assert_error(wire.post_control({"action": "create", "session": unique(), "epoch": old_epoch}), 409, match="epoch")

        # the snapshot exported before the restart restores the same memory: same tensors, same answers
        restored = wire.open()
        wire.ctl("begin", restored, transaction="restore")
        wire.ctl("import", restored, transaction="restore", file="keep.safetensors", encoding=wire.encoding)
        wire.ctl("publish", restored, transaction="restore")
        assert wire.query(restored, PROMPT, 16)["output_ids"] == remembered
        wire.export(restored, "again.safetensors")
        meta_before, before = tensors(server.state_directory / "keep.safetensors")
        meta_after, after = tensors(server.state_directory / "again.safetensors")
        assert meta_before == meta_after and meta_before["format"] == "memt-memory-v1"
        assert sorted(before) == sorted(after) == ["memory.1", "memory.3"]
        for name in before:
            assert before[name].dtype == after[name].dtype and (before[name] == after[name]).all(), name
        wire.close_all()


def test_sigkill_during_commit_leaves_only_whole_snapshots(server):
    state = server.state_directory
    with server.client() as http:
        wire = Wire(http)
        a = wire.open()
        b = wire.open()
        wire.write(a, TURN)
        wire.write(b, OTHER_TURN)
        written: dict[str, bytes] = {}
        for handle, file in ((a, "before-a.safetensors"), (b, "before-b.safetensors")):
            wire.export(handle, file)
            written[file] = (state / file).read_bytes()
        wire.ctl("begin", a, transaction="long")
        commit = wire.commit_body(a, "long", [(i * 7) % 400 + 10 for i in range(LONG_COMMIT)])
        epoch = wire.epoch

    outcome: dict = {}
    churned: list[str] = []
    stop = threading.Event()

    def long_commit():
        try:
            with server.client() as client:
                outcome["response"] = client.post("/generate", json=commit)
        except httpx.HTTPError as exc:
            outcome["error"] = exc

    def churn():
        """Export snapshots (new names and overwrites) from another session while the commit runs."""
        with server.client(timeout=10) as client:
            for i in range(200):
                if stop.is_set():
                    return
                for file, overwrite in ((f"churn-{i}.safetensors", False), ("churn.safetensors", True)):
                    body = {"action": "export", "session": b.session, "lease": b.lease, "epoch": epoch,
                            "encoding": "hf-chat-template", "file": file, "overwrite": overwrite}
                    try:
                        if client.post("/memt/control", json=body).status_code == 200 and not overwrite:
                            churned.append(file)
                    except httpx.HTTPError:
                        return
                time.sleep(0.01)

    committer = threading.Thread(target=long_commit)
    churner = threading.Thread(target=churn)
    committer.start()
    churner.start()
    with server.client() as http:
        deadline = time.monotonic() + 60
        while metric(http.get("/metrics").text, "memt_inflight_commits") < 1:
            assert time.monotonic() < deadline, "the long commit never started"
            time.sleep(0.02)
        while len(churned) < 2:  # a round of exports (a new name, then the overwrite) ran beside the commit in flight
            assert time.monotonic() < deadline, "no round of exports ran while the commit was in flight"
            time.sleep(0.02)
    server.kill()
    stop.set()
    committer.join(60)
    churner.join(60)
    assert "response" not in outcome, "the commit finished before the kill; make it longer"
    assert isinstance(outcome.get("error"), httpx.HTTPError)
    assert churned, "no export ran while the commit was in flight"

    server.start()
    names = sorted(p.name for p in state.iterdir())
    snapshots = [n for n in names if n.endswith(".safetensors")]
    others = [n for n in names if not n.endswith(".safetensors")]
    assert all(re.fullmatch(r"\.tmp-.+\.partial", n) for n in others), others
    assert not [n for n in snapshots if n.startswith(".")]
    for file, data in written.items():
        assert (state / file).read_bytes() == data, file
    for file in churned:
        assert file in snapshots, file
    assert "churn.safetensors" in snapshots
    with server.client() as http:
        wire = Wire(http)
        for file in snapshots:
            metadata, loaded = tensors(state / file)
            assert metadata["format"] == "memt-memory-v1" and sorted(loaded) in ([], ["memory.1", "memory.3"]), file
            h = wire.open()
            wire.ctl("begin", h, transaction="t")
            wire.ctl("import", h, transaction="t", file=file, encoding=wire.encoding)
            wire.ctl("publish", h, transaction="t")
            wire.ctl("close", h)
            wire.opened.remove(h)
        # the interrupted commit left nothing behind: the session is gone with the old epoch
        assert_error(wire.post_control({"action": "inspect", "session": a.session, "epoch": epoch}), 409, match="epoch")
        wire.control("inspect", a.session, expect=409)

"""SessionRecordStore: the on-disk record of what each session's memory holds, matched by published_version."""

from __future__ import annotations

import json
import logging

import pytest

from memt_proxy.session.store import SessionRecordStore
from memt_proxy.session.transcript import HASH_SCHEME, LEGACY

A, B, C = "a" * 64, "b" * 64, "c" * 64


def test_a_record_answers_for_the_current_and_the_next_version(tmp_path):
    store = SessionRecordStore(tmp_path / "state")
    store.save("p-1", 3, [A, B], [A, B, C])
    assert store.load("p-1", 3) == [A, B]  # the change never landed (e.g. the proxy died before publish)
    assert store.load("p-1", 4) == [A, B, C]  # it landed, the proxy died before it learnt so
    assert store.load("p-1", 5) is None  # memory changed by someone else: unknown
    assert store.load("p-2", 3) is None
    store.save("p-1", 4, [A, B, C], [])
    assert store.load("p-1", 3) is None and store.load("p-1", 5) == []


def test_an_unknown_current_history_is_never_answered(tmp_path):
    store = SessionRecordStore(tmp_path)
    store.save("p-1", 0, None, [])
    assert store.load("p-1", 0) is None and store.load("p-1", 1) == []


def test_files_are_replaced_whole_and_deleted(tmp_path):
    store = SessionRecordStore(tmp_path)
    store.save("p-1", 0, [], [A])
    store.save("p-1", 1, [A], [A, B])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p-1.json"]  # no temporary files left behind
    assert json.loads((tmp_path / "p-1.json").read_text())["next"] == {"version": 2, "committed": [A, B]}
    store.delete("p-1")
    store.delete("p-1")  # deleting what is gone is fine
    assert not list(tmp_path.iterdir())


def test_unreadable_records_count_as_unknown(tmp_path, caplog):
    store = SessionRecordStore(tmp_path)
    for text in ("{not json", json.dumps({"version": 1}), json.dumps({"version": 1, "committed": [1, 2], "next": {"version": 2, "committed": []}})):
        (tmp_path / "p-1.json").write_text(text)
        with caplog.at_level(logging.WARNING, logger="memt.proxy"):
            assert store.load("p-1", 1) is None
    assert len([r for r in caplog.records if "unreadable session record" in r.message]) == 3


def test_without_a_directory_nothing_is_kept(tmp_path):
    store = SessionRecordStore(None)
    store.save("p-1", 0, [], [A])
    assert store.load("p-1", 1) is None
    store.delete("p-1")




PENDING = {"hashes": [A, B], "ids": [5, 6, 7], "thinking": False}


def test_a_pending_tool_turn_is_kept_at_its_version(tmp_path):
    store = SessionRecordStore(tmp_path)
    store.save("p-1", 2, [A], [A, B])
    store.save_pending("p-1", 3, [A, B], PENDING)
    assert store.load_pending("p-1", 3) == PENDING
    assert store.load_pending("p-1", 4) is None  # memory changed since: the turn it waited in is gone
    assert store.load("p-1", 3) == [A, B]  # the committed history is kept beside it
    store.save("p-1", 3, [A, B], [A, B, C])  # a change of memory ends it
    assert store.load_pending("p-1", 3) is None and store.load_pending("p-1", 4) is None
    store.save_pending("p-1", 4, [A, B, C], PENDING)
    store.save_pending("p-1", 4, [A, B, C], None)  # abandoned
    assert store.load_pending("p-1", 4) is None and store.load("p-1", 4) == [A, B, C]


def test_a_pending_turn_of_a_session_without_commits(tmp_path):
    store = SessionRecordStore(tmp_path)
    store.save_pending("p-1", 0, [], PENDING)
    assert store.load("p-1", 0) == [] and store.load_pending("p-1", 0) == PENDING
    assert store.load("p-1", 1) is None


def test_a_malformed_pending_turn_is_ignored(tmp_path, caplog):
    store = SessionRecordStore(tmp_path)
    for bad in ({"version": 0, "hashes": [A], "ids": ["x"], "thinking": False}, {"version": 0, "hashes": [A], "ids": [1]},
                {"version": 0, "hashes": [1], "ids": [1], "thinking": True}):
        (tmp_path / "p-1.json").write_text(json.dumps({"version": 0, "committed": [], "next": None, "pending": bad}))
        with caplog.at_level(logging.WARNING, logger="memt.proxy"):
            assert store.load_pending("p-1", 0) is None
        assert store.load("p-1", 0) == []  # the rest of the record still answers
    assert len([r for r in caplog.records if "pending turn" in r.message]) == 3


def test_without_a_directory_no_pending_turn_is_kept(tmp_path):
    store = SessionRecordStore(None)
    store.save_pending("p-1", 0, [], PENDING)
    assert store.load_pending("p-1", 0) is None


def test_offload_records_on_disk(tmp_path):
    """An offloaded session's record says where its memory is and what it holds; forgetting removes it."""
    store = SessionRecordStore(tmp_path)
    assert store.load_offload("p-a") is None
    pending = {"hashes": ["h3"], "ids": [1, 2], "thinking": False}
    store.save_offload("p-a", "sha256-" + "0" * 64 + ".safetensors", ["h1", "h2"], pending)
    again = SessionRecordStore(tmp_path)  # a restarted proxy reads it back
    assert again.load_offload("p-a") == {"file": "sha256-" + "0" * 64 + ".safetensors", "committed": ["h1", "h2"], "pending": pending}
    assert store.load("p-a", 0) is None  # apart from the session's own record
    again.forget_offload("p-a")
    assert store.load_offload("p-a") is None and not list(tmp_path.iterdir())


@pytest.mark.parametrize("record", [
    {"file": "../x.safetensors", "committed": [], "pending": None},
    {"file": "x.safetensors", "committed": [1], "pending": None},
    {"file": "x.safetensors", "committed": None, "pending": {"ids": []}},
    ["not", "an", "object"],
])
def test_unreadable_offload_records_are_ignored(tmp_path, record):
    (tmp_path / "p-a.offload.json").write_text(json.dumps(record))
    assert SessionRecordStore(tmp_path).load_offload("p-a") is None


def test_offload_records_in_memory_are_bounded(monkeypatch):
    """Without a directory the newest MEMORY_OFFLOADS records are kept; older ones are forgotten."""
    monkeypatch.setattr("memt_proxy.session.store.MEMORY_OFFLOADS", 3)
    store = SessionRecordStore(None)
    for number in range(5):
        store.save_offload(f"p-{number}", f"f{number}.safetensors", None, None)
    assert [store.load_offload(f"p-{n}") is not None for n in range(5)] == [False, False, True, True, True]
    store.forget_offload("p-4")
    assert store.load_offload("p-4") is None


def test_a_session_is_known_by_its_record_or_its_offload_record(tmp_path):
    """``known``: a session's memory may hold something (so it is made before its first answer here)."""
    store, shared = SessionRecordStore(tmp_path / "state"), SessionRecordStore(tmp_path / "state2", tmp_path / "records")
    assert not store.known("p-a") and not shared.known("p-a")
    store.save("p-a", 0, [], [A])
    store.save_offload("p-b", "sha256-" + "0" * 64 + ".safetensors", None, None)
    shared.save("p-c", 0, [], [A])  # by another proxy of a cluster
    assert store.known("p-a") and store.known("p-b") and SessionRecordStore(tmp_path / "x", tmp_path / "records").known("p-c")
    store.delete("p-a")
    assert not store.known("p-a")
    memory = SessionRecordStore(None)
    memory.save_offload("p-d", "sha256-" + "0" * 64 + ".safetensors", [], None)
    assert memory.known("p-d") and not memory.known("p-a")


# ---------------------------------------------------------------------- hash schemes (memt_proxy.session.transcript)


def test_records_are_written_with_their_hash_scheme(tmp_path):
    store = SessionRecordStore(tmp_path)
    store.save("p-1", 0, [], [A])
    store.save_pending("p-2", 0, [], PENDING)
    store.save_offload("p-3", "sha256-" + "0" * 64 + ".safetensors", [A], None)
    for name in ("p-1.json", "p-2.json", "p-3.offload.json"):
        assert json.loads((tmp_path / name).read_text())["hash_scheme"] == HASH_SCHEME == 2


def test_a_scheme_one_record_is_read_with_its_hashes_tagged_and_written_again_as_scheme_two(tmp_path):
    """A record a proxy before hash scheme 2 wrote (no "hash_scheme"): its hashes come back tagged, to be matched with
    the old function; the next write keeps them so, under the current scheme."""
    old = {"version": 3, "committed": [A], "next": {"version": 4, "committed": [A, B]},
           "pending": {"version": 3, "hashes": [A, C], "ids": [1], "thinking": False}}
    (tmp_path / "p-1.json").write_text(json.dumps(old))
    store = SessionRecordStore(tmp_path)
    assert store.load("p-1", 3) == [LEGACY + A] and store.load("p-1", 4) == [LEGACY + A, LEGACY + B]
    assert store.load_pending("p-1", 3) == {"hashes": [LEGACY + A, LEGACY + C], "ids": [1], "thinking": False}
    store.save_pending("p-1", 3, None, None)  # rewrites the record around its committed hashes
    record = json.loads((tmp_path / "p-1.json").read_text())
    assert record["hash_scheme"] == HASH_SCHEME and record["committed"] == [LEGACY + A] and "pending" not in record
    assert store.load("p-1", 4) == [LEGACY + A, LEGACY + B]  # tagged once, not twice
    store.save("p-1", 4, [LEGACY + A, LEGACY + B], [A, B, C])
    assert store.load("p-1", 5) == [A, B, C]


def test_a_scheme_one_offload_record_is_read_with_its_hashes_tagged(tmp_path):
    file = "sha256-" + "0" * 64 + ".safetensors"
    (tmp_path / "p-a.offload.json").write_text(json.dumps({"file": file, "committed": [A], "pending": {"hashes": [B], "ids": [1], "thinking": True}}))
    assert SessionRecordStore(tmp_path).load_offload("p-a") == {
        "file": file, "committed": [LEGACY + A], "pending": {"hashes": [LEGACY + B], "ids": [1], "thinking": True},
    }


def test_a_record_of_an_unknown_hash_scheme_counts_as_unknown(tmp_path, caplog):
    for scheme in (3, "2", True):
        (tmp_path / "p-1.json").write_text(json.dumps({"version": 0, "committed": [A], "next": None, "hash_scheme": scheme}))
        with caplog.at_level(logging.WARNING, logger="memt.proxy"):
            assert SessionRecordStore(tmp_path).load("p-1", 0) is None
    assert len([r for r in caplog.records if "unknown scheme" in r.message]) == 3

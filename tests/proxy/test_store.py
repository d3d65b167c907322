"""SessionStore: the on-disk record of what each session's memory holds, matched by published_version."""

from __future__ import annotations

import json
import logging

from memt_proxy.store import SessionStore

A, B, C = "a" * 64, "b" * 64, "c" * 64


def test_a_record_answers_for_the_current_and_the_next_version(tmp_path):
    store = SessionStore(tmp_path / "state")
    store.save("p-1", 3, [A, B], [A, B, C])
    assert store.load("p-1", 3) == [A, B]  # the change never landed (e.g. the proxy died before publish)
    assert store.load("p-1", 4) == [A, B, C]  # it landed, the proxy died before it learnt so
    assert store.load("p-1", 5) is None  # memory changed by someone else: unknown
    assert store.load("p-2", 3) is None
    store.save("p-1", 4, [A, B, C], [])
    assert store.load("p-1", 3) is None and store.load("p-1", 5) == []


def test_an_unknown_current_history_is_never_answered(tmp_path):
    store = SessionStore(tmp_path)
    store.save("p-1", 0, None, [])
    assert store.load("p-1", 0) is None and store.load("p-1", 1) == []


def test_files_are_replaced_whole_and_deleted(tmp_path):
    store = SessionStore(tmp_path)
    store.save("p-1", 0, [], [A])
    store.save("p-1", 1, [A], [A, B])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p-1.json"]  # no temporary files left behind
    assert json.loads((tmp_path / "p-1.json").read_text())["next"] == {"version": 2, "committed": [A, B]}
    store.delete("p-1")
    store.delete("p-1")  # deleting what is gone is fine
    assert not list(tmp_path.iterdir())


def test_unreadable_records_count_as_unknown(tmp_path, caplog):
    store = SessionStore(tmp_path)
    for text in ("{not json", json.dumps({"version": 1}), json.dumps({"version": 1, "committed": [1, 2], "next": {"version": 2, "committed": []}})):
        (tmp_path / "p-1.json").write_text(text)
        with caplog.at_level(logging.WARNING, logger="memt.proxy"):
            assert store.load("p-1", 1) is None
    assert len([r for r in caplog.records if "unreadable session record" in r.message]) == 3


def test_without_a_directory_nothing_is_kept(tmp_path):
    store = SessionStore(None)
    store.save("p-1", 0, [], [A])
    assert store.load("p-1", 1) is None
    store.delete("p-1")



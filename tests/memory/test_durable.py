"""The directory snapshot store: latest version per session, atomic manifests, identity and hash checks, no going back."""

from __future__ import annotations

import os

import pytest
import torch

from memt_core.checkpoint import read_checkpoint
from memt_core.errors import SnapshotError
from memt_core.memory.durable import DirectorySnapshotStore
from memt_core.memory.state import MemoryState


@pytest.fixture
def store(nano_checkpoint, tmp_path):
    checkpoint = read_checkpoint(nano_checkpoint)
    memory = checkpoint.memory
    return DirectorySnapshotStore(tmp_path / "store", identity=checkpoint.identity(), layers=memory.memory_layers, shape=memory.state_shape())


def state(store, seed: int) -> MemoryState:
    gen = torch.Generator().manual_seed(seed)
    return MemoryState({layer: torch.randn(store.shape, generator=gen) for layer in store.layers})


def test_latest_version_round_trip(store):
    assert store.latest("s") is None
    first = store.save("s", 1, state(store, 1))
    second = store.save("s", 2, state(store, 2))
    assert store.latest("s") == second and second.version == 2 and first.file != second.file
    assert store.load(store.latest("s")).equal(state(store, 2))
    assert not [name for name in os.listdir(store.root / "sessions") if name.startswith(".tmp-")]


def test_equal_memory_is_written_again_whatever_another_session_stored(store):
    """Equal memories share one blob, but a publish writes it whether or not another session (of any tenant) stored the
    same bytes before: its cost is no timing channel across sessions (issue 58 item 6; it used to skip the write)."""
    first = store.save("a", 1, state(store, 7))
    path = store.root / "blobs" / first.file
    before = path.stat().st_ino
    second = store.save("b", 1, state(store, 7))
    assert second.file == first.file  # one blob
    assert path.stat().st_ino != before  # written again (a new file renamed over it), not skipped
    assert store.load(second).equal(state(store, 7))


def test_a_version_is_never_written_over_a_newer_one(store):
    store.save("s", 3, state(store, 3))
    for stale in (3, 2):
        with pytest.raises(SnapshotError, match="already holds version 3"):
            store.save("s", stale, state(store, 9))
    assert store.load(store.latest("s")).equal(state(store, 3))


def test_identity_and_content_are_checked(store, tmp_path):
    stored = store.save("s", 1, state(store, 1))
    other = DirectorySnapshotStore(store.root, identity="another-model", layers=store.layers, shape=store.shape)
    with pytest.raises(SnapshotError, match="another model/tokenizer identity"):
        other.latest("s")
    blob = store.root / "blobs" / stored.file
    blob.write_bytes(blob.read_bytes()[:-1] + b"\x00")
    with pytest.raises(SnapshotError, match="does not hold the content"):
        store.load(stored)


def test_forget_and_bad_names(store):
    store.save("s", 1, MemoryState())
    store.forget("s")
    store.forget("never-there")
    assert store.latest("s") is None
    with pytest.raises(Exception, match="must match"):
        store.latest("../escape")
    (store.root / "sessions" / "broken.json").write_text("{not json")
    with pytest.raises(SnapshotError, match="unreadable"):
        store.latest("broken")

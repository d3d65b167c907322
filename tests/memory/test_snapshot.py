"""memt-memory-v1 snapshot files: bit-exact round trips, and every refusal with its message."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from memt_core.checkpoint import SNAPSHOT_FORMAT, read_checkpoint
from memt_core.errors import Conflict, InvalidRequest, SnapshotError
from memt_core.inference import MemTRuntime, memory_batch
from memt_core.memory.snapshot import content_name, load_snapshot, remove_partials, save_content_addressed, save_snapshot, snapshot_bytes, snapshot_path
from memt_core.memory.state import MemoryState
from memt_core.sampling import SamplingParams


@pytest.fixture(scope="module")
def geometry(nano_checkpoint):
    """(identity, memory layers, state shape) of the tiny Nano."""
    checkpoint = read_checkpoint(nano_checkpoint)
    return checkpoint.identity(), checkpoint.memory.memory_layers, checkpoint.memory.state_shape()


def random_state(layers, shape, seed=0) -> MemoryState:
    gen = torch.Generator().manual_seed(seed)
    return MemoryState({layer: torch.randn(shape, generator=gen) for layer in layers})


def load(path, geometry):
    identity, layers, shape = geometry
    return load_snapshot(path, identity=identity, layers=layers, shape=shape)


def write_raw(path, tensors, metadata):
    """A safetensors file written by hand, bypassing save_snapshot's checks."""
    save_file(tensors, str(path), metadata=metadata)
    return path


def leftovers(directory):
    return sorted(name for name in os.listdir(directory) if name.startswith(".tmp-") or name.endswith(".partial"))


def test_round_trip_is_bit_exact(tmp_path, geometry):
    identity, layers, shape = geometry
    state = random_state(layers, shape)
    path = save_snapshot(tmp_path / "a.safetensors", state, identity=identity)
    assert path == tmp_path / "a.safetensors"
    loaded = load(path, geometry)
    assert loaded.equal(state)
    assert all(loaded.get(layer).dtype == torch.float32 for layer in layers)
    with safe_open(str(path), framework="pt") as handle:
        assert handle.metadata() == {"format": SNAPSHOT_FORMAT, "identity": identity}
        assert sorted(handle.keys()) == sorted(f"memory.{layer}" for layer in layers)
    assert leftovers(tmp_path) == []


def test_empty_memory_writes_a_file_without_tensors(tmp_path, geometry):
    identity, _, _ = geometry
    path = save_snapshot(tmp_path / "empty.safetensors", MemoryState(), identity=identity)
    with safe_open(str(path), framework="pt") as handle:
        assert list(handle.keys()) == []
        assert handle.metadata()["format"] == SNAPSHOT_FORMAT
    assert load(path, geometry).is_empty


def test_existing_file_is_a_conflict_unless_overwrite(tmp_path, geometry):
    identity, layers, shape = geometry
    path = tmp_path / "a.safetensors"
    first, second = random_state(layers, shape, seed=1), random_state(layers, shape, seed=2)
    save_snapshot(path, first, identity=identity)
    with pytest.raises(Conflict, match="already exists; pass overwrite"):
        save_snapshot(path, second, identity=identity)
    assert load(path, geometry).equal(first)  # untouched
    save_snapshot(path, second, identity=identity, overwrite=True)
    assert load(path, geometry).equal(second)
    assert sorted(os.listdir(tmp_path)) == ["a.safetensors"]  # no temporary files left


def test_non_finite_memory_is_not_saved(tmp_path, geometry):
    identity, layers, shape = geometry
    state = random_state(layers, shape)
    broken = state.get(layers[-1]).clone()
    broken[0, 0, 0, 0] = float("nan")
    state.set(layers[-1], broken)
    with pytest.raises(SnapshotError, match=f"memory.{layers[-1]} has non-finite values"):
        save_snapshot(tmp_path / "nan.safetensors", state, identity=identity)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "case,message",
    [
        ("format", "has format 'memt-memory-v0'; expected 'memt-memory-v1'"),
        ("no-metadata", "has format None"),
        ("identity", "was made for another model/tokenizer identity"),
        ("layers", "has memory layers [0, 1]; this model's memory layers are [1, 3]"),
        ("missing-layer", "has memory layers [1]; this model's memory layers are [1, 3]"),
        ("extra-name", "unexpected tensor(s): memory.layers.1"),
        ("dtype", "memory.1 has dtype torch.float64; expected float32"),
        ("bf16", "memory.3 has dtype torch.bfloat16; expected float32"),
        ("shape", "memory.1 has shape [1, 2, 16, 17]; expected [1, 2, 16, 16]"),
        ("batch", "memory.3 has shape [2, 2, 16, 16]; expected [1, 2, 16, 16]"),
        ("non-finite", "memory.3 has non-finite values"),
        ("infinite", "memory.1 has non-finite values"),
    ],
)
def test_load_refuses_a_bad_file(tmp_path, geometry, case, message):
    identity, layers, shape = geometry
    assert tuple(layers) == (1, 3) and tuple(shape) == (1, 2, 16, 16)  # the messages above assume them
    tensors = {f"memory.{layer}": torch.randn(shape) for layer in layers}
    metadata = {"format": SNAPSHOT_FORMAT, "identity": identity}
    if case == "format":
        metadata["format"] = "memt-memory-v0"
    elif case == "no-metadata":
        metadata = None
    elif case == "identity":
        metadata["identity"] = "0" * 64
    elif case == "layers":
        tensors = {"memory.0": torch.randn(shape), "memory.1": torch.randn(shape)}
    elif case == "missing-layer":
        del tensors["memory.3"]
    elif case == "extra-name":
        tensors["memory.layers.1"] = tensors.pop("memory.1")
    elif case == "dtype":
        tensors["memory.1"] = tensors["memory.1"].double()
    elif case == "bf16":
        tensors["memory.3"] = tensors["memory.3"].bfloat16()
    elif case == "shape":
        tensors["memory.1"] = torch.randn(1, 2, 16, 17)
    elif case == "batch":
        tensors["memory.3"] = torch.randn(2, 2, 16, 16)
    elif case == "non-finite":
        tensors["memory.3"][0, 1, 2, 3] = float("nan")
    elif case == "infinite":
        tensors["memory.1"][0, 0, 0, 0] = float("-inf")
    path = write_raw(tmp_path / "bad.safetensors", tensors, metadata)
    with pytest.raises(SnapshotError) as info:
        load(path, geometry)
    assert message in str(info.value)
    assert "'bad.safetensors'" in str(info.value)
    assert info.value.status == 400 and isinstance(info.value, InvalidRequest)


def test_load_refuses_a_file_that_is_not_safetensors(tmp_path, geometry):
    path = tmp_path / "junk.safetensors"
    path.write_bytes(b"this is not a safetensors file")
    with pytest.raises(SnapshotError, match="not a readable safetensors file"):
        load(path, geometry)


def test_load_refuses_a_missing_file(tmp_path, geometry):
    with pytest.raises(SnapshotError, match="'missing.safetensors' does not exist"):
        load(tmp_path / "missing.safetensors", geometry)


def test_symbolic_links_are_refused(tmp_path, geometry):
    identity, layers, shape = geometry
    target = save_snapshot(tmp_path / "real.safetensors", random_state(layers, shape), identity=identity)
    link = tmp_path / "link.safetensors"
    link.symlink_to(target)
    with pytest.raises(SnapshotError, match="is a symbolic link; links are refused"):
        load(link, geometry)
    with pytest.raises(InvalidRequest, match="is a symbolic link; links are refused"):
        snapshot_path(tmp_path, "link.safetensors")


def test_snapshot_path_accepts_a_simple_name(tmp_path):
    assert snapshot_path(tmp_path, "session-1.v2_final.safetensors") == tmp_path / "session-1.v2_final.safetensors"
    assert snapshot_path(str(tmp_path), "a.safetensors") == tmp_path / "a.safetensors"


@pytest.mark.parametrize(
    "name,message",
    [
        ("..", "simple file name"),
        ("../a.safetensors", "simple file name"),
        ("a..b.safetensors", "simple file name"),
        ("sub/a.safetensors", "simple file name"),
        ("sub\\a.safetensors", "simple file name"),
        ("/etc/a.safetensors", "simple file name"),
        ("a.bin", "'.safetensors'"),
        ("a.safetensors.tmp", "'.safetensors'"),
        (".hidden.safetensors", None),
        ("a b.safetensors", None),
        ("", "nonempty snapshot file name"),
        (None, "nonempty snapshot file name"),
        (7, "nonempty snapshot file name"),
    ],
)
def test_snapshot_path_refuses(tmp_path, name, message):
    with pytest.raises(InvalidRequest) as info:
        snapshot_path(tmp_path, name)
    if isinstance(name, str) and name:
        assert repr(name) in str(info.value)  # the message names what was refused
    if message:
        assert message in str(info.value)


def test_snapshot_path_needs_a_state_directory():
    with pytest.raises(InvalidRequest, match="--state-directory"):
        snapshot_path(None, "a.safetensors")


def test_local_session_save_and_load_round_trip(tmp_path, nano_model):
    runtime = MemTRuntime(nano_model)
    session = runtime.open_session()
    session.commit(list(range(10, 60)))
    path = session.save(tmp_path / "s.safetensors")
    assert leftovers(tmp_path) == []

    other = runtime.open_session()
    other.load(path)
    assert other.memory.equal(session.memory)
    prompt = list(range(100, 120))
    with torch.no_grad():
        logits = [nano_model(torch.tensor([prompt]), memory=memory_batch(nano_model, [s.memory])).logits for s in (session, other)]
    assert torch.equal(logits[0], logits[1])
    params = SamplingParams(max_new_tokens=5, temperature=0)
    assert other.generate(prompt, params).output_ids == session.generate(prompt, params).output_ids

    with pytest.raises(Conflict):
        session.save(path)
    session.commit(list(range(60, 80)))
    session.save(path, overwrite=True)
    other.load(path)
    assert other.memory.equal(session.memory)


def test_local_session_refuses_a_snapshot_of_another_model(tmp_path, nano_model, flash_checkpoint):
    flash = read_checkpoint(flash_checkpoint)
    path = save_snapshot(
        tmp_path / "flash.safetensors",
        random_state(flash.memory.memory_layers, flash.memory.state_shape()),
        identity=flash.identity(),
    )
    session = MemTRuntime(nano_model).open_session()
    session.commit([1, 2, 3])
    before = session.memory
    with pytest.raises(SnapshotError, match="another model/tokenizer identity"):
        session.load(path)
    assert session.memory is before  # a refused import leaves the session as it was


# ---------------------------------------------------------------------- deterministic, content-addressed files


def test_the_same_memory_always_gives_the_same_bytes(tmp_path, geometry):
    identity, layers, shape = geometry
    first = {save_snapshot(tmp_path / f"a{i}.safetensors", random_state(layers, shape), identity=identity).read_bytes() for i in range(8)}
    assert len(first) == 1  # safetensors alone orders its metadata differently from call to call
    assert snapshot_bytes(random_state(layers, shape, seed=5), identity=identity) not in first
    assert snapshot_bytes(random_state(layers, shape), identity="another") not in first
    assert load(tmp_path / "a0.safetensors", geometry).equal(random_state(layers, shape))


def test_content_addressed_names_are_the_hash_and_are_checked_on_load(tmp_path, geometry):
    identity, layers, shape = geometry
    state = random_state(layers, shape)
    path = save_content_addressed(tmp_path, state, identity=identity)
    data = path.read_bytes()
    assert path.name == content_name(data) == f"sha256-{hashlib.sha256(data).hexdigest()}.safetensors"
    assert save_content_addressed(tmp_path, state, identity=identity) == path  # equal memories share one file
    assert load(path, geometry).equal(state)
    other = save_content_addressed(tmp_path, random_state(layers, shape, seed=9), identity=identity)
    assert other != path
    damaged = bytearray(data)
    damaged[-1] ^= 0x01
    path.write_bytes(bytes(damaged))
    with pytest.raises(SnapshotError, match="does not hold the content its name hashes"):
        load(path, geometry)
    assert save_content_addressed(tmp_path, state, identity=identity) == path  # a damaged file is replaced
    assert path.read_bytes() == data and leftovers(tmp_path) == []


def test_content_addressed_names_are_immutable(tmp_path, geometry):
    """Issue 38: an export with overwrite could replace sha256-<hex> with other bytes, so a later restore failed
    its hash check. Such a name only ever holds the bytes it hashes; the same bytes again are not rewritten."""
    identity, layers, shape = geometry
    state, other = random_state(layers, shape), random_state(layers, shape, seed=9)
    path = save_content_addressed(tmp_path, state, identity=identity)
    data, before = path.read_bytes(), path.stat()
    for overwrite in (False, True):
        with pytest.raises(InvalidRequest, match=r"is content-addressed: it may hold only the bytes its name hashes \(these hash to 'sha256-"):
            save_snapshot(path, other, identity=identity, overwrite=overwrite)
    made_up = tmp_path / ("sha256-" + "0" * 64 + ".safetensors")
    with pytest.raises(InvalidRequest, match="is content-addressed"):
        save_snapshot(made_up, state, identity=identity)
    assert not made_up.exists() and leftovers(tmp_path) == []
    # the very bytes the name hashes: overwrite succeeds without rewriting; without it the name is taken, as any
    assert save_snapshot(path, state, identity=identity, overwrite=True) == path
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns) and path.read_bytes() == data
    with pytest.raises(Conflict, match="already exists"):
        save_snapshot(path, state, identity=identity)
    assert load(path, geometry).equal(state)
    # a damaged file of that name is replaced by the bytes it names; an absent one is written
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert save_snapshot(path, state, identity=identity, overwrite=True).read_bytes() == data
    path.unlink()
    assert save_snapshot(path, state, identity=identity).read_bytes() == data


def test_partial_files_left_by_a_crash_are_removed_once_old(tmp_path):
    old, fresh, kept = tmp_path / ".tmp-old.partial", tmp_path / ".tmp-new.partial", tmp_path / "a.safetensors"
    for path in (old, fresh, kept):
        path.write_bytes(b"x")
    os.utime(old, (1, 1))
    assert remove_partials(tmp_path) == [".tmp-old.partial"]
    assert sorted(os.listdir(tmp_path)) == [".tmp-new.partial", "a.safetensors"]  # a write in progress elsewhere stays

"""``memt-memory-v1`` snapshot files: published memory in safetensors, checked before use.

A file holds one FP32 tensor ``memory.<layer>`` of shape ``[1, H, K, V]`` per memory layer and the
metadata ``format=memt-memory-v1`` and ``identity=<model identity>``. An empty memory has no
tensors. Files are written to a temporary name, fsynced and renamed, so a reader never sees a
partial file under its final name; an existing file is replaced only when asked. A directory that is full
or read-only refuses the write with ``InsufficientStorage`` (507), naming which, and leaves nothing behind.

The bytes are canonical (the same memory and identity always give the same file), so a snapshot can
be named by its content: ``sha256-<hex>.safetensors``. Loading a file so named checks the hash, and no
write ever puts other bytes under such a name (``save_snapshot``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Sequence

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes

from memt_core.checkpoint import SNAPSHOT_FORMAT
from memt_core.errors import Conflict, InsufficientStorage, InvalidRequest, SnapshotError
from memt_core.memory.state import MemoryState
from memt_core.names import check_snapshot_name

log = logging.getLogger("memt.server")

TENSOR_NAME = re.compile(r"^memory\.(0|[1-9][0-9]*)$")
CONTENT_NAME = re.compile(r"^sha256-([0-9a-f]{64})\.safetensors$")


def snapshot_path(directory: str | Path | None, name: object) -> Path:
    """The path of snapshot ``name`` inside ``directory``; refuses anything but a simple file name."""
    if directory is None:
        raise InvalidRequest("snapshots need a server started with --state-directory")
    check_snapshot_name(name)
    root = Path(directory)
    path = root / name
    if path.is_symlink():
        raise InvalidRequest(f"snapshot {name!r} is a symbolic link; links are refused")
    if path.is_dir():
        raise InvalidRequest(f"snapshot {name!r} names a directory in the state directory, not a file")
    return path


def remove_partials(directory: str | Path, *, older_than: float = 600.0) -> list[str]:
    """Delete temporary files a crash left behind (never visible under a final name); returns their names.

    Only files older than ``older_than`` seconds go, so a write in progress in another process that
    shares the directory is left alone.
    """
    removed = []
    for path in Path(directory).glob(".tmp-*.partial"):
        try:
            if path.is_file() and time.time() - path.stat().st_mtime > older_than:
                path.unlink()
                removed.append(path.name)
        except FileNotFoundError:
            continue
    return removed


def snapshot_bytes(state: MemoryState, *, identity: str) -> bytes:
    """The file for ``state``, byte for byte the same whenever memory and identity are the same."""
    tensors = {f"memory.{layer}": state.get(layer).detach().to("cpu", torch.float32).contiguous() for layer in state.layers()}
    for name, tensor in tensors.items():
        if not torch.isfinite(tensor).all():
            raise SnapshotError(f"memory tensor {name} has non-finite values; refusing to save it")
    return _canonical(safetensors_bytes(tensors, metadata={"format": SNAPSHOT_FORMAT, "identity": identity}))


def _canonical(data: bytes) -> bytes:
    # safetensors keeps metadata in a hash map, so the header's key order varies from call to call;
    # rewrite the JSON header with sorted keys (offsets are relative to the data, which is unchanged)
    size = int.from_bytes(data[:8], "little")
    header = json.dumps(json.loads(data[8 : 8 + size]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + data[8 + size :]


def content_name(data: bytes) -> str:
    """The content-addressed name of a snapshot file's bytes."""
    return f"sha256-{hashlib.sha256(data).hexdigest()}.safetensors"


def save_snapshot(path: str | Path, state: MemoryState, *, identity: str, overwrite: bool = False) -> Path:
    """Write ``state`` atomically: temporary file in the same folder, fsync, rename.

    A content-addressed name (``sha256-<hex>.safetensors``) is immutable: it may hold only the bytes it
    hashes, so other bytes are refused (``InvalidRequest``, 400) whether or not the file exists and whatever
    ``overwrite`` says, and nothing is written. Its own bytes go as to any name (an existing file needs
    ``overwrite``), except that with ``overwrite`` an intact file is left as it is: it already holds them
    (a damaged one is replaced).
    """
    path = Path(path)
    data = snapshot_bytes(state, identity=identity)
    named = CONTENT_NAME.match(path.name)
    if named and named.group(1) != hashlib.sha256(data).hexdigest():
        raise InvalidRequest(
            f"snapshot {path.name!r} is content-addressed: it may hold only the bytes its name hashes (these hash to "
            f"{content_name(data)!r}); export without 'file' to be given that name, or choose a name not of the form "
            "sha256-<hex>.safetensors"
        )
    if path.exists() and not overwrite:
        raise Conflict(f"snapshot {path.name!r} already exists; pass overwrite: true to replace it")
    if named and path.is_file() and _sha256(path) == named.group(1):
        return path  # the very bytes are there already: nothing to rewrite
    write_atomic(path, data, overwrite=overwrite)
    return path


def save_content_addressed(directory: str | Path, state: MemoryState, *, identity: str) -> Path:
    """Write ``state`` under its content name; an intact file of that name already holds these bytes."""
    data = snapshot_bytes(state, identity=identity)
    path = Path(directory) / content_name(data)
    if path.is_file() and not path.is_symlink() and _sha256(path) == hashlib.sha256(data).hexdigest():
        return path
    write_atomic(path, data, overwrite=True)  # absent, or damaged: replace atomically
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


#: errors of a directory that cannot take a file: full (ENOSPC, EDQUOT) or not writable (EROFS, EACCES, EPERM)
_NO_ROOM = {errno.ENOSPC: "no space left on the state directory", errno.EDQUOT: "the state directory's disk quota is exceeded",
            errno.EROFS: "the state directory is read-only", errno.EACCES: "the state directory is not writable",
            errno.EPERM: "the state directory is not writable"}


def write_atomic(path: Path, data: bytes, *, overwrite: bool) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync, then rename (or link, when not overwriting).
    A full or read-only directory raises ``InsufficientStorage`` (the OS error mapped here, where it enters)."""
    try:
        _write_atomic(path, data, overwrite=overwrite)
    except OSError as exc:
        if exc.errno not in _NO_ROOM:
            raise
        log.warning("%s: %s not written: %s", path.parent, path.name, exc.strerror)  # the path for the operator, not the client
        raise InsufficientStorage(f"{_NO_ROOM[exc.errno]}: {path.name!r} was not written ({exc.strerror}); "
                                  "nothing changed: retry once there is room") from exc


def _write_atomic(path: Path, data: bytes, *, overwrite: bool) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".partial", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)  # atomic, and fails rather than replace a file that appeared meanwhile
            except FileExistsError:
                raise Conflict(f"snapshot {path.name!r} already exists; pass overwrite: true to replace it") from None
            os.unlink(tmp)
        _fsync_dir(path.parent)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_snapshot(
    path: str | Path,
    *,
    identity: str,
    layers: Sequence[int],
    shape: Sequence[int],
) -> MemoryState:
    """Read and check a snapshot: format, identity, layer set, dtype, shape, finite values."""
    path = Path(path)
    if not path.is_file():
        raise SnapshotError(f"snapshot {path.name!r} does not exist")
    if path.is_symlink():
        raise SnapshotError(f"snapshot {path.name!r} is a symbolic link; links are refused")
    named = CONTENT_NAME.match(path.name)
    if named and _sha256(path) != named.group(1):
        raise SnapshotError(f"snapshot {path.name!r} does not hold the content its name hashes (damaged or altered)")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            names = list(handle.keys())
            _check_header(path.name, metadata, names, identity, layers)
            state = MemoryState()
            from tqdm.auto import tqdm

            # a large model's snapshot: a progress bar on a terminal, once reading takes a while
            for name in tqdm(names, desc=f"loading {path.name}", unit="layer", disable=None, delay=2, leave=False):
                tensor = handle.get_tensor(name)
                _check_tensor(path.name, name, tensor, shape)
                state.set(int(name.split(".")[1]), tensor)
    except SafetensorError as exc:
        raise SnapshotError(f"snapshot {path.name!r} is not a readable safetensors file: {exc}") from exc
    except OSError as exc:
        raise SnapshotError(f"snapshot {path.name!r} could not be read: {exc}") from exc
    return state


def _check_header(file: str, metadata: dict, names: list[str], identity: str, layers: Sequence[int]) -> None:
    if metadata.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotError(
            f"snapshot {file!r} has format {metadata.get('format')!r}; expected {SNAPSHOT_FORMAT!r} "
            "(files using memory.layers.<n> or model/encoding metadata are an older, incompatible format)"
        )
    if metadata.get("identity") != identity:
        raise SnapshotError(
            f"snapshot {file!r} was made for another model/tokenizer identity "
            f"({metadata.get('identity')!r}, this server has {identity!r})"
        )
    bad = [name for name in names if not TENSOR_NAME.match(name)]
    if bad:
        raise SnapshotError(f"snapshot {file!r} has unexpected tensor(s): {', '.join(sorted(bad))}")
    found = sorted(int(name.split(".")[1]) for name in names)
    if found and found != sorted(layers):
        raise SnapshotError(
            f"snapshot {file!r} has memory layers {found}; this model's memory layers are {sorted(layers)}"
        )


def _check_tensor(file: str, name: str, tensor: torch.Tensor, shape: Sequence[int]) -> None:
    if tensor.dtype != torch.float32:
        raise SnapshotError(f"snapshot {file!r}: {name} has dtype {tensor.dtype}; expected float32")
    if tuple(tensor.shape) != tuple(shape):
        raise SnapshotError(f"snapshot {file!r}: {name} has shape {list(tensor.shape)}; expected {list(shape)}")
    if not torch.isfinite(tensor).all():
        raise SnapshotError(f"snapshot {file!r}: {name} has non-finite values")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

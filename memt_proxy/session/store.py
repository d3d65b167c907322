"""What each session's memory holds, kept on disk so that a restarted proxy still trims transcripts.

The proxy knows which messages a native session's memory holds only from its own bookkeeping (a hash
per committed message). With ``--state-directory`` that bookkeeping is written, one small JSON file per
native session, before every change of the session's memory, as a pair: the hashes at the upstream's
current ``published_version`` and the hashes the change will leave at the next version. A proxy that
restarts reads the upstream's ``published_version`` and takes whichever of the two matches it; when
neither does (memory changed by someone else, or a lost write), the history counts as unknown and the
request is handled as an edited history. A turn waiting for tool results is recorded too, with the
version it was made at, so that a restarted proxy continues it when the results come. Files are
replaced atomically (temporary file + rename), so a killed proxy never leaves half a record.

A session offloaded to make room upstream has an offload record beside it (``<native>.offload.json``):
the upstream snapshot holding its memory, the hashes that memory holds and its turn waiting for tool
results. Without a directory the newest ``MEMORY_OFFLOADS`` offload records are kept in memory.

The per-session records can live in a directory of their own (``--records-directory``): on a filesystem
the proxies of a cluster share, whichever proxy the router sends a session to finds its record, and,
since a core restores the session's latest published version from the shared snapshot store, the
record's version matches and trimming continues there. (Offload records stay in the state directory:
they name snapshots in one upstream's own state directory.)

Session and offload records carry the scheme of their message hashes (``"hash_scheme"``, see
``memt_proxy.session.transcript``). One without it was written under scheme 1 (a proxy before hashes keyed on the exact
text): it is read with each hash tagged ``LEGACY``, which the transcript matches with the old function and
rewrites as the new hashes on a request's match; the record is written under the current scheme at the
session's next change (tagged hashes not matched yet stay tagged). A record of a scheme this proxy does not
know (a newer proxy's) counts as unknown history.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections import OrderedDict
from pathlib import Path

from memt_core.names import SNAPSHOT_NAME
from memt_proxy.session.transcript import HASH_SCHEME, LEGACY

log = logging.getLogger("memt.proxy")

KEPT = "branches"  # the records' subdirectory of kept states (named so on disk by earlier versions)
HEADS = "heads"  # beside them in shared records: one file per kept state's head, named by the head's chain hash
MEMORY_OFFLOADS = 65536  # offload records kept in memory without a directory (about 100 bytes each, plus hashes)


class SessionRecordStore:
    """Per-session records under ``directory``; with ``directory=None`` nothing is kept."""

    def __init__(self, directory: str | Path | None, records_directory: str | Path | None = None):
        self.directory = Path(directory) if directory is not None else None
        # the per-session records (not the offload records): elsewhere when shared by a cluster's proxies
        self.records_directory = Path(records_directory) if records_directory is not None else self.directory
        for place in (self.directory, self.records_directory):
            if place is not None:
                place.mkdir(parents=True, exist_ok=True)
        self._offloads: OrderedDict[str, dict] = OrderedDict()  # without a directory
        self.shared = records_directory is not None  # --records-directory: other proxies write these records too

    def recorded_elsewhere(self, native: str) -> bool:
        """Whether the shared records hold this session: another node served it (its memory is in the store)."""
        return self.shared and self._read(native) is not None

    def known(self, native: str) -> bool:
        """Whether a record of this session is kept (a per-session or an offload record): its memory may hold something."""
        if self.records_directory is not None and self._path(native).exists():
            return True
        return self.load_offload(native) is not None

    def _path(self, native: str, suffix: str = ".json") -> Path:
        # native ids are [A-Za-z0-9_.-]: safe file names
        return (self.records_directory if suffix == ".json" else self.directory) / f"{native}{suffix}"

    def save_offload(self, native: str, file: str, committed: list[str] | None, pending: dict | None) -> None:
        """Record that the session's memory is in the upstream snapshot ``file`` and holds ``committed`` (None: unknown)."""
        record = {"file": file, "committed": committed, "pending": pending}
        if self.directory is None:
            self._offloads[native] = record
            self._offloads.move_to_end(native)
            while len(self._offloads) > MEMORY_OFFLOADS:
                self._offloads.popitem(last=False)
            return
        self._write(native, {**record, "hash_scheme": HASH_SCHEME}, suffix=".offload.json")

    def load_offload(self, native: str) -> dict | None:
        """The session's offload record (``file``, ``committed``, ``pending``), or None if it is not offloaded."""
        if self.directory is None:
            return self._offloads.get(native)
        record = self._read_hashes(native, suffix=".offload.json")
        if record is None:
            return None
        file, committed, pending = record.get("file"), record.get("committed"), record.get("pending")
        valid = (
            isinstance(file, str) and SNAPSHOT_NAME.fullmatch(file) is not None
            and (committed is None or isinstance(committed, list) and all(isinstance(h, str) for h in committed))
            and (pending is None or isinstance(pending, dict) and set(pending) == {"hashes", "ids", "thinking"})
        )
        if not valid:
            log.warning("ignoring unreadable offload record of %s", native)
            return None
        return {"file": file, "committed": committed, "pending": pending}

    def forget_offload(self, native: str) -> None:
        """The session is no longer offloaded (restored, or closed)."""
        self._offloads.pop(native, None)
        if self.directory is not None:
            self._path(native, ".offload.json").unlink(missing_ok=True)

    def save(self, native: str, version: int, committed: list[str] | None, next_committed: list[str], answered: dict | None = None) -> None:
        """Record ``committed`` at ``version`` (None: unknown) and ``next_committed`` at ``version + 1`` (the change under way),
        with ``answered``: the answer of the turn that change commits (a JSON object, its ``version`` the next), so
        that an identical retry reaching a restarted proxy gets it again.

        A change of memory ends any turn that was waiting for tool results: the record drops it.
        """
        if self.records_directory is None:
            return
        record = {"version": version, "committed": committed, "next": {"version": version + 1, "committed": next_committed}, "hash_scheme": HASH_SCHEME}
        if answered is not None:
            record["answered"] = answered
        self._write(native, record)

    def load_answer(self, native: str, version: int) -> dict | None:
        """The recorded answer of the turn that made ``version`` (see ``save``), or None."""
        record = self._read_hashes(native) if self.records_directory is not None else None
        answered = record.get("answered") if record is not None else None
        return answered if isinstance(answered, dict) and answered.get("version") == version else None

    def save_pending(self, native: str, version: int, committed: list[str] | None, pending: dict | None) -> None:
        """Record (or with None, forget) the turn waiting for tool results at ``version``: its message hashes, token ids, thinking flag."""
        if self.records_directory is None:
            return
        record = self._read_hashes(native) or {"version": version, "committed": committed, "next": None, "hash_scheme": HASH_SCHEME}
        record.pop("pending", None)
        if pending is not None:
            record["pending"] = {"version": version, "hashes": pending["hashes"], "ids": pending["ids"], "thinking": pending["thinking"]}
        self._write(native, record)

    def _write(self, native: str, record: dict, suffix: str = ".json") -> None:
        fd, temporary = tempfile.mkstemp(dir=self._path(native, suffix).parent, prefix=f".{Path(native).name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(record, out)
            os.replace(temporary, self._path(native, suffix))
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def _read(self, native: str, suffix: str = ".json") -> dict | None:
        try:
            record = json.loads(self._path(native, suffix).read_text())
            if not isinstance(record, dict):
                raise TypeError("a record is a JSON object")
            return record
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            log.warning("ignoring unreadable session record %s: %s", self._path(native, suffix), exc)
            return None

    def _read_hashes(self, native: str, suffix: str = ".json") -> dict | None:
        """A session or offload record with its hashes in the current scheme (see the module docstring): a scheme-1
        record's hashes tagged ``LEGACY``; None for one of a scheme this proxy does not know."""
        record = self._read(native, suffix)
        if record is None:
            return None
        scheme = record.get("hash_scheme", 1)
        if scheme == HASH_SCHEME and type(scheme) is int:
            return record
        if scheme != 1 or type(scheme) is not int:
            log.warning("ignoring session record %s: message hashes of an unknown scheme %r", self._path(native, suffix), scheme)
            return None

        def tagged(hashes):
            return [LEGACY + h if isinstance(h, str) else h for h in hashes] if isinstance(hashes, list) else hashes

        record = {**record, "hash_scheme": HASH_SCHEME}
        if "committed" in record:
            record["committed"] = tagged(record["committed"])
        if isinstance(record.get("next"), dict) and "committed" in record["next"]:
            record["next"] = {**record["next"], "committed": tagged(record["next"]["committed"])}
        if isinstance(record.get("pending"), dict) and "hashes" in record["pending"]:
            record["pending"] = {**record["pending"], "hashes": tagged(record["pending"]["hashes"])}
        return record

    def load(self, native: str, version: int) -> list[str] | None:
        """The committed hashes recorded for ``version`` of the session's memory, or None if none match."""
        if self.records_directory is None:
            return None
        record = self._read_hashes(native)
        if record is None:
            return None
        try:
            for entry in (record, record["next"]):
                if entry is None:
                    continue
                hashes = entry["committed"]
                if entry["version"] == version and hashes is not None:
                    if not all(isinstance(h, str) for h in hashes):
                        raise TypeError("committed hashes must be strings")
                    return list(hashes)
        except (KeyError, TypeError) as exc:
            log.warning("ignoring unreadable session record %s: %s", self._path(native), exc)
        return None

    def load_pending(self, native: str, version: int) -> dict | None:
        """The turn waiting for tool results recorded at ``version``, or None."""
        record = self._read_hashes(native) if self.records_directory is not None else None
        pending = record.get("pending") if record is not None else None
        if pending is None:
            return None
        try:
            if pending["version"] != version:
                return None
            hashes, ids, thinking = pending["hashes"], pending["ids"], pending["thinking"]
            if not (all(isinstance(h, str) for h in hashes) and all(type(i) is int for i in ids) and isinstance(thinking, bool)):
                raise TypeError("pending hashes must be strings, ids integers, thinking a boolean")
            return {"hashes": list(hashes), "ids": list(ids), "thinking": thinking}
        except (KeyError, TypeError) as exc:
            log.warning("ignoring the pending turn of unreadable session record %s: %s", self._path(native), exc)
            return None

    def delete(self, native: str, *, kept: bool = True) -> None:
        """Delete the session's record and (``kept``) its kept state's record. A directory that refuses (read-only)
        leaves them, with a warning: a record that no longer matches the session's version only counts its history
        as unknown, as a lost write does."""
        if self.records_directory is None:
            return
        try:
            self._delete(native, kept=kept)
        except OSError as exc:
            log.warning("could not delete the records of %s: %s", native, exc)

    def _delete(self, native: str, *, kept: bool) -> None:
        self._path(native).unlink(missing_ok=True)
        if not kept:
            return
        kept_path = self.records_directory / KEPT / f"{native}.json"
        if not kept_path.exists():
            return  # a session named by a header: no kept state's record
        record = self._read(f"{KEPT}/{native}") if self.shared else None  # its head file: shared records only
        if record is not None and isinstance(record.get("head"), str):
            self._head_path(record["head"]).unlink(missing_ok=True)
        kept_path.unlink(missing_ok=True)

    def sessions(self) -> list[str]:
        """The native sessions with a per-session record (made or written by this proxy, or an earlier one)."""
        if self.records_directory is None:
            return []
        return sorted(path.name[: -len(".json")] for path in self.records_directory.glob("*.json") if not path.name.endswith(".offload.json"))

    def save_kept(self, native: str, tenant: str, name: str, head: str | None, origin: str | None = None) -> None:
        """Record a kept state's name and head (``memt_proxy.session.headerless``), and the named session it was kept for
        (``origin``), so that a restarted proxy finds it again; what its memory holds is its per-session record's,
        checked on use. Records shared by a cluster's proxies also name the state by its head (``kept_at``), for
        the other nodes."""
        if self.records_directory is None:
            return
        (self.records_directory / KEPT).mkdir(exist_ok=True)
        if self.shared:
            old = (self._read(f"{KEPT}/{native}") or {}).get("head")
            if isinstance(old, str) and old != head:
                self._head_path(old).unlink(missing_ok=True)
            if head is not None:
                self._head_path(head).parent.mkdir(exist_ok=True)
                self._write(f"{KEPT}/{HEADS}/{head}", {"tenant": tenant, "name": name})
        self._write(f"{KEPT}/{native}", {"tenant": tenant, "name": name, "head": head, "origin": origin})

    def _head_path(self, head: str) -> Path:
        return self.records_directory / KEPT / HEADS / f"{head}.json"

    def kept_at(self, links: list[str]) -> tuple[int, str] | None:
        """Shared records: the deepest of ``links`` that heads a kept state another node recorded, as (depth, name)."""
        if not self.shared:
            return None
        for depth in range(len(links), 0, -1):
            if self._head_path(links[depth - 1]).exists():
                record = self._read(f"{KEPT}/{HEADS}/{links[depth - 1]}")
                if record is not None and isinstance(record.get("name"), str):
                    return depth, record["name"]
        return None

    def kept_states(self) -> list[dict]:
        """The recorded kept states, each ``{"tenant", "name", "head", "origin"}`` (unreadable ones skipped)."""
        place = self.records_directory / KEPT if self.records_directory is not None else None
        if place is None or not place.is_dir():
            return []
        found = []
        for path in sorted(place.glob("*.json")):
            record = self._read(f"{KEPT}/{path.stem}")
            if record is not None and all(isinstance(record.get(key), str) for key in ("tenant", "name")) and isinstance(record.get("head"), (str, type(None))):
                origin = record.get("origin")
                found.append({**{key: record[key] for key in ("tenant", "name", "head")}, "origin": origin if isinstance(origin, str) else None})
        return found

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
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger("memt.proxy")


class SessionRecordStore:
    """Per-session records under ``directory``; with ``directory=None`` nothing is kept."""

    def __init__(self, directory: str | Path | None):
        self.directory = Path(directory) if directory is not None else None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, native: str) -> Path:
        return self.directory / f"{native}.json"  # native ids are [A-Za-z0-9_.-]: safe file names

    def save(self, native: str, version: int, committed: list[str] | None, next_committed: list[str]) -> None:
        """Record ``committed`` at ``version`` (None: unknown) and ``next_committed`` at ``version + 1`` (the change under way).

        A change of memory ends any turn that was waiting for tool results: the record drops it.
        """
        if self.directory is None:
            return
        self._write(native, {"version": version, "committed": committed, "next": {"version": version + 1, "committed": next_committed}})

    def save_pending(self, native: str, version: int, committed: list[str] | None, pending: dict | None) -> None:
        """Record (or with None, forget) the turn waiting for tool results at ``version``: its message hashes, token ids, thinking flag."""
        if self.directory is None:
            return
        record = self._read(native) or {"version": version, "committed": committed, "next": None}
        record.pop("pending", None)
        if pending is not None:
            record["pending"] = {"version": version, "hashes": pending["hashes"], "ids": pending["ids"], "thinking": pending["thinking"]}
        self._write(native, record)

    def _write(self, native: str, record: dict) -> None:
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=f".{native}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(record, out)
            os.replace(temporary, self._path(native))
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def _read(self, native: str) -> dict | None:
        try:
            record = json.loads(self._path(native).read_text())
            if not isinstance(record, dict):
                raise TypeError("a record is a JSON object")
            return record
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            log.warning("ignoring unreadable session record %s: %s", self._path(native), exc)
            return None

    def load(self, native: str, version: int) -> list[str] | None:
        """The committed hashes recorded for ``version`` of the session's memory, or None if none match."""
        if self.directory is None:
            return None
        record = self._read(native)
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
        record = self._read(native) if self.directory is not None else None
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

    def delete(self, native: str) -> None:
        if self.directory is not None:
            self._path(native).unlink(missing_ok=True)

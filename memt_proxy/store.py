"""What each session's memory holds, kept on disk so that a restarted proxy still trims transcripts.

The proxy knows which messages a native session's memory holds only from its own bookkeeping (a hash
per committed message). With ``--state-directory`` that bookkeeping is written, one small JSON file per
native session, before every change of the session's memory, as a pair: the hashes at the upstream's
current ``published_version`` and the hashes the change will leave at the next version. A proxy that
restarts reads the upstream's ``published_version`` and takes whichever of the two matches it; when
neither does (memory changed by someone else, or a lost write), the history counts as unknown and the
request is handled as an edited history. Files are replaced atomically (temporary file + rename), so a
killed proxy never leaves half a record.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger("memt.proxy")


class SessionStore:
    """Per-session records under ``directory``; with ``directory=None`` nothing is kept."""

    def __init__(self, directory: str | Path | None):
        self.directory = Path(directory) if directory is not None else None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, native: str) -> Path:
        return self.directory / f"{native}.json"  # native ids are [A-Za-z0-9_.-]: safe file names

    def save(self, native: str, version: int, committed: list[str] | None, next_committed: list[str]) -> None:
        """Record ``committed`` at ``version`` (None: unknown) and ``next_committed`` at ``version + 1`` (the change under way)."""
        if self.directory is None:
            return
        record = {"version": version, "committed": committed, "next": {"version": version + 1, "committed": next_committed}}
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=f".{native}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(record, out)
            os.replace(temporary, self._path(native))
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def load(self, native: str, version: int) -> list[str] | None:
        """The committed hashes recorded for ``version`` of the session's memory, or None if none match."""
        if self.directory is None:
            return None
        try:
            record = json.loads(self._path(native).read_text())
            for entry in (record, record["next"]):
                hashes = entry["committed"]
                if entry["version"] == version and hashes is not None:
                    if not all(isinstance(h, str) for h in hashes):
                        raise TypeError("committed hashes must be strings")
                    return list(hashes)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable session record %s: %s", self._path(native), exc)
        return None

    def delete(self, native: str) -> None:
        if self.directory is not None:
            self._path(native).unlink(missing_ok=True)

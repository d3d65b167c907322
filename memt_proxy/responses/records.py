"""Bookkeeping of the Responses and Conversations APIs: stored responses, threads, and their persistence.

A *thread* is a run of responses sharing one MemT session (a session name in ``memt_proxy.session.sessions``):
a **conversation** (``conv_…``, made by ``POST /v1/conversations``) or a **chain** (``chain_…``, made
when a stored response is first continued with ``previous_response_id``). The thread's ``head`` is its
latest response, ``version`` the session's published memory version right after it, and
``uncommitted`` the chat messages that memory does not hold yet (items added to a conversation, or a
turn still open: cut by ``max_output_tokens``, or waiting for function results); they are sent with
the next input and committed with its turn.

A stored response records where its memory is: (thread, version), plus for chains the upstream
snapshot of that version, kept for the ``--response-snapshots`` most recent ones of each chain only, so
that continuing an older one (a branch) can copy that memory into a new session. A response with no
thread was answered without memory; continuing it starts a chain whose first turn carries its messages.

Records are plain JSON; with a directory every change is written atomically (temporary file +
rename), one file per record named by a hash of (tenant, id), so a proxy killed at any point restarts
with every response and thread it had acknowledged. Ids are only found under their own tenant.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from memt_proxy.errors import kept_on_disk

log = logging.getLogger("memt.proxy")

ID = re.compile(r"^(resp|conv|chain)_[A-Za-z0-9]{1,96}$")
SNAPSHOTS_PER_CHAIN = 16  # default --response-snapshots
IN_MEMORY = 4096  # records of each kind cached in memory; without a directory, older ones are forgotten


@dataclass
class ResponseRecord:
    """A stored response: what it returned and where the memory that continues it is."""

    id: str
    tenant: str
    body: dict  # the response object as returned
    input_items: list[dict]
    thread: str | None = None  # the thread whose session held its memory; None: answered without memory
    version: int = 0  # that session's published memory version right after this response
    snapshot_of: str | None = None  # the response whose snapshot (in its thread's ``snapshots``) is that version
    uncommitted: list[dict] = field(default_factory=list)  # chat messages on top of that memory (an open turn)
    calls: list[str] = field(default_factory=list)  # call_ids of function calls waiting for their output


@dataclass
class Thread:
    """A conversation or a chain: one session, its head response and what its memory does not hold yet."""

    id: str
    tenant: str
    session: str  # the session name (``Sessions.turn``); never a chat session's name (it has a ':')
    created_at: int = 0
    metadata: dict = field(default_factory=dict)
    head: str | None = None
    version: int = 0
    uncommitted: list[dict] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)  # call_ids the head waits for
    behind: list[dict] = field(default_factory=list)  # the messages of the turn committed behind the head's answer
    snapshot_of: str | None = None  # the response whose snapshot holds the memory at ``version`` (chains)
    snapshots: dict[str, str] = field(default_factory=dict)  # response id → upstream snapshot file, oldest first
    saved: int = 0  # snapshots made so far: file slots rotate, so a chain never has more than its bound upstream
    items: list[dict] = field(default_factory=list)  # conversation items recorded by this proxy
    answered: dict | None = None  # the head's request digest and response body, for an identical retry

    @property
    def conversation(self) -> bool:
        return self.id.startswith("conv_")

    # ---- the thread's transitions, as session/state.py names a session's: every change of a thread is one of these

    def rebuilt(self, messages: list[dict]) -> None:
        """Its memory was found empty upstream though writes were recorded: all of ``messages`` (its items) go with the
        next input as context, committed with its turn."""
        self.uncommitted, self.version, self.snapshot_of = messages, 0, None

    def missed_commit(self, version: int) -> None:
        """The turn committed behind the head's answer did not land (memory at ``version``): it goes in with the next one."""
        self.uncommitted = self.behind + self.uncommitted
        self.version, self.behind, self.snapshot_of = version, [], None

    def confirmed(self) -> None:
        """The memory upstream is the one recorded: nothing waits behind the head any longer."""
        self.behind = []

    def answered_by(self, response_id: str, *, messages: list[dict], calls: list[str], version: int | None, base_version: int, items: list[dict]) -> None:
        """``response_id`` is the new head: its turn (``messages``) committed behind the answer (``version``: the one that
        publishes), or, with ``version`` None, left pending on ``calls`` (or open: cut by max_output_tokens) at
        ``base_version``; a conversation records the turn's ``items``."""
        if version is not None:  # the thread's next request waits for the commit, then confirms it (``Threads.confirm``)
            self.uncommitted, self.calls, self.behind = [], [], messages
            self.snapshot_of = None if self.conversation else response_id  # a chain exports it before its next write
        else:
            self.uncommitted, self.calls = messages, calls
            version = base_version
        self.head, self.version = response_id, version
        if self.conversation:
            self.items += items

    def remember_answer(self, digest: str, key: str | None, response_id: str, body: dict) -> None:
        """The head's request and answer, for a client's identical retry."""
        self.answered = {"digest": digest, "key": key, "id": response_id, "body": body}

    def next_snapshot(self, limit: int) -> str:
        """The upstream file for the next snapshot: slot ``saved % limit``, whose previous holder (the
        ``limit``-th most recent) is forgotten by ``keep_snapshot``. A name apart from any tenant-chosen
        snapshot name (those start with 't'), scoped by tenant and thread."""
        tenant = hashlib.sha256(self.tenant.encode()).hexdigest()[:16]
        return f"r{tenant}-{self.id}-{self.saved % limit}.safetensors"

    def keep_snapshot(self, response_id: str, file: str, limit: int) -> None:
        """``response_id``'s memory is now in ``file``; only the ``limit`` most recent snapshots are kept."""
        self.snapshots[response_id] = file
        self.saved += 1
        self.snapshot_of = response_id
        for old in list(self.snapshots)[:-limit]:
            del self.snapshots[old]

    def snapshot(self, response_id: str | None) -> str | None:
        """The file holding ``response_id``'s snapshot, if it is still kept."""
        return self.snapshots.get(response_id) if response_id is not None else None


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes whenever a record's file is rewritten (each write is a new file renamed over it)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def session_name(thread_id: str) -> str:
    """The session of a thread: a name a chat client cannot send (``X-MemT-Session`` has no ':')."""
    return "responses:" + thread_id


def valid_id(value: str) -> bool:
    return isinstance(value, str) and ID.fullmatch(value) is not None


class ResponseRecords:
    """Responses and threads per tenant, in memory (bounded) and, with ``directory``, on disk."""

    def __init__(self, directory: str | Path | None, *, in_memory: int = IN_MEMORY, shared: bool = False):
        self.directory = Path(directory) if directory is not None else None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
        self.in_memory = in_memory
        # shared: other proxies (the nodes of a cluster) write the same directory, so a cached record is
        # checked against its file on every read and refreshed in place when another node rewrote it
        self.shared = shared and self.directory is not None
        self._cache: OrderedDict[tuple[str, str, str], ResponseRecord | Thread] = OrderedDict()
        self._stamps: dict[tuple[str, str, str], tuple[int, int, int]] = {}

    def response(self, tenant: str, response_id: str) -> ResponseRecord | None:
        return self._get(ResponseRecord, tenant, response_id)

    def thread(self, tenant: str, thread_id: str) -> Thread | None:
        return self._get(Thread, tenant, thread_id)

    def save(self, record: ResponseRecord | Thread) -> None:
        """Keep ``record``: on disk first, where there is a directory; one that is full or read-only refuses it with a
        507 (``kept_on_disk``) and a new record is then not kept in memory either."""
        key = (type(record).__name__, record.tenant, record.id)
        if self.directory is not None:
            path = self._path(*key)
            with kept_on_disk("the response" if isinstance(record, ResponseRecord) else f"the {'conversation' if record.conversation else 'chain'}"):
                self._write(path, asdict(record))
            self._stamps[key] = _stamp(path)
        self._cache[key] = record
        self._cache.move_to_end(key)
        while len(self._cache) > self.in_memory:
            self._stamps.pop(self._cache.popitem(last=False)[0], None)

    def delete(self, record: ResponseRecord | Thread) -> None:
        key = (type(record).__name__, record.tenant, record.id)
        if self.directory is not None:
            with kept_on_disk("its deletion"):
                self._path(*key).unlink(missing_ok=True)
        self._cache.pop(key, None)
        self._stamps.pop(key, None)

    def _get(self, kind: type, tenant: str, record_id: str):
        if not valid_id(record_id):
            return None
        key = (kind.__name__, tenant, record_id)
        record = self._cache.get(key)
        if self.directory is not None and (record is None or self.shared):
            path = self._path(*key)
            stamp = _stamp(path)
            if stamp is None:  # never stored, or deleted (by another node, when shared)
                self._cache.pop(key, None)
                self._stamps.pop(key, None)
                return None
            if record is None or stamp != self._stamps.get(key):
                fresh = self._read(kind, path)
                if fresh is None or (fresh.tenant, fresh.id) != (tenant, record_id):
                    return None
                if record is None:
                    record = self._cache[key] = fresh
                else:  # in place: requests already holding this record see the other node's changes
                    vars(record).update(vars(fresh))
                self._stamps[key] = stamp
        if record is not None:
            self._cache.move_to_end(key)
        return record

    def _path(self, kind: str, tenant: str, record_id: str) -> Path:
        digest = hashlib.sha256(f"{tenant}\x00{record_id}".encode()).hexdigest()[:40]
        return self.directory / f"{kind.lower()}-{digest}.json"

    def _write(self, path: Path, data: dict) -> None:
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(data, out)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def _read(self, kind: type, path: Path):
        try:
            return kind(**json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            log.warning("ignoring unreadable record %s: %s", path, exc)
            return None

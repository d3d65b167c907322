"""A small pure-Python ``Engine`` for tests of the engine seam: no model, no torch.

Its "memory" is the tuple of token ids committed to a session; a query reading memory generates
those tokens over and over (so an answer shows exactly what was published), and without memory it
counts up from the prompt's last token. Snapshots are JSON files. It implements every method the
server calls, so the native routes run over it unchanged.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from memt_core.engine import CommitInfo, Engine, EngineOptions, EngineStats, TokenEvent
from memt_core.errors import CheckpointError, InvalidRequest
from memt_core.names import check_snapshot_name
from memt_core.protocol import effects as fx


@dataclass
class _Session:
    published: tuple[int, ...] = ()
    candidates: dict[str, list[int]] = field(default_factory=dict)
    applied: dict[str, list[str]] = field(default_factory=dict)


class FakeEngine(Engine):
    name = "fake"

    def __init__(self, vocab_size: int, state_directory: str | None = None):
        self._vocab = vocab_size
        self._stats = EngineStats()
        self.state_directory = Path(state_directory) if state_directory else None
        self.sessions: dict[str, _Session] = {}
        self.cancelled: set[str] = set()
        self.running = False
        self.effects: list[str] = []  # names of the effects carried out, in order
        self.hold: threading.Event | None = None  # when set to an unset Event, commits and queries wait for it (a stuck worker)
        self.incremental: list[bool] = []  # each query's ``incremental`` flag, in order

    @classmethod
    def check_options(cls, options: EngineOptions) -> None:
        if options.device != "cpu":
            raise CheckpointError("the fake engine runs on 'cpu' only")

    @classmethod
    def load(cls, checkpoint, options: EngineOptions) -> "FakeEngine":
        return cls(int(checkpoint.backbone["vocab_size"]), options.state_directory)

    def start(self) -> "FakeEngine":
        self.running = True
        return self

    def stop(self) -> None:
        self.running = False

    @property
    def alive(self) -> bool:
        return self.running

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def stats(self) -> EngineStats:
        return self._stats

    # ------------------------------------------------------------------ memory

    async def apply(self, effect: fx.Effect):
        self.effects.append(type(effect).__name__)
        s = self.sessions.get(effect.session)
        if isinstance(effect, fx.NewMemory):
            self.sessions[effect.session] = _Session()
        elif isinstance(effect, fx.CopyMemory):
            self.sessions[effect.session] = _Session(published=self.sessions[effect.source].published)
        elif isinstance(effect, fx.ForkCandidate):
            s.candidates[effect.transaction] = list(s.published)
            s.applied[effect.transaction] = []
        elif isinstance(effect, fx.DropCandidate):
            s.candidates.pop(effect.transaction, None)
        elif isinstance(effect, fx.PublishCandidate):
            s.published = tuple(s.candidates.pop(effect.transaction))
        elif isinstance(effect, fx.ClearMemory):
            s.published = ()
        elif isinstance(effect, fx.DropSession):
            self.sessions.pop(effect.session, None)
        elif isinstance(effect, fx.ImportSnapshot):
            s.candidates[effect.transaction] = json.loads(self._path(effect.file).read_text())["tokens"]
        elif isinstance(effect, fx.ExportSnapshot):
            tokens = s.published if effect.transaction is None else s.candidates[effect.transaction]
            name = effect.file or f"{effect.session}-export.safetensors"
            path = self._path(name)
            if path.exists() and not effect.overwrite:
                raise InvalidRequest(f"{name} exists")
            path.write_text(json.dumps({"tokens": list(tokens)}))
            return name
        elif isinstance(effect, fx.CancelRequest):
            return self.cancel(effect.rid)
        elif isinstance(effect, fx.ReconcileCommits):
            return list(s.applied.get(effect.transaction, [])) if s else []
        return None

    def _path(self, name: str) -> Path:
        if self.state_directory is None:
            raise InvalidRequest("no state directory")
        return self.state_directory / check_snapshot_name(name)

    async def _held(self) -> None:
        if self.hold is not None:
            await asyncio.to_thread(self.hold.wait)

    async def commit(self, session: str, transaction: str, nonce: str, ids: list[int]) -> CommitInfo:
        await self._held()
        s = self.sessions[session]
        s.candidates[transaction].extend(ids)
        s.applied[transaction].append(nonce)
        self._stats.commits += 1
        self._stats.commit_tokens += len(ids)
        return CommitInfo(tokens=len(ids), write_events=1)

    def committed(self, session: str, transaction: str, nonce: str) -> bool:
        s = self.sessions.get(session)
        return bool(s and nonce in s.applied.get(transaction, []))

    # ------------------------------------------------------------------ generation

    def check_prompt(self, session: str, prompt: list[int]) -> None:
        return None

    def query(self, rid, prompt, params, *, session=None, memory_read=True, retain=False, incremental=True):
        memory = self.sessions[session].published if session is not None and memory_read else ()
        self.incremental.append(incremental)
        self._stats.prompt_tokens += len(prompt)
        return self._events(rid, list(prompt), memory, params.max_new_tokens)

    async def _events(self, rid: str, prompt: list[int], memory: tuple[int, ...], count: int):
        await self._held()
        for i in range(count):
            await asyncio.sleep(0)
            if rid in self.cancelled:
                yield TokenEvent(None, finish_reason="abort")
                return
            token = memory[i % len(memory)] if memory else (prompt[-1] + 1 + i) % self._vocab
            self._stats.generated_tokens += 1
            yield TokenEvent(token, finish_reason="length" if i + 1 == count else None)

    def cancel(self, rid: str) -> bool:
        self.cancelled.add(rid)
        return True

"""The session layer's unit tests' harness: a ``Sessions`` over an in-process core — the real native server (protocol,
service, routes) over ``tests/server/fake_engine.py``'s pure-Python engine — through the embedded transport
(``memt_proxy.http.embedded.InProcessNativeClient``). No servers, no sockets, no model: each test runs in well
under a second of CPU.

The fake engine's memory is the token ids committed to a session, and a query reading it answers those ids over
and over, so ``Harness.memory`` (or a query) shows exactly what a session's memory holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "server"))  # fake_engine, as tests/server imports it

from fake_engine import FakeEngine  # noqa: E402

import httpx  # noqa: E402

from memt_core.bundled import BUNDLED_MODEL  # noqa: E402
from memt_core.client.chat_format import load_chat_format, load_tokenizer  # noqa: E402
from memt_core.client.native import new_transaction  # noqa: E402
from memt_core.launch import assemble, build_parser, plan_launch  # noqa: E402
from memt_proxy.http.embedded import InProcessNativeClient  # noqa: E402
from memt_proxy.session.clock import Clock  # noqa: E402
from memt_proxy.session.prefix_index import chain  # noqa: E402
from memt_proxy.session.sessions import Sessions  # noqa: E402
from memt_proxy.session.state import new_kept_name  # noqa: E402
from memt_proxy.session.store import SessionRecordStore  # noqa: E402

Hook = Callable[[str, str | None, dict], Awaitable[None] | None]


class RecordingClient(InProcessNativeClient):
    """The embedded client, every control action and commit recorded as ``(action, session)`` in ``calls``;
    ``hooks[action](action, session, fields)`` runs (and may raise) before the call is sent."""

    def __init__(self, app, service):
        super().__init__(app, service=service, max_body_bytes=8 << 20)
        self.calls: list[tuple[str, str | None]] = []
        self.hooks: dict[str, Hook] = {}

    async def _hook(self, action: str, session: str | None, fields: dict) -> None:
        self.calls.append((action, session))
        hook = self.hooks.get(action)
        if hook is not None:
            result = hook(action, session, fields)
            if asyncio.iscoroutine(result):
                await result

    async def control(self, action: str, session: str | None = None, **fields: Any) -> dict:
        await self._hook(action, session, fields)
        return await super().control(action, session, **fields)

    async def commit(self, session: str, lease: str, transaction: str, input_ids: list[int], *, nonce: str | None = None) -> dict:
        await self._hook("commit", session, {"ids": list(input_ids)})
        return await super().commit(session, lease, transaction, input_ids, nonce=nonce)

    async def query(self, session: str, lease: str, input_ids: list[int], **kwargs: Any) -> dict:
        await self._hook("query", session, {"lease": lease})
        return await super().query(session, lease, input_ids, **kwargs)

    async def query_stream(self, session: str, lease: str, input_ids: list[int], **kwargs: Any):
        await self._hook("query", session, {"lease": lease})
        async for body in super().query_stream(session, lease, input_ids, **kwargs):
            yield body

    def count(self, action: str, session: str | None = None) -> int:
        return sum(1 for a, s in self.calls if a == action and (session is None or s == session))


class StoppedClock(Clock):
    """Time that moves only when a test moves it (``advance``), or a part sleeps on it (``sleep``: that time has passed).
    Given to ``run`` (``clock=``), it is both the proxy's (``Sessions.clock``) and the core's (``MemTService.clock``), so
    a lease test waits for no second of real time and what it sees does not depend on the machine's speed."""

    def __init__(self, start: float = 1000.0):
        self.time = start
        self._waiting: dict[asyncio.Task, float] = {}  # a task waiting on the clock → until when
        self._moved = asyncio.Event()

    def now(self) -> float:
        return self.time

    def _move(self, to: float) -> list[asyncio.Task]:
        """Time on to ``to``; every waiter wakes to look; those due are returned (no longer counted as waiting)."""
        self.time = max(self.time, to)
        due = [task for task, until in self._waiting.items() if until <= self.time]
        for task in due:
            del self._waiting[task]
        self._moved.set()
        self._moved = asyncio.Event()
        return due

    async def sleep(self, seconds: float) -> None:
        self._move(self.time + seconds)
        await asyncio.sleep(0)

    async def wait(self, event: asyncio.Event, until: float) -> None:
        task = asyncio.current_task()
        while not event.is_set() and self.time < until:
            self._waiting[task] = until
            either = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._moved.wait())]
            try:
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in either:
                    waiter.cancel()
                self._waiting.pop(task, None)

    async def advance(self, seconds: float, *, step: float = 0.05) -> None:
        """Move time on by ``seconds``, ``step`` at a time; after each step the waiters that came due run until they
        wait on the clock again or end (a keeper renews or releases its lease, then waits for its next moment)."""
        start, end, steps = self.time, self.time + seconds, max(1, round(seconds / step))
        for taken in range(1, steps + 1):  # each step's time from the start, so that the last one is ``end`` exactly
            await asyncio.sleep(0)  # a task just started (a keeper of a lease just taken) reaches its wait first
            due = self._move(end if taken == steps else start + seconds * taken / steps)
            await until(lambda: all(task.done() or task in self._waiting for task in due), what="the waiters the clock woke")


@dataclass
class Harness:
    app: Any
    service: Any  # the core's MemTService
    engine: FakeEngine
    sessions: Sessions  # the proxy's session layer
    client: RecordingClient  # its client
    records_directory: Path | None
    options: dict
    identity: str
    lives: list[Sessions] = field(default_factory=list)

    @property
    def clock(self):
        """The clock the proxy and the core run on (``run(clock=...)``)."""
        return self.sessions.clock

    @property
    def protocol(self):
        return self.service.protocol

    def life(self, **more) -> Sessions:
        """Another proxy's session layer over the same core (e.g. a restarted one), with the same records unless told;
        ``check_upstream`` is left to the caller."""
        client = RecordingClient(self.app, self.service)
        options = {**self.options, **more}
        if "records" not in more and self.records_directory is not None:
            options["records"] = SessionRecordStore(self.records_directory)
        sessions = Sessions(client, identity=self.identity, **options)
        self.lives.append(sessions)
        return sessions

    def other_client(self) -> InProcessNativeClient:
        """A native client of its own: another client of the same core."""
        return InProcessNativeClient(self.app, service=self.service, max_body_bytes=8 << 20)

    def memory(self, native: str) -> tuple[int, ...] | None:
        """The ids the session's published memory holds (None: no such native session)."""
        session = self.engine.sessions.get(native)
        return None if session is None else session.published

    def native(self, native: str):
        """The core's protocol record of a session (None if it does not exist)."""
        return self.protocol.sessions.get(native)

    def proxy_sessions(self) -> set[str]:
        """The native sessions a proxy made on the core (their ids start with ``p-``)."""
        return {name for name in self.protocol.sessions if name.startswith("p-")}


_PLANS: dict[tuple, Any] = {}


def _plan(flags: tuple[str, ...]):
    if flags not in _PLANS:  # the first plan imports the checkpoint's config classes (about 2 s); later ones are quick
        _PLANS[flags] = plan_launch(build_parser().parse_args(["--device", "cpu", *flags]))
    return _PLANS[flags]


def run(body: Callable[[Harness], Awaitable[Any]], *, core: tuple[str, ...] = (), state: Path | None = None, records: bool = True,
        check: bool = True, timeout: float = 30.0, clock: Clock | None = None, **options) -> Any:
    """``await body(harness)`` in a fresh event loop, over a fresh in-process core (``core``: launcher flags; ``state``:
    its --state-directory, also the proxy's records directory unless ``records`` is False); ``options``: the
    ``Sessions``' (``lease_wait`` 5 s unless given). ``check``: the upstream checked first (``check_upstream``). ``clock``:
    the proxy's and the core's (a ``StoppedClock``: ``harness.clock``), else the wall clock."""
    flags = tuple(core) + (("--state-directory", str(state)) if state is not None else ())
    plan = _plan(flags)
    engine = FakeEngine.load(plan.checkpoint, plan.engine_options())
    app, service = assemble(plan, engine)
    if clock is not None:
        service.clock = clock.now
        options["clock"] = clock
    options.setdefault("lease_wait", 5.0)
    options.setdefault("native_encoding", plan.checkpoint.native_encoding()["name"])  # as the proxy's chat format says
    records_directory = state / "records" if state is not None and records else None

    async def main():
        async with app.router.lifespan_context(app):
            harness = Harness(app, service, engine, None, None, records_directory, options, plan.checkpoint.identity())  # type: ignore[arg-type]
            harness.sessions = harness.life()
            harness.client = harness.sessions.upstream.client
            try:
                if check:
                    await harness.sessions.check_upstream()
                return await asyncio.wait_for(body(harness), timeout)
            finally:
                for sessions in harness.lives:
                    await sessions.aclose()

    return asyncio.run(main())


async def until(condition: Callable[[], bool], timeout: float = 5.0, what: str = "the condition") -> None:
    """Let the event loop run, a round at a time (as ``turns``: no sleep), until ``condition()`` holds; bounded:
    AssertionError after ``timeout`` seconds of rounds (a condition that never comes)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0)


async def turns(count: int = 1) -> None:
    """Let the event loop run ``count`` rounds (every ready task steps once a round); no time passes: how a test
    interleaves concurrent requests without sleeping."""
    for _ in range(count):
        await asyncio.sleep(0)


async def settle(sessions: Sessions) -> None:
    """Wait for every commit and fork under way behind answers (and any they start)."""
    while sessions.behind:
        await asyncio.gather(*set(sessions.behind), return_exceptions=True)


async def write_natively(client: InProcessNativeClient, native: str, lease: str, ids: list[int]) -> None:
    """begin → commit ``ids`` → publish by a native client (someone other than the proxy changing the memory)."""
    transaction = new_transaction()
    await client.control("begin", native, lease=lease, transaction=transaction)
    await client.commit(native, lease, transaction, ids)
    await client.control("publish", native, lease=lease, transaction=transaction, memory_read=True)


async def committed_session(sessions: Sessions, tenant: str, name: str, ids: list[int], hashes: list[str]):
    """A named session created and written (``ids``, recorded as holding ``hashes``) in one held turn; its state."""
    async with sessions.turn(tenant, name) as held:
        await held.start()
        await held.commit_turn([], ids, hashes)
        return held.state


def kept(sessions: Sessions) -> list:
    """The kept states (header-less kind) that exist upstream."""
    return [state for state in sessions.table if state.is_kept and state.exists]


async def kept_state(sessions: Sessions, tenant: str, hashes: list[str], ids: list[int]):
    """A kept state holding ``ids``, recorded as holding ``hashes`` and indexed by their chain, as ``headerless`` makes one."""
    async with sessions.turn(tenant, new_kept_name()) as held:
        state = held.state
        async with sessions.kept.room(state):
            await held.start()
        sessions.kept.move(state, chain(tenant, hashes)[-1])
        await sessions.writes.write(state, held.lease, [ids], hashes)
    return state


# ---- the surfaces and the proxy's app over the harness's session layer


@functools.lru_cache(maxsize=1)
def chat_format_and_parser():
    """The chat format and output parser of the checkpoint the harness's core serves (the bundled demo model's)."""
    return load_chat_format(BUNDLED_MODEL, tokenizer=load_tokenizer(BUNDLED_MODEL))


def surfaces(h: Harness, *, records=None, **options):
    """The real ``ChatService`` and ``ResponsesService`` (sharing one turn runner, as the proxy builds them) over the
    harness's session layer; ``records``: the Responses records (in memory unless given); ``options``: both services'."""
    from memt_proxy.chat.service import ChatService
    from memt_proxy.responses.records import ResponseRecords
    from memt_proxy.responses.service import ResponsesService

    chat_format, parser = chat_format_and_parser()
    chat = ChatService(h.sessions, chat_format, parser, model_names=["m"], **options)
    responses = ResponsesService(h.sessions, chat_format, parser, records or ResponseRecords(None), model_names=["m"], runner=chat.runner, **options)
    return chat, responses


def asked(body, tenant: str = "t", **controls) -> tuple:
    """A surface's arguments for a request ``body``: the body and its ``RequestContext``, built as the routes build it
    (``route_inputs.request_context``; ``controls``: ``Controls``' fields, the memory policy "auto" unless given)."""
    from memt_proxy.http.route_inputs import Controls, request_context

    return body, request_context(tenant, body, Controls(**controls), "auto")


@contextlib.asynccontextmanager
async def proxy(h: Harness, *, api_keys: dict[str, str] | None = None, **options):
    """The proxy's whole app (``create_app``: routes, auth, error bodies, metrics) over the harness's session layer, and
    an ``httpx.AsyncClient`` that calls it in-process: yields (client, chat service, responses service)."""
    from memt_proxy.http.app import create_app

    chat, responses = surfaces(h)
    app = create_app(chat, responses=responses, api_keys=api_keys, **options)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as client:
        yield client, chat, responses

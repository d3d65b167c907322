"""One turn on the session layer, whatever the surface: hold → answer or stream → memory after it → retry → usage.

A surface (Chat Completions, Responses) reads its request into a ``Turn`` — what the model reads, where the
memory comes from, what a completed answer commits — and shapes the answer it gets back. Everything between is
here, once, so both surfaces follow the same rules:

* **hold**: a held session is let go when its answer ends; a stream's when the stream ends, or after
  ``STREAM_START_TIMEOUT`` if the client never starts reading it (``answer``, ``streaming``);
* **generate**: a query reading the held session's memory, or a plain generation (``generate``, ``generate_stream``);
* **memory after the answer** (``after``): function calls leave the turn pending (its exact tokens), a completed
  answer on memory policy ``auto`` is committed behind the answer (a named chat session keeping the state before it,
  ``keep_parent``; a session that forked follows the state it read, ``follower``), any other ends the turn as
  context; a header-less turn forks the conversation's next state instead (``memt_proxy.session.headerless``), a cut answer
  included (closed with the end token, as the app's transcript closes it);
* **retry**: every answer on memory is kept for a client's retry (``retried``; the rule is ``retries.retried``);
* **usage**: ``on_usage`` once per finished answer (``usage``), with the prompt tokens memory spared.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

from memt_core.client.chat_format import ChatFormat
from memt_proxy.session.headerless import HeaderlessPlan, after_answer, closed, planned, resumable, resume
from memt_proxy.errors import ProxyError, Unavailable
from memt_proxy.session.sessions import HeldSession, MemoryFound, PendingTurn, Sessions, SessionState
from memt_proxy.session.transcript import message_hash, overlap
from memt_proxy.session.retries import KeptAnswers, retried

log = logging.getLogger("memt.proxy")

STREAM_START_TIMEOUT = 60.0  # seconds a held session waits for its stream to be consumed


def no_usage(**usage) -> None:
    """The default ``on_usage``: nobody is counting."""


@dataclass
class Turn:
    """Everything decided before the model runs, by either surface."""

    tenant: str
    policy: str  # memory: "auto" reads and commits, "read" only reads, "off" neither
    prompt: list[int]
    turn_ids: list[int] = field(default_factory=list)  # the open turn's ids, the forced start included
    context_ids: list[int] = field(default_factory=list)  # the messages before the turn that memory lacks
    context: list[dict] = field(default_factory=list)
    turn: list[dict] = field(default_factory=list)  # the open turn's messages
    context_hashes: list[str] | None = None  # ``context``'s hashes, where the surface has them already
    thinking: bool = False
    sampling: dict = field(default_factory=dict)
    prefix: str = ""  # the forced start of the answer (a tool call)
    stops: list[str] = field(default_factory=list)
    parallel_tools: bool = True
    raw: bool = False  # the answer is structured JSON, returned as it is (no markup to parse)
    state: SessionState | None = None  # the memory the prompt reads (None: none)
    saved: int = 0  # prompt tokens memory spared (``MemoryTokens``)
    digest: str = ""  # the request's digest (``retries.request_digest``): set, its answer is kept for a retry
    key: str | None = None  # the request's Idempotency-Key
    kept: str | None = None  # the answer as the app received it (set by the surface before ``after``)
    headerless: HeaderlessPlan | None = None  # a conversation identified by its transcript (``memt_proxy.session.headerless``)
    opening: Callable[[], Awaitable[list[int]]] | None = None  # header-less, no kept state: its history and turn as committed
    follower: HeldSession | None = None  # a named session that follows the state the prompt reads (a fork)
    keep_parent: bool = False  # a commit first keeps the state before it (named chat sessions)
    started: bool = False  # streams: the response began
    request: Any = None  # the surface's request
    thread: Any = None  # Responses: the thread the response lands in (None: no memory)
    items: list[dict] = field(default_factory=list)  # Responses: the request's input items (stored form)
    base_version: int = 0  # Responses: the memory version the prompt reads
    as_text: int = 0  # Responses, memory off: the leading messages sent as text that the conversation holds already


@dataclass(frozen=True)
class OnMemory:
    """Where a turn is answered, as a hold says for either surface: on ``held`` (let go by closing ``hold``) with the turn
    ``prepare()`` makes there; or, holding no memory, the plain generation's ``turn``; or, for a client's retry, only
    the kept answer (``replay``)."""

    held: HeldSession | None = None
    hold: contextlib.AsyncExitStack | None = None
    prepare: Callable[[], Awaitable[Turn]] | None = None
    turn: Turn | None = None
    replay: Any = None


class TurnRunner:
    """Runs planned ``Turn``s on one upstream's session layer for every surface (see the module docstring).
    ``on_usage(prompt_tokens=, completion_tokens=, saved_tokens=, memory=)``: once per finished answer (not for a
    replayed one); ``memory``: memory was read."""

    def __init__(self, sessions: Sessions, chat_format: ChatFormat):
        self.sessions = sessions
        self.chat_format = chat_format
        self.memory_tokens = sessions.memory_tokens
        self.answers = KeptAnswers()  # for a client's retry where no session keeps the answer
        self.on_usage = no_usage

    # ---- hold

    async def hold_named(self, tenant: str, session: str, messages: list, *, policy: str, strict: bool, size: int, digest: str,
                         retry: bool, key: str | None, plan: Callable[..., Awaitable[Turn]], starts_over: Callable[[SessionState], bool]):
        """Hold a named session for a request carrying ``messages`` (its whole transcript). Returns the session held,
        the stack that lets it go and the maker of its turn (``plan(state, hashes=None)``: the turn on ``state``'s
        memory); or, for a client's retry of the session's last committed turn, (None, None, its kept answer).

        A request that does not continue the session's memory — a regenerate, an edit, another conversation sent under
        the same name (an app's background task) — is answered from the deepest kept state its earlier messages reach
        (the session keeps the state before each of its turns, ``keep_parent``), and the session then follows it (a copy
        of that state with the turn written in, ``Later.source``). With none, memory starts over from the request's
        history (``starts_over``: one that must), what it held kept first as a state of its own, so the conversation it
        was can still be resumed. ``strict``: the session refuses a diverging request instead (409)."""
        hold = contextlib.AsyncExitStack()
        held = await hold.enter_async_context(self.sessions.turn(tenant, session))
        state = held.state
        try:
            await self.sessions.placement.adopt_recorded(state)  # e.g. after a restart: its record, its last answer
            last = state.last_turn
            if last and last.get("version") == state.version and last.get("digest") == digest and retried(retry, key, last.get("key")):
                await hold.aclose()
                return None, None, last
            forked = None if strict or policy != "auto" else await self._fork(held, hold, messages, size, plan)
        except BaseException:
            await hold.aclose()
            raise

        async def prepare() -> Turn:
            turn = await (forked[1]() if forked is not None else self._on_named(state, strict, plan, starts_over))
            turn.digest, turn.key = digest, key
            return turn

        return (held if forked is None else forked[0]), hold, prepare

    async def hold_headerless(self, tenant: str, messages: list, *, policy: str, size: int, digest: str, key: str | None,
                              plain: Callable[[HeaderlessPlan], Awaitable[Turn]],
                              plan: Callable[[SessionState, HeaderlessPlan], Awaitable[Turn]]) -> OnMemory:
        """Hold the memory of a conversation without a session name, for either surface: the deepest kept state its
        ``messages`` reach (``headerless.resume``), with the maker of its turn there (``plan(state, found)``); reaching none,
        the plain generation's turn (``plain(found)``). Either turn is the header-less plan's (``Turn.headerless``): its
        answer forks the conversation's next state (``after``)."""
        found, held, hold = await resume(self.sessions, messages, tenant, size)

        def marked(turn: Turn) -> Turn:
            turn.headerless, turn.policy, turn.digest, turn.key = found, policy, digest, key
            return turn

        if held is None:
            return OnMemory(turn=marked(await plain(found)))

        async def prepare() -> Turn:
            return marked(await plan(held.state, found))

        return OnMemory(held, hold, prepare)

    async def _fork(self, held: HeldSession, hold: contextlib.AsyncExitStack, messages: list, size: int, plan):
        """The kept state a named session's diverging request forks from, held (let go with the session), and the
        turn's maker; None: no fork (the request continues memory, or no kept state holds a prefix of it)."""
        state = held.state
        if not state.committed or not state.history_known:
            return None
        found = await planned(self.sessions, messages, state.tenant, size)
        if found.found is None or overlap(found.hashes, state.committed):
            return None
        origin_hold = contextlib.AsyncExitStack()
        try:
            origin = await origin_hold.enter_async_context(self.sessions.turn(state.tenant, found.found.name))
            if not await resumable(self.sessions, origin.state, found):
                await origin_hold.aclose()  # closed meanwhile: memory starts over instead
                return None
        except ProxyError as exc:
            await origin_hold.aclose()
            if exc.status != 429:
                raise
            return None
        except BaseException:
            await origin_hold.aclose()
            raise
        hold.push_async_callback(origin_hold.aclose)  # let go with the session, before it (its commit forks from it)
        log.info("%s forks from a kept state of %d messages", state.native, len(origin.state.committed))

        async def prepare() -> Turn:
            turn = await plan(origin.state, found.hashes)
            turn.follower = held
            return turn

        return origin, prepare

    async def _on_named(self, state: SessionState, strict: bool, plan, starts_over) -> Turn:
        """The turn on a named session's own memory (see ``hold_named``); it keeps the state before its commit."""
        try:
            if not starts_over(state):
                turn = await plan(state)
                turn.keep_parent = True
                return turn
        except ProxyError as exc:
            if exc.code != "transcript_diverged" or strict:
                raise
        await self.sessions.placement.lease_of(state)
        await self.sessions.keep_parent(state)
        await self.sessions.writes.reset(state, await self.sessions.placement.lease_of(state))
        turn = await plan(state)
        turn.keep_parent = True
        return turn

    async def answer(self, held: HeldSession, hold: contextlib.AsyncExitStack, prepare: Callable[[], Awaitable[Turn]], *,
                     stream: bool, run, streamed, create: bool = False):
        """Answer on a held session with the turn ``prepare()`` makes — before the native session exists, so a refused
        request creates nothing — with ``run(turn, held)`` or, streamed, ``streamed(turn, held, hold)``. ``create``: a
        new session is created beside its (non-streamed) answer (``HeldSession.start``)."""
        handed_off = False
        try:
            state = held.state
            turn = await prepare()
            missing, assumed = not state.exists, list(state.committed)
            await held.start(with_answer=True, create=create and not stream)
            # adopted holding memory already, or created empty where the turn assumed memory held some of the transcript
            # (e.g. after an upstream restart): the turn is prepared again on what memory holds
            if missing and state.exists and (not state.blank or state.committed != assumed):
                turn = await prepare()
            if stream:
                handed_off = True
                return self.handed(turn, held, hold, stream=True, run=run, streamed=streamed)
            try:
                return await run(turn, held)
            except MemoryFound:  # the same, found only once the answer was under way
                return await run(await prepare(), held)
        finally:
            if not handed_off:
                await hold.aclose()

    def handed(self, turn: Turn, held: HeldSession, hold: contextlib.AsyncExitStack, *, stream: bool, run, streamed):
        """The answer of a turn on a started session, which ``hold`` lets go when it ends: ``streamed(turn, held, hold)``
        (let go by the stream, or if it is not started in time) or an awaitable of ``run(turn, held)``."""
        if stream:
            asyncio.get_running_loop().call_later(STREAM_START_TIMEOUT, self._unstarted, turn, hold)
            return streamed(turn, held, hold)

        async def answered():
            try:
                return await run(turn, held)
            finally:
                await hold.aclose()
        return answered()

    async def streaming(self, turn: Turn, hold: contextlib.AsyncExitStack | None, events: AsyncIterator) -> AsyncIterator:
        """``events``, a stream's bodies; the held session (if any) is let go when the stream ends, however it ends."""
        if turn.started:  # too late: the session was already let go
            raise Unavailable("the stream was not consumed in time", code="stream_expired")
        turn.started = True
        try:
            async for event in events:
                yield event
        finally:
            if hold is not None:  # the client may have gone away: let the session go in a task of its own
                asyncio.get_running_loop().create_task(hold.aclose())

    def _unstarted(self, turn: Turn, hold: contextlib.AsyncExitStack) -> None:
        """A stream the server never started (client gone before the response): let its session go."""
        if not turn.started:
            turn.started = True
            asyncio.get_running_loop().create_task(hold.aclose())

    # ---- generate

    async def generate(self, turn: Turn, held: HeldSession | None, sampling: dict | None = None) -> dict:
        """The native answer body: reading the held session's memory, or a plain generation."""
        sampling = turn.sampling if sampling is None else sampling
        return await (self.sessions.upstream.generate(turn.prompt, sampling) if held is None else held.query(turn.prompt, sampling))

    def generate_stream(self, turn: Turn, held: HeldSession | None, sampling: dict | None = None) -> AsyncIterator[dict]:
        """``generate`` as cumulative stream bodies."""
        sampling = turn.sampling if sampling is None else sampling
        return self.sessions.upstream.generate_stream(turn.prompt, sampling) if held is None else held.query_stream(turn.prompt, sampling)

    # ---- after the answer

    def after(self, turn: Turn, held: HeldSession | None, answer: list[dict], output_ids: list[int], finish: str, *,
              answered: dict | None = None) -> int | None:
        """Memory after an answer (``finish``: "stop", "length" or "tool_calls"; ``answer``: its messages) and the answer
        kept for a client's retry (``answered``: what the surface replays): a named chat session's committed turn in the
        session's record (``SessionState.last_turn``, which a restarted proxy reads too), any other in ``answers``.
        Returns the memory version a commit behind the answer publishes, or None."""
        named = held is not None and turn.headerless is None and turn.thread is None  # its retries read only its record
        if answered is not None and turn.digest and not named:
            self.answers.keep(turn.tenant, turn.digest, turn.key, answered)
        if turn.headerless is not None:
            self._fork_next(turn, held, answer, output_ids, finish)
            return None
        if held is None:
            return None
        state = held.state
        if finish == "tool_calls":
            if turn.follower is None:  # a fork's tool round forks again with its results
                hashes = [message_hash(m) for m in turn.turn + answer]
                self.sessions.writes.set_pending(state, PendingTurn(hashes, turn.turn_ids + output_ids, turn.thinking))
            return None
        if turn.policy != "auto" or finish != "stop":
            self.sessions.writes.set_pending(state, None)  # ended without a commit (read-only, or cut): it stays context
            return None
        context = turn.context_hashes if turn.context_hashes is not None else [message_hash(m) for m in turn.context]
        committed = state.committed + context + [message_hash(m) for m in turn.turn + answer]
        reply = self.reply_ids(turn, output_ids)
        # committed behind the answer: the app has it first, and the session's next request waits for the commit
        if turn.follower is not None:  # the named session becomes a copy of the state read (version 0), then this turn
            turn.follower.commit_turn_later(turn.context_ids, turn.turn_ids + reply, committed, source=state.name)
            target, version = turn.follower.state, 1
        else:
            held.commit_turn_later(turn.context_ids, turn.turn_ids + reply, committed, keep_parent=turn.keep_parent)
            self.memory_tokens.wrote(state, len(committed), len(turn.context_ids) + len(turn.turn_ids) + len(reply))
            target, version = state, state.version + 1
        if answered is not None and named:
            # kept in the session's record with that commit: a retry reaching a restarted proxy gets it too
            target.last_turn = {"digest": turn.digest, "key": turn.key, "version": version, **answered}
        return version

    def _fork_next(self, turn: Turn, held: HeldSession | None, answer: list[dict], output_ids: list[int], finish: str) -> None:
        """Header-less: an answer (not a function call) forks the conversation's next state from the one the request
        read, or starts one for a conversation worth keeping (``memt_proxy.session.headerless``)."""
        plan = turn.headerless
        keep = finish in ("stop", "length") and turn.policy == "auto" and (held is not None or plan.worth_keeping)
        reply = closed(self.reply_ids(turn, output_ids), self.chat_format.tokenizer.eos_token_id, finish == "length") if keep else []
        lacking, opening = turn.context_ids + turn.turn_ids, turn.opening

        async def ids() -> list[int]:
            return (await opening() if opening is not None else lacking) + reply

        after_answer(self.sessions, plan, answer, parent=held.state if held is not None else None, keep=keep, ids=ids)

    def reply_ids(self, turn: Turn, output_ids: list[int]) -> list[int]:
        """The reply as memory keeps it (``ChatFormat.reply_ids``): the generated ids, or for a reply cut by a stop
        string or cleaned of markup by the parser, the ids of the text the app received and an end token."""
        kept = turn.kept
        if kept is None or not kept.startswith(turn.prefix):  # the forced prefix is already in the turn's ids
            return output_ids
        return self.chat_format.reply_ids(output_ids, self.chat_format.decode(output_ids), kept[len(turn.prefix):])

    def usage(self, turn: Turn, completion_tokens: int) -> None:
        """``on_usage`` for a finished answer (all its choices)."""
        try:
            self.on_usage(prompt_tokens=len(turn.prompt), completion_tokens=completion_tokens, saved_tokens=turn.saved, memory=turn.state is not None)
        except Exception:
            log.exception("on_usage failed")

    def retried(self, tenant: str, digest: str, retry: bool, key: str | None):
        """The answer kept for this request when it is a client's retry (``retries.retried``), else None."""
        return self.answers.retried(tenant, digest, retry, key)

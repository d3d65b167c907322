"""Header-less memory: a conversation without ``X-MemT-Session`` is identified by its own transcript.

Each request is planned against the tenant's ``PrefixIndex`` (``plan_headerless``): the chain of its earlier
messages (those before its last user message; system/developer messages excluded) finds the deepest kept
*state* — a native session the proxy made, named ``~<nonce>`` (outside the client's name grammar, so no header
can name one), holding exactly the messages its chain names. The surface holds that state as it holds any
session (``Sessions.turn``), checks under its lock that it still holds a prefix of the transcript
(``resumable``: one closed meanwhile is looked for again), and answers from memory plus the rest.

States are never written once made. Behind a completed answer (``after_answer``) the conversation's next state
is *forked*: a new native session copied from the state the request read (``create`` with ``source``), into
which what that state lacks is committed — the messages between it and the turn, the turn and its answer —
so the conversation's next request finds it and sends the model only its new messages, as in a named
session. The state it was forked from stays, so a regenerate of that answer, or an edit of the last message,
resumes from the state before the turn, and an edit of message k resumes from the deepest state before k.
With no kept state, a request that is worth keeping (``PrefixIndex.worth_keeping``: its history holds an
answer of ours, or more than one exchange) starts a new state holding its whole answered transcript; a
one-shot request (no earlier exchange) is a plain generation that keeps nothing: most are one-off tasks
(titles, tags, classifications) that never continue, and a state for each would cost a native session and
a write and push real conversations' states out of the bound.

Were the upstream full with nothing idle to close, the state is simply not made: a header-less request is
never refused for room, and a state lost (closed to make room, or its write failed) only lengthens the
conversation's next prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

from memt_proxy.errors import ProxyError, Unavailable
from memt_proxy.session.prefix_index import Found, PrefixIndex, chain, extend, root
from memt_proxy.protocol import Message
from memt_proxy.session.state import new_kept_name
from memt_proxy.session.sessions import HeldSession, Sessions, SessionState
from memt_proxy.session.transcript import message_hash
from memt_proxy.worker import off_loop

log = logging.getLogger("memt.proxy")

RESUME_TRIES = 4  # lookups of one request, each after a kept state it found had moved on


@dataclass
class HeaderlessPlan:
    """Where a header-less request resumes: its earlier messages' hashes and chain, the deepest kept state."""

    hashes: list[str]  # the earlier messages' hashes
    found: Found | None
    worth_keeping: bool  # with no kept state: start one (else a plain generation)
    link: str  # the chain of the whole conversation sent (the answer extends it)
    links: tuple[str, ...] = ()  # the chain of each earlier message
    conversation: tuple[str, ...] = ()  # the hashes of every message sent (system/developer left out)
    tenant: str = ""


def _role(message: Message | dict) -> str:
    return message.role if isinstance(message, Message) else message["role"]


def plan_headerless(messages: list[Message] | list[dict], tenant: str, prefixes: PrefixIndex) -> HeaderlessPlan:
    """Plan a request (see the module docstring); ``messages``: a Chat request's, or a Responses input's as
    chat messages. A transcript that is no session turn (no user message, or ending with the assistant)
    finds nothing and is not worth keeping: it is answered as stateless chat."""
    conversation = [m for m in messages if _role(m) not in ("system", "developer")]
    hashes = [message_hash(m) for m in conversation]
    links = chain(tenant, hashes)
    link = links[-1] if links else root(tenant)
    last_user = max((i for i, m in enumerate(conversation) if _role(m) == "user"), default=None)
    if last_user is None or _role(conversation[-1]) == "assistant":
        return HeaderlessPlan([], None, False, link, tenant=tenant)
    earlier = links[:last_user]
    users = sum(_role(m) == "user" for m in conversation[:last_user])
    found = prefixes.find(earlier)
    worth = found is None and bool(earlier) and prefixes.worth_keeping(earlier, users)
    return HeaderlessPlan(hashes[:last_user], found, worth, link, tuple(earlier), tuple(hashes), tenant)


async def planned(sessions: Sessions, messages: list[Message] | list[dict], tenant: str, size: int) -> HeaderlessPlan:
    """``plan_headerless``, once the state the request's whole history names is made, if it is being made (its answer,
    just sent, forks it behind itself): a conversation's next request reads it, as a named session's next request waits
    for its commit. The wait is bounded by ``lease_wait``; past it the request reads what is kept."""
    plan = await off_loop(size, plan_headerless, messages, tenant, sessions.kept.prefixes)
    making = sessions.kept.prefixes.being_made(plan.links[-1]) if plan.links else None
    if making is not None and (plan.found is None or plan.found.depth < len(plan.links)):
        try:
            await asyncio.wait_for(making.wait(), timeout=sessions.leases.lease_wait)
        except asyncio.TimeoutError:
            return plan
        plan = await off_loop(size, plan_headerless, messages, tenant, sessions.kept.prefixes)
    return plan


async def resume(sessions: Sessions, messages: list[Message] | list[dict], tenant: str, size: int) -> tuple[HeaderlessPlan, HeldSession | None, contextlib.AsyncExitStack]:
    """Where a header-less request resumes, for either surface: its plan, the deepest kept state it reaches held
    (``Sessions.turn``; checked under its lock, ``resumable``: one closed meanwhile is looked for again, up to
    ``RESUME_TRIES`` times), and the stack that lets that state go; None held: answered from its text (no state
    reached, or every state in use)."""
    for attempt in range(RESUME_TRIES):
        plan = await planned(sessions, messages, tenant, size)
        find_shared(sessions, plan)
        if attempt == RESUME_TRIES - 1:
            plan.found = None  # the states it found kept going away: answered from the text
        hold = contextlib.AsyncExitStack()
        if plan.found is None:
            return plan, None, hold
        try:
            held = await hold.enter_async_context(sessions.turn(tenant, plan.found.name))
            if await resumable(sessions, held.state, plan):
                return plan, held, hold
        except ProxyError as exc:
            await hold.aclose()
            if exc.status != 429:
                raise
            plan.found = None  # no room for the state now (every state in use): answered without memory
            return plan, None, contextlib.AsyncExitStack()
        except BaseException:
            await hold.aclose()
            raise
        await hold.aclose()  # the state was closed meanwhile: look again
    raise AssertionError("unreachable: the last attempt answers without memory")


def find_shared(sessions: Sessions, plan: HeaderlessPlan) -> None:
    """With records a cluster's proxies share: a request that found no kept state here looks for one another
    node made (its memory in the shared snapshot store), and finds it from then on."""
    if plan.found is None:
        plan.found = sessions.kept.found_elsewhere(list(plan.links))


async def resumable(sessions: Sessions, state: SessionState, plan: HeaderlessPlan) -> bool:
    """Whether the held kept state ``state`` still holds a prefix of the request's earlier messages (adopting its
    native session first, e.g. after a proxy restart; one that is gone, e.g. closed to make room since the
    request found it, is not made again). If not, the index is told what it holds now."""
    if not state.exists and sessions.records.recorded_elsewhere(state.native):
        try:  # another node's (or one this core let go): brought back from the shared snapshot store
            await sessions.placement.ensure(state)
        except ProxyError as exc:
            log.info("kept state %s not taken over here (%s): answered from the text", state.native, exc.message)
            return False
    elif not state.exists and await sessions.upstream.call(sessions.placement.adopt_existing, state) is None:
        sessions.kept.move(state, None)
        return False
    held = state.committed
    if state.history_known and held and held == plan.hashes[: len(held)]:
        return True
    sessions.kept.move(state, chain(state.tenant, held)[-1] if state.history_known and held else None)
    return False




def closed(reply: list[int], end: int | None, cut: bool) -> list[int]:
    """A reply's ids as a kept state holds them: an answer ``cut`` at max_tokens is closed with the ``end`` token, as the
    app's transcript (which carries it as a whole message) closes it."""
    return reply + [end] if cut and end is not None and reply[-1:] != [end] else reply


def after_answer(
    sessions: Sessions, plan: HeaderlessPlan, answer: list[dict], *,
    parent: SessionState | None, keep: bool, ids: Callable[[], Awaitable[list[int]]],
) -> None:
    """Behind a header-less answer: the answered transcript remembered (a request carrying it is worth keeping)
    and, with ``keep``, the conversation's next state forked in a task the proxy's shutdown waits for (see the
    module docstring): a copy of ``parent`` (the state the request read; None: a new, empty session) into which
    ``ids()`` is written — the tokens of what ``parent`` lacks. A state already kept or being made for the same
    transcript is not made twice (concurrent identical requests with identical answers make one)."""
    hashes = [*plan.conversation, *(message_hash(m) for m in answer)]
    link = plan.link
    for message in answer:
        link = extend(link, message_hash(message))
    sessions.kept.answered(link)
    if not keep or not sessions.kept.reserve(link):
        return  # nothing to keep, the table's last place (a request's), or kept already
    task = asyncio.get_running_loop().create_task(_fork(sessions, plan.tenant, None if parent is None else parent.name, link, hashes, ids))
    sessions.behind.add(task)
    task.add_done_callback(sessions.behind.discard)


async def _fork(sessions: Sessions, tenant: str, parent: str | None, link: str, hashes: list[str], ids: Callable[[], Awaitable[list[int]]]) -> None:
    try:
        async with sessions.turn(tenant, new_kept_name()) as held:
            state = held.state
            # indexed (the conversation's next request waits for it) and recorded before it exists upstream: a proxy
            # killed from here on leaves no native session its records do not name (a restart adopts or forgets it)
            sessions.kept.move(state, link)
            try:
                written = await ids()
                if parent is None:
                    async with sessions.kept.room(state):
                        await held.start()
                else:
                    await _copy(sessions, tenant, parent, state, hashes)
                    await held.start()
                sessions.memory_tokens.wrote(state, len(hashes), len(written))
                await sessions.writes.write(state, held.lease, sessions.upstream.pieces(written), hashes)
            except ProxyError as exc:
                log.info("a header-less conversation's state is not kept (%s)", exc.message)
                await sessions.kept.abandon(state, held.lease)
    except ProxyError as exc:  # e.g. every session state of the proxy in use
        log.info("a header-less conversation's state is not kept (%s)", exc.message)
    except Exception:
        log.exception("keeping a header-less conversation's state failed")
    finally:
        sessions.kept.made(link)


async def _copy(sessions: Sessions, tenant: str, parent: str, state: SessionState, hashes: list[str]) -> None:
    """Create ``state``'s native session as a copy of the kept state ``parent``, which must still hold a prefix of
    ``hashes``; held meanwhile, so that making room for the copy never closes it, and its lease is the copy's warrant."""
    async with sessions.turn(tenant, parent) as source:
        held = source.state.committed
        if not (source.state.exists and source.state.history_known and held == hashes[: len(held)]):
            raise Unavailable("the state it extends is gone", code="state_gone")
        lease = await sessions.placement.lease_of(source.state)
        async with sessions.kept.room(state):
            await sessions.placement.copy(state, source.state, lease)
        source.state.extended = True  # no longer its conversation's latest state: room is made from such states first
        sessions.memory_tokens.copied(state, source.state)

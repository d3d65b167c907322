"""Header-less memory: a conversation without ``X-MemT-Session`` is identified by its own transcript.

Each request is planned against the tenant's ``PrefixIndex`` (``plan_headerless``): the chain of its earlier
messages (those before its last user message; system/developer messages excluded) finds the deepest kept
state, the head of a *branch* — a native session the proxy made, named ``~<nonce>`` (outside the client's
name grammar, so no header can name one). The surface then holds that branch as it holds any session
(``Sessions.turn``), checks under its lock that the branch still holds a prefix of the transcript
(``resumable``: a conversation that shares the opening may have moved it on meanwhile; then the request
looks again), and answers from memory plus the rest. Behind the answer it commits the rest's history (never
the turn just answered: that is committed only if a later request carries it), so a regenerate commits nothing
and an edited or forked transcript resumes from the deepest state it still matches. With no kept state, a
request that is worth keeping (``PrefixIndex.worth_keeping``) starts a new branch; any other is a plain
generation that commits nothing.

A new branch is made behind the answer (``keep``): the answer is a plain generation over the transcript (an
empty memory reads as none, so the same tokens), and a task then creates the native session and commits the
earlier messages. Were the upstream full with nothing idle to close, the conversation is simply not kept:
a header-less request is never refused for room.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

from memt_core.client.errors import MemTClientError
from memt_core.client.native import new_nonce
from memt_core.errors import UnknownSession
from memt_proxy.errors import ProxyError
from memt_proxy.prefix_index import Found, PrefixIndex, chain, extend, root
from memt_proxy.protocol import Message
from memt_proxy.sessions import BRANCH_PREFIX, Sessions, SessionState
from memt_proxy.transcript import message_hash

log = logging.getLogger("memt.proxy")

BRANCH_TRIES = 4  # lookups of one request, each after a branch it found had moved on


@dataclass
class HeaderlessPlan:
    """Where a header-less request resumes: its earlier messages' hashes and chain, the deepest kept state."""

    hashes: list[str]  # the earlier messages' hashes
    found: Found | None
    worth_keeping: bool  # with no kept state: start a branch (else a plain generation)
    link: str  # the chain of the whole conversation sent (the answer extends it)
    head: str | None = None  # the chain of the earlier messages: the branch's head once they are committed
    links: tuple[str, ...] = ()  # the chain of each earlier message


def new_branch_name() -> str:
    return BRANCH_PREFIX + new_nonce()


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
        return HeaderlessPlan([], None, False, link)
    earlier = links[:last_user]
    users = sum(_role(m) == "user" for m in conversation[:last_user])
    found = prefixes.find(earlier)
    worth = found is None and bool(earlier) and prefixes.worth_keeping(earlier, users)
    return HeaderlessPlan(hashes[:last_user], found, worth, link, earlier[-1] if earlier else None, tuple(earlier))


def find_shared(sessions: Sessions, plan: HeaderlessPlan) -> None:
    """With records a cluster's proxies share: a request that found no kept state here looks for one another
    node made (its memory in the shared snapshot store), and finds it from then on."""
    if plan.found is not None or not sessions.records.shared:
        return
    shared = sessions.records.branch_at(list(plan.links))
    if shared is not None:
        depth, name = shared
        sessions.prefixes.move(name, plan.links[depth - 1])
        plan.found = Found(depth, name)


async def resumable(sessions: Sessions, state: SessionState, plan: HeaderlessPlan) -> bool:
    """Whether the held branch ``state`` still holds a prefix of the request's earlier messages (adopting its
    native session first, e.g. after a proxy restart; one that is gone, e.g. closed to make room since the
    request found it, is not made again). If not, the index is told what it holds now."""
    if not state.exists and sessions.records.recorded_elsewhere(state.native):
        try:  # another node's (or one this core let go): brought back from the shared snapshot store
            await sessions.ensure(state)
        except ProxyError as exc:
            log.info("branch %s not taken over here (%s): answered from the text", state.native, exc.message)
            return False
    elif not state.exists:
        try:
            sessions.adopt(state, await sessions.client.control("inspect", state.native))
        except MemTClientError as exc:
            if not isinstance(exc.cause, UnknownSession):
                raise sessions.upstream_error(exc) from None
            sessions.move_head(state, None)
            return False
    held = state.committed
    if state.history_known and held and held == plan.hashes[: len(held)]:
        return True
    sessions.move_head(state, chain(state.tenant, held)[-1] if state.history_known and held else None)
    return False


def after_answer(
    sessions: Sessions, memory_tokens, answered_from: str, answer: list[dict], keep: Callable[[], None] | None,
    held, context_ids: list[int], context_hashes: list[str], head: str | None,
) -> None:
    """Behind a header-less answer: the answered transcript remembered (a request carrying it is worth
    keeping), a new branch started (``keep``), or the history the request resumed with written to its branch
    (``held``; never the turn just answered), whose head then moves there."""
    link = answered_from
    for message in answer:
        link = extend(link, message_hash(message))
    sessions.prefixes.answered(link)
    if keep is not None:
        keep()
    if held is None or not context_ids:
        return
    state = held.state
    committed = state.committed + list(context_hashes)
    held.write_later(sessions.pieces(context_ids), committed)
    # found at once by the conversation's next request, which then waits for this write (a failed one leaves the
    # head to be corrected when a request finds it: ``resumable``)
    sessions.move_head(state, head)
    memory_tokens.wrote(state, len(committed), len(context_ids))


def keep(sessions: Sessions, tenant: str, plan: HeaderlessPlan, history_ids: Callable[[], Awaitable[list[int]]]) -> None:
    """Start a new branch holding the request's earlier messages (``history_ids()``: their tokens), behind the
    answer, in a task of its own that the proxy's shutdown waits for (see the module docstring)."""
    task = asyncio.get_running_loop().create_task(_keep(sessions, tenant, plan, history_ids))
    sessions.behind.add(task)
    task.add_done_callback(sessions.behind.discard)


async def _keep(sessions: Sessions, tenant: str, plan: HeaderlessPlan, history_ids: Callable[[], Awaitable[list[int]]]) -> None:
    try:
        async with sessions.turn(tenant, new_branch_name()) as held:
            state = held.state
            sessions.move_head(state, plan.head)  # found from now on: the conversation's next request waits for this
            try:
                await sessions.make_branch_room(state)
                await held.start()
                await sessions.write(state, held.lease, sessions.pieces(await history_ids()), plan.hashes)
            except ProxyError as exc:
                log.info("a header-less conversation is not kept (%s)", exc.message)
                sessions.move_head(state, None)
                if state.exists:
                    await sessions.close_branch(state, held.lease)
    except ProxyError as exc:  # e.g. every session state of the proxy in use
        log.info("a header-less conversation is not kept (%s)", exc.message)
    except Exception:
        log.exception("keeping a header-less conversation failed")

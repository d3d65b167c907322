"""How a Responses request continues a ``conversation`` or a ``previous_response_id`` chain: which thread's session it
runs on (the thread itself, or a new chain branched from an older response's snapshot), that session's memory
confirmed against the thread's record before use, and the thread advanced after the answer.

A completed answer commits its turn behind the answer, in the session's own task; the thread's next request waits for
it and confirms it landed (else resends its messages as context), and a chain then exports the previous response's
snapshot before writing again. The threads and response records themselves are ``memt_proxy.responses.records``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Awaitable, Callable

from memt_proxy.errors import BadRequest, Conflict, NotFound
from memt_proxy.responses.protocol import ResponseRequest, item_messages, new_id
from memt_proxy.responses.records import ResponseRecord, ResponseRecords, Thread, session_name
from memt_proxy.responses.stream import replayed
from memt_proxy.session.sessions import HeldSession, Sessions
from memt_proxy.session.turn import Turn
from memt_proxy.session.retries import retried
from memt_proxy.worker import off_loop

log = logging.getLogger("memt.proxy")


class Threads:
    """Runs requests on conversations and chains of stored responses. ``plan``: the service's request → ``Turn``
    (``ResponsesPlanner.plan`` off the event loop); ``answer``: the service's answer of a planned turn on a held
    session, which lets the hold go when the answer ends."""

    def __init__(
        self, sessions: Sessions, records: ResponseRecords, *, snapshots_per_chain: int,
        plan: Callable[..., Awaitable[Turn]], answer: Callable[[Turn, HeldSession | None, contextlib.AsyncExitStack], Awaitable[Any]],
    ):
        self.sessions = sessions
        self.records = records
        self.snapshots_per_chain = snapshots_per_chain  # --response-snapshots
        self.plan = plan
        self.answer = answer
        self.memory_tokens = sessions.memory_tokens

    async def in_conversation(self, request: ResponseRequest, items: list[dict], tenant: str):
        """A request with ``conversation``: run on that conversation's session."""
        thread = self.records.thread(tenant, request.conversation_id)
        if thread is None or not thread.conversation:
            raise NotFound(f"conversation {request.conversation_id!r} not found; create one with POST /v1/conversations", param="conversation", code="conversation_not_found")
        return await self._in_thread(request, items, tenant, thread, None)

    async def continued(self, request: ResponseRequest, items: list[dict], tenant: str):
        """A request with ``previous_response_id``: in that response's thread if it is the latest there, else in a new
        chain (a branch) from its snapshot."""
        previous = self._previous(request, tenant)
        restore = None
        if previous.thread is not None:
            thread = self.records.thread(tenant, previous.thread)
            if thread is not None and thread.head == previous.id:
                result = await self._in_thread(request, items, tenant, thread, previous.id)
                if result is not None:
                    return result
            elif thread is not None and (thread.answered or {}).get("digest") == request._digest and retried(request._retry, request._key, thread.answered.get("key")):
                result = await self._in_thread(request, items, tenant, thread, thread.head)  # a retry of its latest
                if result is not None:
                    return result
            restore = thread.snapshot(previous.snapshot_of) if thread is not None else None
            if previous.version > 0 and restore is None:
                raise Conflict(
                    f"response {previous.id!r} is no longer the latest of its chain and its memory snapshot was dropped: the proxy keeps snapshots "
                    f"for the {self.snapshots_per_chain} most recent responses of each chain (--response-snapshots). Continue a more recent response, or the latest.",
                    param="previous_response_id", code="snapshot_expired",
                )
        branch = Thread(id=new_id("chain"), tenant=tenant, session="", created_at=int(time.time()), uncommitted=list(previous.uncommitted), calls=list(previous.calls))
        branch.session = session_name(branch.id)
        return await self._in_thread(request, items, tenant, branch, None, restore=restore)

    def _previous(self, request: ResponseRequest, tenant: str) -> ResponseRecord:
        previous = self.records.response(tenant, request.previous_response_id)
        if previous is None:
            raise BadRequest(f"previous response {request.previous_response_id!r} not found (it was never stored, was deleted, or belongs to another API key)", param="previous_response_id", code="previous_response_not_found")
        thread = self.records.thread(tenant, previous.thread) if previous.thread else None
        if thread is not None and thread.conversation:
            raise BadRequest(f"response {previous.id!r} belongs to conversation {thread.id!r}: continue it with 'conversation', not 'previous_response_id'", param="previous_response_id", code="invalid_request")
        return previous

    async def _in_thread(self, request: ResponseRequest, items: list[dict], tenant: str, thread: Thread, head: str | None, *, restore: str | None = None):
        """Run on the thread's session. With ``head``, only while that response is still the thread's
        latest (checked under the session's lock); returns None when it no longer is."""
        hold = contextlib.AsyncExitStack()
        held = await hold.enter_async_context(self.sessions.turn(tenant, thread.session))
        handed_off = False
        try:
            answered = thread.answered
            if answered and answered["digest"] == request._digest and thread.head == answered["id"] and retried(request._retry, request._key, answered.get("key")):
                # a client's retry of the response that is this thread's latest (its answer lost on the way, or
                # a timeout): the same response again, streamed if asked so, its turn not committed twice (issue 38)
                log.info("an identical retry of %s on %s: answered again", answered["id"], thread.id)
                return replayed(answered["body"]) if request.stream else answered["body"]
            if head is not None and thread.head != head:
                return None
            if request._policy == "off":
                handed_off = True
                return await self.answer(await self._as_text(request, tenant, items, thread), None, hold)
            await self.plan(request, tenant, items, thread, thread.uncommitted, thread.calls, None)  # a refusal creates nothing upstream
            await held.start(with_answer=True)
            if restore is not None:
                await held.restore(restore, name=restore)
            state = held.state
            if restore is None:
                await self.confirm(held, thread)
            plan = await self.plan(request, tenant, items, thread, thread.uncommitted, thread.calls, state.pending)
            plan.base_version, plan.state, plan.policy = state.version, state, "read" if request._policy == "read" else "auto"
            plan.saved, plan.digest, plan.key = self.memory_tokens.held(state), request._digest, request._key
            handed_off = True
            return await self.answer(plan, held, hold)
        finally:
            if not handed_off:
                await hold.aclose()

    async def _as_text(self, request: ResponseRequest, tenant: str, items: list[dict], thread: Thread) -> Turn:
        """Memory off on a conversation: the input answered from the conversation's items as text, its memory neither read
        nor written (the turn joins what the conversation's next input sends as context). A chain keeps no transcript."""
        if not thread.conversation:
            raise BadRequest(
                "X-MemT-Memory: off answers without memory, and a chain of responses keeps no transcript to answer from: continue it "
                "with memory (auto or read), or send the whole input without previous_response_id", param="X-MemT-Memory", code="unsupported_parameter",
            )
        known = await off_loop(request._size, item_messages, thread.items)
        plan = await self.plan(request, tenant, items, thread, known, thread.calls, None)
        plan.base_version, plan.digest, plan.key, plan.as_text = thread.version, request._digest, request._key, len(known) - len(thread.uncommitted)
        return plan

    async def confirm(self, held: HeldSession, thread: Thread) -> None:
        """Check the session's memory against the thread's record before using it: the turn committed behind
        the last answer either landed (a chain then exports its snapshot, for branches from that response)
        or did not (its messages go with this input, as context). A conversation whose memory is empty upstream though
        the proxy recorded writes (the upstream restarted without a snapshot store, or lost it otherwise) is rebuilt:
        every item it holds goes with this input as context and is committed with its turn, as a named chat session
        sends its whole transcript. Any other version is refused."""
        version = held.state.version
        if thread.conversation and thread.version > 0 and version == 0 and not held.state.committed:
            log.warning("the memory of %s is empty upstream (it restarted): its %d items go with the next turn and are committed again", thread.id, len(thread.items))
            thread.rebuilt(item_messages(thread.items))
        elif thread.behind and version == thread.version - 1:
            log.warning("the last turn of %s was not committed; it goes in with the next one", thread.id)
            thread.missed_commit(version)
        elif version != thread.version:
            raise Conflict(
                f"the memory of {thread.id!r} is at version {version} upstream but this proxy recorded version {thread.version}: "
                "it was changed outside the proxy; start a new conversation", code="memory_version_mismatch",
            )
        thread.confirmed()
        if thread.snapshot_of is not None and thread.snapshot(thread.snapshot_of) is None:
            file = thread.next_snapshot(self.snapshots_per_chain)
            await held.save(file, overwrite=True, name=file)
            thread.keep_snapshot(thread.snapshot_of, file, self.snapshots_per_chain)
        self.records.save(thread)

    def advance(self, plan: Turn, thread: Thread, response_id: str, messages: list[dict], calls: list[str], output: list[dict], version: int | None) -> None:
        """The thread after this response: its turn committed behind the answer (``version``: the one that publishes),
        left pending (``calls``: the function calls it waits for), or left open (cut by max_output_tokens)."""
        thread.answered_by(response_id, messages=messages, calls=calls, version=version, base_version=plan.base_version, items=plan.items + output)
        self.records.save(thread)

"""How a Responses request continues a ``conversation`` or a ``previous_response_id`` chain: which thread's session it
runs on (the thread itself, or a new chain branched from an older response's snapshot), that session's memory
confirmed against the thread's record before use, and the thread advanced after the answer.

A completed answer commits its turn behind the answer, in the session's own task; the thread's next request waits for
it and confirms it landed (else resends its messages as context), and a chain then exports the previous response's
snapshot before writing again. The threads and response records themselves are ``memt_proxy.responses.records``.

``Threads`` calls nothing of the service back: ``hold`` returns where a request runs (a ``ThreadTurn``: the thread, its
session held, the snapshot to restore, or the answer to replay for a client's retry), and the service plans, answers
and then tells the thread what became of it (``confirm`` before, ``advance`` after).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

from memt_proxy.errors import BadRequest, Conflict, NotFound
from memt_proxy.request_context import RequestContext
from memt_proxy.responses.protocol import ResponseRequest, item_messages, new_id
from memt_proxy.responses.records import ResponseRecord, ResponseRecords, Thread, session_name
from memt_proxy.session.sessions import HeldSession, Sessions
from memt_proxy.session.retries import KeptAnswers, retried
from memt_proxy.worker import off_loop

log = logging.getLogger("memt.proxy")


class ThreadAnswers:
    """Where a thread's turn keeps its answer for a client's retry (a ``retries.RetryStore``, the turn's
    ``MemoryPlan.retries``): the runner's ``answers``, and the thread's record as its head's (``Thread.remember_answer``),
    where the thread's next request looks for a retry of it (``Threads.hold``)."""

    def __init__(self, thread: Thread, answers: KeptAnswers):
        self.thread, self.answers = thread, answers

    def answered(self, context: RequestContext, answer: dict) -> None:
        self.answers.answered(context, answer)
        self.thread.remember_answer(context.digest, context.key, answer["id"], answer)

    def committed(self, context: RequestContext, answer, state, version: int) -> None:
        """(Kept already, when answered.)"""


@dataclass(frozen=True)
class ThreadTurn:
    """Where a Responses request on a thread runs: the thread, its session held (``held``, let go by closing ``hold``),
    and the snapshot a new chain starts from (``restore``); or, for a client's identical retry of the thread's latest
    response, only that response (``replay``: its body), the hold already let go."""

    thread: Thread
    held: HeldSession | None = None
    hold: contextlib.AsyncExitStack | None = None
    restore: str | None = None
    replay: dict | None = None


class Threads:
    """Conversations and chains of stored responses: which thread and session a request runs on (``hold``), that
    session's memory confirmed against the thread's record (``confirm``), and the thread after the answer (``advance``)."""

    def __init__(self, sessions: Sessions, records: ResponseRecords, *, snapshots_per_chain: int):
        self.sessions = sessions
        self.records = records
        self.snapshots_per_chain = snapshots_per_chain  # --response-snapshots

    async def hold(self, request: ResponseRequest, context: RequestContext) -> ThreadTurn:
        """The thread of a request with ``conversation`` or ``previous_response_id``, its session held."""
        if request.conversation_id is not None:
            return await self._in_conversation(request, context)
        return await self._continued(request, context)

    async def _in_conversation(self, request: ResponseRequest, context: RequestContext) -> ThreadTurn:
        """A request with ``conversation``: run on that conversation's session."""
        thread = self.records.thread(context.tenant, request.conversation_id)
        if thread is None or not thread.conversation:
            raise NotFound(f"conversation {request.conversation_id!r} not found; create one with POST /v1/conversations", param="conversation", code="conversation_not_found")
        return await self._in_thread(context, thread, None)

    async def _continued(self, request: ResponseRequest, context: RequestContext) -> ThreadTurn:
        """A request with ``previous_response_id``: in that response's thread if it is the latest there, else in a new
        chain (a branch) from its snapshot."""
        tenant = context.tenant
        previous = self._previous(request, tenant)
        restore = None
        if previous.thread is not None:
            thread = self.records.thread(tenant, previous.thread)
            if thread is not None and thread.head == previous.id:
                result = await self._in_thread(context, thread, previous.id)
                if result is not None:
                    return result
            elif thread is not None and (thread.answered or {}).get("digest") == context.digest and retried(context.retry, context.key, thread.answered.get("key")):
                result = await self._in_thread(context, thread, thread.head)  # a retry of its latest
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
        return await self._in_thread(context, branch, None, restore=restore)

    def _previous(self, request: ResponseRequest, tenant: str) -> ResponseRecord:
        previous = self.records.response(tenant, request.previous_response_id)
        if previous is None:
            raise BadRequest(f"previous response {request.previous_response_id!r} not found (it was never stored, was deleted, or belongs to another API key)", param="previous_response_id", code="previous_response_not_found")
        thread = self.records.thread(tenant, previous.thread) if previous.thread else None
        if thread is not None and thread.conversation:
            raise BadRequest(f"response {previous.id!r} belongs to conversation {thread.id!r}: continue it with 'conversation', not 'previous_response_id'", param="previous_response_id", code="invalid_request")
        return previous

    async def _in_thread(self, context: RequestContext, thread: Thread, head: str | None, *, restore: str | None = None) -> ThreadTurn | None:
        """The thread's session held. With ``head``, only while that response is still the thread's latest (checked
        under the session's lock); None, the session let go, when it no longer is."""
        hold = contextlib.AsyncExitStack()
        held = await hold.enter_async_context(self.sessions.turn(context.tenant, thread.session))
        handed_off = False
        try:
            answered = thread.answered
            if answered and answered["digest"] == context.digest and thread.head == answered["id"] and retried(context.retry, context.key, answered.get("key")):
                # a client's retry of the response that is this thread's latest (its answer lost on the way, or
                # a timeout): the same response again, streamed if asked so, its turn not committed twice (issue 38)
                log.info("an identical retry of %s on %s: answered again", answered["id"], thread.id)
                return ThreadTurn(thread, replay=answered["body"])
            if head is not None and thread.head != head:
                return None
            handed_off = True
            return ThreadTurn(thread, held, hold, restore)
        finally:
            if not handed_off:
                await hold.aclose()

    async def known_messages(self, context: RequestContext, thread: Thread) -> list[dict]:
        """Memory off on a conversation: the messages of its items, answered from as text (its memory neither read nor
        written; the turn joins what the conversation's next input sends as context). A chain keeps no transcript."""
        if not thread.conversation:
            raise BadRequest(
                "X-MemT-Memory: off answers without memory, and a chain of responses keeps no transcript to answer from: continue it "
                "with memory (auto or read), or send the whole input without previous_response_id", param="X-MemT-Memory", code="unsupported_parameter",
            )
        return await off_loop(context.size, item_messages, thread.items)

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

    def advance(self, thread: Thread, response_id: str, messages: list[dict], calls: list[str], output: list[dict], version: int | None, *,
                base_version: int, items: list[dict]) -> None:
        """The thread after this response: its turn committed behind the answer (``version``: the one that publishes),
        left pending (``calls``: the function calls it waits for), or left open (cut by max_output_tokens).
        ``base_version``: the memory version its prompt read; ``items``: its input items, which the output's join."""
        thread.answered_by(response_id, messages=messages, calls=calls, version=version, base_version=base_version, items=items + output)
        self.records.save(thread)

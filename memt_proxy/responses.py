"""The Responses API over the proxy's session layer: request → plan (which memory, which prompt) → response.

Where the memory comes from (see ``memt_proxy.conversations`` for threads and records):

* ``conversation`` — the conversation's session; the prompt holds only what memory does not (the new
  input, after anything the conversation recorded as uncommitted).
* ``previous_response_id`` of a thread's latest response — that thread's session, continued.
* ``previous_response_id`` of an older response — a **branch**: a new chain whose session starts from
  that response's snapshot (or empty, for one answered before any commit). Past the snapshots kept per
  chain the request is refused (409): memory is never silently taken from another version.
* ``previous_response_id`` of a response answered without memory — a new chain whose first turn
  carries that response's messages as context.
* neither — answered without memory; if stored, kept so that it can be continued.

A completed answer commits its turn (context + input + answer) behind the answer, in the session's own
task; the thread's next request waits for it and confirms it landed (else resends its messages as
context), and a chain then exports the previous response's snapshot before writing again. A response
that calls functions leaves its turn pending in the session (exact token ids), and the
``function_call_output`` items that answer it continue that turn; a response cut by
``max_output_tokens`` is not committed: its messages are sent with the next input. Usage
``input_tokens`` is the prompt the model read, so the constant cost of memory shows in it.

``text.format`` json_schema / json_object and forced function calls are grammars as on Chat
Completions (``memt_proxy.structured``); ``on_usage`` is ``ChatService.on_usage``'s contract here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from memt_core.client.chat_format import ChatFormat
from memt_core.client.parsers import OutputParser
from memt_proxy.branches import HeaderlessPlan, after_answer, closed, resume
from memt_proxy.conversations import SNAPSHOTS_PER_CHAIN, ResponseRecord, ResponseRecords, Thread, session_name
from memt_proxy.errors import BadRequest, Conflict, NotFound, ProxyError, Unavailable
from memt_proxy.protocol import logprobs_content, logprobs_sampling
from memt_proxy.responses_protocol import (
    ConversationRequest, Events, InputItems, ResponseRequest, conversation_object, function_call_item, item_list,
    item_messages, message_item, new_id, reasoning_item, response_object, usage,
)
from memt_proxy.responses_stream import StreamedItems, replayed
from memt_proxy.sessions import HeldSession, PendingTurn, Sessions, SessionState
from memt_proxy.structured import structure
from memt_proxy.transcript import message_hash
from memt_proxy.turn_plan import (
    KeptAnswers, RawStream, check_prefill, check_text_fits, continued_turn_ids, encode, fit_output, forced_prefix, no_usage, off_loop, prompt_ids, request_digest, retried,
)

log = logging.getLogger("memt.proxy")

STREAM_START_TIMEOUT = 60.0  # seconds a held session waits for its stream to be consumed


@dataclass
class Plan:
    """Everything decided before the model runs."""

    request: ResponseRequest
    tenant: str
    items: list[dict]  # the request's input items (stored form)
    thread: Thread | None  # where the response lands (None: no memory)
    base_version: int = 0  # the session's memory version the prompt reads
    context: list[dict] = field(default_factory=list)  # messages before the turn that memory lacks
    turn: list[dict] = field(default_factory=list)  # the open turn's messages
    prompt: list[int] = field(default_factory=list)
    context_ids: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    prefix: str = ""
    thinking: bool = False
    sampling: dict = field(default_factory=dict)
    raw: bool = False  # the answer is structured JSON, returned as it is (no markup to parse)
    saved: int = 0  # prompt tokens memory spared this request
    started: bool = False  # streams: the response began
    headerless: HeaderlessPlan | None = None  # an input carrying its history (``memt_proxy.branches``)
    parent: SessionState | None = None  # header-less: the kept state the prompt reads


class ResponsesService:
    """Serves /v1/responses and /v1/conversations for one upstream model, over its session layer."""

    def __init__(
        self, sessions: Sessions, chat_format: ChatFormat, parser: OutputParser, records: ResponseRecords, *,
        model_names: list[str], aliases: tuple[str, ...] = (), default_thinking: bool = False, snapshots_per_chain: int = SNAPSHOTS_PER_CHAIN, headerless: bool = True,
    ):
        self.sessions = sessions
        self.chat_format = chat_format
        self.parser = parser
        self.records = records
        self.model_names = model_names
        self.accepted = {*model_names, *aliases}
        self.default_thinking = default_thinking
        self.snapshots_per_chain = snapshots_per_chain
        self.headerless = headerless  # an input carrying its history resumes from memory (``memt_proxy.branches``)
        self.on_usage = no_usage  # as ChatService.on_usage: once per finished response
        self.memory_tokens = sessions.memory_tokens
        self._answers = KeptAnswers()  # responses on memory, for a client's retry (the durable one: each thread's latest)

    # ------------------------------------------------------------------ POST /v1/responses

    async def create(self, request: ResponseRequest, *, tenant: str, stateless: bool = False, retry: bool = False, key: str | None = None) -> dict | AsyncIterator[dict]:
        """A response object, or (``stream``) an iterator of Responses stream events; ``stateless`` (X-MemT-Memory:
        off): an input without conversation or previous_response_id is answered without memory. ``retry``: the
        client says it sends this request again (the openai SDK's ``x-stainless-retry-count``), as does a repeated
        ``key`` (``Idempotency-Key``): if an identical request was answered on memory, that response is returned again
        and nothing is committed twice (an identical input that is no retry is a new turn: "Next." may well be said
        twice)."""
        ignored = request.checked()
        if ignored:
            log.info("ignoring request field(s): %s", ", ".join(ignored))
        if request.model not in self.accepted:
            raise NotFound(f"model {request.model!r} does not exist; this proxy serves {', '.join(self.model_names)}", param="model", code="model_not_found")
        dumped = request.model_dump_json()
        request._size = len(dumped)  # decides where its prompt is prepared (``turn_plan.off_loop``)
        request._digest = request_digest(dumped)  # an identical retry is answered again, not run twice
        request._retry, request._key = retry, key
        kept = self._answers.retried(tenant, request._digest, retry, key)
        if kept is not None:
            log.info("an identical retry of a response: answered again")
            return replayed(kept) if request.stream else kept
        items = await off_loop(request._size, lambda: InputItems.of(request.input).items)
        await self.sessions.check_upstream()
        if request.conversation_id is not None:
            thread = self.records.thread(tenant, request.conversation_id)
            if thread is None or not thread.conversation:
                raise NotFound(f"conversation {request.conversation_id!r} not found; create one with POST /v1/conversations", param="conversation", code="conversation_not_found")
            return await self._in_thread(request, items, tenant, thread, None)
        if request.previous_response_id is not None:
            return await self._continue(request, items, tenant, self._previous(request, tenant))
        if self.headerless and not stateless:
            return await self._headerless(request, items, tenant)
        plan = await self._planned(request, tenant, items, None, [], [], None)
        return self._stream(plan, None, None) if request.stream else await self._run(plan, None)

    async def _planned(self, request: ResponseRequest, *args, **kwargs) -> Plan:
        """``_plan``, off the event loop for a large request (``turn_plan.off_loop``)."""
        return await off_loop(request._size, self._plan, request, *args, **kwargs)

    async def _headerless(self, request: ResponseRequest, items: list[dict], tenant: str):
        """An input with neither conversation nor previous_response_id, as a header-less chat request: resumed
        from the deepest kept state of the history it carries, its next state forked behind the answer
        (``memt_proxy.branches``). An input with system/developer messages is answered from its text and keeps
        nothing: they sit among the items, where a kept state's message count cannot skip them."""
        messages = await off_loop(request._size, item_messages, items)
        instructed = any(m["role"] in ("system", "developer") for m in messages)
        found, held, hold = await resume(self.sessions, messages, tenant, request._size, reads=not instructed)
        handed_off = False
        try:
            if held is None:
                plan = await self._planned(request, tenant, items, None, [], [], None)
                if not instructed:
                    plan.headerless = found
                return self._stream(plan, None, None) if request.stream else await self._run(plan, None)
            plan = await self._planned(request, tenant, items, None, [], [], None, held=len(held.state.committed))
            await held.start(with_answer=True)
            plan.headerless, plan.parent, plan.saved = found, held.state, self.memory_tokens.held(held.state)
            handed_off = True
            return await self._answer(plan, held, hold)
        finally:
            if not handed_off:
                await hold.aclose()

    def _previous(self, request: ResponseRequest, tenant: str) -> ResponseRecord:
        previous = self.records.response(tenant, request.previous_response_id)
        if previous is None:
            raise BadRequest(f"previous response {request.previous_response_id!r} not found (it was never stored, was deleted, or belongs to another API key)", param="previous_response_id", code="previous_response_not_found")
        thread = self.records.thread(tenant, previous.thread) if previous.thread else None
        if thread is not None and thread.conversation:
            raise BadRequest(f"response {previous.id!r} belongs to conversation {thread.id!r}: continue it with 'conversation', not 'previous_response_id'", param="previous_response_id", code="invalid_request")
        return previous

    async def _continue(self, request: ResponseRequest, items: list[dict], tenant: str, previous: ResponseRecord):
        """Continue a stored response: in its thread if it is the latest there, else in a new chain (a branch)."""
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
            await self._planned(request, tenant, items, thread, thread.uncommitted, thread.calls, None)  # a refusal creates nothing upstream
            await held.start(with_answer=True)
            if restore is not None:
                await held.restore(restore, name=restore)
            state = held.state
            if restore is None:
                await self._confirm(held, thread)
            plan = await self._planned(request, tenant, items, thread, thread.uncommitted, thread.calls, state.pending)
            plan.base_version = state.version
            plan.saved = self.memory_tokens.held(state)
            handed_off = True
            return await self._answer(plan, held, hold)
        finally:
            if not handed_off:
                await hold.aclose()

    async def _answer(self, plan: Plan, held: HeldSession, hold: contextlib.AsyncExitStack):
        """Answer ``plan`` on the held session, which is let go when the answer ends (a stream: when it does)."""
        if plan.request.stream:
            asyncio.get_running_loop().call_later(STREAM_START_TIMEOUT, self._unstarted, plan, hold)
            return self._stream(plan, held, hold)
        try:
            return await self._run(plan, held)
        finally:
            await hold.aclose()

    async def _confirm(self, held: HeldSession, thread: Thread) -> None:
        """Check the session's memory against the thread's record before using it: the turn committed behind
        the last answer either landed (a chain then exports its snapshot, for branches from that response)
        or did not (its messages go with this input, as context); any other version is refused."""
        version = held.state.version
        if thread.behind and version == thread.version - 1:
            log.warning("the last turn of %s was not committed; it goes in with the next one", thread.id)
            thread.uncommitted = thread.behind + thread.uncommitted
            thread.version, thread.behind, thread.snapshot_of = version, [], None
        elif version != thread.version:
            raise Conflict(
                f"the memory of {thread.id!r} is at version {version} upstream but this proxy recorded version {thread.version}: "
                "it was changed outside the proxy; start a new conversation", code="memory_version_mismatch",
            )
        thread.behind = []
        if thread.snapshot_of is not None and thread.snapshot(thread.snapshot_of) is None:
            file = thread.next_snapshot(self.snapshots_per_chain)
            await held.save(file, overwrite=True, name=file)
            thread.keep_snapshot(thread.snapshot_of, file, self.snapshots_per_chain)
        self.records.save(thread)

    # ------------------------------------------------------------------ the prompt

    def _plan(self, request: ResponseRequest, tenant: str, items: list[dict], thread: Thread | None, uncommitted: list[dict], calls: list[str], pending: PendingTurn | None, *, held: int = 0) -> Plan:
        """Decide the prompt: the system block, the context memory lacks, and the open turn (``held``: the
        number of leading messages memory holds already, header-less)."""
        plan = Plan(request, tenant, items, thread)
        tools = request.chat_tools()
        plan.thinking = self._thinking(request)
        named = request.tool_choice["name"] if tools and isinstance(request.tool_choice, dict) else None
        plan.prefix = forced_prefix(self.chat_format, tools, required=request.tool_choice == "required", named=named)
        grammar = structure(
            self.chat_format, schema=request.output_schema(), schema_param="text.format", tools=tools, tools_param="tools",
            forced=bool(tools) and (request.tool_choice == "required" or named is not None), name=named,
        )
        if grammar is not None:
            plan.thinking, plan.raw = False, grammar.raw  # the grammar starts at the answer
        echoed = set(calls)  # an app may resend the function calls it answers (the Agents SDK may): already known
        new = item_messages([item for item in items if not (item["type"] == "function_call" and item["call_id"] in echoed)])
        answered = {m["tool_call_id"] for m in new if m["role"] == "tool"}
        if calls and not set(calls) <= answered:
            raise BadRequest(f"the previous response called functions and waits for their results: send a function_call_output item for each of call_id(s) {sorted(set(calls) - answered)} first", param="input", code="tool_results_missing")
        messages = (list(uncommitted) + new)[held:]
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
        if last_user is None:
            raise BadRequest("input must hold a user message (or function_call_output items answering the previous response's function calls)", param="input", code="invalid_input")
        plan.context, plan.turn = messages[:last_user], messages[last_user:]
        check_text_fits(self.chat_format, messages, request.instructions, self.sessions.max_prefill_tokens, "input")
        continued = continued_turn_ids(self.chat_format, pending if calls else None, plan.turn)
        if continued is not None:  # function results continue the pending turn from the model's exact tokens
            plan.turn_ids = continued
            plan.thinking = pending.thinking and grammar is None
        else:
            plan.turn_ids = self.chat_format.open_turn_ids(plan.turn, enable_thinking=plan.thinking)
        plan.turn_ids += encode(self.chat_format, plan.prefix)
        plan.context_ids = self.chat_format.history_ids(plan.context)
        plan.prompt = prompt_ids(self.chat_format, request.instructions, tools, plan.context_ids, plan.turn_ids)
        check_prefill(plan.prompt, self.sessions.max_prefill_tokens, "input")
        plan.sampling = dict(self.chat_format.default_sampling())
        fit_output(plan.sampling, plan.prompt, request.max_output_tokens, self.sessions.context_length, param="max_output_tokens", prompt_param="input")
        for name in ("temperature", "top_p"):
            if getattr(request, name) is not None:
                plan.sampling[name] = getattr(request, name)
        if grammar is not None:
            plan.sampling[grammar.field] = grammar.source
        if request.logprobs:
            plan.sampling.update(logprobs_sampling(request.top_logprobs))
        return plan

    def _thinking(self, request: ResponseRequest) -> bool:
        effort = (request.reasoning or {}).get("effort")
        return self.default_thinking if effort is None else effort not in ("none", "minimal")

    # ------------------------------------------------------------------ generation

    async def _run(self, plan: Plan, held: HeldSession | None) -> dict:
        body = await (held.query(plan.prompt, plan.sampling) if held is not None else self.sessions.generate(plan.prompt, plan.sampling))
        output_ids = body["output_ids"]
        logprobs = logprobs_content(body["meta_info"]) if plan.request.logprobs else None
        if plan.raw:
            return await self._settle(plan, held, new_id("resp"), int(time.time()), [message_item(self.chat_format.decode(output_ids), logprobs=logprobs)], output_ids, _finish(body))
        parsed = self.parser.parse(plan.prefix + self.chat_format.decode(output_ids), thinking=plan.thinking)
        output = []
        if parsed.reasoning:
            output.append(reasoning_item(parsed.reasoning))
        calls = [call.to_openai() for call in parsed.tool_calls]
        if parsed.content or not calls:
            output.append(message_item(parsed.content, logprobs=logprobs))
        output += [function_call_item(call) for call in calls[: None if plan.request.parallel_tool_calls is not False else 1]]
        return await self._settle(plan, held, new_id("resp"), int(time.time()), output, output_ids, _finish(body))

    async def _stream(self, plan: Plan, held: HeldSession | None, hold: contextlib.AsyncExitStack | None) -> AsyncIterator[dict]:
        """The Responses stream events; the last one (``response.completed``) carries the settled response."""
        if plan.started:  # too late: the session was already let go
            raise Unavailable("the stream was not consumed in time", code="stream_expired")
        plan.started = True
        response_id, created, events = new_id("resp"), int(time.time()), Events()
        try:
            opening = response_object(plan.request, response_id=response_id, created_at=created, status="in_progress", output=[], usage=None)
            yield events.event("response.created", response=opening)
            yield events.event("response.in_progress", response=opening)
            items = StreamedItems(events, one_call=plan.request.parallel_tool_calls is False, logprobs=plan.request.logprobs)
            stream, decoder = RawStream() if plan.raw else self.parser.stream(thinking=plan.thinking), self.chat_format.output_decoder()
            upstream = held.query_stream(plan.prompt, plan.sampling) if held is not None else self.sessions.generate_stream(plan.prompt, plan.sampling)
            body: dict = {"output_ids": [], "meta_info": {}}
            try:
                async for body in upstream:
                    items.tokens(body["meta_info"])
                    for event in items.feed(stream.feed(plan.prefix + decoder.update(body["output_ids"]))):
                        yield event
                    if (body["meta_info"].get("finish_reason") or {}).get("type") is not None:
                        break
            finally:
                await upstream.aclose()
            items.tokens(body["meta_info"])
            for event in items.feed(stream.finish(plan.prefix + decoder.update(body["output_ids"], final=True))) + items.close():
                yield event
            response = await self._settle(plan, held, response_id, created, items.output, body["output_ids"], _finish(body))
            yield events.event("response.completed" if response["status"] == "completed" else "response.incomplete", response=response)
        except ProxyError as exc:
            yield events.event("error", code=exc.code, message=exc.message, param=exc.param)
        finally:
            if hold is not None:  # the client may have gone away: let the session go in a task of its own
                asyncio.get_running_loop().create_task(hold.aclose())

    def _unstarted(self, plan: Plan, hold: contextlib.AsyncExitStack) -> None:
        """A stream the server never started (client gone before the response): let its session go."""
        if not plan.started:
            plan.started = True
            asyncio.get_running_loop().create_task(hold.aclose())

    # ------------------------------------------------------------------ after the answer

    async def _settle(self, plan: Plan, held: HeldSession | None, response_id: str, created: int, output: list[dict], output_ids: list[int], finish: str) -> dict:
        """Commit or keep open the turn, record the thread and the response; returns the response object."""
        request, thread = plan.request, plan.thread
        calls = [item["call_id"] for item in output if item["type"] == "function_call"]
        incomplete = finish == "length"
        body = response_object(
            request, response_id=response_id, created_at=created, status="incomplete" if incomplete else "completed", output=output,
            usage=usage(len(plan.prompt), len(output_ids)), incomplete="max_output_tokens" if incomplete else None,
        )
        messages = plan.context + plan.turn + item_messages(output)
        if thread is None:
            uncommitted, version, snapshot_of = messages, 0, None
            self._headerless_after(plan, output, output_ids, bool(calls), incomplete)
        else:
            thread.answered = {"digest": request._digest, "key": request._key, "id": response_id, "body": body}
            self._answers.keep(plan.tenant, request._digest, request._key, body)
            await self._advance(plan, held, thread, response_id, messages, calls, output, output_ids, incomplete)
            uncommitted, version, snapshot_of = list(thread.uncommitted), thread.version, thread.snapshot_of
        try:
            self.on_usage(prompt_tokens=len(plan.prompt), completion_tokens=len(output_ids), saved_tokens=plan.saved, memory=thread is not None)
        except Exception:
            log.exception("on_usage failed")
        if request.stored:
            self.records.save(ResponseRecord(response_id, plan.tenant, body, plan.items, thread.id if thread else None, version, snapshot_of, uncommitted, calls if not incomplete else []))
        return body

    def _headerless_after(self, plan: Plan, output: list[dict], output_ids: list[int], calls: bool, incomplete: bool) -> None:
        """Header-less: an answer forks the conversation's next state from the one the input read (or starts one, for a
        conversation worth keeping; ``memt_proxy.branches``); function calls keep none (their results come next)."""
        if plan.headerless is None:
            return
        keep = not calls and (plan.parent is not None or plan.headerless.worth_keeping)
        reply = closed(self._reply_ids(plan, output_ids), self.chat_format.tokenizer.eos_token_id, incomplete) if keep else []
        written = plan.context_ids + plan.turn_ids + reply

        async def ids() -> list[int]:
            return written

        after_answer(self.sessions, plan.headerless, item_messages(output), parent=plan.parent, keep=keep, ids=ids)

    def _reply_ids(self, plan: Plan, output_ids: list[int]) -> list[int]:
        """The answer as committed (``ChatFormat.reply_ids``): without the stray or malformed markup the
        parser dropped, as the app received it."""
        if plan.raw:
            return output_ids
        generated = self.chat_format.decode(output_ids)
        kept = self.parser.parse(plan.prefix + generated, thinking=plan.thinking).text
        if not kept.startswith(plan.prefix):  # the forced prefix is already in the turn's ids
            return output_ids
        return self.chat_format.reply_ids(output_ids, generated, kept[len(plan.prefix):])

    async def _advance(self, plan: Plan, held: HeldSession, thread: Thread, response_id: str, messages: list[dict], calls: list[str], output: list[dict], output_ids: list[int], incomplete: bool) -> None:
        """The thread after this response: its turn committed behind the answer (a completed answer), left
        pending (function calls), or left open (cut by max_output_tokens)."""
        state = held.state
        version = plan.base_version
        if calls and not incomplete:
            hashes = [message_hash(m) for m in plan.turn + item_messages(output)]
            self.sessions.set_pending(state, PendingTurn(hashes, plan.turn_ids + output_ids, plan.thinking))
            thread.uncommitted, thread.calls = messages, calls
        elif incomplete:
            self.sessions.set_pending(state, None)
            thread.uncommitted, thread.calls = messages, []
        else:
            # committed behind the answer; the thread's next request waits for it, then confirms it (``_confirm``)
            committed = state.committed + [message_hash(m) for m in messages]
            reply_ids = self._reply_ids(plan, output_ids)
            held.commit_turn_later(plan.context_ids, plan.turn_ids + reply_ids, committed)
            self.memory_tokens.wrote(state, len(committed), len(plan.context_ids) + len(plan.turn_ids) + len(reply_ids))
            version = plan.base_version + 1  # one publish per turn
            thread.uncommitted, thread.calls, thread.behind = [], [], messages
            thread.snapshot_of = None if thread.conversation else response_id  # a chain exports it before its next write
        thread.head, thread.version = response_id, version
        if thread.conversation:
            thread.items += plan.items + output
        self.records.save(thread)

    # ------------------------------------------------------------------ stored responses

    def get(self, tenant: str, response_id: str) -> dict:
        return self._stored(tenant, response_id).body

    def delete(self, tenant: str, response_id: str) -> dict:
        """Forget a stored response (its thread and memory stay: later responses build on them)."""
        self.records.delete(self._stored(tenant, response_id))
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    def input_items(self, tenant: str, response_id: str, *, after: str | None, limit: int, order: str) -> dict:
        return item_list(self._stored(tenant, response_id).input_items, after=after, limit=limit, order=order)

    def _stored(self, tenant: str, response_id: str) -> ResponseRecord:
        record = self.records.response(tenant, response_id)
        if record is None:
            raise NotFound(f"response {response_id!r} not found (it was never stored, was deleted, or belongs to another API key)", param="response_id", code="response_not_found")
        return record

    # ------------------------------------------------------------------ conversations

    def create_conversation(self, tenant: str, request: ConversationRequest) -> dict:
        """A new conversation: a new session, made upstream on its first response; initial items are
        sent with that response's input and committed with its turn."""
        items = InputItems.of(request.items or []).items
        conversation = Thread(id=new_id("conv"), tenant=tenant, session="", created_at=int(time.time()), metadata=request.metadata or {}, items=items, uncommitted=item_messages(items))
        conversation.session = session_name(conversation.id)
        self.records.save(conversation)
        return conversation_object(conversation.id, conversation.created_at, conversation.metadata)

    def conversation(self, tenant: str, conversation_id: str) -> dict:
        conversation = self._conversation(tenant, conversation_id)
        return conversation_object(conversation.id, conversation.created_at, conversation.metadata)

    async def delete_conversation(self, tenant: str, conversation_id: str) -> dict:
        """Close the conversation's session (its memory goes with it) and drop its records."""
        conversation = self._conversation(tenant, conversation_id)
        try:
            await self.sessions.admin(tenant, conversation.session, "close")
        except ProxyError as exc:
            if exc.status != 404:  # 404: no response ever made its session upstream
                raise
        self.records.delete(conversation)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    def conversation_items(self, tenant: str, conversation_id: str, *, after: str | None, limit: int, order: str) -> dict:
        return item_list(self._conversation(tenant, conversation_id).items, after=after, limit=limit, order=order)

    async def add_items(self, tenant: str, conversation_id: str, raw: list[dict]) -> dict:
        """Append items: recorded now, sent to the model with the next response and committed with its turn."""
        conversation = self._conversation(tenant, conversation_id)
        items = InputItems.of(raw).items
        async with self.sessions.turn(tenant, conversation.session):  # not while a response runs on it
            if conversation.calls:
                raise BadRequest(f"the conversation's latest response waits for function results (call_id(s) {conversation.calls}); send them with POST /v1/responses first", param="items", code="tool_results_missing")
            conversation.items += items
            conversation.uncommitted += item_messages(items)
            self.records.save(conversation)
        return item_list(items, after=None, limit=len(items) or 1, order="asc")

    def _conversation(self, tenant: str, conversation_id: str) -> Thread:
        conversation = self.records.thread(tenant, conversation_id)
        if conversation is None or not conversation.conversation:
            raise NotFound(f"conversation {conversation_id!r} not found", param="conversation_id", code="conversation_not_found")
        return conversation


def _finish(body: dict) -> str:
    """The native finish reason as "stop" (an end token or stop string) or "length"."""
    return "stop" if (body["meta_info"].get("finish_reason") or {}).get("type") == "stop" else "length"

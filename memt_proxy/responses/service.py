"""The Responses API over the proxy's session layer: request → plan (which memory, which prompt) → response.

Where the memory comes from (``memt_proxy.responses.threads`` continues conversations and chains;
``memt_proxy.responses.records`` holds threads and records):

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
task; the thread's next request confirms it landed (``Threads.confirm``). A response
that calls functions leaves its turn pending in the session (exact token ids), and the
``function_call_output`` items that answer it continue that turn; a response cut by
``max_output_tokens`` is not committed: its messages are sent with the next input. Usage
``input_tokens`` is the prompt the model read, so the constant cost of memory shows in it.

``text.format`` json_schema / json_object and forced function calls are grammars as on Chat
Completions (``memt_proxy.structured``); the turn runner both surfaces share (``memt_proxy.session.turn``) holds, answers, commits and counts.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator

from memt_core.client.chat_format import ChatFormat
from memt_core.client.parsers import OutputParser
from memt_proxy.errors import NotFound, ProxyError
from memt_proxy.protocol import logprobs_content
from memt_proxy.request_context import RequestContext
from memt_proxy.responses.plan import ResponsesPlanner, ResponseTurn
from memt_proxy.responses.protocol import (
    Events, InputItems, ResponseRequest, function_call_item, item_messages, message_item, new_id, reasoning_item, response_object, usage,
)
from memt_proxy.responses.records import SNAPSHOTS_PER_CHAIN, ResponseRecord, ResponseRecords
from memt_proxy.responses.stored import StoredResponses
from memt_proxy.responses.stream import StreamedItems, replayed
from memt_proxy.responses.threads import ThreadAnswers, Threads, ThreadTurn
from memt_proxy.session.sessions import HeldSession, Sessions
from memt_proxy.session.turn import NO_MEMORY, MemoryPlan, OnMemory, Turn, TurnRunner
from memt_proxy.structured import RawStream
from memt_proxy.worker import off_loop

log = logging.getLogger("memt.proxy")

class ResponsesService:
    """Serves /v1/responses and /v1/conversations for one upstream model, over its session layer."""

    def __init__(
        self, sessions: Sessions, chat_format: ChatFormat, parser: OutputParser, records: ResponseRecords, *,
        model_names: list[str], aliases: tuple[str, ...] = (), default_thinking: bool = False, snapshots_per_chain: int = SNAPSHOTS_PER_CHAIN, headerless: bool = True,
        runner: TurnRunner | None = None, default_memory: str = "auto",
    ):
        self.sessions = sessions
        self.chat_format = chat_format
        self.parser = parser
        self.records = records
        self.stored = StoredResponses(sessions, records)  # GET/DELETE of responses, the Conversations API
        self.model_names = model_names
        self.accepted = {*model_names, *aliases}
        self.plans = ResponsesPlanner(chat_format, sessions, default_thinking=default_thinking)
        self.default_memory = default_memory  # the proxy's --memory
        self.headerless = headerless  # an input carrying its history resumes from memory (``memt_proxy.session.headerless``)
        self.runner = runner or TurnRunner(sessions, chat_format)  # the turn runner both surfaces share
        self.memory_tokens = sessions.memory_tokens
        # conversations and chains of responses: which session, confirmed how, advanced after the answer
        self.threads = Threads(sessions, records, snapshots_per_chain=snapshots_per_chain)

    # ------------------------------------------------------------------ POST /v1/responses

    async def create(self, request: ResponseRequest, context: RequestContext) -> dict | AsyncIterator[dict]:
        """A response object, or (``stream``) an iterator of Responses stream events. ``context.policy``: the
        X-MemT-Memory policy (below, else the proxy's --memory); ``context.retry``: the client says it sends this request
        again (the openai SDK's ``x-stainless-retry-count``), as does a repeated ``context.key`` (``Idempotency-Key``): if
        an identical request was answered on memory, that response is returned again and nothing is committed twice (an
        identical input that is no retry is a new turn: "Next." may well be said twice)."""
        ignored = request.checked()
        if ignored:
            log.info("ignoring request field(s): %s", ", ".join(ignored))
        if request.model not in self.accepted:
            raise NotFound(f"model {request.model!r} does not exist; this proxy serves {', '.join(self.model_names)}", param="model", code="model_not_found")
        # the memory policy: "read" reads memory and commits nothing (the turn stays context, sent with the next input);
        # "off" answers an input without conversation or previous response from its text (one that names them asks
        # for that memory: read and committed as "auto")
        answering = ResponseAnswer(self, request)
        kept = self.runner.retried(context.tenant, context.digest, context.retry, context.key)
        if kept is not None:
            log.info("an identical retry of a response: answered again")
            return answering.replayed(kept)
        items = await off_loop(context.size, lambda: InputItems.of(request.input).items)
        await self.sessions.check_upstream()
        if request.conversation_id is not None or request.previous_response_id is not None:
            on = await self._on_thread(request, context, items, await self.threads.hold(request, context))
        elif self.headerless and context.policy != "off":
            on = await self._headerless(request, context, items)
        else:
            on = OnMemory(turn=await self._planned(request, context, items, None, [], [], None))
        return await self.runner.run(on, answering, stream=bool(request.stream))

    async def _planned(self, request: ResponseRequest, context: RequestContext, items: list[dict], thread, uncommitted: list[dict], calls: list[str],
                       pending, memory: MemoryPlan = NO_MEMORY, *, base_version: int = 0, as_text: int = 0, held: int = 0, lift: bool = False) -> ResponseTurn:
        """The request's turn on ``memory``: its prompt (``ResponsesPlanner.plan``, off the event loop for a large
        request, ``worker.off_loop``) and what the surface keeps beside it."""
        prompt = await off_loop(context.size, self.plans.plan, request, items, uncommitted, calls, pending, held=held, lift=lift)
        return ResponseTurn(Turn(prompt, memory, context), thread, items, base_version, as_text)

    async def _on_thread(self, request: ResponseRequest, context: RequestContext, items: list[dict], on: ThreadTurn) -> OnMemory:
        """Where a request on a conversation or chain (``Threads.hold``) is answered: its memory confirmed before the
        prompt is planned on it (a refusal of the plan creates nothing upstream), the held session let go when the
        answer ends. Its answer is kept for a retry in the runner's ``answers`` and the thread's record (``ThreadAnswers``)."""
        if on.replay is not None:
            return OnMemory(replay=on.replay)
        thread, held, hold = on.thread, on.held, on.hold
        handed_off = False
        try:
            if context.policy == "off":
                known = await self.threads.known_messages(context, thread)
                plan = await self._planned(request, context, items, thread, known, thread.calls, None, MemoryPlan("off", retries=ThreadAnswers(thread, self.runner.answers)),
                                           base_version=thread.version, as_text=len(known) - len(thread.uncommitted))
                handed_off = True
                return OnMemory(hold=hold, turn=plan)
            await self._planned(request, context, items, thread, thread.uncommitted, thread.calls, None)  # a refusal creates nothing upstream
            await held.start(with_answer=True)
            if on.restore is not None:
                await held.restore(on.restore, name=on.restore)
            state = held.state
            if on.restore is None:
                await self.threads.confirm(held, thread)
            memory = self.runner.memory_plan("read" if context.policy == "read" else "auto", state,
                                             retries=ThreadAnswers(thread, self.runner.answers))
            plan = await self._planned(request, context, items, thread, thread.uncommitted, thread.calls, state.pending, memory, base_version=state.version)
            handed_off = True
            return OnMemory(held, hold, turn=plan)
        finally:
            if not handed_off:
                await hold.aclose()

    async def _headerless(self, request: ResponseRequest, context: RequestContext, items: list[dict]) -> OnMemory:
        """An input with neither conversation nor previous_response_id, as a header-less chat request: resumed
        from the deepest kept state of the history it carries, its next state forked behind the answer
        (``memt_proxy.session.headerless``). Its system/developer items are instructions, as a chat request's system messages:
        sent with every input, never kept in a state."""
        messages = await off_loop(context.size, item_messages, items)

        def on_memory(memory: MemoryPlan, found):
            return self._planned(request, context, items, None, [], [], None, memory, held=len(memory.state.committed), lift=True)

        return await self.runner.hold_headerless(
            context, messages, plain=lambda memory: self._planned(request, context, items, None, [], [], None, memory, lift=True), plan=on_memory,
        )

    # ------------------------------------------------------------------ generation

    async def _run(self, request: ResponseRequest, plan: ResponseTurn, held: HeldSession | None) -> dict:
        prompt = plan.turn.prompt
        body = await self.runner.generate(plan.turn, held)
        output_ids = body["output_ids"]
        logprobs = logprobs_content(body["meta_info"]) if request.logprobs else None
        if prompt.raw:
            output = [message_item(self.chat_format.decode(output_ids), logprobs=logprobs)]
            return await self._settle(request, plan, held, new_id("resp"), int(time.time()), output, output_ids, _finish(body), None)
        parsed = self.parser.parse(prompt.prefix + self.chat_format.decode(output_ids), thinking=prompt.thinking)
        output = []
        if parsed.reasoning:
            output.append(reasoning_item(parsed.reasoning))
        calls = [call.to_openai() for call in parsed.tool_calls]
        if parsed.content or not calls:
            output.append(message_item(parsed.content, logprobs=logprobs))
        output += [function_call_item(call) for call in calls[: None if request.parallel_tool_calls is not False else 1]]
        # parsed once: the text the app receives is what memory keeps (``TurnRunner.reply_ids``)
        return await self._settle(request, plan, held, new_id("resp"), int(time.time()), output, output_ids, _finish(body), parsed.text)

    async def _events(self, request: ResponseRequest, plan: ResponseTurn, held: HeldSession | None) -> AsyncIterator[dict]:
        """The Responses stream events; the last one (``response.completed``) carries the settled response."""
        prompt = plan.turn.prompt
        response_id, created, events = new_id("resp"), int(time.time()), Events()
        try:
            opening = response_object(request, response_id=response_id, created_at=created, status="in_progress", output=[], usage=None)
            yield events.event("response.created", response=opening)
            yield events.event("response.in_progress", response=opening)
            items = StreamedItems(events, one_call=not prompt.parallel_tools, logprobs=request.logprobs)
            stream, decoder = RawStream() if prompt.raw else self.parser.stream(thinking=prompt.thinking), self.chat_format.output_decoder()
            upstream = self.runner.generate_stream(plan.turn, held)
            body: dict = {"output_ids": [], "meta_info": {}}
            try:
                async for body in upstream:
                    items.tokens(body["meta_info"])
                    for event in items.feed(stream.feed(prompt.prefix + decoder.update(body["output_ids"]))):
                        yield event
                    if (body["meta_info"].get("finish_reason") or {}).get("type") is not None:
                        break
            finally:
                await upstream.aclose()
            items.tokens(body["meta_info"])
            for event in items.feed(stream.finish(prompt.prefix + decoder.update(body["output_ids"], final=True))) + items.close():
                yield event
            kept = self._received(prompt, body["output_ids"])
            response = await self._settle(request, plan, held, response_id, created, items.output, body["output_ids"], _finish(body), kept)
            yield events.event("response.completed" if response["status"] == "completed" else "response.incomplete", response=response)
        except ProxyError as exc:
            yield events.event("error", code=exc.code, message=exc.message, param=exc.param)

    # ------------------------------------------------------------------ after the answer

    async def _settle(self, request: ResponseRequest, plan: ResponseTurn, held: HeldSession | None, response_id: str, created: int, output: list[dict],
                      output_ids: list[int], finish: str, kept: str | None) -> dict:
        """Memory after the response (``TurnRunner.after``; ``kept``: the answer as the app received it), its thread and
        its record; returns the response object."""
        turn, thread = plan.turn, plan.thread
        calls = [item["call_id"] for item in output if item["type"] == "function_call"]
        incomplete = finish == "length"
        body = response_object(
            request, response_id=response_id, created_at=created, status="incomplete" if incomplete else "completed", output=output,
            usage=usage(len(turn.prompt.ids), len(output_ids)), incomplete="max_output_tokens" if incomplete else None,
        )
        answer = item_messages(output)
        messages = (turn.prompt.context + turn.prompt.turn)[plan.as_text:] + answer
        version = self.runner.after(turn, held, answer, output_ids, "tool_calls" if calls and not incomplete else finish, kept=kept, answered=body)
        self.runner.usage(turn, len(output_ids))
        if thread is None:
            uncommitted, version, snapshot_of = messages, 0, None
        else:
            self.threads.advance(thread, response_id, messages, [] if incomplete else calls, output, version, base_version=plan.base_version, items=plan.items)
            uncommitted, version, snapshot_of = list(thread.uncommitted), thread.version, thread.snapshot_of
        if request.stored:
            self.records.save(ResponseRecord(response_id, turn.context.tenant, body, plan.items, thread.id if thread else None, version, snapshot_of, uncommitted, calls if not incomplete else []))
        return body

    def _received(self, prompt, output_ids: list[int]) -> str | None:
        """A streamed answer's text as the app received it, as memory keeps it (``TurnRunner.reply_ids``): without the
        stray or malformed markup the parser dropped; a structured answer as generated (None: the generated ids)."""
        if prompt.raw:
            return None
        return self.parser.parse(prompt.prefix + self.chat_format.decode(output_ids), thinking=prompt.thinking).text


@dataclass(frozen=True)
class ResponseAnswer:
    """The service's side of ``TurnRunner.run`` for one request (an ``Answerer``): its ``ResponseTurn`` answered as a
    response object or as stream events, or a kept response replayed."""

    service: ResponsesService
    request: ResponseRequest

    def answer(self, plan: ResponseTurn, held: HeldSession | None):
        return self.service._run(self.request, plan, held)

    def events(self, plan: ResponseTurn, held: HeldSession | None) -> AsyncIterator[dict]:
        return self.service._events(self.request, plan, held)

    def replayed(self, kept: dict):
        return replayed(kept) if self.request.stream else kept


def _finish(body: dict) -> str:
    """The native finish reason as "stop" (an end token or stop string) or "length"."""
    return "stop" if (body["meta_info"].get("finish_reason") or {}).get("type") == "stop" else "length"

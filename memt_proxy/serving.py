"""Chat completions over the proxy's session layer: request → prepared turn → OpenAI response or chunks.

A request with ``X-MemT-Session`` runs on one session of ``memt_proxy.sessions`` (lock → create or
adopt → lease, kept across requests → query → answer; the completed turn is committed behind the
answer, before the session's next request runs); without one, or with memory ``off``,
it is a plain generation over the whole transcript. Memory policy: ``auto`` reads memory and commits
each completed turn, ``read`` only reads, ``off`` neither. This module decides what the model sees
(transcript trimming, tool rounds, thinking, stop strings) and shapes what the app gets back; the
session layer decides nothing about OpenAI shapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator

from memt_core.client.chat_format import ChatFormat
from memt_core.client.parsers import OutputParser, hold_partial
from memt_proxy.errors import ProxyError
from memt_proxy.protocol import ChatCompletionRequest, Usage, chunk_body, completion_id, response_body
from memt_proxy.sessions import HeldSession, PendingTurn, Sessions, SessionState
from memt_proxy.transcript import Split, as_dict, check_tool_rounds, message_hash, split_transcript

log = logging.getLogger("memt.proxy")

POLICIES = ("auto", "read", "off")
STREAM_START_TIMEOUT = 60.0
#: requests with more text than this are templated and tokenized in a worker thread, off the event loop
OFF_LOOP_CHARS = 64 * 1024


@dataclass
class Prepared:
    """Everything decided before the model runs."""

    state: SessionState | None
    policy: str
    prompt: list[int]
    turn_ids: list[int]  # the open turn's ids (for a later commit / pending state)
    context_ids: list[int]
    split: Split | None
    thinking: bool
    sampling: dict
    prefix: str  # forced start of the output (tool_choice required / named)
    stops: list[str]
    parallel_tools: bool
    started: bool = False  # for streams: the response began
    digest: str = ""  # the request's digest (``request_digest``), kept with a committed turn's answer


@dataclass
class AnsweredTurn:
    """The answer to a session's last committed turn, kept so that an identical retry gets it again."""

    digest: str
    version: int  # the session's published version right after the commit
    message: dict
    finish: str
    usage: Usage


def request_digest(request: ChatCompletionRequest) -> str:
    """SHA-256 of the whole request as received: a client's retry of the same request has the same digest."""
    return hashlib.sha256(request.model_dump_json().encode()).hexdigest()


class ChatService:
    """Serves /v1/chat/completions for one upstream model, over its session layer."""

    def __init__(
        self,
        sessions: Sessions,
        chat_format: ChatFormat,
        parser: OutputParser,
        *,
        model_names: list[str],
        default_memory: str = "auto",
        default_thinking: bool = False,
        on_divergence: str = "reject",
    ):
        self.sessions = sessions
        self.chat_format = chat_format
        self.parser = parser
        self.model_names = model_names
        self.default_memory = default_memory
        self.default_thinking = default_thinking
        self.on_divergence = on_divergence
        # one thread: tokenizer and templates are used from one worker at a time, off the event loop
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memt-prepare")

    async def _off_loop(self, request: ChatCompletionRequest, work, *args):
        """``work(*args)`` — in the worker thread when ``request`` is large, so it slows only itself."""
        size = sum(len(m.model_dump_json()) for m in request.messages) if len(request.messages) < 10_000 else OFF_LOOP_CHARS + 1
        if size <= OFF_LOOP_CHARS:
            return work(*args)
        return await asyncio.get_running_loop().run_in_executor(self._worker, work, *args)

    async def complete(self, request: ChatCompletionRequest, *, tenant: str, session: str | None, memory: str | None, on_divergence: str | None = None) -> dict | AsyncIterator[dict]:
        """A chat.completion body, or (``stream``) an iterator of chat.completion.chunk bodies."""
        ignored = request.validate_semantics()
        if ignored:
            log.info("ignoring request field(s): %s", ", ".join(ignored))
        if request.model not in self.model_names:
            raise ProxyError(404, f"model {request.model!r} does not exist; this proxy serves {', '.join(self.model_names)}", param="model", code="model_not_found")
        policy = (memory or self.default_memory).lower()
        if policy not in POLICIES:
            raise ProxyError(400, f"X-MemT-Memory must be one of {', '.join(POLICIES)}", param="X-MemT-Memory")
        await self.sessions.check_upstream()
        if session is None or policy == "off":
            prepared = await self._off_loop(request, self._prepare_stateless, request)
            if request.stream:
                return self._stream(request, prepared, None, None)
            return await self._run(request, prepared, None)
        held_until = contextlib.AsyncExitStack()  # the session is held until this closes
        held = await held_until.enter_async_context(self.sessions.turn(tenant, session))
        handed_off = False
        try:
            state = held.state
            divergence = on_divergence or self.on_divergence
            replayed = self._replay(request, state)
            if replayed is not None:
                return replayed
            # prepared before the native session exists, so a refused request never creates one
            prepared = await self._prepare_session(request, state, policy, divergence)
            if not state.exists:
                await held.ensure()
                if state.committed or not state.history_known or state.pending:
                    # adopted: the native session already held memory (its record says what, or nobody knows)
                    prepared = await self._prepare_session(request, state, policy, divergence)
            prepared.digest = request_digest(request)
            await held.start()
            if request.stream:
                handed_off = True  # the stream lets the session go when it ends
                stream = self._stream(request, prepared, held, held_until)
                asyncio.get_running_loop().call_later(STREAM_START_TIMEOUT, self._unstarted, prepared, held_until)
                return stream
            return await self._run(request, prepared, held)
        finally:
            if not handed_off:
                await held_until.aclose()

    def _options(self, request: ChatCompletionRequest) -> tuple[bool, list | None, str, bool]:
        thinking = self.default_thinking
        if request.reasoning_effort is not None:
            thinking = request.reasoning_effort not in ("none", "minimal")
        if request.chat_template_kwargs and "enable_thinking" in request.chat_template_kwargs:
            thinking = bool(request.chat_template_kwargs["enable_thinking"])
        tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools and request.tool_choice != "none" else None
        prefix = ""
        if tools and request.tool_choice == "required":
            prefix = self.chat_format.tool_call_prefix()
        elif tools and request.tool_choice not in (None, "auto", "none"):  # a NamedToolChoice
            prefix = self.chat_format.tool_call_prefix(request.tool_choice.function.name)
        return thinking, tools, prefix, request.parallel_tool_calls is not False

    def _sampling(self, request: ChatCompletionRequest) -> dict:
        sampling = dict(self.chat_format.default_sampling())
        sampling["max_new_tokens"] = request.max_new_tokens or 1024
        for name in ("temperature", "top_p", "seed"):
            if getattr(request, name) is not None:
                sampling[name] = getattr(request, name)
        stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        if stops:
            sampling["stop"] = stops
        return sampling

    def _prepare_stateless(self, request: ChatCompletionRequest) -> Prepared:
        thinking, tools, prefix, parallel = self._options(request)
        check_tool_rounds([m for m in request.messages if m.role not in ("system", "developer")])  # as with a session
        messages = [as_dict(m) for m in request.messages]
        prompt = self.chat_format.conversation_ids(messages, tools=tools, enable_thinking=thinking) + self._encode(prefix)
        self._check_length(prompt)
        sampling = self._sampling(request)
        return Prepared(None, "off", prompt, [], [], None, thinking, sampling, prefix, sampling.get("stop", []), parallel)

    async def _prepare_session(self, request: ChatCompletionRequest, state: SessionState, policy: str, on_divergence: str) -> Prepared:
        try:
            return await self._off_loop(request, self._prepare_split, request, state, policy)
        except ProxyError as exc:
            if exc.code != "transcript_diverged" or on_divergence != "reset":
                raise
        await self.sessions.reset(state)
        return await self._off_loop(request, self._prepare_split, request, state, policy)

    def _prepare_split(self, request: ChatCompletionRequest, state: SessionState, policy: str) -> Prepared:
        thinking, tools, prefix, parallel = self._options(request)
        split = split_transcript(request.messages, state.committed, history_known=state.history_known)
        turn = [as_dict(m) for m in split.turn]
        turn_hashes = [message_hash(m) for m in turn]
        last_assistant = max((i for i, m in enumerate(turn) if m["role"] == "assistant"), default=None)
        pending = state.pending
        continues = last_assistant is not None and pending is not None and pending.hashes == turn_hashes[: last_assistant + 1]
        if continues:
            results = [{"tool_call_id": m.get("tool_call_id"), "content": m["content"]} for m in turn[last_assistant + 1:]]
            turn_ids = pending.ids + self.chat_format.tool_results_ids(results, enable_thinking=pending.thinking)
            thinking = pending.thinking
        else:
            turn_ids = self.chat_format.open_turn_ids(turn, enable_thinking=thinking)
        context_ids = self.chat_format.history_ids([as_dict(m) for m in split.context])
        prompt = (
            list(self.chat_format.bos_ids)
            + self.chat_format.system_ids(split.instructions, tools)
            + context_ids
            + turn_ids
            + self._encode(prefix)
        )
        self._check_length(prompt)
        # a continued turn stays pending until this request ends it (or calls tools again), so that a
        # retry after a failure, here or in a restarted proxy, continues it too; any other request abandons it
        if not continues:
            self.sessions.set_pending(state, None)
        sampling = self._sampling(request)
        return Prepared(state, policy, prompt, turn_ids + self._encode(prefix), context_ids, split, thinking, sampling, prefix, sampling.get("stop", []), parallel)

    def _encode(self, text: str) -> list[int]:
        return self.chat_format.tokenizer.encode(text, add_special_tokens=False) if text else []

    def _check_length(self, prompt: list[int]) -> None:
        limit = self.sessions.max_prefill_tokens
        if limit and len(prompt) > limit:
            raise ProxyError(
                400, f"the prompt has {len(prompt)} tokens; the upstream accepts at most {limit}",
                param="messages", code="context_length_exceeded",
            )

    # ---- generation

    def _text(self, prepared: Prepared, output_ids: list[int], *, final: bool, decoder=None) -> tuple[str, bool]:
        """Decoded output with the forced prefix and stop strings applied; True if a stop string ended it.

        A stream passes its ``ChatFormat.output_decoder()``, so each frame decodes only its new tokens."""
        decoded = decoder.update(output_ids, final=final) if decoder is not None else self.chat_format.decode(output_ids)
        text = prepared.prefix + decoded
        found = [at for at in (text.find(stop) for stop in prepared.stops) if at >= 0]
        if found:  # the earliest stop string wins, whichever its place in the list
            return text[: min(found)], True
        if not final and prepared.stops:
            text = hold_partial(text, tuple(prepared.stops))
        return text, False

    def _message(self, prepared: Prepared, text: str, finish: str) -> tuple[dict, str]:
        parsed = self.parser.parse(text, thinking=prepared.thinking)
        calls = [c.to_openai() for c in parsed.tool_calls]
        if calls and not prepared.parallel_tools:
            calls = calls[:1]
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content or (None if calls else "")}
        if parsed.reasoning is not None:
            message["reasoning_content"] = parsed.reasoning
        if calls and finish != "length":
            message["tool_calls"] = calls
            return message, "tool_calls"
        return message, finish

    async def _run(self, request: ChatCompletionRequest, prepared: Prepared, held: HeldSession | None) -> dict:
        if held is None:
            body = await self.sessions.generate(prepared.prompt, prepared.sampling)
        else:
            body = await held.query(prepared.prompt, prepared.sampling)
        output_ids = body["output_ids"]
        text, stopped = self._text(prepared, output_ids, final=True)
        finish = "stop" if stopped or (body["meta_info"].get("finish_reason") or {}).get("type") == "stop" else "length"
        message, finish = self._message(prepared, text, finish)
        await self._after(prepared, held, output_ids, message, finish)
        usage = Usage(prompt_tokens=len(prepared.prompt), completion_tokens=len(output_ids), total_tokens=len(prepared.prompt) + len(output_ids))
        return response_body(id=completion_id(), model=request.model, message=message, finish_reason=finish, usage=usage)

    async def _after(self, prepared: Prepared, held: HeldSession | None, output_ids: list[int], message: dict, finish: str) -> None:
        """Record a pending tool round, or commit the completed turn (policy auto)."""
        if held is None:
            return
        state = held.state
        turn = [as_dict(m) for m in prepared.split.turn]
        if finish == "tool_calls":
            self.sessions.set_pending(state, PendingTurn([message_hash(m) for m in turn] + [message_hash(message)], prepared.turn_ids + output_ids, prepared.thinking))
            return
        if prepared.policy != "auto" or finish != "stop":
            self.sessions.set_pending(state, None)  # the turn ended without a commit (read-only, or a truncated reply)
            return  # it stays in the app's transcript as context
        committed = (
            state.committed
            + [message_hash(as_dict(m)) for m in prepared.split.context]
            + [message_hash(m) for m in turn]
            + [message_hash(message)]
        )
        # committed behind the answer: the app has it first, and the session's next request waits for the commit
        held.commit_turn_later(prepared.context_ids, prepared.turn_ids + self._reply_ids(prepared, output_ids), committed)
        usage = Usage(prompt_tokens=len(prepared.prompt), completion_tokens=len(output_ids), total_tokens=len(prepared.prompt) + len(output_ids))
        # the version the session has once that commit is published (a failed one leaves nothing to replay)
        state.last_turn = AnsweredTurn(prepared.digest, state.version + 1, message, finish, usage)

    def _replay(self, request: ChatCompletionRequest, state: SessionState) -> dict | AsyncIterator[dict] | None:
        """The kept answer when ``request`` repeats the session's last committed turn exactly (e.g. the
        openai SDK retrying after the answer was lost): nothing is generated or committed again."""
        last = state.last_turn
        if not isinstance(last, AnsweredTurn) or last.version != state.version or last.digest != request_digest(request):
            return None
        log.info("an identical retry of the last committed turn of %s: answered again, not committed twice", state.native)
        if request.stream:
            return self._replayed_stream(request, last)
        return response_body(id=completion_id(), model=request.model, message=last.message, finish_reason=last.finish, usage=last.usage)

    async def _replayed_stream(self, request: ChatCompletionRequest, last: AnsweredTurn) -> AsyncIterator[dict]:
        """``last`` as chunks: role, reasoning, content, tool calls, finish, usage when asked."""
        cid, created = completion_id(), int(time.time())
        yield chunk_body(id=cid, model=request.model, created=created, delta={"role": "assistant", "content": ""})
        for key in ("reasoning_content", "content"):
            if last.message.get(key):
                yield chunk_body(id=cid, model=request.model, created=created, delta={key: last.message[key]})
        for index, call in enumerate(last.message.get("tool_calls") or []):
            yield chunk_body(id=cid, model=request.model, created=created, delta={"tool_calls": [{"index": index, **call}]})
        yield chunk_body(id=cid, model=request.model, created=created, delta={}, finish_reason=last.finish)
        if request.stream_options and request.stream_options.include_usage:
            yield chunk_body(id=cid, model=request.model, created=created, delta=None, usage=last.usage)

    def _reply_ids(self, prepared: Prepared, output_ids: list[int]) -> list[int]:
        """The reply as committed: the generated ids, or for a reply cut by a stop string the ids of the
        text the client received (the stop string and whatever followed it left out) and an end token."""
        if not prepared.stops or (output_ids and output_ids[-1] in self.chat_format.end_ids):
            return output_ids
        text, stopped = self._text(prepared, output_ids, final=True)
        if not stopped:
            return output_ids
        end = self.chat_format.tokenizer.eos_token_id
        return self._encode(text[len(prepared.prefix):]) + ([end] if end is not None else [])

    # ---- streaming

    async def _stream(self, request: ChatCompletionRequest, prepared: Prepared, held: HeldSession | None, held_until: contextlib.AsyncExitStack | None) -> AsyncIterator[dict]:
        cid, created = completion_id(), int(time.time())
        if prepared.started:  # too late: the session was already freed for others
            raise ProxyError(503, "the stream was not consumed in time", code="stream_expired")
        prepared.started = True
        try:
            yield chunk_body(id=cid, model=request.model, created=created, delta={"role": "assistant", "content": ""})
            stream = self.parser.stream(thinking=prepared.thinking)
            decoder = self.chat_format.output_decoder()
            output_ids: list[int] = []
            finish = "length"
            upstream = (
                self.sessions.generate_stream(prepared.prompt, prepared.sampling)
                if held is None
                else held.query_stream(prepared.prompt, prepared.sampling)
            )
            try:
                async for body in upstream:
                    output_ids = body["output_ids"]
                    text, stopped = self._text(prepared, output_ids, final=False, decoder=decoder)
                    reason = (body["meta_info"].get("finish_reason") or {}).get("type")
                    for delta in _deltas(stream.feed(text), prepared.parallel_tools):
                        yield chunk_body(id=cid, model=request.model, created=created, delta=delta)
                    if stopped or reason is not None:
                        finish = "stop" if stopped or reason == "stop" else "length"
                        break
            finally:
                await upstream.aclose()
            text, stopped = self._text(prepared, output_ids, final=True, decoder=decoder)
            finish = "stop" if stopped else finish
            for delta in _deltas(stream.finish(text), prepared.parallel_tools):
                yield chunk_body(id=cid, model=request.model, created=created, delta=delta)
            message, finish = self._message(prepared, text, finish)
            await self._after(prepared, held, output_ids, message, finish)
            yield chunk_body(id=cid, model=request.model, created=created, delta={}, finish_reason=finish)
            if request.stream_options and request.stream_options.include_usage:
                usage = Usage(prompt_tokens=len(prepared.prompt), completion_tokens=len(output_ids), total_tokens=len(prepared.prompt) + len(output_ids))
                yield chunk_body(id=cid, model=request.model, created=created, delta=None, usage=usage)
        finally:
            if held_until is not None:
                # the client may have gone away: let the session go in a task of its own
                asyncio.get_running_loop().create_task(held_until.aclose())

    def _unstarted(self, prepared: Prepared, held_until: contextlib.AsyncExitStack) -> None:
        """A stream the server never started (client gone before the response): let its session go."""
        if not prepared.started:
            prepared.started = True
            asyncio.get_running_loop().create_task(held_until.aclose())


def _deltas(deltas, parallel_tools: bool):
    """Parser deltas as OpenAI ``delta`` objects (tool calls carry their ``index``)."""
    for delta in deltas:
        if delta.kind == "content":
            yield {"content": delta.text}
        elif delta.kind == "reasoning":
            yield {"reasoning_content": delta.text}
        elif parallel_tools or delta.index == 0:
            yield {"tool_calls": [{"index": delta.index, **delta.call.to_openai()}]}

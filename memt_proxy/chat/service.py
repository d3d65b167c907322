"""Chat completions over the proxy's session layer: request → prepared turn → OpenAI response or chunks.

A request with ``X-MemT-Session`` runs on one session of ``memt_proxy.session.sessions``, one without it on the
kept state its transcript reaches (``memt_proxy.chat.memory`` holds either; the completed turn is committed behind
the answer, before the session's next request runs); with memory ``off``, or with no memory to resume,
it is a plain generation over the whole transcript. Memory policy: ``auto`` reads memory and commits
each completed turn, ``read`` only reads, ``off`` neither. The surface decides what the model sees
(``memt_proxy.chat.plan``: transcript trimming, tool rounds, thinking, stop strings) and this module shapes what
the app gets back; the session layer decides nothing about OpenAI shapes.

Structured outputs (``memt_proxy.structured``) become one grammar field of the native sampling params;
a structured turn runs without a reasoning block (the grammar starts at the answer). ``n`` > 1 runs
``n`` generations of a stateless request (choice ``i`` with seed ``seed + i``); a session has one
memory and one answer per turn, so there it is refused. ``on_usage`` is called once per finished
completion (see ``ChatService``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator

from memt_core.client.chat_format import ChatFormat
from memt_core.client.parsers import OutputParser, hold_partial
from memt_proxy.chat.memory import ChatMemory, OnMemory
from memt_proxy.chat.plan import SEED_MODULUS, ChatPlanner
from memt_proxy.chat.stream import deltas, replayed
from memt_proxy.errors import BadRequest, NotFound
from memt_proxy.protocol import ChatCompletionRequest, Usage, choice, chunk_body, completion_id, logprobs_content, response_body
from memt_proxy.request_context import RequestContext
from memt_proxy.session.turn import NO_MEMORY, Prompt, Turn, TurnRunner
from memt_proxy.session.sessions import HeldSession, Sessions
from memt_proxy.structured import RawStream
from memt_proxy.worker import off_loop

log = logging.getLogger("memt.proxy")

POLICIES = ("auto", "read", "off")
DIVERGENCE = ("fork", "error", "branch", "reset", "reject")  # branch, reset: older names of fork; reject: of error
STRICT = ("error", "reject")


class ChatService:
    """Serves /v1/chat/completions for one upstream model, over its session layer (``runner``: the turn runner both
    surfaces share; its ``on_usage`` counts finished completions)."""

    def __init__(
        self,
        sessions: Sessions,
        chat_format: ChatFormat,
        parser: OutputParser,
        *,
        model_names: list[str],
        aliases: tuple[str, ...] = (),
        default_memory: str = "auto",
        default_thinking: bool = False,
        on_divergence: str = "fork",
        headerless: bool = True,
        runner: TurnRunner | None = None,
    ):
        self.sessions = sessions
        self.chat_format = chat_format
        self.parser = parser
        self.model_names = model_names  # listed by /v1/models
        self.accepted = {*model_names, *aliases}  # also asked for by other names of the checkpoint
        self.default_memory = default_memory
        self.on_divergence = on_divergence
        self.headerless = headerless  # requests without X-MemT-Session get memory too (``memt_proxy.session.headerless``)
        self.runner = runner or TurnRunner(sessions, chat_format)
        self.plans = ChatPlanner(chat_format, sessions, default_thinking=default_thinking)
        # which memory a turn runs on: a named session, or the kept state a header-less conversation reaches
        self.memory = ChatMemory(sessions, self.runner, self.plans)

    async def complete(
        self, request: ChatCompletionRequest, context: RequestContext, *, session: str | None, on_divergence: str | None = None,
    ) -> dict | AsyncIterator[dict]:
        """A chat.completion body, or (``stream``) an iterator of chat.completion.chunk bodies. ``context``: the
        request's tenant, memory policy, size, digest, and whether the client says it retries (the OpenAI SDKs'
        ``x-stainless-retry-count``) or repeats an ``Idempotency-Key``. A retry of an answered request gets its kept
        answer; the same request without either is a regenerate: a new answer, which memory keeps in place of the old one."""
        ignored = request.validate_semantics()
        if ignored:
            log.info("ignoring request field(s): %s", ", ".join(ignored))
        if request.model not in self.accepted:
            raise NotFound(f"model {request.model!r} does not exist; this proxy serves {', '.join(self.model_names)}", param="model", code="model_not_found")
        policy = context.policy
        if policy not in POLICIES:
            raise BadRequest(f"X-MemT-Memory must be one of {', '.join(POLICIES)}", param="X-MemT-Memory")
        if (request.n or 1) > 1 and session is not None and policy != "off":
            raise BadRequest(
                "n > 1 needs a stateless request: a session's turn has one answer to commit; "
                "leave out X-MemT-Session or send X-MemT-Memory: off", param="n", code="unsupported_parameter",
            )
        await self.sessions.check_upstream()
        answering = ChatAnswer(self, request)
        if policy == "off" or session is None and ((request.n or 1) > 1 or not self.headerless):
            turn = Turn(await off_loop(context.size, self.plans.stateless, request), NO_MEMORY, context)
            return await self.runner.run(OnMemory(turn=turn), answering, stream=bool(request.stream))
        if session is None:
            on = await self.memory.headerless(request, context)
        else:
            on = await self.memory.named(request, context, session=session, strict=(on_divergence or self.on_divergence) in STRICT)
        # a new session is created beside its (non-streamed) answer (``TurnRunner.answer``)
        return await self.runner.run(on, answering, stream=bool(request.stream), create=True)

    # ---- generation

    def _text(self, prompt: Prompt, output_ids: list[int], *, final: bool, decoder=None) -> tuple[str, bool]:
        """Decoded output with the forced prefix and stop strings applied; True if a stop string ended it.

        A stream passes its ``ChatFormat.output_decoder()``, so each frame decodes only its new tokens."""
        decoded = decoder.update(output_ids, final=final) if decoder is not None else self.chat_format.decode(output_ids)
        text = prompt.prefix + decoded
        found = [at for at in (text.find(stop) for stop in prompt.stops) if at >= 0]
        if found:  # the earliest stop string wins, whichever its place in the list
            return text[: min(found)], True
        if not final and prompt.stops:
            text = hold_partial(text, tuple(prompt.stops))
        return text, False

    def _message(self, prompt: Prompt, text: str, finish: str) -> tuple[dict, str, str]:
        """The assistant message of the answer ``text`` (its markup parsed), its finish reason, and its text as the app
        receives it (what memory keeps, ``TurnRunner.reply_ids``)."""
        if prompt.raw:
            return {"role": "assistant", "content": text}, finish, text
        parsed = self.parser.parse(text, thinking=prompt.thinking)
        calls = [c.to_openai() for c in parsed.tool_calls]
        if calls and not prompt.parallel_tools:
            calls = calls[:1]
        message: dict = {"role": "assistant", "content": parsed.content or (None if calls else "")}
        if parsed.reasoning is not None:
            message["reasoning_content"] = parsed.reasoning
        if calls and finish != "length":
            message["tool_calls"] = calls
            return message, "tool_calls", parsed.text
        return message, finish, parsed.text

    def _after(self, turn: Turn, held: HeldSession | None, output_ids: list[int], message: dict, finish: str, kept: str) -> None:
        prompt_tokens = len(turn.prompt.ids)
        usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=len(output_ids), total_tokens=prompt_tokens + len(output_ids))
        self.runner.after(turn, held, [message], output_ids, finish, kept=kept, answered={"message": message, "finish": finish, "usage": usage.model_dump()})

    def _choice_sampling(self, prompt: Prompt, index: int) -> dict:
        """Choice ``index``'s sampling params: its own seed when the request gave one (``seed + index``)."""
        if index == 0 or "seed" not in prompt.sampling:
            return prompt.sampling
        return {**prompt.sampling, "seed": (prompt.sampling["seed"] + index) % SEED_MODULUS}

    async def _run(self, request: ChatCompletionRequest, turn: Turn, held: HeldSession | None) -> dict:
        prompt = turn.prompt

        async def one(index: int) -> tuple[dict, int]:
            body = await self.runner.generate(turn, held, self._choice_sampling(prompt, index))
            output_ids = body["output_ids"]
            text, stopped = self._text(prompt, output_ids, final=True)
            finish = "stop" if stopped or (body["meta_info"].get("finish_reason") or {}).get("type") == "stop" else "length"
            message, finish, kept = self._message(prompt, text, finish)
            self._after(turn, held, output_ids, message, finish, kept)
            logprobs = logprobs_content(body["meta_info"]) if request.logprobs else None
            return choice(index, message, finish, logprobs), len(output_ids)

        results = [await one(0)] if (request.n or 1) == 1 else await asyncio.gather(*(one(index) for index in range(request.n)))
        completion = sum(count for _, count in results)
        self.runner.usage(turn, completion)
        usage = Usage(prompt_tokens=len(prompt.ids), completion_tokens=completion, total_tokens=len(prompt.ids) + completion)
        return response_body(id=completion_id(), model=request.model, choices=[c for c, _ in results], usage=usage)

    # ---- streaming

    async def _chunks(self, request: ChatCompletionRequest, turn: Turn, held: HeldSession | None) -> AsyncIterator[dict]:
        cid, created = completion_id(), int(time.time())
        completion = 0
        for index in range(request.n or 1):  # n > 1 (stateless only): the choices one after the other
            counted: list[int] = []
            async for chunk in self._stream_choice(request, turn, held, index, cid, created, counted):
                yield chunk
            completion += counted[0]
        self.runner.usage(turn, completion)
        if request.stream_options and request.stream_options.include_usage:
            prompt_tokens = len(turn.prompt.ids)
            usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=completion, total_tokens=prompt_tokens + completion)
            yield chunk_body(id=cid, model=request.model, created=created, delta=None, usage=usage)

    async def _stream_choice(self, request: ChatCompletionRequest, turn: Turn, held: HeldSession | None, index: int, cid: str, created: int,
                             counted: list[int]) -> AsyncIterator[dict]:
        """One choice's chunks (role, deltas with their log-probabilities, finish); ``counted`` gets its token count."""
        prompt = turn.prompt

        def chunk(delta: dict, finish_reason: str | None = None) -> dict:
            nonlocal sent
            logprobs = None
            if request.logprobs:
                logprobs = logprobs_content(meta, sent)
                sent += len(logprobs)
            return chunk_body(id=cid, model=request.model, created=created, delta=delta, finish_reason=finish_reason, index=index, logprobs=logprobs)

        sent, meta = 0, {}
        yield chunk_body(id=cid, model=request.model, created=created, delta={"role": "assistant", "content": ""}, index=index)
        stream = RawStream() if prompt.raw else self.parser.stream(thinking=prompt.thinking)
        decoder = self.chat_format.output_decoder()
        output_ids: list[int] = []
        finish = "length"
        upstream = self.runner.generate_stream(turn, held, self._choice_sampling(prompt, index))
        try:
            async for body in upstream:
                output_ids, meta = body["output_ids"], body["meta_info"]
                text, stopped = self._text(prompt, output_ids, final=False, decoder=decoder)
                reason = (meta.get("finish_reason") or {}).get("type")
                for delta in deltas(stream.feed(text), prompt.parallel_tools):
                    yield chunk(delta)
                if stopped or reason is not None:
                    finish = "stop" if stopped or reason == "stop" else "length"
                    break
        finally:
            await upstream.aclose()
        text, stopped = self._text(prompt, output_ids, final=True, decoder=decoder)
        finish = "stop" if stopped else finish
        for delta in deltas(stream.finish(text), prompt.parallel_tools):
            yield chunk(delta)
        message, finish, kept = self._message(prompt, text, finish)
        self._after(turn, held, output_ids, message, finish, kept)
        yield chunk({}, finish)
        counted.append(len(output_ids))


@dataclass(frozen=True)
class ChatAnswer:
    """The service's side of ``TurnRunner.run`` for one request (an ``Answerer``): its turn answered as a
    chat.completion body or as chunks, or its kept answer replayed."""

    service: ChatService
    request: ChatCompletionRequest

    def answer(self, turn: Turn, held: HeldSession | None):
        return self.service._run(self.request, turn, held)

    def events(self, turn: Turn, held: HeldSession | None) -> AsyncIterator[dict]:
        return self.service._chunks(self.request, turn, held)

    def replayed(self, kept: dict):
        return replayed(self.request, kept)

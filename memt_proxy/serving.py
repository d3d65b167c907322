"""Chat completions over the proxy's session layer: request → prepared turn → OpenAI response or chunks.

A request with ``X-MemT-Session`` runs on one session of ``memt_proxy.sessions`` (lock → create or
adopt → lease, kept across requests → query → answer; the completed turn is committed behind the
answer, before the session's next request runs); without one, or with memory ``off``,
it is a plain generation over the whole transcript. Memory policy: ``auto`` reads memory and commits
each completed turn, ``read`` only reads, ``off`` neither. This module decides what the model sees
(transcript trimming, tool rounds, thinking, stop strings) and shapes what the app gets back; the
session layer decides nothing about OpenAI shapes.

Structured outputs (``memt_proxy.structured``) become one grammar field of the native sampling params;
a structured turn runs without a reasoning block (the grammar starts at the answer). ``n`` > 1 runs
``n`` generations of a stateless request (choice ``i`` with seed ``seed + i``); a session has one
memory and one answer per turn, so there it is refused. ``on_usage`` is called once per finished
completion (see ``ChatService``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

from memt_core.client.chat_format import ChatFormat
from memt_core.client.parsers import OutputParser, hold_partial
from memt_proxy.branches import HeaderlessPlan, after_answer, closed, planned, resumable, resume
from memt_proxy.errors import BadRequest, NotFound, ProxyError, Unavailable
from memt_proxy.protocol import ChatCompletionRequest, NamedToolChoice, Usage, choice, chunk_body, completion_id, logprobs_content, logprobs_sampling, response_body
from memt_proxy.sessions import HeldSession, MemoryFound, PendingTurn, Sessions, SessionState
from memt_proxy.structured import structure
from memt_proxy.transcript import Split, as_dict, check_turn, message_hash, overlap, split_transcript
from memt_proxy.turn_plan import (
    KeptAnswers, RawStream, check_prefill, check_text_fits, continued_turn_ids, encode, fit_output, forced_prefix, no_usage, off_loop, prompt_ids, request_digest, retried,
)

log = logging.getLogger("memt.proxy")

POLICIES = ("auto", "read", "off")
DIVERGENCE = ("fork", "error", "branch", "reset", "reject")  # branch, reset: older names of fork; reject: of error
STRICT = ("error", "reject")
STREAM_START_TIMEOUT = 60.0
SEED_MODULUS = 1 << 63  # native seeds are in [0, 2**63); OpenAI's may be negative


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
    raw: bool = False  # the answer is structured JSON, returned as it is (no markup to parse)
    saved: int = 0  # prompt tokens memory spared this request (``MemoryTokens``)
    kept: str | None = None  # the answer's text as it may be committed (``Parsed.text``; set by ``_message``)
    headerless: HeaderlessPlan | None = None  # a conversation identified by its transcript (``memt_proxy.branches``)
    opening: Callable[[], Awaitable[list[int]]] | None = None  # header-less, no kept state: its history and turn as committed
    key: str | None = None  # the request's Idempotency-Key, kept with a committed turn's answer
    follower: HeldSession | None = None  # a named session forking from the state the prompt reads: it follows (``_fork``)


class ChatService:
    """Serves /v1/chat/completions for one upstream model, over its session layer.

    ``on_usage(prompt_tokens=, completion_tokens=, saved_tokens=, memory=)`` is called once per finished
    completion (streamed or not; not for a replayed answer): ``saved_tokens`` estimates the prompt
    tokens the transcript would have cost beyond what was sent, as the tokens this proxy wrote into
    the session's memory (0 stateless, or for memory it did not write); ``memory``: memory was read.
    """

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
    ):
        self.sessions = sessions
        self.chat_format = chat_format
        self.parser = parser
        self.model_names = model_names  # listed by /v1/models
        self.accepted = {*model_names, *aliases}  # also asked for by other names of the checkpoint
        self.default_memory = default_memory
        self.default_thinking = default_thinking
        self.on_divergence = on_divergence
        self.headerless = headerless  # requests without X-MemT-Session get memory too (``memt_proxy.branches``)
        self.on_usage = no_usage
        self.memory_tokens = sessions.memory_tokens
        self._answers = KeptAnswers()  # header-less answers, for a client's retry (a named session keeps its last turn's)

    async def complete(
        self, request: ChatCompletionRequest, *, tenant: str, session: str | None, memory: str | None, on_divergence: str | None = None,
        retry: bool = False, key: str | None = None,
    ) -> dict | AsyncIterator[dict]:
        """A chat.completion body, or (``stream``) an iterator of chat.completion.chunk bodies. ``retry``: the client
        says it sends this request again (the OpenAI SDKs' ``x-stainless-retry-count``); ``key``: its
        ``Idempotency-Key``. A retry of an answered request gets its kept answer (``_replayed``); the same
        request without either is a regenerate: a new answer, which memory keeps in place of the old one."""
        ignored = request.validate_semantics()
        if ignored:
            log.info("ignoring request field(s): %s", ", ".join(ignored))
        if request.model not in self.accepted:
            raise NotFound(f"model {request.model!r} does not exist; this proxy serves {', '.join(self.model_names)}", param="model", code="model_not_found")
        policy = (memory or self.default_memory).lower()
        if policy not in POLICIES:
            raise BadRequest(f"X-MemT-Memory must be one of {', '.join(POLICIES)}", param="X-MemT-Memory")
        if (request.n or 1) > 1 and session is not None and policy != "off":
            raise BadRequest(
                "n > 1 needs a stateless request: a session's turn has one answer to commit; "
                "leave out X-MemT-Session or send X-MemT-Memory: off", param="n", code="unsupported_parameter",
            )
        await self.sessions.check_upstream()
        dumped = request.model_dump_json()  # once: the size that decides where preparing runs, and the retry digest
        if policy == "off" or session is None and ((request.n or 1) > 1 or not self.headerless):
            prepared = await off_loop(len(dumped), self._prepare_stateless, request)
            if request.stream:
                return self._stream(request, prepared, None, None)
            return await self._run(request, prepared, None)
        digest = request_digest(dumped)
        if session is None:
            kept = self._answers.retried(tenant, digest, retry, key)
            if kept is not None:
                return self._replayed(request, kept)
            return await self._headerless(request, tenant, policy, len(dumped), digest, key)
        held_until = contextlib.AsyncExitStack()  # the session is held until this closes
        held = await held_until.enter_async_context(self.sessions.turn(tenant, session))
        state = held.state
        divergence = on_divergence or self.on_divergence
        try:
            await self.sessions.adopt_recorded(state)  # e.g. after a restart: its record, its last answer
        except BaseException:
            await held_until.aclose()
            raise
        last = state.last_turn  # a retry of the session's last committed turn gets its kept answer
        if last and last.get("version") == state.version and last.get("digest") == digest and retried(retry, key, last.get("key")):
            replayed = self._replayed(request, last)
            await held_until.aclose()
            return replayed

        try:
            forked = await self._fork(request, held, held_until, policy, divergence, len(dumped))
        except BaseException:
            await held_until.aclose()
            raise

        async def prepare() -> Prepared:
            prepared = await (forked[1]() if forked is not None else self._prepare_session(request, state, policy, divergence, len(dumped)))
            prepared.digest, prepared.key = digest, key
            return prepared

        return await self._answer(request, held if forked is None else forked[0], held_until, prepare)

    async def _fork(self, request: ChatCompletionRequest, held: HeldSession, held_until: contextlib.AsyncExitStack, policy: str, divergence: str, size: int):
        """A request on a named session that does not continue its memory — a regenerate, an edit, another
        conversation sent under the same name (an app's background task) — is answered from the deepest kept state
        its earlier messages reach (``memt_proxy.branches``: the session keeps the state before each of its turns);
        the session then follows it, a copy of that state with the turn written in (``Later.source``). Returns that
        state, held, and the prompt's maker; or None: no fork (the request continues memory, the session refuses
        divergence, or no state holds a prefix of it: then memory starts over from the request's history)."""
        state = held.state
        if divergence in STRICT or policy != "auto" or not state.committed or not state.history_known:
            return None
        plan = await planned(self.sessions, request.messages, state.tenant, size)
        if plan.found is None or overlap(plan.hashes, state.committed):
            return None  # nothing kept to fork from, or the request continues memory
        hold = contextlib.AsyncExitStack()
        try:
            origin = await hold.enter_async_context(self.sessions.turn(state.tenant, plan.found.branch))
            if not await resumable(self.sessions, origin.state, plan):
                await hold.aclose()  # closed meanwhile: memory starts over instead
                return None
        except ProxyError as exc:
            await hold.aclose()
            if exc.status != 429:
                raise
            return None
        except BaseException:
            await hold.aclose()
            raise
        held_until.push_async_callback(hold.aclose)  # let go with the session, before it (its commit forks from it)
        log.info("%s forks from a kept state of %d messages", state.native, len(origin.state.committed))

        async def prepare() -> Prepared:
            prepared = await off_loop(size, self._prepare_split, request, origin.state, policy, plan.hashes)
            prepared.follower = held
            return prepared

        return origin, prepare

    async def _answer(self, request: ChatCompletionRequest, held: HeldSession, held_until: contextlib.AsyncExitStack, prepare) -> dict | AsyncIterator[dict]:
        """Answer on a held session with the prompt ``prepare()`` makes; the session is let go when the answer
        (or its stream) ends."""
        handed_off = False
        try:
            state = held.state
            # prepared before the native session exists, so a refused request never creates one
            prepared = await prepare()
            missing = not state.exists
            # a new session is created beside its (non-streamed) answer, like its lease
            await held.start(with_answer=True, create=not request.stream)
            if missing and state.exists and not state.blank:
                # adopted: the native session already held memory (its record says what, or nobody knows)
                prepared = await prepare()
            if request.stream:
                handed_off = True  # the stream lets the session go when it ends
                stream = self._stream(request, prepared, held, held_until)
                asyncio.get_running_loop().call_later(STREAM_START_TIMEOUT, self._unstarted, prepared, held_until)
                return stream
            try:
                return await self._run(request, prepared, held)
            except MemoryFound:  # the same, found only once the answer was under way
                return await self._run(request, await prepare(), held)
        finally:
            if not handed_off:
                await held_until.aclose()

    async def _headerless(self, request: ChatCompletionRequest, tenant: str, policy: str, size: int, digest: str, key: str | None) -> dict | AsyncIterator[dict]:
        """A conversation without X-MemT-Session, identified by its transcript (``memt_proxy.branches``): resumed
        from the deepest kept state its earlier messages reach; with none, a plain generation. Behind the answer
        the conversation's next state is forked (``_after``)."""
        plan, held, held_until = await resume(self.sessions, request.messages, tenant, size)
        if held is None:
            prepared = await off_loop(size, self._prepare_stateless, request)
            prepared.headerless, prepared.digest, prepared.key = plan, digest, key
            plan.worth_keeping = plan.worth_keeping and policy == "auto"
            conversation = [as_dict(m) for m in request.messages if m.role not in ("system", "developer")]
            earlier, turn = conversation[: len(plan.hashes)], conversation[len(plan.hashes):]
            prepared.opening = functools.partial(off_loop, size, self._opening_ids, earlier, turn, prepared)
            if request.stream:
                return self._stream(request, prepared, None, None)
            return await self._run(request, prepared, None)

        async def prepare() -> Prepared:
            prepared = await off_loop(size, self._prepare_split, request, held.state, policy, plan.hashes)
            prepared.headerless, prepared.digest, prepared.key = plan, digest, key
            return prepared

        return await self._answer(request, held, held_until, prepare)

    def _opening_ids(self, earlier: list[dict], turn: list[dict], prepared: Prepared) -> list[int]:
        """A conversation's history and open turn as a session would commit them (its answer's ids follow)."""
        return self.chat_format.history_ids(earlier) + self.chat_format.open_turn_ids(turn, enable_thinking=prepared.thinking) + encode(self.chat_format, prepared.prefix)

    def _options(self, request: ChatCompletionRequest) -> tuple[bool, list | None, str, bool]:
        thinking = self.default_thinking
        if request.reasoning_effort is not None:
            thinking = request.reasoning_effort not in ("none", "minimal")
        if request.chat_template_kwargs and "enable_thinking" in request.chat_template_kwargs:
            thinking = bool(request.chat_template_kwargs["enable_thinking"])
        tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools and request.tool_choice != "none" else None
        named = request.tool_choice.function.name if isinstance(request.tool_choice, NamedToolChoice) else None
        prefix = forced_prefix(self.chat_format, tools, required=request.tool_choice == "required", named=named)
        if _structured(request, prefix):
            thinking = False  # the grammar (or forced call) starts at the answer
        return thinking, tools, prefix, request.parallel_tool_calls is not False

    def _structure(self, request: ChatCompletionRequest, tools: list[dict] | None):
        """The grammar of the answer (``memt_proxy.structured``), or None."""
        named = request.tool_choice.function.name if isinstance(request.tool_choice, NamedToolChoice) else None
        return structure(
            self.chat_format, schema=request.output_schema(), schema_param="response_format", tools=tools, tools_param="tools",
            forced=bool(tools) and (request.tool_choice == "required" or named is not None), name=named,
        )

    def _sampling(self, request: ChatCompletionRequest, prompt: list[int], tools: list[dict] | None = None) -> dict:
        """The native sampling params (log-probability fields included; a ``json_schema`` grammar means
        the answer is the JSON itself, see ``memt_proxy.structured``); the output's limit what fits beside
        ``prompt`` (``fit_output``)."""
        sampling = dict(self.chat_format.default_sampling())
        for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            if getattr(request, name) is not None:
                sampling[name] = getattr(request, name)
        if request.seed is not None:
            sampling["seed"] = request.seed % SEED_MODULUS
        if request.min_tokens:
            sampling["min_new_tokens"] = request.min_tokens
        limit = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
        fit_output(sampling, prompt, request.max_new_tokens, self.sessions.context_length, param=limit, prompt_param="messages")
        if request.logit_bias:
            vocab = len(self.chat_format.tokenizer)
            for key in request.logit_bias:
                if int(key) >= vocab:
                    raise BadRequest(f"logit_bias key {key[:40]!r} is not a token id of this model (its vocabulary has {vocab})", param="logit_bias")
            sampling["logit_bias"] = {str(int(key)): float(value) for key, value in request.logit_bias.items()}
        if request.logprobs:
            sampling.update(logprobs_sampling(request.top_logprobs))
        stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        if stops:
            sampling["stop"] = stops
        grammar = self._structure(request, tools)
        if grammar is not None:
            sampling[grammar.field] = grammar.source
        return sampling

    def _prepare_stateless(self, request: ChatCompletionRequest) -> Prepared:
        thinking, tools, prefix, parallel = self._options(request)
        check_turn([m for m in request.messages if m.role not in ("system", "developer")])  # as with a session
        messages = [as_dict(m) for m in request.messages]
        check_text_fits(self.chat_format, messages, None, self.sessions.max_prefill_tokens, "messages")
        prompt = self.chat_format.conversation_ids(messages, tools=tools, enable_thinking=thinking) + encode(self.chat_format, prefix)
        check_prefill(prompt, self.sessions.max_prefill_tokens, "messages")
        sampling = self._sampling(request, prompt, tools)
        return Prepared(None, "off", prompt, [], [], None, thinking, sampling, prefix, sampling.get("stop", []), parallel, raw="json_schema" in sampling)

    async def _prepare_session(self, request: ChatCompletionRequest, state: SessionState, policy: str, on_divergence: str, size: int) -> Prepared:
        try:
            if not _regenerates(request, state):
                return await off_loop(size, self._prepare_split, request, state, policy)
        except ProxyError as exc:
            if exc.code != "transcript_diverged" or on_divergence in STRICT:
                raise
        # no kept state holds a prefix of the request's history (``_fork``): memory starts over from it, the request's
        # history committed again; what memory held is kept first, so the conversation it was can still be resumed
        await self.sessions.lease_of(state)
        await self.sessions.keep_parent(state)
        await self.sessions.reset(state)
        return await off_loop(size, self._prepare_split, request, state, policy)

    def _prepare_split(self, request: ChatCompletionRequest, state: SessionState, policy: str, hashes: list[str] | None = None) -> Prepared:
        """``hashes``: the earlier messages' hashes when the caller has them (a header-less plan)."""
        thinking, tools, prefix, parallel = self._options(request)
        split = split_transcript(request.messages, state.committed, history_known=state.history_known, hashes=hashes)
        turn = [as_dict(m) for m in split.turn]
        context = [as_dict(m) for m in split.context]
        check_text_fits(self.chat_format, context + turn, split.instructions, self.sessions.max_prefill_tokens, "messages")
        turn_ids = continued_turn_ids(self.chat_format, state.pending, turn)
        continues = turn_ids is not None
        if continues:
            thinking = state.pending.thinking and not _structured(request, prefix)  # a grammar starts at the answer
        else:
            turn_ids = self.chat_format.open_turn_ids(turn, enable_thinking=thinking)
        context_ids = self.chat_format.history_ids(context)
        forced = encode(self.chat_format, prefix)
        prompt = prompt_ids(self.chat_format, split.instructions, tools, context_ids, turn_ids + forced)
        check_prefill(prompt, self.sessions.max_prefill_tokens, "messages")
        # a continued turn stays pending until this request ends it (or calls tools again), so that a
        # retry after a failure, here or in a restarted proxy, continues it too; any other request abandons it
        sampling = self._sampling(request, prompt, tools)
        if not continues:
            self.sessions.set_pending(state, None)
        return Prepared(
            state, policy, prompt, turn_ids + forced, context_ids, split, thinking, sampling, prefix, sampling.get("stop", []), parallel,
            raw="json_schema" in sampling, saved=self.memory_tokens.held(state),
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
        prepared.kept = text
        if prepared.raw:
            return {"role": "assistant", "content": text}, finish
        parsed = self.parser.parse(text, thinking=prepared.thinking)
        prepared.kept = parsed.text
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

    def _choice_sampling(self, prepared: Prepared, index: int) -> dict:
        """Choice ``index``'s sampling params: its own seed when the request gave one (``seed + index``)."""
        if index == 0 or "seed" not in prepared.sampling:
            return prepared.sampling
        return {**prepared.sampling, "seed": (prepared.sampling["seed"] + index) % SEED_MODULUS}

    async def _run(self, request: ChatCompletionRequest, prepared: Prepared, held: HeldSession | None) -> dict:
        n = request.n or 1

        async def one(index: int) -> tuple[dict, int]:
            sampling = self._choice_sampling(prepared, index)
            body = await (self.sessions.generate(prepared.prompt, sampling) if held is None else held.query(prepared.prompt, sampling))
            output_ids = body["output_ids"]
            text, stopped = self._text(prepared, output_ids, final=True)
            finish = "stop" if stopped or (body["meta_info"].get("finish_reason") or {}).get("type") == "stop" else "length"
            message, finish = self._message(prepared, text, finish)
            await self._after(prepared, held, output_ids, message, finish)
            logprobs = logprobs_content(body["meta_info"]) if request.logprobs else None
            return choice(index, message, finish, logprobs), len(output_ids)

        results = [await one(0)] if n == 1 else await asyncio.gather(*(one(index) for index in range(n)))
        completion = sum(count for _, count in results)
        usage = Usage(prompt_tokens=len(prepared.prompt), completion_tokens=completion, total_tokens=len(prepared.prompt) + completion)
        self._usage(prepared, usage)
        return response_body(id=completion_id(), model=request.model, usage=usage, choices=[c for c, _ in results])

    def _usage(self, prepared: Prepared, usage: Usage) -> None:
        """Tell ``on_usage`` about a finished completion; a failing observer never fails the request."""
        try:
            self.on_usage(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens, saved_tokens=prepared.saved, memory=prepared.policy != "off")
        except Exception:
            log.exception("on_usage failed")

    async def _after(self, prepared: Prepared, held: HeldSession | None, output_ids: list[int], message: dict, finish: str) -> None:
        """Record a pending tool round, or commit the completed turn (policy auto); header-less, fork the
        conversation's next state (``memt_proxy.branches``)."""
        if prepared.headerless is not None:
            self._fork_after(prepared, held, output_ids, message, finish)
            return
        if held is None:
            return
        state = held.state
        follower = prepared.follower
        turn = [as_dict(m) for m in prepared.split.turn]
        if finish == "tool_calls":
            if follower is None:  # a fork's tool round forks again with its results
                self.sessions.set_pending(state, PendingTurn([message_hash(m) for m in turn] + [message_hash(message)], prepared.turn_ids + output_ids, prepared.thinking))
            return
        if prepared.policy != "auto" or finish != "stop":
            self.sessions.set_pending(state, None)  # the turn ended without a commit (read-only, or a truncated reply)
            return  # it stays in the app's transcript as context
        committed = (
            state.committed
            + prepared.split.context_hashes
            + [message_hash(m) for m in turn]
            + [message_hash(message)]
        )
        # committed behind the answer: the app has it first, and the session's next request waits for the commit
        reply_ids = self._reply_ids(prepared, output_ids)
        usage = Usage(prompt_tokens=len(prepared.prompt), completion_tokens=len(output_ids), total_tokens=len(prepared.prompt) + len(output_ids))
        # the version the session has once that commit is published (a failed one leaves nothing to replay); kept in
        # the session's record with that commit, so a client's retry reaching a restarted proxy gets it too
        answered = {"digest": prepared.digest, "key": prepared.key, "version": state.version + 1, "message": message, "finish": finish, "usage": usage.model_dump()}
        if follower is not None:  # the named session becomes a copy of the state read (version 0), then this turn
            follower.commit_turn_later(prepared.context_ids, prepared.turn_ids + reply_ids, committed, source=state.name)
            follower.state.last_turn = {**answered, "version": 1}
            return
        held.commit_turn_later(prepared.context_ids, prepared.turn_ids + reply_ids, committed, keep_parent=True)
        self.memory_tokens.wrote(state, len(committed), len(prepared.context_ids) + len(prepared.turn_ids) + len(reply_ids))
        state.last_turn = answered

    def _fork_after(self, prepared: Prepared, held: HeldSession | None, output_ids: list[int], message: dict, finish: str) -> None:
        """Header-less: a completed answer (policy auto) forks the conversation's next state from the one the request
        read (or starts one, for a conversation worth keeping); a tool call keeps none (its results come next)."""
        plan = prepared.headerless
        usage = Usage(prompt_tokens=len(prepared.prompt), completion_tokens=len(output_ids), total_tokens=len(prepared.prompt) + len(output_ids))
        self._answers.keep(plan.tenant, prepared.digest, prepared.key, {"message": message, "finish": finish, "usage": usage.model_dump()})
        keep = finish in ("stop", "length") and (prepared.policy == "auto" if held is not None else plan.worth_keeping)
        reply = closed(self._reply_ids(prepared, output_ids), self.chat_format.tokenizer.eos_token_id, finish == "length") if keep else []
        if held is not None:
            lacking = prepared.context_ids + prepared.turn_ids

            async def ids() -> list[int]:
                return lacking + reply
        else:
            async def ids() -> list[int]:
                return await prepared.opening() + reply
        after_answer(self.sessions, plan, [message], parent=held.state if held is not None else None, keep=keep, ids=ids)

    def _replayed(self, request: ChatCompletionRequest, last: dict) -> dict | AsyncIterator[dict]:
        """The kept answer ``last`` again, for a client's retry of its request (e.g. the openai SDK after the answer was
        lost): nothing is generated or committed again."""
        log.info("a client's retry of an answered request: answered again, not committed twice")
        usage = Usage(**last["usage"])
        if request.stream:
            return self._replayed_stream(request, last["message"], last["finish"], usage)
        return response_body(id=completion_id(), model=request.model, message=last["message"], finish_reason=last["finish"], usage=usage)

    async def _replayed_stream(self, request: ChatCompletionRequest, message: dict, finish: str, usage: Usage) -> AsyncIterator[dict]:
        """A kept answer as chunks: role, reasoning, content, tool calls, finish, usage when asked."""
        cid, created = completion_id(), int(time.time())
        yield chunk_body(id=cid, model=request.model, created=created, delta={"role": "assistant", "content": ""})
        for key in ("reasoning_content", "content"):
            if message.get(key):
                yield chunk_body(id=cid, model=request.model, created=created, delta={key: message[key]})
        for index, call in enumerate(message.get("tool_calls") or []):
            yield chunk_body(id=cid, model=request.model, created=created, delta={"tool_calls": [{"index": index, **call}]})
        yield chunk_body(id=cid, model=request.model, created=created, delta={}, finish_reason=finish)
        if request.stream_options and request.stream_options.include_usage:
            yield chunk_body(id=cid, model=request.model, created=created, delta=None, usage=usage)

    def _reply_ids(self, prepared: Prepared, output_ids: list[int]) -> list[int]:
        """The reply as committed (``ChatFormat.reply_ids``): the generated ids, or for a reply cut by a stop
        string or cleaned of markup by the parser, the ids of the text the app received and an end token."""
        kept = prepared.kept if prepared.kept is not None else self._text(prepared, output_ids, final=True)[0]
        if not kept.startswith(prepared.prefix):  # the forced prefix is already in the turn's ids
            return output_ids
        return self.chat_format.reply_ids(output_ids, self.chat_format.decode(output_ids), kept[len(prepared.prefix):])

    # ---- streaming

    async def _stream(self, request: ChatCompletionRequest, prepared: Prepared, held: HeldSession | None, held_until: contextlib.AsyncExitStack | None) -> AsyncIterator[dict]:
        cid, created = completion_id(), int(time.time())
        if prepared.started:  # too late: the session was already freed for others
            raise Unavailable("the stream was not consumed in time", code="stream_expired")
        prepared.started = True
        try:
            completion = 0
            for index in range(request.n or 1):  # n > 1 (stateless only): the choices one after the other
                counted: list[int] = []
                async for chunk in self._stream_choice(request, prepared, held, index, cid, created, counted):
                    yield chunk
                completion += counted[0]
            usage = Usage(prompt_tokens=len(prepared.prompt), completion_tokens=completion, total_tokens=len(prepared.prompt) + completion)
            self._usage(prepared, usage)
            if request.stream_options and request.stream_options.include_usage:
                yield chunk_body(id=cid, model=request.model, created=created, delta=None, usage=usage)
        finally:
            if held_until is not None:
                # the client may have gone away: let the session go in a task of its own
                asyncio.get_running_loop().create_task(held_until.aclose())

    async def _stream_choice(self, request: ChatCompletionRequest, prepared: Prepared, held: HeldSession | None, index: int, cid: str, created: int, counted: list[int]) -> AsyncIterator[dict]:
        """One choice's chunks (role, deltas with their log-probabilities, finish); ``counted`` gets its token count."""
        def chunk(delta: dict, finish_reason: str | None = None) -> dict:
            nonlocal sent
            logprobs = None
            if request.logprobs:
                logprobs = logprobs_content(meta, sent)
                sent += len(logprobs)
            return chunk_body(id=cid, model=request.model, created=created, delta=delta, finish_reason=finish_reason, index=index, logprobs=logprobs)

        sent, meta = 0, {}
        yield chunk_body(id=cid, model=request.model, created=created, delta={"role": "assistant", "content": ""}, index=index)
        stream = RawStream() if prepared.raw else self.parser.stream(thinking=prepared.thinking)
        decoder = self.chat_format.output_decoder()
        output_ids: list[int] = []
        finish = "length"
        sampling = self._choice_sampling(prepared, index)
        upstream = self.sessions.generate_stream(prepared.prompt, sampling) if held is None else held.query_stream(prepared.prompt, sampling)
        try:
            async for body in upstream:
                output_ids, meta = body["output_ids"], body["meta_info"]
                text, stopped = self._text(prepared, output_ids, final=False, decoder=decoder)
                reason = (meta.get("finish_reason") or {}).get("type")
                for delta in _deltas(stream.feed(text), prepared.parallel_tools):
                    yield chunk(delta)
                if stopped or reason is not None:
                    finish = "stop" if stopped or reason == "stop" else "length"
                    break
        finally:
            await upstream.aclose()
        text, stopped = self._text(prepared, output_ids, final=True, decoder=decoder)
        finish = "stop" if stopped else finish
        for delta in _deltas(stream.finish(text), prepared.parallel_tools):
            yield chunk(delta)
        message, finish = self._message(prepared, text, finish)
        await self._after(prepared, held, output_ids, message, finish)
        yield chunk({}, finish)
        counted.append(len(output_ids))

    def _unstarted(self, prepared: Prepared, held_until: contextlib.AsyncExitStack) -> None:
        """A stream the server never started (client gone before the response): let its session go."""
        if not prepared.started:
            prepared.started = True
            asyncio.get_running_loop().create_task(held_until.aclose())


def _regenerates(request: ChatCompletionRequest, state: SessionState) -> bool:
    """Whether a request sending only its turn asks again the one turn memory holds (a regenerate of a first answer):
    then memory starts over from it. With more in memory, the same message is a new turn (an app that sends only
    new messages may well say "Next." twice)."""
    conversation = [m for m in request.messages if m.role not in ("system", "developer")]
    if len(conversation) != 1 or not state.history_known or len(state.committed) != 2:
        return False
    return state.committed[0] == message_hash(conversation[0])


def _structured(request: ChatCompletionRequest, prefix: str) -> bool:
    """Whether the answer is constrained from its first token: a JSON response format, or a forced call."""
    return bool(prefix) or request.output_schema() is not None


def _deltas(deltas, parallel_tools: bool):
    """Parser deltas as OpenAI ``delta`` objects (tool calls carry their ``index``)."""
    for delta in deltas:
        if delta.kind == "content":
            yield {"content": delta.text}
        elif delta.kind == "reasoning":
            yield {"reasoning_content": delta.text}
        elif parallel_tools or delta.index == 0:
            yield {"tool_calls": [{"index": delta.index, **delta.call.to_openai()}]}

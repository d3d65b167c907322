"""Chat completions over a memt_core server: sessions, trimming, tool rounds, memory writes.

A request with ``X-MemT-Session`` maps onto one native session (its ID derived from tenant and
session name, so tenants can never meet). Per request: take the session's local lock (bounded wait),
acquire the native lease → query → [begin → commit context → commit turn → publish] → release.
Memory policy: ``auto`` reads memory and commits each completed turn, ``read`` only reads, ``off``
neither (a plain generation over the whole transcript, as does a request without a session).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncIterator

from memt_core.client.chat_format import ChatFormat
from memt_core.client.errors import MemTClientError
from memt_core.client.native import AsyncNativeClient
from memt_core.client.parsers import OutputParser, hold_partial
from memt_core.errors import EpochMismatch, LeaseConflict, MemTError, SessionBusy, SessionExists, UnknownSession
from memt_proxy.errors import ProxyError, from_native
from memt_proxy.protocol import ChatCompletionRequest, Usage, chunk_body, completion_id, response_body, text_of
from memt_proxy.store import SessionStore
from memt_proxy.transcript import Split, as_dict, check_tool_rounds, message_hash, split_transcript

log = logging.getLogger("memt.proxy")

POLICIES = ("auto", "read", "off")
LEASE_TTL = 30  # default native lease lifetime (seconds); renewed while a request holds it
STREAM_START_TIMEOUT = 60.0
COMMIT_CAPACITY_WAIT = 30.0  # seconds a commit retries while the upstream's in-flight commit capacity is full (429)
RELEASE_WAIT = 10.0  # seconds a release retries while a cancelled query is still winding down upstream


@dataclass
class PendingTurn:
    """A turn waiting for tool results: the hashes of its messages so far and its exact token ids."""

    hashes: list[str]
    ids: list[int]
    thinking: bool


@dataclass
class SessionState:
    native: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    committed: list[str] = field(default_factory=list)  # hashes of committed messages, in order
    history_known: bool = True  # False when we adopted a native session whose history we never saw
    pending: PendingTurn | None = None
    exists: bool = False
    version: int = 0  # the upstream's published_version of the memory that ``committed`` describes
    keeper: asyncio.Task | None = None  # renews the native lease while a request holds it


def native_session_id(tenant: str, session: str) -> str:
    """Tenant-scoped, collision-resistant native session ID within the native grammar."""
    return "p-" + hashlib.sha256(f"{tenant}\x00{session}".encode()).hexdigest()[:40]


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


class ChatService:
    """Serves /v1/chat/completions and the session admin routes for one upstream model."""

    def __init__(
        self,
        client: AsyncNativeClient,
        chat_format: ChatFormat,
        parser: OutputParser,
        *,
        model_names: list[str],
        default_memory: str = "auto",
        default_thinking: bool = False,
        lease_wait: float = 30.0,
        on_divergence: str = "reject",
        store: SessionStore | None = None,
        lease_ttl: int = LEASE_TTL,
    ):
        self.client = client
        self.chat_format = chat_format
        self.parser = parser
        self.model_names = model_names
        self.default_memory = default_memory
        self.default_thinking = default_thinking
        self.lease_wait = lease_wait
        self.on_divergence = on_divergence
        self.store = store or SessionStore(None)
        self.lease_ttl = lease_ttl
        self.sessions: dict[tuple[str, str], SessionState] = {}
        self._upstream_checked = False
        self.max_prefill_tokens: int | None = None
        self.chunk_tokens: int | None = None

    # ------------------------------------------------------------------ upstream

    async def check_upstream(self) -> None:
        """The upstream must serve the checkpoint whose chat format we use."""
        if self._upstream_checked:
            return
        try:
            capabilities = await self.client.capabilities(refresh=True)
        except MemTClientError as exc:
            raise from_native(exc) from None
        if capabilities.get("identity") != self.chat_format.identity:
            raise ProxyError(503, "the upstream MemT server serves a different model/tokenizer than this proxy's --model-path", code="upstream_identity_mismatch")
        self.max_prefill_tokens = capabilities.get("max_prefill_tokens")
        self.chunk_tokens = capabilities.get("chunk_tokens")
        self._upstream_checked = True

    async def _native(self, call, *args, **kwargs):
        try:
            return await call(*args, **kwargs)
        except MemTClientError as exc:
            raise self._upstream_error(exc) from None

    def _upstream_error(self, exc: MemTClientError) -> ProxyError:
        """The OpenAI error for a native failure; an epoch mismatch means the upstream restarted."""
        if isinstance(exc.cause, EpochMismatch):
            self._upstream_checked = False  # the upstream restarted: sessions are gone; relearn its epoch
            for state in self.sessions.values():
                state.exists = False
                state.committed, state.pending, state.history_known = [], None, True
        return from_native(exc)

    # ------------------------------------------------------------------ sessions

    def state(self, tenant: str, session: str) -> SessionState:
        key = (tenant, session)
        if key not in self.sessions:
            self.sessions[key] = SessionState(native=native_session_id(tenant, session))
        return self.sessions[key]

    async def _locked(self, state: SessionState):
        try:
            await asyncio.wait_for(state.lock.acquire(), timeout=self.lease_wait)
        except asyncio.TimeoutError:
            raise ProxyError(409, f"session busy: another request on this session is still running after {self.lease_wait:.0f}s; retry later", code="session_busy") from None

    async def _ensure(self, state: SessionState) -> None:
        if state.exists:
            return
        try:
            await self.client.control("create", state.native, memory_read=True)
        except MemTClientError as exc:
            # errors rebuilt from the wire carry the generic class of their status (Conflict), not SessionExists
            if not isinstance(exc.cause, SessionExists):
                raise self._upstream_error(exc) from None
            self._adopt(state, await self._native(self.client.control, "inspect", state.native))
            return
        self.store.delete(state.native)  # a record from an earlier life of this id (before an upstream restart)
        state.exists, state.version, state.committed, state.history_known = True, 0, [], True

    def _adopt(self, state: SessionState, native: dict) -> None:
        """Take over a native session that exists upstream: its record, if one matches its version, says
        what memory holds and which turn, if any, waits for tool results."""
        version = native["published_version"]
        committed = self.store.load(state.native, version)
        state.exists, state.version = True, version
        state.committed, state.history_known = committed or [], committed is not None
        pending = self.store.load_pending(state.native, version) if committed is not None else None
        state.pending = PendingTurn(**pending) if pending is not None else None

    def _changing(self, state: SessionState, committed: list[str]) -> None:
        """Record, before it happens, that the next published version of the session's memory holds ``committed``."""
        self._record(state, self.store.save, committed)

    def _set_pending(self, state: SessionState, pending: PendingTurn | None) -> None:
        """Keep (or drop) the turn waiting for tool results, in memory and in the session's record."""
        if pending is None and state.pending is None:
            return
        state.pending = pending
        self._record(state, self.store.save_pending, None if pending is None else asdict(pending))

    def _record(self, state: SessionState, save, *fields) -> None:
        """Write the session's record with ``save`` (a SessionStore method) after its version and committed history."""
        try:
            save(state.native, state.version, state.committed if state.history_known else None, *fields)
        except OSError:
            # without a fresh record a restarted proxy finds no version match: the history counts as unknown
            log.warning("could not write the session record of %s", state.native, exc_info=True)

    def _changed(self, state: SessionState, committed: list[str]) -> None:
        """The change recorded by ``_changing`` was published (which ends any turn waiting for tool results)."""
        state.committed, state.version, state.history_known, state.pending = committed, state.version + 1, True, None

    async def _acquire(self, state: SessionState) -> str:
        deadline = time.monotonic() + self.lease_wait
        while True:
            try:
                lease = (await self.client.control("acquire", state.native, ttl=self.lease_ttl))["lease"]
                break
            except MemTClientError as exc:
                if not isinstance(exc.cause, LeaseConflict) or time.monotonic() > deadline:
                    raise self._upstream_error(exc) from None
            await asyncio.sleep(0.2)
        state.keeper = asyncio.get_running_loop().create_task(self._keep(state, lease))
        return lease

    async def _keep(self, state: SessionState, lease: str) -> None:
        """Renew the lease every third of its lifetime until released: long generations keep it, and
        a proxy that dies leaves its sessions leased for at most ``lease_ttl`` seconds."""
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            try:
                await self.client.control("renew", state.native, lease=lease, ttl=self.lease_ttl)
            except MemTClientError:
                log.warning("renewing the lease of %s failed", state.native, exc_info=True)
                return

    async def _release(self, state: SessionState, lease: str) -> None:
        if state.keeper is not None:
            state.keeper.cancel()
            state.keeper = None
        deadline = time.monotonic() + RELEASE_WAIT
        while True:
            try:
                await self.client.control("release", state.native, lease=lease)
                return
            except MemTClientError as exc:
                # after a client disconnect the cancelled upstream query may still be in flight for a moment
                if isinstance(exc.cause, SessionBusy) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                    continue
                log.warning("release of %s failed", state.native, exc_info=True)
                return

    async def _commit(self, state: SessionState, lease: str, transaction: str, ids: list[int]) -> None:
        """One commit; while the upstream's in-flight commit capacity is full (429, nothing applied), wait and retry."""
        deadline, delay = time.monotonic() + COMMIT_CAPACITY_WAIT, 0.02
        while True:
            try:
                await self._native(self.client.commit, state.native, lease, transaction, ids)
                return
            except ProxyError as exc:
                if exc.status != 429 or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.5)

    # ------------------------------------------------------------------ chat completions

    async def complete(self, request: ChatCompletionRequest, *, tenant: str, session: str | None, memory: str | None, on_divergence: str | None = None) -> dict | AsyncIterator[dict]:
        ignored = request.validate_semantics()
        if ignored:
            log.info("ignoring request field(s): %s", ", ".join(ignored))
        if request.model not in self.model_names:
            raise ProxyError(404, f"model {request.model!r} does not exist; this proxy serves {', '.join(self.model_names)}", param="model", code="model_not_found")
        policy = (memory or self.default_memory).lower()
        if policy not in POLICIES:
            raise ProxyError(400, f"X-MemT-Memory must be one of {', '.join(POLICIES)}", param="X-MemT-Memory")
        await self.check_upstream()
        if session is None or policy == "off":
            prepared = self._prepare_stateless(request)
            if request.stream:
                return self._stream(request, prepared, lease=None)
            return await self._run(request, prepared, lease=None)
        state = self.state(tenant, session)
        await self._locked(state)
        handed_off = False
        try:
            divergence = on_divergence or self.on_divergence
            # prepared before the native session exists, so a refused request never creates one
            prepared = await self._prepare_session(request, state, policy, divergence)
            if not state.exists:
                known = state.history_known
                await self._ensure(state)
                if state.history_known != known:  # the session already held memory we never saw
                    prepared = await self._prepare_session(request, state, policy, divergence)
            lease = await self._acquire(state)
            if request.stream:
                handed_off = True  # the stream releases the lease and the lock when it ends
                stream = self._stream(request, prepared, lease=lease)
                asyncio.get_running_loop().call_later(STREAM_START_TIMEOUT, self._unstarted, prepared, state, lease)
                return stream
            try:
                return await self._run(request, prepared, lease=lease)
            finally:
                await self._release(state, lease)
        finally:
            if not handed_off:
                state.lock.release()

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
        elif tools and isinstance(request.tool_choice, dict):
            prefix = self.chat_format.tool_call_prefix(request.tool_choice["function"]["name"])
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
        thinking, tools, prefix, parallel = self._options(request)
        try:
            split = split_transcript(request.messages, state.committed, history_known=state.history_known)
        except ProxyError as exc:
            if exc.code != "transcript_diverged" or on_divergence != "reset":
                raise
            await self._reset_native(state)
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
            self._set_pending(state, None)
        sampling = self._sampling(request)
        return Prepared(state, policy, prompt, turn_ids + self._encode(prefix), context_ids, split, thinking, sampling, prefix, sampling.get("stop", []), parallel)

    def _encode(self, text: str) -> list[int]:
        return self.chat_format.tokenizer.encode(text, add_special_tokens=False) if text else []

    def _check_length(self, prompt: list[int]) -> None:
        if self.max_prefill_tokens and len(prompt) > self.max_prefill_tokens:
            raise ProxyError(
                400, f"the prompt has {len(prompt)} tokens; the upstream accepts at most {self.max_prefill_tokens}",
                param="messages", code="context_length_exceeded",
            )

    # ---- generation

    def _text(self, prepared: Prepared, output_ids: list[int], *, final: bool) -> tuple[str, bool]:
        """Decoded output with the forced prefix and stop strings applied; True if a stop string ended it."""
        text = prepared.prefix + self.chat_format.decode(output_ids)
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

    async def _generate(self, prepared: Prepared, lease: str | None) -> dict:
        if lease is None:
            return await self._native(self.client.generate, prepared.prompt, sampling_params=prepared.sampling)
        return await self._native(self.client.query, prepared.state.native, lease, prepared.prompt, sampling_params=prepared.sampling)

    async def _run(self, request: ChatCompletionRequest, prepared: Prepared, lease: str | None) -> dict:
        body = await self._generate(prepared, lease)
        output_ids = body["output_ids"]
        text, stopped = self._text(prepared, output_ids, final=True)
        finish = "stop" if stopped or (body["meta_info"].get("finish_reason") or {}).get("type") == "stop" else "length"
        message, finish = self._message(prepared, text, finish)
        await self._after(prepared, lease, output_ids, message, finish)
        usage = Usage(prompt_tokens=len(prepared.prompt), completion_tokens=len(output_ids), total_tokens=len(prepared.prompt) + len(output_ids))
        return response_body(id=completion_id(), model=request.model, message=message, finish_reason=finish, usage=usage)

    async def _after(self, prepared: Prepared, lease: str | None, output_ids: list[int], message: dict, finish: str) -> None:
        """Record a pending tool round, or commit the completed turn (policy auto)."""
        state = prepared.state
        if state is None:
            return
        turn = [as_dict(m) for m in prepared.split.turn]
        if finish == "tool_calls":
            self._set_pending(state, PendingTurn([message_hash(m) for m in turn] + [message_hash(message)], prepared.turn_ids + output_ids, prepared.thinking))
            return
        if prepared.policy != "auto" or finish != "stop":
            self._set_pending(state, None)  # the turn ended without a commit (read-only, or a truncated reply)
            return  # it stays in the app's transcript as context
        transaction = f"t-{uuid.uuid4().hex[:16]}"
        await self._native(self.client.control, "begin", state.native, lease=lease, transaction=transaction)
        if prepared.context_ids:
            await self._commit(state, lease, transaction, prepared.context_ids)
        for piece in self._pieces(prepared.turn_ids + self._reply_ids(prepared, output_ids)):
            await self._commit(state, lease, transaction, piece)
        committed = (
            state.committed
            + [message_hash(as_dict(m)) for m in prepared.split.context]
            + [message_hash(m) for m in turn]
            + [message_hash(message)]
        )
        self._changing(state, committed)
        await self._native(self.client.control, "publish", state.native, lease=lease, transaction=transaction)
        self._changed(state, committed)

    def _pieces(self, ids: list[int]) -> list[list[int]]:
        """The turn as commits of at most the upstream's max_prefill_tokens (usually one).

        A prompt that fits can make, with its answer, a turn that does not: rather than lose the answer,
        it goes in several commits of the same transaction, cut at whole ``chunk_tokens`` so the write
        events fall where one commit would put them (each later piece reads the memory as written so far).
        """
        limit = self.max_prefill_tokens
        if not limit or len(ids) <= limit:
            return [ids]
        chunk = self.chunk_tokens or 1
        step = max(chunk, limit - limit % chunk)
        return [ids[i: i + step] for i in range(0, len(ids), step)]

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

    async def _stream(self, request: ChatCompletionRequest, prepared: Prepared, lease: str | None) -> AsyncIterator[dict]:
        cid, created = completion_id(), int(time.time())
        state = prepared.state
        if prepared.started:  # too late: the session was already freed for others
            raise ProxyError(503, "the stream was not consumed in time", code="stream_expired")
        prepared.started = True
        try:
            yield chunk_body(id=cid, model=request.model, created=created, delta={"role": "assistant", "content": ""})
            stream = self.parser.stream(thinking=prepared.thinking)
            output_ids: list[int] = []
            finish = "length"
            upstream = (
                self.client.generate_stream(prepared.prompt, sampling_params=prepared.sampling)
                if lease is None
                else self.client.query_stream(state.native, lease, prepared.prompt, sampling_params=prepared.sampling)
            )
            try:
                async for body in upstream:
                    output_ids = body["output_ids"]
                    text, stopped = self._text(prepared, output_ids, final=False)
                    reason = (body["meta_info"].get("finish_reason") or {}).get("type")
                    for delta in _deltas(stream.feed(text), prepared.parallel_tools):
                        yield chunk_body(id=cid, model=request.model, created=created, delta=delta)
                    if stopped or reason is not None:
                        finish = "stop" if stopped or reason == "stop" else "length"
                        break
            except MemTClientError as exc:
                raise self._upstream_error(exc) from None
            finally:
                await upstream.aclose()
            text, stopped = self._text(prepared, output_ids, final=True)
            finish = "stop" if stopped else finish
            for delta in _deltas(stream.finish(text), prepared.parallel_tools):
                yield chunk_body(id=cid, model=request.model, created=created, delta=delta)
            message, finish = self._message(prepared, text, finish)
            await self._after(prepared, lease, output_ids, message, finish)
            yield chunk_body(id=cid, model=request.model, created=created, delta={}, finish_reason=finish)
            if request.stream_options and request.stream_options.include_usage:
                usage = Usage(prompt_tokens=len(prepared.prompt), completion_tokens=len(output_ids), total_tokens=len(prepared.prompt) + len(output_ids))
                yield chunk_body(id=cid, model=request.model, created=created, delta=None, usage=usage)
        finally:
            if state is not None:
                # the client may have gone away: finish the bookkeeping in its own task
                asyncio.get_running_loop().create_task(self._close_stream(state, lease))

    def _unstarted(self, prepared: Prepared, state: SessionState, lease: str) -> None:
        """A stream the server never started (client gone before the response): free its session."""
        if not prepared.started:
            prepared.started = True
            asyncio.get_running_loop().create_task(self._close_stream(state, lease))

    async def _close_stream(self, state: SessionState, lease: str | None) -> None:
        try:
            if lease is not None:
                await self._release(state, lease)
        finally:
            state.lock.release()

    # ------------------------------------------------------------------ session admin

    async def admin(self, tenant: str, session: str, action: str, **fields) -> dict:
        """inspect | save | restore | reset | close, under the session's lock and lease."""
        await self.check_upstream()
        state = self.state(tenant, session)
        await self._locked(state)
        try:
            if action == "inspect":
                if not state.exists:
                    try:
                        native = await self.client.control("inspect", state.native)
                    except MemTClientError as exc:
                        if not isinstance(exc.cause, UnknownSession):
                            raise self._upstream_error(exc) from None  # e.g. the upstream is unreachable: not a 404
                        raise ProxyError(404, f"session {session!r} does not exist", code="session_not_found") from None
                    self._adopt(state, native)
                else:
                    native = await self._native(self.client.control, "inspect", state.native)
                return {"session": session, "native": native, "committed_messages": len(state.committed), "history_known": state.history_known, "pending_tool_calls": state.pending is not None}
            await self._ensure(state)
            lease = await self._acquire(state)
            try:
                return await self._admin_leased(state, lease, action, **fields)
            finally:
                if action != "close":
                    await self._release(state, lease)
        finally:
            state.lock.release()

    async def _admin_leased(self, state: SessionState, lease: str, action: str, name: str | None = None, overwrite: bool = False) -> dict:
        encoding = self.chat_format.native_encoding
        if action == "save":
            result = await self._native(self.client.control, "export", state.native, lease=lease, encoding=encoding, file=name, overwrite=overwrite)
            return {"snapshot": result["file"]}
        if action == "restore":
            transaction = f"t-{uuid.uuid4().hex[:16]}"
            await self._native(self.client.control, "begin", state.native, lease=lease, transaction=transaction)
            try:
                await self._native(self.client.control, "import", state.native, lease=lease, transaction=transaction, file=name, encoding=encoding)
            except ProxyError:
                await self._native(self.client.control, "abort", state.native, lease=lease, transaction=transaction)
                raise
            self._changing(state, [])
            await self._native(self.client.control, "publish", state.native, lease=lease, transaction=transaction, memory_read=True)
            self._changed(state, [])
            return {"restored": name}
        if action == "reset":
            await self._reset_leased(state, lease)
            return {"reset": True}
        if action == "close":
            await self._native(self.client.control, "close", state.native, lease=lease)
            self.store.delete(state.native)
            state.exists, state.committed, state.pending, state.history_known = False, [], None, True
            return {"closed": True}
        raise ValueError(action)

    async def _reset_native(self, state: SessionState) -> None:
        lease = await self._acquire(state)
        try:
            await self._reset_leased(state, lease)
        finally:
            await self._release(state, lease)

    async def _reset_leased(self, state: SessionState, lease: str) -> None:
        self._changing(state, [])
        await self._native(self.client.control, "reset", state.native, lease=lease)
        self._changed(state, [])


def _deltas(deltas, parallel_tools: bool):
    """Parser deltas as OpenAI ``delta`` objects (tool calls carry their ``index``)."""
    for delta in deltas:
        if delta.kind == "content":
            yield {"content": delta.text}
        elif delta.kind == "reasoning":
            yield {"reasoning_content": delta.text}
        elif parallel_tools or delta.index == 0:
            yield {"tool_calls": [{"index": delta.index, **delta.call.to_openai()}]}

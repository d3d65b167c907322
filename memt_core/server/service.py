"""The serving logic between HTTP and the engine: protocol decisions carried out on the engine.

Nothing here knows about HTTP. ``control`` runs a control action (plan → engine effects → complete);
``generate`` admits a query, commit or plain generation and returns either a finished response body
or an async iterator of cumulative stream bodies. Errors are typed ``MemTError``s.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator

from memt_core.detokenize import IncrementalDecoder
from memt_core.engine.base import Engine, TokenEvent
from memt_core.errors import CapacityExceeded, InvalidRequest, MemTError, WorkerUnavailable
from memt_core.grammar import GrammarCompiler
from memt_core.protocol import APPLIED, FAILED, Commit, Create, MemTProtocol, PlainGeneration, Query, Ticket, action_name, parse_control, parse_generate
from memt_core.sampling_params import SamplingParams

log = logging.getLogger("memt.server")


@dataclass
class Counters:
    """What the service counts for /metrics (the engine counts tokens; latencies go to observers)."""

    control: dict[tuple[str, int], int] = field(default_factory=dict)  # (action, status) → count
    requests: dict[tuple[str, int], int] = field(default_factory=dict)  # (kind, status) → count

    def count(self, table: dict, key: tuple[str, int]) -> None:
        table[key] = table.get(key, 0) + 1


class MemTService:
    """One model served over memt-http-v1."""

    def __init__(
        self,
        engine: Engine,
        protocol: MemTProtocol,
        *,
        tokenizer=None,
        max_prefill_tokens: int,
        context_length: int,
        ack_timeout: float | None = None,
        clock=time.monotonic,
        extensions: bool = True,
    ):
        self.engine = engine
        self.extensions = extensions  # this server's control actions beside the spec's (off under --spec-strict)
        self.protocol = protocol
        self.tokenizer = tokenizer
        self.grammars = GrammarCompiler(tokenizer) if tokenizer is not None else None
        # no token covers more characters than its vocabulary entry has (byte-level or ▁ forms): a cheap bound on long texts
        self.max_token_chars = max(map(len, tokenizer.get_vocab()), default=1) if tokenizer is not None else 1
        self.max_prefill_tokens = max_prefill_tokens
        self.context_length = context_length
        self.ack_timeout = ack_timeout  # seconds the engine has to acknowledge a commit or a query's first token
        self.vocab_size = engine.vocab_size
        self.clock = clock
        self.counters = Counters()
        self.observers: list = []  # callables (kind, seconds) → None, e.g. Prometheus histograms

    # ------------------------------------------------------------------ control

    async def control(self, body: Any) -> dict:
        action = parse_control(body, extensions=self.extensions)
        name = action_name(action)
        started = self.clock()
        try:
            plan = await self._plan_control(action, started)
            try:
                results = [await self.engine.apply(effect) for effect in plan.effects]
            except BaseException as exc:
                self.protocol.abandon(plan)
                if isinstance(exc, MemTError) or not isinstance(exc, Exception):
                    raise
                log.exception("engine effect failed for %s", name)
                raise WorkerUnavailable(f"the engine failed to carry out {name!r}: {exc}") from exc
            response = self.protocol.complete(plan, results, self.clock())
        except MemTError as exc:
            self.counters.count(self.counters.control, (name, exc.status))
            raise
        self.counters.count(self.counters.control, (name, 200))
        self._observe("control", self.clock() - started)
        if name == "create":
            response["epoch"] = self.protocol.epoch
        return response

    async def _plan_control(self, action, now: float):
        """The protocol's plan for ``action``; a create that finds every slot taken first unloads the longest idle
        session that can go without loss (``room_unload``: any, where memory is durable; else an empty one), instead
        of answering 429."""
        try:
            return self.protocol.control(action, now)
        except CapacityExceeded:
            room = self.protocol.room_unload(now) if isinstance(action, Create) else None
            if room is None or not await self._run_unload(room, "to make room"):
                raise
            return self.protocol.control(action, self.clock())

    async def _run_unload(self, plan, why: str) -> bool:
        try:
            results = [await self.engine.apply(effect) for effect in plan.effects]
        except Exception:
            self.protocol.abandon(plan)
            log.exception("unloading session %r %s failed; it stays here", plan.session, why)
            return False
        self.protocol.complete(plan, results, self.clock())
        log.info("unloaded session %r %s (its memory stays in the snapshot store, or it held none)", plan.session, why)
        return True

    async def reap(self) -> None:
        """Free candidates of transactions whose lease expired, and unload sessions idle past ``--unload-idle``
        (run periodically)."""
        for effect in self.protocol.reap(self.clock()):
            await self.engine.apply(effect)
        for plan in self.protocol.idle_unloads(self.clock()):
            await self._run_unload(plan, "left idle")

    # ------------------------------------------------------------------ generation

    async def generate(self, body: Any) -> dict | AsyncIterator[dict]:
        request = parse_generate(body, vocab_size=self.vocab_size, max_prefill_tokens=self.max_prefill_tokens)
        if isinstance(request, Commit):
            return await self._commit(request)
        if isinstance(request, Query):
            # checked before admission, so a refusal consumes nothing (not even the nonce)
            self._check_context(len(request.input_ids), request.sampling)
            self.engine.check_prompt(request.rid.session, list(request.input_ids))
            params = await self._params(request.sampling)
            ticket = self.protocol.start_query(request, self.clock())
            try:
                events = self.engine.query(
                    request.rid.text, list(request.input_ids), params,
                    session=ticket.session, memory_read=ticket.memory_read, retain=ticket.retain_kv,
                    incremental=_incremental(request),
                )
            except BaseException:
                self.protocol.finish_query(ticket, self.clock())
                raise
            return await self._respond(request.rid.text, list(request.input_ids), request.sampling, events, request.stream, ticket)
        return await self._plain(request)

    async def _plain(self, request: PlainGeneration) -> dict | AsyncIterator[dict]:
        if request.input_ids is not None:
            ids = list(request.input_ids)
        else:
            if self.tokenizer is None:
                raise InvalidRequest("this server has no tokenizer; send input_ids")
            if len(request.text) > self.max_prefill_tokens * self.max_token_chars:  # over the limit whatever its tokens
                raise InvalidRequest(
                    f"'text' has {len(request.text)} characters, more than max_prefill_tokens ({self.max_prefill_tokens}) tokens can hold"
                )
            # a long text is tokenised off the event loop, so it slows only itself
            ids = await asyncio.to_thread(self.tokenizer.encode, request.text, add_special_tokens=False)
            if not ids:
                raise InvalidRequest("'text' encodes to no tokens")
            if len(ids) > self.max_prefill_tokens:
                raise InvalidRequest(f"{len(ids)} input tokens exceed max_prefill_tokens ({self.max_prefill_tokens})")
        self._check_context(len(ids), request.sampling)
        rid = request.rid or uuid.uuid4().hex
        events = self.engine.query(rid, ids, await self._params(request.sampling), incremental=_incremental(request))
        return await self._respond(rid, ids, request.sampling, events, request.stream, None)

    async def _params(self, sampling: SamplingParams) -> SamplingParams:
        """The request's sampling with its grammar compiled (a constraint of its own): a bad grammar is refused
        before admission."""
        if sampling.grammar is None:
            return sampling
        if self.grammars is None:
            raise InvalidRequest("this server has no tokenizer; grammar-constrained decoding needs one")
        return replace(sampling, constraint=await asyncio.to_thread(self.grammars.compile, *sampling.grammar))

    def _check_context(self, prompt: int, sampling: SamplingParams) -> None:
        if prompt + sampling.max_new_tokens > self.context_length:
            raise InvalidRequest(
                f"{prompt} prompt tokens + max_new_tokens {sampling.max_new_tokens} exceed the context length {self.context_length}"
            )

    async def _respond(self, rid, prompt, sampling, events, stream: bool, ticket: Ticket | None):
        run = _Generation(self, rid, prompt, sampling, events, ticket)
        await run.acknowledged(self.ack_timeout)
        if stream:
            return run.stream()
        return await run.collect()

    async def _commit(self, request: Commit) -> dict:
        ticket = self.protocol.start_commit(request, self.clock())
        # The commit runs to its end even if the client goes away, so its receipt is always exact.
        task = asyncio.ensure_future(self._run_commit(ticket, request))
        task.add_done_callback(_retrieved)
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.ack_timeout)
        except asyncio.TimeoutError:
            # the commit goes on and its receipt records the real outcome; until then the session is busy
            self.counters.count(self.counters.requests, ("commit", 503))
            raise WorkerUnavailable(
                f"the engine did not acknowledge commit {request.rid.text!r} within {self.ack_timeout:g} s; its outcome is "
                "unknown until it finishes: check the transaction's receipts with status, then recover"
            ) from None

    async def _run_commit(self, ticket: Ticket, request: Commit) -> dict:
        started = self.clock()
        outcome = FAILED
        try:
            info = await self.engine.commit(ticket.session, ticket.transaction, ticket.nonce, list(request.input_ids))
            outcome = APPLIED
        except MemTError as exc:
            self.counters.count(self.counters.requests, ("commit", exc.status))
            raise
        except Exception as exc:
            log.exception("commit failed")
            self.counters.count(self.counters.requests, ("commit", 503))
            raise WorkerUnavailable(f"commit failed in the engine: {exc}") from exc
        finally:
            # a commit that raised may still have reached the candidate: ask the engine
            if outcome != APPLIED and self.engine.committed(ticket.session, ticket.transaction, ticket.nonce):
                outcome = APPLIED
            self.protocol.finish_commit(ticket, outcome, self.clock())
        self.counters.count(self.counters.requests, ("commit", 200))
        self._observe("commit", self.clock() - started)
        return {
            "text": "",
            "output_ids": [],
            "meta_info": {
                "id": request.rid.text,
                "finish_reason": {"type": "length", "length": 0},
                "prompt_tokens": info.tokens,
                "completion_tokens": 0,
                "memt": {
                    "session": ticket.session,
                    "transaction": ticket.transaction,
                    "nonce": ticket.nonce,
                    "committed_tokens": info.tokens,
                    "write_events": info.write_events,
                    "status": APPLIED,
                },
            },
        }

    def _observe(self, kind: str, seconds: float) -> None:
        for observer in self.observers:
            observer(kind, seconds)


def _incremental(request: Query | PlainGeneration) -> bool:
    """Whether the response needs each token as it comes: a stream, or stop strings to watch for in the text."""
    return request.stream or bool(request.sampling.stop)


def _retrieved(task: asyncio.Task) -> None:
    """Consume a background commit's exception (its caller may have stopped waiting for it)."""
    if not task.cancelled():
        task.exception()


class _Generation:
    """Turns engine token events into response bodies, applying stop strings."""

    def __init__(self, service: MemTService, rid, prompt, sampling: SamplingParams, events, ticket: Ticket | None):
        self.service, self.rid, self.prompt, self.sampling = service, rid, prompt, sampling
        self.events, self.ticket = events, ticket
        self.memt = {"session": ticket.session, "memory_read": ticket.memory_read} if ticket else None
        self.output: list[int] = []
        self.text = ""
        self.finish: dict | None = None
        self.started = service.clock()
        tokenizer = service.tokenizer
        self.decoder = IncrementalDecoder(tokenizer, skip_special_tokens=sampling.skip_special_tokens) if tokenizer else None
        self.longest_stop = max((len(stop) for stop in sampling.stop), default=0)
        self.first: TokenEvent | None = None
        self.token_logprobs: list[list] = []  # [logprob, token id, text or None] per output token
        self.top_logprobs: list[list[list]] = []

    async def acknowledged(self, timeout: float | None) -> None:
        """Wait for the engine's first event; a 503 when it does not come in time (the work is then cancelled)."""
        try:
            self.first = await asyncio.wait_for(anext(self.events), timeout)
        except StopAsyncIteration:
            self.first = None
        except asyncio.TimeoutError:
            self.service.engine.cancel(self.rid)
            await self.events.aclose()
            self._close(503)
            raise WorkerUnavailable(
                f"the engine did not start request {self.rid!r} within {timeout:g} s; it was cancelled"
            ) from None
        except BaseException:
            await self.events.aclose()
            self._close(503)
            raise

    async def _events(self) -> AsyncIterator[TokenEvent]:
        if self.first is not None:
            yield self.first
        async for event in self.events:
            yield event

    def _append(self, delta: str) -> bool:
        """Add decoded text; True when a stop string now occurs (the text is then cut before it)."""
        if not delta:
            return False
        searched = max(0, len(self.text) - self.longest_stop + 1)  # a stop can only end in the new text
        self.text += delta
        if not self.longest_stop:
            return False
        hits = [(at, stop) for stop in self.sampling.stop if (at := self.text.find(stop, searched)) >= 0]
        if not hits:
            return False
        at, stop = min(hits)  # the stop string that occurs first in the text
        self.text = self.text[:at]
        self.finish = {"type": "stop", "matched": stop}
        self.service.engine.cancel(self.rid)
        return True

    def _logprobs(self, event: TokenEvent) -> None:
        def entry(token: int, logprob: float | None) -> list:
            text = None
            if self.sampling.logprob_text and self.service.tokenizer is not None:
                text = self.service.tokenizer.decode([token], skip_special_tokens=False)
            return [logprob, token, text]

        self.token_logprobs.append(entry(event.token, event.logprob))
        if self.sampling.top_logprobs:
            self.top_logprobs.append([entry(token, logprob) for token, logprob in event.top_logprobs or ()])

    def _absorb(self, event: TokenEvent) -> bool:
        """Take one engine event; returns True when the generation is over."""
        if event.error is not None:
            raise event.error
        if event.token is not None:
            self.output.append(event.token)
            if self.sampling.logprobs:
                self._logprobs(event)
            if self.decoder is not None and self._append(self.decoder.push(event.token)):
                return True
        if event.finish_reason is not None:
            if self.decoder is not None and self._append(self.decoder.flush()):
                return True
            if event.finish_reason == "stop":
                self.finish = {"type": "stop", "matched": event.matched_stop}
            elif event.finish_reason == "length":
                self.finish = {"type": "length", "length": len(self.output)}
            else:
                self.finish = {"type": "abort", "message": "cancelled"}
            return True
        return False

    def body(self) -> dict:
        meta = {
            "id": self.rid,
            "finish_reason": self.finish,
            "prompt_tokens": len(self.prompt),
            "completion_tokens": len(self.output),
            "e2e_latency": round(self.service.clock() - self.started, 6),
        }
        if self.sampling.logprobs:
            meta["output_token_logprobs"] = self.token_logprobs
            if self.sampling.top_logprobs:
                meta["output_top_logprobs"] = self.top_logprobs
        if self.memt is not None:
            meta["memt"] = self.memt
        return {"text": self.text, "output_ids": list(self.output), "meta_info": meta}

    def _close(self, status: int = 200) -> None:
        if self.ticket is not None:
            read = {
                "prompt_tokens": len(self.prompt), "completion_tokens": len(self.output),
                "finish_reason": self.finish["type"] if self.finish else ("error" if status != 200 else "disconnected"),
                "at": round(time.time(), 3),
            }
            self.service.protocol.finish_query(self.ticket, self.service.clock(), read=read)
            self.ticket = None
        kind = "query" if self.rid.startswith("memt|") else "generate"
        self.service.counters.count(self.service.counters.requests, (kind, status))
        if status != 200:
            return
        self.service._observe(kind, self.service.clock() - self.started)

    async def collect(self) -> dict:
        try:
            async for event in self._events():
                if self._absorb(event):
                    break
        finally:
            await self.events.aclose()
            self._close()
        return self.body()

    async def stream(self) -> AsyncIterator[dict]:
        try:
            async for event in self._events():
                done = self._absorb(event)
                if event.token is not None or done:
                    yield self.body()
                if done:
                    break
        finally:
            await self.events.aclose()
            self._close()

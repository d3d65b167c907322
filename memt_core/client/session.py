"""``MemTSession``: a conversation with latent memory over a memt_core server.

Each public call issues a fixed sequence of native requests (each control action is a
``POST /memt/control``, queries and commits are ``POST /generate``):

=============================  ==============================================================
``MemTSession(...)``           capabilities → create (memory_read: true) [→ load_state]
``set_memory_read(enabled)``   acquire → memory_read → release
``chat(question)``             acquire → query → release
``chat(..., enable_memory)``   acquire → query → begin → commit per unsaved turn → publish → release
``commit_history()``           acquire → begin → commit per unsaved turn → publish → release
``ingest(document)``           acquire → begin → commit per unsaved turn → commit per chunk → publish → release
``save_state(path)``           acquire → begin → commit per unsaved turn → export candidate → publish → release
``load_state(path)``           acquire → begin → import → publish (memory_read: true) → release
``reset()``                    acquire → reset → release
``close()``                    acquire → close
=============================  ==============================================================

A *turn* is one user message and everything until its final answer, tool rounds included, kept as
the exact token ids the model saw and produced. Unsaved turns are replayed in later prompts; once
committed they leave the prompt, since memory now holds them. Truncated answers are never committed
automatically, and nothing is written while tool results are pending. When a write's outcome is
uncertain the lease is kept so ``status()`` and ``recover()`` can reconcile from the server's
receipts; a write is never replayed blindly. The steps of each write, and what a failure of each
leads to, are planned by ``memt_core.client.turns.MemoryWrite``, which the proxy drives too.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from memt_core.client.chat_format import ChatFormat
from memt_core.client.errors import MemTClientError
from memt_core.client.native import NativeClient, new_nonce, new_transaction
from memt_core.client.parsers import OutputParser
from memt_core.client.turns import (
    AbortStep, BeginStep, CommitStep, ExportStep, ImportStep, MemoryWrite, PublishStep, Step, WaitStep,
)
from memt_core.sampling_params import DEFAULT_MAX_NEW_TOKENS

LEASE_TTL = 3600


@dataclass
class TurnRecord:
    number: int
    messages: list[dict]
    ids: list[int]
    thinking: bool
    completed: bool = False
    enable_memory: bool = False
    sampling: dict = field(default_factory=dict)


@dataclass
class _Uncertain:
    """A write whose outcome is unknown, kept with its lease until ``recover()``."""

    stage: str
    transaction: str | None
    lease: str
    write: MemoryWrite | None = None  # the memory write it interrupted (None: another control action)
    turns: list[TurnRecord] = field(default_factory=list)  # turns the write was meant to hold


class MemTSession:
    """One server session: chat, memory writes, snapshots. Use as a context manager to close it."""

    def __init__(
        self,
        client: NativeClient,
        chat_format: ChatFormat,
        parser: OutputParser,
        *,
        session: str | None = None,
        system_prompt: str | None = None,
        tools: list[dict] | None = None,
        state: str | None = None,
    ):
        self.client = client
        self.chat_format = chat_format
        self.parser = parser
        self.system_prompt = system_prompt
        self.tools = tools
        self.memory_read = True
        self._turns: list[TurnRecord] = []  # unsaved turns, replayed in prompts
        self._open: TurnRecord | None = None  # a turn waiting for tool results
        self._count = 0
        self._uncertain: _Uncertain | None = None
        self._closed = False
        capabilities = client.capabilities(refresh=True)
        described = None if "identity" in capabilities else client.identity()  # a server that reports only the spec's fields
        if not chat_format.matches(capabilities, described):
            server_identity = capabilities.get("identity") or {key: (described or {}).get(key) for key in chat_format.served}
            raise MemTClientError(
                "the server's model/tokenizer identity does not match this chat format's checkpoint "
                f"(server {server_identity!r}, local {chat_format.identity!r}); use the checkpoint the server serves",
                stage="create",
            )
        self.chunk_tokens = int(capabilities.get("chunk_tokens") or chat_format.chunk_tokens)
        self.max_prefill_tokens = int(capabilities.get("max_prefill_tokens") or 0) or None
        created = client.control("create", session, memory_read=True)
        self.session_id: str = created["session"]
        if state is not None:
            try:
                self.load_state(state)
            except MemTClientError as exc:
                if not exc.uncertain:  # the caller never gets this object: do not leak the server session
                    try:
                        self.close()
                    except MemTClientError:
                        pass
                raise

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> "MemTSession":
        return self

    def __exit__(self, *exc) -> None:
        if not self._closed:
            try:
                self.close()
            except MemTClientError:
                if exc[0] is None:
                    raise

    # ------------------------------------------------------------------ leases

    def _acquire(self) -> str:
        return self.client.control("acquire", self.session_id, ttl=LEASE_TTL)["lease"]

    def _release(self, lease: str) -> None:
        self.client.control("release", self.session_id, lease=lease)

    def _run(self, stage: str, work: Callable[[str], Any], *, answer=None) -> Any:
        """acquire → work(lease) → release. An uncertain failure keeps the lease for recover()."""
        self._check_certain(stage)
        lease = self._acquire()
        try:
            result = work(lease)
        except MemTClientError as exc:
            if not exc.uncertain:
                self._release_quietly(lease)
            elif self._uncertain is None:
                self._uncertain = _Uncertain(stage=exc.stage or stage, transaction=exc.transaction, lease=lease)
            raise
        except BaseException:
            self._release_quietly(lease)
            raise
        self._release(lease)
        return result

    def _release_quietly(self, lease: str) -> None:
        try:
            self._release(lease)
        except MemTClientError:
            pass

    def _check_certain(self, stage: str) -> None:
        if self._uncertain is not None:
            raise MemTClientError(
                f"{stage} refused: an earlier {self._uncertain.stage} has an uncertain outcome; call status() and recover() first",
                stage=stage, uncertain=True, transaction=self._uncertain.transaction,
            )

    def _refuse_pending(self, what: str) -> None:
        if self._open is not None:
            raise MemTClientError(f"{what} refused: tool results are pending; call submit_tool_results() first", stage=what)

    # ------------------------------------------------------------------ chat

    def chat(
        self,
        message: str,
        *,
        enable_memory: bool = False,
        enable_thinking: bool | None = None,
        return_dict: bool = False,
        **sampling: Any,
    ):
        """Ask ``message``. Returns the answer text, or a result dict with ``return_dict`` or tools.

        With ``enable_memory`` every unsaved turn, this one included, is committed once the answer
        completes (and the turns leave the prompt). Sampling options: max_new_tokens, temperature,
        top_p, top_k, seed, stop.
        """
        self._refuse_pending("chat")
        thinking = self.chat_format.thinking(enable_thinking)
        self._count += 1
        turn = TurnRecord(
            number=self._count,
            messages=[{"role": "user", "content": message}],
            ids=self.chat_format.user_ids(message, enable_thinking=thinking),
            thinking=thinking,
            enable_memory=enable_memory,
            sampling=sampling,
        )
        result = self._answer(turn)
        return result if (return_dict or self.tools) else result["answer"]

    def submit_tool_results(self, results: list[dict]) -> dict:
        """Continue the pending turn with exactly one ``{"tool_call_id", "content"}`` per tool call."""
        turn = self._open
        if turn is None:
            raise MemTClientError("no tool calls are pending", stage="submit_tool_results")
        expected = [call["id"] for call in turn.messages[-1].get("tool_calls", [])]
        given = [r.get("tool_call_id") for r in results]
        if sorted(given) != sorted(expected) or any(not isinstance(r.get("content"), str) for r in results):
            raise MemTClientError(
                f"submit exactly one text result per tool call; expected ids {expected}, got {given}",
                stage="submit_tool_results",
            )
        by_id = {r["tool_call_id"]: r for r in results}
        ordered = [by_id[i] for i in expected]
        names = {call["id"]: call["function"]["name"] for call in turn.messages[-1]["tool_calls"]}
        for r in ordered:
            turn.messages.append({"role": "tool", "tool_call_id": r["tool_call_id"], "name": names[r["tool_call_id"]], "content": r["content"]})
        self._open = None
        turn.ids = turn.ids + self.chat_format.tool_results_ids(ordered, enable_thinking=turn.thinking)
        try:
            return self._answer(turn)
        except MemTClientError as exc:
            if self._open is None and turn not in self._turns and not exc.uncertain:
                self._open = turn  # the round did not happen: results stay submittable
                del turn.messages[-len(ordered):]
                turn.ids = turn.ids[: -len(self.chat_format.tool_results_ids(ordered, enable_thinking=turn.thinking))]
            raise

    def _answer(self, turn: TurnRecord) -> dict:
        prompt = self.chat_format.prompt_ids(
            system_prompt=self.system_prompt, tools=self.tools, turns=[t.ids for t in self._turns], tail=turn.ids
        )
        params = self._sampling(turn.sampling)
        state: dict[str, Any] = {}

        def work(lease: str) -> dict:
            body = self.client.query(self.session_id, lease, prompt, sampling_params=params)
            result = self._absorb(turn, body)
            state["result"] = result
            if result["turn_completed"] and turn.enable_memory:
                committed = self._commit_in(lease, list(self._turns), answer=result)
                result["memory_updated"] = True
                result["committed_turns"] = [t.number for t in committed]
            return result

        try:
            return self._run("chat", work)
        except MemTClientError as exc:
            raise exc.with_context(answer=state.get("result"))

    def _absorb(self, turn: TurnRecord, body: dict) -> dict:
        """Record the generated ids in the turn and build the result dict."""
        output_ids = list(body.get("output_ids", []))
        meta = body.get("meta_info", {})
        finish = (meta.get("finish_reason") or {}).get("type")
        truncated = finish != "stop"
        decoded = self.chat_format.decode(output_ids)
        parsed = self.parser.parse(decoded, thinking=turn.thinking)
        calls = [call.to_openai() for call in parsed.tool_calls]
        # a completed answer is kept (replayed, committed) as the caller received it, without stray or
        # malformed markup; a tool round continues from its exact generated tokens
        cleaned = not truncated and not calls
        turn.ids = turn.ids + (self.chat_format.reply_ids(output_ids, decoded, parsed.text) if cleaned else output_ids)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.reasoning is not None:
            message["reasoning_content"] = parsed.reasoning
        if calls:
            message["tool_calls"] = calls
        turn.messages.append(message)
        requires_action = bool(calls) and not truncated
        if requires_action:
            self._open = turn
        else:
            turn.completed = not truncated
            self._turns.append(turn)
        return {
            "answer": parsed.content,
            "reasoning": parsed.reasoning,
            "tool_calls": calls,
            "requires_action": requires_action,
            "generation_completed": not truncated,
            "turn_completed": turn.completed,
            "memory_updated": False,
            "committed_turns": [],
            "output_ids": output_ids,
            "finish_reason": finish,
            "meta_info": meta,
        }

    def _sampling(self, overrides: dict) -> dict:
        params = {"max_new_tokens": DEFAULT_MAX_NEW_TOKENS, **self.chat_format.default_sampling(), **overrides}
        return {k: v for k, v in params.items() if v is not None}

    # ------------------------------------------------------------------ writes

    def _commit_in(
        self,
        lease: str,
        turns: list[TurnRecord],
        *,
        documents: list[list[int]] = (),
        export: dict | None = None,
        answer=None,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[TurnRecord]:
        """begin → commit each turn (then each document piece) → [export] → publish, in ``lease``."""
        write = MemoryWrite(
            new_transaction(), [t.ids for t in turns] + list(documents), new_nonce=new_nonce,
            export=(export.get("file"), export.get("overwrite", False)) if export is not None else None,
        )

        def committed(index: int) -> None:
            if progress is not None and index >= len(turns):
                progress(index - len(turns) + 1, len(documents))

        self._drive(write, lease, turns, answer=answer, on_commit=committed)
        if export is not None:
            export["result"] = write.results["export"]
        self._forget(turns)
        return turns

    def _drive(self, write: MemoryWrite, lease: str, turns: list[TurnRecord] = (), *, answer=None, on_commit=None) -> None:
        """Carry out ``write``'s steps (``memt_core.client.turns``) in ``lease``. A failure is raised with the
        transaction (and ``answer``) attached; an uncertain one is kept, with the lease, for ``recover()``."""
        error: MemTClientError | None = None
        while (step := write.next_step(time.monotonic())) is not None:
            if isinstance(step, WaitStep):
                time.sleep(step.seconds)
                continue
            try:
                result = self._send(step, lease)
            except MemTClientError as exc:
                error = exc
                write.failed(uncertain=exc.uncertain, capacity=getattr(exc, "status", None) == 429, now=time.monotonic())
                continue
            write.succeeded(result)
            if isinstance(step, CommitStep) and on_commit is not None:
                on_commit(step.index)
        if write.outcome == "uncertain":
            self._uncertain = _Uncertain(write.stage, write.transaction, lease, write, list(turns))
        if error is not None and write.outcome not in ("published", "aborted"):
            raise error.with_context(transaction=write.transaction, answer=answer)

    def _send(self, step: Step, lease: str) -> dict:
        """One step of a memory write as its native request."""
        control, session, transaction = self.client.control, self.session_id, step.transaction
        if isinstance(step, BeginStep):
            return control("begin", session, lease=lease, transaction=transaction)
        if isinstance(step, CommitStep):
            return self.client.commit(session, lease, transaction, step.ids, nonce=step.nonce)
        if isinstance(step, ImportStep):
            return control("import", session, lease=lease, transaction=transaction, file=step.file, encoding=self.chat_format.native_encoding)
        if isinstance(step, ExportStep):
            return control("export", session, lease=lease, transaction=transaction, encoding=self.chat_format.native_encoding, file=step.file, overwrite=step.overwrite)
        if isinstance(step, PublishStep):
            return control("publish", session, lease=lease, transaction=transaction, memory_read=step.memory_read)
        if isinstance(step, AbortStep):
            return control("abort", session, lease=lease, transaction=transaction)
        raise TypeError(step)

    def _forget(self, turns: list[TurnRecord]) -> None:
        """Committed turns leave the prompt: memory holds them now."""
        done = {id(t) for t in turns}
        self._turns = [t for t in self._turns if id(t) not in done]

    def commit_history(self) -> dict:
        """Commit every unsaved turn (no requests when there is none)."""
        self._refuse_pending("commit_history")
        if not self._turns:
            return {"committed_turns": [], "memory_updated": False}
        committed = self._run("commit_history", lambda lease: self._commit_in(lease, list(self._turns)))
        return {"committed_turns": [t.number for t in committed], "memory_updated": True}

    def ingest(self, document: str, *, progress: Callable[[int, int], None] | None = None) -> dict:
        """Commit unsaved turns, then ``document`` in ``chunk_tokens`` pieces, in one transaction."""
        self._refuse_pending("ingest")
        ids = self.chat_format.document_ids(document)
        if not ids:
            raise MemTClientError("the document is empty", stage="ingest")
        pieces = [ids[i: i + self.chunk_tokens] for i in range(0, len(ids), self.chunk_tokens)]
        turns = list(self._turns)
        if progress is not None:
            progress(0, len(pieces))

        self._run("ingest", lambda lease: self._commit_in(lease, turns, documents=pieces, progress=progress))
        return {"chunks": len(pieces), "tokens": len(ids), "committed_turns": [t.number for t in turns], "memory_updated": True}

    def save_state(self, path: str | None = None, overwrite: bool = False) -> dict:
        """Commit unsaved turns and export that memory to the server's state directory, then adopt it."""
        self._refuse_pending("save_state")
        if path is not None and (Path(path).name != path or not path.endswith(".safetensors")):
            raise MemTClientError(f"snapshot name {path!r} must be a simple .safetensors file name", stage="save_state")
        export = {"file": path, "overwrite": overwrite}
        turns = list(self._turns)
        self._run("save_state", lambda lease: self._commit_in(lease, turns, export=export))
        result = export["result"]
        return {"path": result["file"], "transaction": result.get("transaction"), "committed_turns": [t.number for t in turns]}

    def load_state(self, path: str) -> dict:
        """Replace memory with a snapshot from the server's state directory; clears local messages."""
        self._refuse_pending("load_state")

        def work(lease: str) -> dict:
            write = MemoryWrite(new_transaction(), new_nonce=new_nonce, import_file=path, memory_read=True)
            self._drive(write, lease)
            return write.results["publish"]

        result = self._run("load_state", work)
        self._turns, self._open = [], None
        self.memory_read = True
        return result

    def set_memory_read(self, enabled: bool) -> None:
        self._run("set_memory_read", lambda lease: self.client.control("memory_read", self.session_id, lease=lease, enabled=enabled))
        self.memory_read = enabled

    def reset(self) -> None:
        """Clear the session's memory and the local conversation."""
        self._run("reset", lambda lease: self.client.control("reset", self.session_id, lease=lease))
        self._turns, self._open = [], None

    def close(self) -> None:
        """Delete the session on the server (its memory is not saved)."""
        if self._closed:
            return
        self._check_certain("close")
        lease = self._acquire()
        self.client.control("close", self.session_id, lease=lease)
        self._closed = True

    # ------------------------------------------------------------------ inspection and recovery

    @property
    def messages(self) -> list[dict]:
        """A detached copy of the conversation not yet committed to memory."""
        turns = self._turns + ([self._open] if self._open else [])
        return copy.deepcopy([m for t in turns for m in t.messages])

    def status(self) -> dict:
        """Server status (transaction receipts, uncertainty) plus local state."""
        if self._uncertain is not None:
            server = self.client.control("status", self.session_id, lease=self._uncertain.lease)
        else:
            lease = self._acquire()
            try:
                server = self.client.control("status", self.session_id, lease=lease)
            finally:
                self._release_quietly(lease)
        local = self._uncertain
        return {
            **server,
            "uncertain": bool(server.get("uncertain")) or local is not None,
            "uncertain_stage": local.stage if local else None,
            "uncertain_transaction": local.transaction if local else None,
            "uncommitted_turns": len(self._turns),
            "pending_tool_calls": len(self._open.messages[-1].get("tool_calls", [])) if self._open else 0,
        }

    def recover(self) -> dict:
        """Reconcile an uncertain write from the server's receipts, finishing it without duplicates."""
        record = self._uncertain
        if record is None:
            return {"recovered": False, "reason": "nothing uncertain"}
        lease = record.lease
        self.client.control("recover", self.session_id, lease=lease, ttl=LEASE_TTL)
        status = self.client.control("status", self.session_id, lease=lease)
        write = record.write
        receipt = status.get("receipts", {}).get(record.transaction) if record.transaction else None
        if write is None:  # not a memory write: nothing to finish
            state = receipt["state"] if receipt else None
            landed, resent = 0, 0
        else:
            write.resume(receipt)
            self._uncertain = None
            finishing = write.outcome is None  # still open: finish it
            if finishing:
                self._drive(write, lease, record.turns)
            state = None if write.outcome == "unknown" else write.outcome
            landed, resent = len(write.landed), write.resent
            if finishing and write.import_file is not None and state == "published":  # load_state, completed
                self._turns, self._open = [], None
                self.memory_read = True
        self._uncertain = None
        if state == "published":
            self._forget(record.turns)
        self._release_quietly(lease)
        return {
            "recovered": True,
            "transaction": record.transaction,
            "state": state,
            "landed_commits": landed,
            "resent_commits": resent,
            "committed_turns": [t.number for t in record.turns] if state == "published" else [],
        }

"""``NativeClient`` and ``AsyncNativeClient``: memt-http-v1 over HTTP, one method per request kind.

Both carry the server epoch automatically (learned from ``/memt/capabilities``), send a fresh nonce
with every generation request, add ``Authorization: Bearer`` when given an API key, and map every
transport failure to ``MemTClientError`` in one place (``_mapped``). A failure after the request may
have reached the server is *uncertain* for state-changing requests: the caller must reconcile with
``status``/``recover`` rather than retry. Request bodies are built by the same functions for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import Any, AsyncIterator, Iterator

import httpx

from memt_core.client.errors import MemTClientError
from memt_core.errors import Conflict, EpochMismatch, LeaseConflict, SessionExists, UnknownSession, error_from_wire
from memt_core.sampling_params import DEFAULT_MAX_NEW_TOKENS

#: Control actions that change nothing on the server (never uncertain).
READ_ONLY_ACTIONS = {"inspect", "status"}
STREAM_END_WAIT = 1.0  # seconds to read a stream's end after [DONE] before dropping its connection instead


def new_nonce() -> str:
    return uuid.uuid4().hex


def new_transaction() -> str:
    """A fresh transaction name (unique per session, as the protocol requires)."""
    return f"t-{uuid.uuid4().hex[:16]}"


def control_body(epoch: str, action: str, session: str | None, fields: dict) -> dict:
    body = {"action": action, "epoch": epoch}
    if session is not None:
        body["session"] = session
    body.update({k: v for k, v in fields.items() if v is not None})
    return body


#: Log-probability fields a caller may pass along with its sampling params (the proxy's one channel to a
#: generation); the protocol reads them at the body's top level, so the request builders move them there.
LOGPROB_FIELDS = ("return_logprob", "top_logprobs_num", "return_text_in_logprobs")


def _sampling(sampling_params: dict | None) -> tuple[dict, dict]:
    """``(sampling_params with the default max_new_tokens, the log-probability fields for the body)``."""
    params = {"max_new_tokens": DEFAULT_MAX_NEW_TOKENS, **(sampling_params or {})}
    return params, {name: params.pop(name) for name in LOGPROB_FIELDS if name in params}


def query_rid(session: str, nonce: str) -> str:
    """The request id of a query sent with ``nonce`` (what ``cancel`` names and ``inspect`` lists in ``in_flight``)."""
    return f"memt|{session}|query|{nonce}"


def query_body(epoch, session, lease, input_ids, sampling_params, stream, nonce) -> dict:
    params, logprobs = _sampling(sampling_params)
    return {
        "rid": query_rid(session, nonce or new_nonce()),
        "input_ids": list(input_ids),
        "sampling_params": params,
        "memt_lease": lease,
        "memt_epoch": epoch,
        "stream": stream,
        **logprobs,
    }


def commit_body(epoch, session, lease, transaction, input_ids, nonce) -> dict:
    return {
        "rid": f"memt|{session}|commit:{len(input_ids)}|{nonce or new_nonce()}",
        "input_ids": list(input_ids),
        "sampling_params": {"max_new_tokens": 0},
        "memt_lease": lease,
        "memt_transaction": transaction,
        "memt_epoch": epoch,
    }


def generate_body(input_ids, sampling_params, stream) -> dict:
    """An ordinary generation (no MemT RID): never reads or writes session memory."""
    params, logprobs = _sampling(sampling_params)
    return {"input_ids": list(input_ids), "sampling_params": params, "stream": stream, **logprobs}


def check_response(status: int, body: Any, stage: str, *, changes_state: bool = False) -> Any:
    """The body of a success; a typed ``MemTClientError`` otherwise. A 503 to a state-changing request is
    uncertain (the spec: the worker may have applied it before communication failed or timed out)."""
    if status >= 400:
        error = error_from_wire(status, body)
        uncertain = changes_state and status == 503
        message = f"{stage}: {error.message}"
        if uncertain:
            message += " (the outcome is uncertain: call status()/recover() before further writes)"
        raise MemTClientError(message, stage=stage, status=status, cause=error, uncertain=uncertain)
    return body


def stream_chunk(line: str, stage: str) -> dict | None:
    """One SSE line → a body dict, ``None`` for lines to skip; raises at ``[DONE]`` with StopIteration semantics left to the caller."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return {"__done__": True}
    chunk = json.loads(data)
    if "error" in chunk:
        error = error_from_wire(400, chunk)
        raise MemTClientError(f"{stage}: {error.message}", stage=stage, cause=error)
    return chunk


#: Actions whose bare 409 is named by asking whether the session exists (``inspect`` needs no lease).
PROBED_ACTIONS = {"create", "acquire", "inspect", "status"}


def unnamed_conflict(exc: MemTClientError) -> bool:
    """A 409 whose kind the server did not name: the spec promises only the status (``code`` is this
    project's extension), so the client finds the kind out itself where it can."""
    return type(exc.cause) is Conflict


def named_conflict(action: str, *, epoch_changed: bool, exists: bool | None) -> type[Conflict] | None:
    """The kind of a bare 409 to ``action``, from what the spec lets a client see: whether the server's
    epoch changed (it restarted) and, for the probed actions, whether the session exists."""
    if epoch_changed:
        return EpochMismatch
    if exists is None:
        return None
    if action == "create":
        return SessionExists if exists else None
    if not exists:
        return UnknownSession
    return LeaseConflict if action == "acquire" else None


def _renamed(exc: MemTClientError, kind: type[Conflict] | None) -> MemTClientError:
    if kind is not None:
        exc.cause = kind(exc.cause.message)
    return exc


def json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


class _Base:
    def __init__(self, base_url: str, api_key: str | None, timeout: float):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._capabilities: dict | None = None

    @contextlib.contextmanager
    def _mapped(self, stage: str, *, changes_state: bool, failures: tuple | None = None):
        """Map transport failures to MemTClientError, deciding whether the outcome is uncertain.

        ``failures``: the transport's exception classes as (refused, connect timed out, failed after
        sending); httpx's unless given.
        """
        refused, connect_timeout, broken = failures or (httpx.ConnectError, httpx.ConnectTimeout, (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError))
        try:
            yield
        except refused as exc:
            raise self._not_sent(stage, f"cannot connect to {self.base_url}: {exc}") from exc
        except connect_timeout as exc:
            raise self._not_sent(stage, f"timed out connecting to {self.base_url}") from exc
        except broken as exc:
            raise self._broken(stage, exc, changes_state) from exc

    @staticmethod
    def _not_sent(stage: str, why: str) -> MemTClientError:
        return MemTClientError(f"{stage}: {why}", stage=stage, uncertain=False, status=503)

    @staticmethod
    def _broken(stage: str, exc: Exception, changes_state: bool) -> MemTClientError:
        return MemTClientError(
            f"{stage}: the connection failed after the request was sent ({type(exc).__name__}); "
            + ("the outcome is uncertain: call status()/recover() before further writes" if changes_state else "retry"),
            stage=stage,
            uncertain=changes_state,
            status=503,
        )

    @property
    def epoch(self) -> str:
        if self._capabilities is None:
            raise MemTClientError("the server epoch is unknown until capabilities() is called", stage="epoch")
        return self._capabilities["epoch"]


class NativeClient(_Base):
    """Blocking client of one memt_core server. ``timeout`` is in seconds."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 300, transport: httpx.BaseTransport | None = None):
        super().__init__(base_url, api_key, timeout)
        self._http = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "NativeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _send(self, stage: str, method: str, path: str, *, body: dict | None = None, changes_state: bool) -> Any:
        with self._mapped(stage, changes_state=changes_state):
            response = self._http.request(method, path, json=body)
        return check_response(response.status_code, json_or_text(response.text), stage, changes_state=changes_state)

    def capabilities(self, *, refresh: bool = False) -> dict:
        """``GET /memt/capabilities`` (cached); also records the server epoch."""
        if self._capabilities is None or refresh:
            self._capabilities = self._send("capabilities", "GET", "/memt/capabilities", changes_state=False)
        return self._capabilities

    def identity(self) -> dict:
        return self._send("identity", "GET", "/memt/identity", changes_state=False)

    @property
    def epoch(self) -> str:
        return self.capabilities()["epoch"]

    def control(self, action: str, session: str | None = None, **fields: Any) -> dict:
        """``POST /memt/control``; ``None`` fields are left out, the epoch is added."""
        body = control_body(self.epoch, action, session, fields)
        return self._send(action, "POST", "/memt/control", body=body, changes_state=action not in READ_ONLY_ACTIONS)

    def query(self, session: str, lease: str, input_ids: list[int], *, sampling_params: dict | None = None, stream: bool = False, nonce: str | None = None) -> dict | Iterator[dict]:
        """Generate from ``input_ids`` reading the session's memory; ``stream`` yields cumulative bodies."""
        body = query_body(self.epoch, session, lease, input_ids, sampling_params, stream, nonce)
        if stream:
            return self._stream(body, "query")
        return self._send("query", "POST", "/generate", body=body, changes_state=False)

    def generate(self, input_ids: list[int], *, sampling_params: dict | None = None, stream: bool = False) -> dict | Iterator[dict]:
        """Ordinary generation without memory (no session)."""
        body = generate_body(input_ids, sampling_params, stream)
        if stream:
            return self._stream(body, "generate")
        return self._send("generate", "POST", "/generate", body=body, changes_state=False)

    def _stream(self, body: dict, stage: str) -> Iterator[dict]:
        with self._mapped(stage, changes_state=False):
            with self._http.stream("POST", "/generate", json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    check_response(response.status_code, json_or_text(response.text), stage)
                for line in response.iter_lines():
                    chunk = stream_chunk(line, stage)
                    if chunk is None:
                        continue
                    if "__done__" in chunk:
                        return
                    yield chunk

    def commit(self, session: str, lease: str, transaction: str, input_ids: list[int], *, nonce: str | None = None) -> dict:
        """Write ``input_ids`` into the open transaction (one commit request)."""
        body = commit_body(self.epoch, session, lease, transaction, input_ids, nonce)
        return self._send("commit", "POST", "/generate", body=body, changes_state=True)

    def commit_turns(self, session: str, lease: str, transaction: str, turns: list[list[int]]) -> list[dict]:
        """One commit per turn, in order, in one transaction."""
        return [self.commit(session, lease, transaction, ids) for ids in turns]


def _aiohttp_failures() -> tuple:
    """aiohttp's failures in ``_mapped``'s order: refused or never connected is certain, anything later is not."""
    import aiohttp

    return aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError, (aiohttp.ClientError, TimeoutError)


class AsyncNativeClient(_Base):
    """The same client for asyncio programs (the OpenAI-compatible proxy uses it).

    It runs over aiohttp rather than httpx's async client: on this path a request costs about half as
    much client time (``scripts/bench/proxy.py``), and the proxy makes six of them per session turn.
    The aiohttp session is opened on first use, inside the event loop that uses it.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 300):
        super().__init__(base_url, api_key, timeout)
        self._http = None

    def _session(self):
        if self._http is None or self._http.closed:
            import aiohttp

            self._http = aiohttp.ClientSession(
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=None, connect=self.timeout, sock_connect=min(self.timeout, 10.0), sock_read=self.timeout),
                # idle connections are dropped before uvicorn's own 5 s keep-alive limit closes them under us
                connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=4.0),
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _send(self, stage: str, method: str, path: str, *, body: dict | None = None, changes_state: bool) -> Any:
        with self._mapped(stage, changes_state=changes_state, failures=_aiohttp_failures()):
            async with self._session().request(method, self.base_url + path, json=body) as response:
                status, text = response.status, await response.text()
        return check_response(status, json_or_text(text), stage, changes_state=changes_state)

    async def capabilities(self, *, refresh: bool = False) -> dict:
        if self._capabilities is None or refresh:
            self._capabilities = await self._send("capabilities", "GET", "/memt/capabilities", changes_state=False)
        return self._capabilities

    async def identity(self) -> dict:
        return await self._send("identity", "GET", "/memt/identity", changes_state=False)

    async def control(self, action: str, session: str | None = None, **fields: Any) -> dict:
        await self.capabilities()
        body = control_body(self.epoch, action, session, fields)
        try:
            return await self._send(action, "POST", "/memt/control", body=body, changes_state=action not in READ_ONLY_ACTIONS)
        except MemTClientError as exc:
            if session is None or not unnamed_conflict(exc):
                raise
            raise _renamed(exc, await self._name(action, session)) from None

    async def _name(self, action: str, session: str) -> type[Conflict] | None:
        """The kind of a bare 409 (see ``named_conflict``); None when it cannot be found out."""
        epoch = self.epoch
        try:
            if (await self.capabilities(refresh=True))["epoch"] != epoch:
                return named_conflict(action, epoch_changed=True, exists=None)
            if action not in PROBED_ACTIONS:
                return None
            try:
                await self._send("inspect", "POST", "/memt/control", body=control_body(self.epoch, "inspect", session, {}), changes_state=False)
                exists = True
            except MemTClientError as probe:
                if probe.status != 409:
                    return None
                exists = False
        except MemTClientError:
            return None
        return named_conflict(action, epoch_changed=False, exists=exists)

    async def query(self, session: str, lease: str, input_ids: list[int], *, sampling_params: dict | None = None, nonce: str | None = None) -> dict:
        await self.capabilities()
        body = query_body(self.epoch, session, lease, input_ids, sampling_params, False, nonce)
        try:
            return await self._send("query", "POST", "/generate", body=body, changes_state=False)
        except MemTClientError as exc:
            if not unnamed_conflict(exc):
                raise
            raise _renamed(exc, await self._name("query", session)) from None

    async def query_stream(self, session: str, lease: str, input_ids: list[int], *, sampling_params: dict | None = None, nonce: str | None = None) -> AsyncIterator[dict]:
        """Cumulative stream bodies; leaving the iteration early closes the upstream request (which cancels it)."""
        await self.capabilities()
        body = query_body(self.epoch, session, lease, input_ids, sampling_params, True, nonce)
        started = False
        try:
            async for chunk in self._stream(body, "query"):
                started = True
                yield chunk
        except MemTClientError as exc:
            if started or not unnamed_conflict(exc):
                raise
            raise _renamed(exc, await self._name("query", session)) from None

    async def generate(self, input_ids: list[int], *, sampling_params: dict | None = None) -> dict:
        return await self._send("generate", "POST", "/generate", body=generate_body(input_ids, sampling_params, False), changes_state=False)

    async def generate_stream(self, input_ids: list[int], *, sampling_params: dict | None = None) -> AsyncIterator[dict]:
        async for chunk in self._stream(generate_body(input_ids, sampling_params, True), "generate"):
            yield chunk

    async def _stream(self, body: dict, stage: str) -> AsyncIterator[dict]:
        with self._mapped(stage, changes_state=False, failures=_aiohttp_failures()):
            async with self._session().post(self.base_url + "/generate", json=body) as response:
                if response.status >= 400:
                    check_response(response.status, json_or_text(await response.text()), stage)
                finished = False
                try:
                    pending = b""  # SSE lines can outgrow aiohttp's line limit (bodies are cumulative): split here
                    async for data in response.content.iter_any():
                        *lines, pending = (pending + data).split(b"\n")
                        for line in lines:
                            chunk = stream_chunk(line.decode("utf-8").rstrip("\r"), stage)
                            if chunk is None:
                                continue
                            if "__done__" in chunk:
                                finished = True
                                break
                            yield chunk
                        if finished:
                            break
                    if finished:  # read the end of the response, so that its connection can serve the next request
                        try:
                            await asyncio.wait_for(response.content.read(), STREAM_END_WAIT)
                        except _aiohttp_failures()[2]:
                            pass  # the stream is complete; its connection is dropped below
                finally:
                    if not (finished and response.content.at_eof()):
                        response.close()  # a stream left early drops its connection, which cancels the request upstream

    async def commit(self, session: str, lease: str, transaction: str, input_ids: list[int], *, nonce: str | None = None) -> dict:
        await self.capabilities()
        body = commit_body(self.epoch, session, lease, transaction, input_ids, nonce)
        return await self._send("commit", "POST", "/generate", body=body, changes_state=True)

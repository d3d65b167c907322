"""A new session's first turn is answered while its lease is taken (live memt_core server, the real ``openai`` SDK).

In process, the proxy's app runs over ``Recorded``, a native client that sends every request for real and
records when each began and ended. A new session's first turn does not wait for the native session to be
made, nor for its lease: its answer is a plain generation (an empty memory reads as none), sent first, and
the same tokens a query would give; the turn is then committed under that lease, and the next turn queries
memory. Were the lease held by another client, which may write before letting go, or the native session
found to hold memory already (made by someone else), the generation is dropped and the answer is a query
made once the lease is the proxy's, with the prompt prepared for what memory holds.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from e2e.proxies import MODEL, STOPS, unique

from memt_core.client.native import AsyncNativeClient, NativeClient
from memt_proxy.http.app import create_app
from memt_proxy.chat.service import ChatService
from memt_proxy.session.sessions import Sessions, native_session_id
from memt_proxy.session.store import SessionRecordStore

pytestmark = pytest.mark.timeout(600)


class Recorded(AsyncNativeClient):
    """A real native client that records ("start" | "end" | "error", kind, session) for each request."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log: list[tuple[str, str, str | None]] = []
        self.refused = asyncio.Event()  # an acquire was refused (the lease is another client's)

    async def _recorded(self, kind: str, session: str | None, call):
        self.log.append(("start", kind, session))
        try:
            answer = await call
        except BaseException:
            self.log.append(("error", kind, session))
            if kind == "acquire":
                self.refused.set()
            raise
        self.log.append(("end", kind, session))
        return answer

    async def control(self, action, session=None, **fields):
        return await self._recorded(action, session, super().control(action, session, **fields))

    async def query(self, session, lease, input_ids, **kwargs):
        return await self._recorded("query", session, super().query(session, lease, input_ids, **kwargs))

    async def generate(self, input_ids, **kwargs):
        return await self._recorded("generate", None, super().generate(input_ids, **kwargs))

    async def generate_stream(self, input_ids, **kwargs):
        self.log.append(("start", "generate_stream", None))
        async for body in super().generate_stream(input_ids, **kwargs):
            yield body
        self.log.append(("end", "generate_stream", None))

    async def query_stream(self, session, lease, input_ids, **kwargs):
        self.log.append(("start", "query_stream", session))
        async for body in super().query_stream(session, lease, input_ids, **kwargs):
            yield body
        self.log.append(("end", "query_stream", session))

    def kinds(self) -> list[str]:
        """The requests in the order they were sent."""
        return [kind for event, kind, _ in self.log if event == "start"]

    def at(self, event: str, kind: str) -> int:
        return self.log.index(next(entry for entry in self.log if entry[:2] == (event, kind)))


@pytest.fixture(scope="module")
def chat(nano_checkpoint):
    from memt_core.client.chat_format import load_chat_format, load_tokenizer

    return load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))


def in_process(client, chat, records=None):
    """The proxy's app over ``client`` (its session records in ``records``), and an ``openai.AsyncOpenAI`` talking to it in process."""
    from openai import AsyncOpenAI

    chat_format, parser = chat
    sessions = Sessions(client, identity=chat_format.identity, records=SessionRecordStore(records))
    app = create_app(ChatService(sessions, chat_format, parser, model_names=[MODEL], on_divergence="error"))
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=120)
    return sessions, AsyncOpenAI(base_url="http://proxy/v1", api_key="unused", http_client=http, max_retries=0)


async def ask(openai, messages, session: str | None, seed: int, memory: str = "auto"):
    headers = {"X-MemT-Memory": memory} if session is None else {"X-MemT-Session": session, "X-MemT-Memory": memory}
    return await openai.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=1.0, seed=seed, stop=STOPS, extra_headers=headers,
    )


async def ask_streaming(openai, messages, session: str | None, seed: int, memory: str = "auto") -> str:
    """The streamed answer's text."""
    headers = {"X-MemT-Memory": memory} if session is None else {"X-MemT-Session": session, "X-MemT-Memory": memory}
    stream = await openai.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=1.0, seed=seed, stop=STOPS, extra_headers=headers, stream=True,
    )
    return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])


async def inspect(openai, session: str) -> dict:
    response = await openai._client.get(f"http://proxy/v1/memt/sessions/{session}")
    assert response.status_code == 200, response.text
    return response.json()


def test_a_new_sessions_first_turn_is_generated_while_its_lease_is_taken(proxy_upstream, chat):
    session = unique("first")
    messages = [{"role": "user", "content": "The code of locker 37 is K53."}]

    async def scenario():
        client = Recorded(proxy_upstream.url)
        sessions, openai = in_process(client, chat)
        try:
            stateless = {}
            for seed in range(20):  # a seed whose answer ends with a stop string: a completed turn, committed
                stateless[seed] = await ask(openai, messages, None, seed, memory="off")
                if stateless[seed].choices[0].finish_reason == "stop":
                    break
            others = {s: await ask(openai, messages, None, s, memory="off") for s in (seed + 1, seed + 2)}
            client.log.clear()
            first = await ask(openai, messages, session, seed)
            first_turn = list(client.log)
            info = await inspect(openai, session)  # waits for the commit behind the answer
            fresh = {s: await ask(openai, messages, unique("first"), s) for s in others}
            client.log.clear()
            history = messages + [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "What is the code?"}]
            await ask(openai, history, session, seed)
            return stateless[seed], first, first_turn, info, others, fresh, list(client.log)
        finally:
            await sessions.aclose()

    stateless, first, first_turn, info, others, fresh, second_turn = asyncio.run(scenario())
    # the same tokens as a query of the empty memory, which reads as none: as the stateless answers
    assert first.choices[0].finish_reason == "stop"
    assert first.choices[0].message.content == stateless.choices[0].message.content
    assert {s: reply.choices[0].message.content for s, reply in fresh.items()} == {s: reply.choices[0].message.content for s, reply in others.items()}
    kinds = [kind for event, kind, _ in first_turn if event == "start"]
    assert sorted(kinds[:3]) == ["acquire", "create", "generate"] and "query" not in kinds, first_turn
    # sent before the session was made, not after it
    assert first_turn.index(("start", "generate", None)) < first_turn.index(("end", "create", native_session_id("default", session)))
    # the turn was committed under the lease taken meanwhile, and the next turn queries the memory that holds it
    assert info["native"]["published_version"] == 1 and info["committed_messages"] == 2
    assert [kind for event, kind, native in second_turn if event == "start" and native == native_session_id("default", session)][:1] == ["query"], second_turn


def test_a_first_turn_on_a_lease_another_client_holds_waits_and_queries(proxy_upstream, chat):
    session = unique("held")
    native = native_session_id("default", session)

    async def scenario():
        client = Recorded(proxy_upstream.url)
        sessions, openai = in_process(client, chat)
        other = NativeClient(proxy_upstream.url)
        try:
            other.control("create", native, memory_read=True)  # made, and leased, by another client of the upstream
            lease = other.control("acquire", native, ttl=60)["lease"]
            answer = asyncio.ensure_future(ask(openai, [{"role": "user", "content": "hello there"}], session, 0))
            await client.refused.wait()  # the proxy found the lease taken
            # the other client writes, then lets go: the proxy's turn must read that memory
            other.control("begin", native, lease=lease, transaction="t-other")
            other.commit(native, lease, "t-other", [5, 6, 7, 8, 9, 10])
            other.control("publish", native, lease=lease, transaction="t-other", memory_read=True)
            other.control("release", native, lease=lease)
            reply = await answer
            await inspect(openai, session)  # after the commit behind the answer
            return reply, list(client.log), other.control("inspect", native)
        finally:
            other.close()
            await sessions.aclose()

    reply, log, native_info = asyncio.run(scenario())
    assert reply.choices[0].message is not None
    refused = log.index(("error", "acquire", native))
    granted = log.index(("end", "acquire", native))
    query = log.index(("start", "query", native))
    assert refused < granted < query, log  # the answer is a query under the proxy's own lease, made after the write
    assert native_info["published_version"] == 2  # the other client's write, then the proxy's turn


def test_a_first_turn_on_a_session_that_already_holds_memory_reads_it(proxy_upstream, chat):
    session, edited = unique("found"), unique("found")
    natives = {name: native_session_id("default", name) for name in (session, edited)}

    async def scenario():
        client = Recorded(proxy_upstream.url)
        sessions, openai = in_process(client, chat)
        other = NativeClient(proxy_upstream.url)
        try:
            for native in natives.values():  # made and written by another client of the upstream, then let go
                other.control("create", native, memory_read=True)
                lease = other.control("acquire", native, ttl=60)["lease"]
                other.control("begin", native, lease=lease, transaction="t-other")
                other.commit(native, lease, "t-other", [5, 6, 7, 8, 9, 10])
                other.control("publish", native, lease=lease, transaction="t-other", memory_read=True)
                other.control("release", native, lease=lease)
            reply = await ask(openai, [{"role": "user", "content": "hello there"}], session, 0)
            await inspect(openai, session)  # after the commit behind the answer
            log = list(client.log)
            # a transcript with earlier messages cannot continue a memory whose history the proxy never saw
            transcript = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and now?"}]
            with pytest.raises(Exception) as refused:
                await ask(openai, transcript, edited, 0)
            return reply, log, refused.value, {name: other.control("inspect", native) for name, native in natives.items()}
        finally:
            other.close()
            await sessions.aclose()

    reply, log, refused, infos = asyncio.run(scenario())
    assert reply.choices[0].message is not None
    native = natives[session]
    # the generation started before the session was found to hold memory; the answer is a query of that memory
    assert log.index(("start", "generate", None)) < log.index(("error", "create", native)), log  # it exists already
    assert ("start", "query", native) in log and log.index(("start", "generate", None)) < log.index(("start", "query", native)), log
    assert infos[session]["published_version"] == 2  # the other client's write, then the proxy's turn
    assert getattr(refused, "status_code", None) == 409 and "transcript_diverged" in str(refused), refused
    assert infos[edited]["published_version"] == 1  # refused: nothing written


def test_a_recorded_session_is_adopted_before_its_answer(proxy_upstream, chat, tmp_path):
    """A session the proxy has a record of (here: written before a restart) may hold memory: it is adopted
    first, and its turn is a query, with no generation spent on a prompt prepared for an empty memory."""
    session = unique("recorded")
    native = native_session_id("default", session)
    messages = [{"role": "user", "content": "The code of locker 37 is K53."}]

    async def scenario():
        for life in range(2):  # the same records, a proxy before and after a restart
            client = Recorded(proxy_upstream.url)
            sessions, openai = in_process(client, chat, records=tmp_path)
            try:
                reply = await ask(openai, messages, session, 0)
                messages.extend([{"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": "What is the code?"}])
                info = await inspect(openai, session)
            finally:
                await sessions.aclose()
        return list(client.log), info

    log, info = asyncio.run(scenario())
    kinds = [kind for event, kind, _ in log if event == "start"]
    assert "generate" not in kinds and "query" in kinds and ("start", "create", native) not in log, log  # adopted from its record, not made
    assert log.index(("start", "inspect", native)) < log.index(("start", "query", native))
    assert info["history_known"] and info["native"]["published_version"] >= 1


def test_a_streamed_first_turn_is_generated_while_its_lease_is_taken(proxy_upstream, chat):
    """Streamed, the session is made first and its lease taken beside the answer, which is passed on once the
    lease is the proxy's; a lease another client holds makes it a query under the proxy's lease, after that
    client's write."""
    session, held = unique("streamed"), unique("streamed")
    natives = {name: native_session_id("default", name) for name in (session, held)}
    messages = [{"role": "user", "content": "The code of locker 37 is K53."}]

    async def scenario():
        client = Recorded(proxy_upstream.url)
        sessions, openai = in_process(client, chat)
        other = NativeClient(proxy_upstream.url)
        try:
            stateless = await ask_streaming(openai, messages, None, 3, memory="off")
            client.log.clear()
            first = await ask_streaming(openai, messages, session, 3)
            first_turn = list(client.log)
            info = await inspect(openai, session)
            native = natives[held]
            other.control("create", native, memory_read=True)
            lease = other.control("acquire", native, ttl=60)["lease"]
            client.log.clear()
            answer = asyncio.ensure_future(ask_streaming(openai, messages, held, 3))
            await client.refused.wait()
            other.control("begin", native, lease=lease, transaction="t-other")
            other.commit(native, lease, "t-other", [5, 6, 7, 8, 9, 10])
            other.control("publish", native, lease=lease, transaction="t-other", memory_read=True)
            other.control("release", native, lease=lease)
            await answer
            held_turn = list(client.log)
            return stateless, first, first_turn, info, held_turn
        finally:
            other.close()
            await sessions.aclose()

    stateless, first, first_turn, info, held_turn = asyncio.run(scenario())
    native = natives[session]
    assert first == stateless  # an empty memory reads as none
    kinds = [kind for event, kind, _ in first_turn if event == "start"]
    assert kinds[0] == "create" and "generate_stream" in kinds and "query_stream" not in kinds, first_turn
    assert first_turn.index(("start", "generate_stream", None)) < first_turn.index(("end", "acquire", native)), first_turn
    # committed under that lease when the answer ended with a stop string
    assert (info["native"]["published_version"], info["committed_messages"]) in ((1, 2), (0, 0)), info
    refused = held_turn.index(("error", "acquire", natives[held]))
    granted = held_turn.index(("end", "acquire", natives[held]))
    assert refused < granted < held_turn.index(("start", "query_stream", natives[held])), held_turn

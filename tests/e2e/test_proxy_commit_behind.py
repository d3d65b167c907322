"""A turn's commit runs behind its answer (live memt_core server, the real ``openai`` SDK).

In process, the proxy's app runs over ``GatedWrites``, a native client that sends every request for
real but can hold a write's ``begin`` at a gate, or refuse it as if the upstream were unreachable:

* the answer arrives while its commit is held, and a fast follow-up request waits for the commit
  (its prompt is trimmed to the new message, which only the published commit allows);
* a failed commit loses nothing: the resent turn goes in with the next one, as context;
* a proxy that dies between an answer and its commit (its commit never sent): the next proxy, with or
  without records, sends the lost turn as context and commits it with the next turn.

As processes: a proxy killed (SIGKILL) right after an answer, with and without ``--state-directory``,
leaves a session the next proxy continues correctly whether or not the commit landed; a proxy stopped
(SIGTERM) right after an answer finishes the commit before it exits and lets its leases go; an idle
session's lease is released after ``--lease-idle``.
"""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest
from e2e.proxies import MODEL, STOPS, ProxyServer, assistant, expected_prompt, unique

from memt_core.client.native import AsyncNativeClient, NativeClient
from memt_proxy.http.app import create_app
from memt_proxy.chat.service import ChatService
from memt_proxy.session.sessions import Sessions, native_session_id
from memt_proxy.session.store import SessionRecordStore

pytestmark = pytest.mark.timeout(600)


class GatedWrites(AsyncNativeClient):
    """A real native client whose memory writes can be held (``gate``) or refused before they are sent."""

    def __init__(self, *args, refuse: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = asyncio.Event()
        self.gate.set()
        self.reached = asyncio.Event()  # a write's begin arrived (at the gate)
        self.refuse = refuse  # how many writes to refuse, as if the upstream could not be reached

    async def control(self, action, session=None, **fields):
        if action == "begin":
            self.reached.set()
            await self.gate.wait()
            if self.refuse:
                self.refuse -= 1
                raise self._not_sent("begin", "cannot connect (test)")
        return await super().control(action, session, **fields)


@pytest.fixture(scope="module")
def chat(nano_checkpoint):
    from memt_core.client.chat_format import load_chat_format, load_tokenizer

    return load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))


def in_process(client, chat, **options):
    """The proxy's app over ``client``, and an ``openai.AsyncOpenAI`` talking to it in process."""
    from openai import AsyncOpenAI

    chat_format, parser = chat
    sessions = Sessions(client, identity=chat_format.identity, **options)
    app = create_app(ChatService(sessions, chat_format, parser, model_names=[MODEL], on_divergence="error"))
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=120)
    return sessions, AsyncOpenAI(base_url="http://proxy/v1", api_key="unused", http_client=http, max_retries=0)


async def inspect(openai, session: str) -> dict:
    """The proxy's view of ``session`` (its admin route waits for a commit under way)."""
    response = await openai._client.get(f"http://proxy/v1/memt/sessions/{session}")
    assert response.status_code == 200, response.text
    return response.json()


async def completed(openai, session: str, history: list[dict], seed: int = 0):
    """Ask until a seed gives a completed turn (a stop string ends it); the answer is appended to ``history``."""
    for s in range(seed, seed + 20):
        reply = await openai.chat.completions.create(
            model=MODEL, messages=history, max_tokens=24, temperature=1.0, seed=s, stop=STOPS,
            extra_headers={"X-MemT-Session": session},
        )
        if reply.choices[0].finish_reason == "stop":
            history.append(assistant(reply.choices[0].message))
            return reply
    pytest.fail("no completed turn in 20 seeds")


def native_inspect(upstream, session: str) -> dict:
    with NativeClient(upstream.url) as native:
        return native.control("inspect", native_session_id("default", session))


def test_the_answer_comes_first_and_a_fast_follow_up_waits_for_its_commit(proxy_upstream, chat):
    chat_format = chat[0]
    session = unique("behind")

    async def scenario():
        client = GatedWrites(proxy_upstream.url)
        client.gate.clear()
        sessions, openai = in_process(client, chat)
        try:
            history = [{"role": "user", "content": "first question"}]
            await completed(openai, session, history)  # answered while its commit is held at the gate
            await client.reached.wait()
            state = sessions.table.get("default", session)
            assert state.committing is not None and state.version == 0 and state.committed == []
            history.append({"role": "user", "content": "second question"})
            follow = asyncio.ensure_future(completed(openai, session, history, seed=1))
            while state.users < 2:  # the follow-up now waits for the session (the commit holds the other use)
                await asyncio.sleep(0.01)
            assert not follow.done()
            client.gate.set()
            second = await follow
            return second, history, await inspect(openai, session)
        finally:
            await sessions.aclose()

    second, history, info = asyncio.run(scenario())
    # only the new question reached the model: the follow-up ran after the first turn was published
    assert second.usage.prompt_tokens == len(expected_prompt(chat_format, history[:-1], 2))
    assert info["committed_messages"] == 4 and info["native"]["published_version"] == 2


def test_a_failed_commit_is_made_good_by_the_next_turn(proxy_upstream, chat):
    chat_format = chat[0]
    session = unique("refused")

    async def scenario():
        client = GatedWrites(proxy_upstream.url, refuse=1)
        sessions, openai = in_process(client, chat)
        try:
            history = [{"role": "user", "content": "first question"}]
            first = await completed(openai, session, history)  # the app has its answer; the commit is then refused
            info = await inspect(openai, session)  # waits for the commit
            history.append({"role": "user", "content": "second question"})
            second = await completed(openai, session, history, seed=1)
            after = await inspect(openai, session)
            return first, info, second, history, after, client.refuse
        finally:
            await sessions.aclose()

    first, info, second, history, after, refusals_left = asyncio.run(scenario())
    assert refusals_left == 0 and first.choices[0].finish_reason == "stop"  # the app had its answer
    assert info["committed_messages"] == 0 and info["native"]["published_version"] == 0  # nothing was written
    assert info["native"]["transaction"] is None
    # the first turn went to the model again, as context, and into memory with the second
    assert second.usage.prompt_tokens == len(expected_prompt(chat_format, history[:-1], 0))
    assert after["committed_messages"] == 4 and after["native"]["published_version"] == 1


@pytest.mark.parametrize("records", [True, False], ids=["state-directory", "no-state-directory"])
def test_a_proxy_that_dies_before_its_commit_loses_nothing(proxy_upstream, chat, tmp_path, records):
    """The first proxy answers and dies with its commit unsent (held at the gate, its lease no longer renewed);
    the next proxy takes the session over once the dead one's lease ran out."""
    chat_format = chat[0]
    session = unique("died")
    store = (lambda: SessionRecordStore(tmp_path)) if records else (lambda: None)

    async def scenario():
        dying = GatedWrites(proxy_upstream.url)
        dying.gate.clear()
        first_sessions, first = in_process(dying, chat, records=store(), lease_ttl=3)
        history = [{"role": "user", "content": "first question"}]
        await completed(first, session, history)
        await dying.reached.wait()
        state = first_sessions.table.get("default", session)
        state.keeper.cancel()  # the process is gone: nothing renews or releases its lease any more
        second_sessions, second = in_process(AsyncNativeClient(proxy_upstream.url), chat, records=store(), lease_ttl=3, lease_wait=15)
        try:
            history.append({"role": "user", "content": "second question"})
            reply = await completed(second, session, history, seed=1)
            info = await inspect(second, session)
            return reply, history, info
        finally:
            await second_sessions.aclose()
            state.committing.cancel()
            await dying.aclose()

    reply, history, info = asyncio.run(scenario())
    assert reply.usage.prompt_tokens == len(expected_prompt(chat_format, history[:-1], 0))  # the lost turn as context
    assert info["committed_messages"] == 4 and info["history_known"] is True and info["native"]["published_version"] == 1


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_kept_lease_that_lapsed_is_taken_again(proxy_upstream, chat, stream):
    """The lease kept since the last turn is gone upstream (here: released behind the proxy's back): the
    next query is refused for it, and the proxy takes a new lease and asks again, once."""
    session = unique("lapsed")

    async def scenario():
        client = AsyncNativeClient(proxy_upstream.url)
        sessions, openai = in_process(client, chat)
        try:
            await completed(openai, session, [{"role": "user", "content": "first question"}])
            await inspect(openai, session)  # the commit is done
            state = sessions.table.get("default", session)
            kept = state.lease
            await client.control("release", state.native, lease=kept)
            request = dict(model=MODEL, messages=[{"role": "user", "content": "again"}], max_tokens=4, extra_headers={"X-MemT-Session": session})
            if stream:
                chunks = [chunk async for chunk in await openai.chat.completions.create(stream=True, **request)]
                finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            else:
                finish = [(await openai.chat.completions.create(**request)).choices[0].finish_reason]
            return kept, state.lease, finish
        finally:
            await sessions.aclose()

    kept, now, finish = asyncio.run(scenario())
    assert finish in (["stop"], ["length"]) and now is not None and now != kept


# ---------------------------------------------------------------------- as processes


def ask_once(proxy: ProxyServer, session: str, history: list[dict], seed: int = 0):
    client = proxy.openai("unused")
    for s in range(seed, seed + 20):
        reply = client.chat.completions.create(
            model=MODEL, messages=history, max_tokens=24, temperature=1.0, seed=s, stop=STOPS, extra_headers={"X-MemT-Session": session},
        )
        if reply.choices[0].finish_reason == "stop":
            return reply
    pytest.fail("no completed turn in 20 seeds")


@pytest.mark.parametrize("records", [True, False], ids=["state-directory", "no-state-directory"])
def test_a_proxy_killed_right_after_an_answer(proxy_upstream, nano_checkpoint, proxy_chat_format, tmp_path, records):
    """SIGKILL as soon as the answer arrived: whether its commit landed or not, the next proxy goes on correctly."""
    args = ["--lease-ttl", "3", "--lease-wait", "15"] + (["--state-directory", str(tmp_path / "records")] if records else [])
    session, history = unique("killed"), [{"role": "user", "content": "first question"}]
    first = ProxyServer(proxy_upstream.url, nano_checkpoint, args=args).start()
    try:
        reply = ask_once(first, session, history)
        first.process.send_signal(signal.SIGKILL)
    finally:
        first.process.wait(30)
    history += [assistant(reply.choices[0].message), {"role": "user", "content": "second question"}]
    landed = native_inspect(proxy_upstream, session)["published_version"]
    assert landed in (0, 1)
    with ProxyServer(proxy_upstream.url, nano_checkpoint, args=args) as second:
        if landed == 1 and not records:
            # memory holds the turn but nobody knows which: a restart without records refuses the resent history in strict mode
            with second.http(None) as http:
                response = http.post("/v1/chat/completions", json={"model": MODEL, "messages": history, "max_tokens": 4},
                                     headers={"X-MemT-Session": session, "X-MemT-On-Divergence": "error"})
            assert response.status_code == 409 and response.json()["error"]["code"] == "transcript_diverged"
            return
        again = ask_once(second, session, history, seed=1)
        assert again.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, history, 2 if landed else 0))
        info = second.inspect(session, None)
        assert info["committed_messages"] == 4 and info["native"]["published_version"] == landed + 1
        print(f"commit {'landed' if landed else 'had not landed'} before the kill")


def test_a_stopped_proxy_finishes_its_commit_and_releases_its_leases(proxy_upstream, nano_checkpoint):
    session = unique("stopped")
    proxy = ProxyServer(proxy_upstream.url, nano_checkpoint).start()
    try:
        ask_once(proxy, session, [{"role": "user", "content": "first question"}])
        proxy.process.send_signal(signal.SIGTERM)  # right after the answer: its commit is still under way
        assert proxy.process.wait(60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has shut down
    finally:
        proxy.stop()
    native = native_inspect(proxy_upstream, session)
    assert native["published_version"] == 1 and native["leased"] is False and native["transaction"] is None


def test_an_idle_session_lets_its_lease_go(proxy_upstream, nano_checkpoint):
    session = unique("idle")
    with ProxyServer(proxy_upstream.url, nano_checkpoint, args=["--lease-idle", "1"]) as proxy:
        ask_once(proxy, session, [{"role": "user", "content": "first question"}])
        assert proxy.inspect(session, None)["native"]["leased"] is True  # kept for the next turn
        deadline = time.monotonic() + 30
        while native_inspect(proxy_upstream, session)["leased"]:
            assert time.monotonic() < deadline, "the idle session's lease was never released"
            time.sleep(0.1)
        # the next turn takes a new lease
        assert ask_once(proxy, session, [{"role": "user", "content": "hello again"}]).choices[0].finish_reason == "stop"
        with proxy.http(None) as http:
            assert http.delete(f"/v1/memt/sessions/{session}").status_code == 200

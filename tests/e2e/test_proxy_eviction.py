"""The proxy's bounded session table, live: a proxy with ``--max-sessions 2`` in front of a real memt_core
server, driven by the ``openai`` SDK. Talking to a third session drops the least recently used one from
the proxy's memory; its native session (and memory) stays upstream, unleased. When the dropped session
comes back, the proxy adopts it again: with ``--state-directory`` it re-reads the session's record and
still trims the resent transcript; without, the history is unknown and the resent transcript is
an edited one (409 ``transcript_diverged`` in strict mode), while new messages alone continue the same memory.
Last, 5,000 distinct sessions through the session layer (create, lease, release on a live upstream
with room for them all) leave at most ``max_sessions`` states in the proxy's memory and no lease held.
"""

from __future__ import annotations

import asyncio

import pytest
from e2e.proxies import MODEL, ProxyServer, assert_openai_error, completed_turn, expected_prompt, say, unique
from e2e.wire import metric

from memt_core.client.native import AsyncNativeClient
from memt_proxy.session.sessions import Sessions, native_session_id

pytestmark = pytest.mark.timeout(600)


def upstream_inspect(server, tenant: str, session: str) -> dict:
    """The native session behind a proxy session, as the upstream reports it."""
    with server.client() as http:
        epoch = http.get("/memt/capabilities").json()["epoch"]
        response = http.post("/memt/control", json={"action": "inspect", "session": native_session_id(tenant, session), "epoch": epoch})
    assert response.status_code == 200, response.text
    return response.json()


def close(proxy: ProxyServer, *sessions: str) -> None:
    with proxy.http(None) as http:
        for session in sessions:
            assert http.delete(f"/v1/memt/sessions/{session}").status_code == 200


def test_an_evicted_session_continues_from_its_record(proxy_upstream, nano_checkpoint, proxy_chat_format, tmp_path):
    args = ["--max-sessions", "2", "--state-directory", str(tmp_path / "proxy-state")]
    a, b, c = unique("evict-a"), unique("evict-b"), unique("evict-c")
    history: list[dict] = []
    with ProxyServer(proxy_upstream.url, nano_checkpoint, args=args) as proxy:
        client = proxy.openai("unused")
        for text in ("first question", "second question"):
            say(client, history, text, a)
        for other in (b, c):  # two more sessions: a, the least recently used, leaves the proxy's table
            say(client, [], "hello", other)
        native = upstream_inspect(proxy_upstream, "default", a)
        assert native["published_version"] == 2 and native["leased"] is False  # memory kept, lease let go
        reply = say(client, history, "third question", a)
        # only the new question reached the model: the record said memory holds the first four messages
        assert reply.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, history[:-1], 4))
        info = proxy.inspect(a, None)
        assert info["committed_messages"] == 6 and info["history_known"] is True
        assert info["native"]["published_version"] == 3
        close(proxy, a, b, c)


def test_without_a_state_directory_an_evicted_session_has_an_unknown_history(proxy_upstream, nano_checkpoint, proxy_chat_format):
    a, b, c = unique("evict-bare-a"), unique("evict-bare-b"), unique("evict-bare-c")
    history: list[dict] = []
    with ProxyServer(proxy_upstream.url, nano_checkpoint, args=["--max-sessions", "2"]) as proxy:
        client = proxy.openai("unused")
        say(client, history, "first question", a)
        assert proxy.inspect(a, None)["history_known"] is True
        for other in (b, c):
            say(client, [], "hello", other)
        assert upstream_inspect(proxy_upstream, "default", a)["leased"] is False
        with proxy.http(None) as http:
            resent = history + [{"role": "user", "content": "second question"}]
            response = http.post("/v1/chat/completions", json={"model": MODEL, "messages": resent, "max_tokens": 4},
                                 headers={"X-MemT-Session": a, "X-MemT-On-Divergence": "error"})
            assert_openai_error(response, 409, code="transcript_diverged")
        info = proxy.inspect(a, None)
        assert info["history_known"] is False and info["native"]["published_version"] == 1  # adopted, memory intact
        # the new message alone continues the same memory, and its turn is committed on top of it
        only_new = [{"role": "user", "content": "second question"}]
        reply = completed_turn(client, a, only_new)
        assert reply.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, only_new, 0))
        assert proxy.inspect(a, None)["native"]["published_version"] == 2
        close(proxy, a, b, c)


def test_five_thousand_sessions_leave_at_most_max_sessions_in_memory(memt_servers, nano_checkpoint, proxy_chat_format):
    upstream = memt_servers(nano_checkpoint, "--max-sessions-per-rank", "5100")
    names = [f"many-{number}" for number in range(5000)]

    async def scenario():
        sessions = Sessions(AsyncNativeClient(upstream.url), identity=proxy_chat_format.identity, max_sessions=64)
        try:
            await sessions.check_upstream()
            largest = 0
            for name in names:
                async with sessions.turn("t", name) as held:
                    await held.start()  # create, then a lease renewed while held
                largest = max(largest, len(sessions.table))
            first_dropped = sessions.table.get("t", names[0]) is None
            async with sessions.turn("t", names[0]) as held:  # long dropped: adopted again from the upstream
                await held.start()
                adopted = (held.state.exists, held.state.history_known, held.state.version)
            return largest, len(sessions.table), sessions.table.dropped, first_dropped, adopted
        finally:
            await sessions.aclose()  # shutting down releases the leases the 64 states kept

    largest, kept, dropped, first_dropped, adopted = asyncio.run(scenario())
    assert largest == kept == 64 and dropped == 5000 + 1 - 64 and first_dropped
    assert adopted == (True, True, 0)  # its native session was there, never written to: its memory is known to be empty
    with upstream.client() as http:
        text = http.get("/metrics").text
    assert metric(text, "memt_sessions") == 5000  # every native session kept, none closed to make room
    assert metric(text, "memt_leases") == 0  # and no lease left behind by a dropped state

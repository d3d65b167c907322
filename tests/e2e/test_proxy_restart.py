"""A proxy restarted (killed) in the middle of conversations, in front of an upstream that kept running.

With ``--state-directory`` the new proxy reads each session's record and still trims the resent
transcript to the new message, and continues a turn that was waiting for tool results; without it the
history is unknown and a resent transcript is an edited history: refused (409 ``transcript_diverged``)
with ``X-MemT-On-Divergence: error``, never silently mixed with the memory it does not know.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from e2e.proxies import (
    DEMO_MODEL, DEMO_PATH, LONG_MESSAGES, LONG_TOKENS, MODEL, ProxyServer, assert_openai_error, assistant, completed_turn,
    demo_chat_format, expected_prompt, say, unique,
)

from memt_demo.tool_turns import TOOLS

pytestmark = pytest.mark.timeout(600)


def killed(proxy: ProxyServer) -> None:
    proxy.process.kill()
    proxy.process.wait(30)


def test_restarted_proxy_keeps_trimming_with_a_state_directory(proxy_upstream, nano_checkpoint, proxy_chat_format, tmp_path):
    args = ["--state-directory", str(tmp_path / "proxy-state")]
    session, history = unique("restart"), []
    first = ProxyServer(proxy_upstream.url, nano_checkpoint, args=args).start()
    try:
        for text in ("first question", "second question"):
            say(first.openai("unused"), history, text, session)
        assert first.inspect(session, None)["committed_messages"] == 4
    finally:
        killed(first)
    with ProxyServer(proxy_upstream.url, nano_checkpoint, args=args) as second:
        info = second.inspect(session, None)
        assert info["committed_messages"] == 4 and info["history_known"] is True
        reply = say(second.openai("unused"), history, "third question", session)
        # only the new question reached the model: the four committed messages were trimmed
        assert reply.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, history[:-1], 4))
        assert second.inspect(session, None)["committed_messages"] == 6
        # a reset is recorded too: after another restart the session is known to be empty
        with second.http(None) as http:
            assert http.post(f"/v1/memt/sessions/{session}/reset").status_code == 200
        killed(second)
    with ProxyServer(proxy_upstream.url, nano_checkpoint, args=args) as third:
        info = third.inspect(session, None)
        assert info["committed_messages"] == 0 and info["history_known"] is True
        with third.http(None) as http:
            assert http.delete(f"/v1/memt/sessions/{session}").status_code == 200
    assert not list((tmp_path / "proxy-state").glob("*.json"))  # a closed session leaves no record


def test_restarted_proxy_without_records_refuses_the_unknown_history(proxy_upstream, nano_checkpoint):
    session, history = unique("restart-bare"), []
    first = ProxyServer(proxy_upstream.url, nano_checkpoint).start()
    try:
        say(first.openai("unused"), history, "first question", session)
        assert first.inspect(session, None)["native"]["published_version"] == 1  # the commit behind the answer is done
    finally:
        killed(first)
    with ProxyServer(proxy_upstream.url, nano_checkpoint) as second:
        with second.http(None) as http:
            history.append({"role": "user", "content": "second question"})
            response = http.post("/v1/chat/completions", json={"model": MODEL, "messages": history, "max_tokens": 4},
                                 headers={"X-MemT-Session": session, "X-MemT-On-Divergence": "error"})
            assert_openai_error(response, 409, code="transcript_diverged")
            assert second.inspect(session, None)["history_known"] is False
            assert http.delete(f"/v1/memt/sessions/{session}").status_code == 200


def test_tool_results_without_a_pending_call_are_a_new_turn(proxy_upstream, nano_checkpoint, proxy_chat_format):
    """What a proxy without a record of the call sees (restarted without --state-directory) when an app sends its results."""
    session = unique("restart-tools")
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    messages = [
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 3}'},
    ]
    with ProxyServer(proxy_upstream.url, nano_checkpoint) as proxy:
        client = proxy.openai("unused")
        reply = completed_turn(client, session, messages)
        # the model saw the whole round, rendered as the chat template renders it
        assert reply.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, messages, 0))
        assert proxy.inspect(session, None)["committed_messages"] == 4
        with proxy.http(None) as http:
            assert http.delete(f"/v1/memt/sessions/{session}").status_code == 200


def test_a_restarted_proxy_continues_a_pending_tool_call(demo_proxy, tmp_path):
    """The app gets a tool call from one proxy, which is then killed; it sends the results to the next one,
    which continues the same turn from the record (needs the demo model: a random one never calls tools)."""
    args, session = ["--state-directory", str(tmp_path / "proxy-state")], unique("restart-pending")
    question = {"role": "user", "content": "What is the weather in Paris?"}
    ask = {"model": DEMO_MODEL, "tools": [TOOLS["get_weather"]], "temperature": 0.0, "max_tokens": 64, "extra_headers": {"X-MemT-Session": session}}
    first = ProxyServer(demo_proxy.upstream, DEMO_PATH, args=args).start()
    try:
        called = first.openai("unused").chat.completions.create(messages=[question], **ask)
        assert called.choices[0].finish_reason == "tool_calls", called.choices[0]
    finally:
        killed(first)
    call = called.choices[0].message.tool_calls[0]
    results = [{"tool_call_id": call.id, "content": '{"city": "Paris", "temperature": 21, "condition": "sunny"}'}]
    with ProxyServer(demo_proxy.upstream, DEMO_PATH, args=args) as second:
        assert second.inspect(session, None)["pending_tool_calls"] is True
        messages = [question, assistant(called.choices[0].message), {"role": "tool", **results[0]}]
        answered = second.openai("unused").chat.completions.create(messages=messages, **ask)
        assert answered.choices[0].finish_reason == "stop" and answered.choices[0].message.content
        # continued: the prompt is the first one + the call's exact tokens + the results (not the turn re-rendered)
        assert answered.usage.prompt_tokens == called.usage.prompt_tokens + called.usage.completion_tokens + len(
            demo_chat_format().tool_results_ids(results, enable_thinking=False))
        info = second.inspect(session, None)
        assert info["pending_tool_calls"] is False and info["committed_messages"] == 4
        with second.http(None) as http:
            assert http.delete(f"/v1/memt/sessions/{session}").status_code == 200


def test_a_killed_proxy_frees_its_sessions_within_the_lease_ttl(proxy_upstream, nano_checkpoint, long_seed):
    session = unique("restart-leased")
    body = {"model": MODEL, "messages": LONG_MESSAGES, "max_tokens": LONG_TOKENS, "temperature": 1.0, "seed": long_seed, "stream": True}
    first = ProxyServer(proxy_upstream.url, nano_checkpoint, args=["--lease-ttl", "3"]).start()
    try:
        with first.http(None) as http:
            with http.stream("POST", "/v1/chat/completions", json=body, headers={"X-MemT-Session": session}) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        killed(first)  # mid-stream, holding the session's lease
                        break
    finally:
        killed(first)
    with ProxyServer(proxy_upstream.url, nano_checkpoint, args=["--lease-ttl", "3"]) as second:
        started = time.monotonic()
        reply = second.openai("unused").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "anyone there?"}], max_tokens=4,
            extra_headers={"X-MemT-Session": session},
        )
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert time.monotonic() - started < 3 + 5  # the dead proxy's lease ran out; not the 30 s --lease-wait
        with second.http(None) as http:
            assert http.delete(f"/v1/memt/sessions/{session}").status_code == 200


def test_a_lease_is_renewed_while_held(proxy_upstream, nano_checkpoint):
    """The proxy's own session layer against the live upstream: a lease held past its TTL stays valid, is kept
    after the request while the session is active, and goes at shutdown."""
    from memt_core.client.chat_format import load_chat_format, load_tokenizer
    from memt_core.client.native import AsyncNativeClient
    from memt_proxy.session.sessions import Sessions

    chat_format, parser = load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))

    async def scenario():
        client, observer = AsyncNativeClient(proxy_upstream.url), AsyncNativeClient(proxy_upstream.url)
        sessions = Sessions(client, identity=chat_format.identity, lease_ttl=3)
        await sessions.check_upstream()
        async with sessions.turn("t", unique("renewed")) as held:
            await held.start()
            await asyncio.sleep(4.5)  # past the 3 s the lease was granted for
            held_info = await observer.control("inspect", held.state.native)
        kept = await observer.control("inspect", held.state.native)
        await sessions.aclose()
        released = await observer.control("inspect", held.state.native)
        await observer.control("close", held.state.native, lease=(await observer.control("acquire", held.state.native, ttl=5))["lease"])
        await observer.aclose()
        return held_info, kept, released

    held, kept, released = asyncio.run(scenario())
    assert held["leased"] is True and held["lease_expires_in"] > 0
    assert kept["leased"] is True  # between requests the session keeps its lease (--lease-idle)
    assert released["leased"] is False

"""Sessions past the upstream's capacity, and a retried turn whose answer was lost, live.

An upstream with room for three native sessions, a proxy with default settings: a fourth conversation
offloads the least recently used idle session (its memory exported to a snapshot, its native session
closed) instead of being refused with 429, and the offloaded session, asked again, is restored first:
it answers from the same memory as before, and its resent transcript is still trimmed.

The openai SDK retries a request whose answer was lost on the way back. The proxy committed that turn
already; the identical retry gets the same answer again, nothing is committed twice, and the session
goes on (the dropping transport below really sends every request and reads every answer, and drops the
first answer before the SDK sees it).
"""

from __future__ import annotations

import json

import httpx
import pytest
from e2e.proxies import MODEL, ProxyServer, ask, expected_prompt, say, unique

from memt_proxy.session.sessions import native_session_id

pytestmark = pytest.mark.timeout(900)
QUESTION = [{"role": "user", "content": "What did I tell you?"}]


def recall(client, session: str) -> str:
    """A deterministic answer from the session's memory (read only: commits nothing)."""
    return ask(client, QUESTION, session, memory="read", seed=5, stop=None, max_tokens=16).choices[0].message.content


def native_exists(upstream, session: str) -> bool:
    with upstream.client() as http:
        body = {"action": "inspect", "session": native_session_id("default", session), "epoch": upstream.epoch()}
        return http.post("/memt/control", json=body).status_code == 200


@pytest.mark.parametrize("records", ["state-directory", "in-memory"])
def test_a_full_upstream_offloads_idle_sessions_and_restores_them(memt_servers, nano_checkpoint, proxy_chat_format, tmp_path, records):
    upstream = memt_servers(nano_checkpoint, "--max-sessions-per-rank", "3")
    args = ["--state-directory", str(tmp_path / "proxy-state")] if records == "state-directory" else []
    first, history = unique("offload-first"), []
    with ProxyServer(upstream.url, nano_checkpoint, args=args) as proxy:
        client = proxy.openai("unused")
        for text in ("My name is Ada.", "I live in Lisbon."):
            say(client, history, text, first)
        before = recall(client, first)
        others = [unique("offload-other") for _ in range(5)]
        for other in others:  # more conversations than the upstream has room for: none is refused
            say(client, [], "hello", other)
        assert not native_exists(upstream, first)  # offloaded: its native session was closed to make room
        offloads = lambda: sorted(p.name for p in upstream.state_directory.glob("o-*.safetensors"))  # noqa: E731
        assert f"o-{native_session_id('default', first)}" in " ".join(offloads())
        assert recall(client, first) == before  # restored first: the same memory answers the same
        reply = say(client, history, "Where do I live?", first)
        # the resent transcript was trimmed to the new question: the record came back with the memory
        assert reply.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, history[:-1], 4))
        info = proxy.inspect(first, None)
        assert info["committed_messages"] == 6 and info["history_known"] is True
        with proxy.http(None) as http:
            for session in [first, *others]:  # offloaded or not, every session can be closed
                assert http.delete(f"/v1/memt/sessions/{session}").status_code == 200
            assert http.get(f"/v1/memt/sessions/{others[0]}").status_code == 404  # closed means gone, offloaded or not
        assert offloads() == []  # each offload snapshot deleted once restored (a close restores first)
    if records == "state-directory":
        assert not list((tmp_path / "proxy-state").glob("*.offload.json"))


def test_a_restarted_proxy_makes_room_among_the_sessions_it_recorded(memt_servers, nano_checkpoint, proxy_chat_format, tmp_path):
    """The upstream full of sessions an earlier proxy made (killed, its table gone): a new session is served at
    once, not 429 until they expire (issue 38). The records name them, and one of them is offloaded; it comes
    back, trimmed, when its conversation does."""
    upstream = memt_servers(nano_checkpoint, "--max-sessions-per-rank", "3")
    args = ["--state-directory", str(tmp_path / "proxy-state"), "--lease-idle", "0"]  # leases let go after each request
    histories = {unique("recorded"): [] for _ in range(3)}
    first = ProxyServer(upstream.url, nano_checkpoint, args=args).start()
    try:
        for session, history in histories.items():
            say(first.openai("unused"), history, "My name is Ada.", session)
            assert first.inspect(session, None)["native"]["published_version"] == 1  # committed, lease let go
    finally:
        first.process.kill()
        first.process.wait(30)
    with ProxyServer(upstream.url, nano_checkpoint, args=args) as second:
        client = second.openai("unused")
        say(client, [], "hello", unique("new"))  # the upstream is full: room is made among the recorded ones
        moved = [session for session in histories if not native_exists(upstream, session)]
        assert len(moved) == 1, moved
        history = histories[moved[0]]
        reply = say(client, history, "Where do I live?", moved[0])  # restored (room made again), trimmed
        assert reply.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, history[:-1], 2))


def answer_of(body: str) -> dict:
    """``{"content", "finish_reason"}`` of a chat.completion body or of a chat.completion.chunk stream."""
    if not body.lstrip().startswith("data:"):
        choice = json.loads(body)["choices"][0]
        return {"content": choice["message"]["content"], "finish_reason": choice["finish_reason"]}
    content, finish = "", None
    for line in body.splitlines():
        if line.startswith("data:") and "[DONE]" not in line:
            for choice in json.loads(line[5:]).get("choices", []):
                content += choice["delta"].get("content") or ""
                finish = choice.get("finish_reason") or finish
    return {"content": content, "finish_reason": finish}


class DropFirstAnswer(httpx.HTTPTransport):
    """Sends each request for real and reads its answer; the first chat answer is dropped (a broken connection)."""

    def __init__(self):
        super().__init__()
        self.sent = 0
        self.dropped: list[dict] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.url.path.endswith("/chat/completions"):
            self.sent += 1
            if not self.dropped:
                response.read()
                self.dropped.append(answer_of(response.content.decode()))
                response.close()
                raise httpx.ReadError("connection reset after the answer was sent (test)", request=request)
        return response


@pytest.mark.parametrize("stream", [False, True])
def test_the_sdks_retry_of_a_committed_turn_is_answered_again_not_committed_twice(proxy_upstream, nano_checkpoint, proxy_chat_format, stream):
    from openai import OpenAI

    session, history = unique("retry"), []
    with ProxyServer(proxy_upstream.url, nano_checkpoint) as proxy:
        say(proxy.openai("unused"), history, "My name is Ada.", session)
        transport = DropFirstAnswer()
        retrying = OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=2, timeout=120, http_client=httpx.Client(transport=transport, timeout=120))
        history.append({"role": "user", "content": "I live in Lisbon."})
        for seed in range(20):  # a seed whose answer completes the turn (so that it is committed)
            transport.dropped.clear()
            version = proxy.inspect(session, None)["native"]["published_version"]
            created = retrying.chat.completions.create(
                model=MODEL, messages=history, max_tokens=24, temperature=1.0, seed=seed, stop=[" ", "e"],
                extra_headers={"X-MemT-Session": session}, stream=stream,
            )
            content = "".join(chunk.choices[0].delta.content or "" for chunk in created if chunk.choices) if stream else created.choices[0].message.content
            if transport.dropped[0]["finish_reason"] == "stop":
                break
        info = proxy.inspect(session, None)
        assert transport.sent >= 2 and len(transport.dropped) == 1  # the SDK really retried after losing the answer
        assert info["native"]["published_version"] == version + 1  # committed once, not twice
        assert info["committed_messages"] == 4
        assert content == transport.dropped[0]["content"]  # the same answer again
        history.append({"role": "assistant", "content": content})
        reply = say(proxy.openai("unused"), history, "Where do I live?", session)
        assert reply.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, history[:-1], 4))  # and trimming goes on

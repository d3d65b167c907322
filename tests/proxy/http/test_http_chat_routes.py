"""``memt_proxy.http.chat_routes`` over the session harness (the proxy's whole app, called in-process): the model list,
a completion answered and streamed as SSE ending in ``[DONE]`` (the same greedy answer), a named session made under the
tenant's id, the on-divergence control checked where it is read (header or metadata), and the tenant's key required."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session"))  # the session harness

from memt_proxy.session.sessions import native_session_id  # noqa: E402
from session_harness import proxy, run, settle  # noqa: E402

ASK = {"model": "m", "messages": [{"role": "user", "content": "Hello there."}], "max_tokens": 4}
KEY = {"Authorization": "Bearer key-a"}


def frames(text: str) -> list[str]:
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


def test_models_a_completion_and_its_stream():
    async def body(h):
        async with proxy(h, api_keys={"key-a": "alpha"}) as (client, _, _):
            models = (await client.get("/v1/models", headers=KEY)).json()
            unkeyed = await client.get("/v1/models")
            answer = await client.post("/v1/chat/completions", json=ASK, headers=KEY)
            streamed = await client.post("/v1/chat/completions", json={**ASK, "stream": True}, headers=KEY)
            named = await client.post("/v1/chat/completions", json=ASK, headers={**KEY, "X-MemT-Session": "chat-1"})
            await settle(h.sessions)
            return models, unkeyed, answer, streamed, named, h.memory(native_session_id("alpha", "chat-1"))

    models, unkeyed, answer, streamed, named, memory = run(body)
    assert [m["id"] for m in models["data"]] == ["m"] and unkeyed.status_code == 401
    assert answer.status_code == 200 and answer.json()["object"] == "chat.completion" and answer.json()["usage"]["completion_tokens"] == 4
    assert streamed.headers["content-type"].startswith("text/event-stream")
    data = frames(streamed.text)
    assert data[-1] == "[DONE]" and all(json.loads(d)["object"] == "chat.completion.chunk" for d in data[:-1])
    text = "".join(json.loads(d)["choices"][0]["delta"].get("content") or "" for d in data[:-1] if json.loads(d)["choices"])
    assert text == answer.json()["choices"][0]["message"]["content"]  # greedy: the same answer streamed
    assert named.status_code == 200 and memory == ()  # the tenant's session made beside the answer; cut at max_tokens: nothing committed


def test_the_on_divergence_control_is_checked_where_it_was_sent():
    async def body(h):
        async with proxy(h) as (client, _, _):
            headed = await client.post("/v1/chat/completions", json=ASK, headers={"X-MemT-Session": "s", "X-MemT-On-Divergence": "maybe"})
            carried = await client.post("/v1/chat/completions", json={**ASK, "metadata": {"memt_on_divergence": "maybe"}}, headers={"X-MemT-Session": "s"})
            bad_session = await client.post("/v1/chat/completions", json=ASK, headers={"X-MemT-Session": "a b"})
            return headed, carried, bad_session

    headed, carried, bad_session = run(body)
    assert headed.status_code == 400 and headed.json()["error"]["param"] == "X-MemT-On-Divergence"
    assert carried.status_code == 400 and carried.json()["error"]["param"] == "metadata.memt_on_divergence"
    assert bad_session.status_code == 400 and bad_session.json()["error"]["code"] == "invalid_session"

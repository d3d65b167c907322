"""``memt_proxy.http.responses_routes`` over the session harness (the proxy's whole app, called in-process): a response
created, read, its input items paged and deleted; streamed as ``event:``/``data:`` frames without a ``[DONE]`` sentinel,
ending with the completed response; the Conversations routes (create, read, add and list items, delete with its memory);
each under its tenant's key, refusals in OpenAI's error shape."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session"))  # the session harness

from session_harness import proxy, run, settle  # noqa: E402

ASK = {"model": "m", "input": "Hello there.", "max_output_tokens": 4}
KEY_A, KEY_B = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}


def events(text: str) -> list[tuple[str, dict]]:
    """The SSE frames as (event, data) pairs."""
    kinds = [line[len("event: "):] for line in text.splitlines() if line.startswith("event: ")]
    data = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert len(kinds) == len(data) and "[DONE]" not in data
    return [(kind, json.loads(datum)) for kind, datum in zip(kinds, data)]


def test_a_response_is_created_read_paged_deleted_and_streamed():
    async def body(h):
        async with proxy(h, api_keys={"key-a": "alpha", "key-b": "beta"}) as (client, _, _):
            made = (await client.post("/v1/responses", json=ASK, headers=KEY_A)).json()
            path = f"/v1/responses/{made['id']}"
            seen = {
                "made": made, "got": (await client.get(path, headers=KEY_A)).json(),
                "items": (await client.get(path + "/input_items", headers=KEY_A, params={"limit": 1})).json(),
                "other": await client.get(path, headers=KEY_B), "bad_order": await client.get(path + "/input_items", headers=KEY_A, params={"order": "up"}),
                "deleted": (await client.delete(path, headers=KEY_A)).json(), "after": await client.get(path, headers=KEY_A),
                "stream": await client.post("/v1/responses", json={**ASK, "stream": True}, headers=KEY_A),
                "unkeyed": await client.post("/v1/responses", json=ASK),
            }
            await settle(h.sessions)
            return seen

    seen = run(body)
    made = seen["made"]
    assert made["object"] == "response" and made["status"] == "incomplete" and seen["got"] == made  # cut at max_output_tokens
    assert [item["content"][0]["text"] for item in seen["items"]["data"]] == ["Hello there."]
    assert seen["other"].status_code == 404 and seen["other"].json()["error"]["code"] == "response_not_found"
    assert seen["bad_order"].status_code == 400
    assert seen["deleted"] == {"id": made["id"], "object": "response.deleted", "deleted": True} and seen["after"].status_code == 404
    streamed = events(seen["stream"].text)
    assert [kind for kind, _ in streamed[:2]] == ["response.created", "response.in_progress"]
    assert all(kind == data["type"] for kind, data in streamed)
    last = streamed[-1][1]["response"]
    assert streamed[-1][0] == "response.incomplete" and last["output"][0]["content"][0]["text"] == made["output"][0]["content"][0]["text"]
    assert seen["unkeyed"].status_code == 401


def test_the_conversation_routes():
    async def body(h):
        async with proxy(h) as (client, _, _):
            made = (await client.post("/v1/conversations", json={"items": [{"type": "message", "role": "user", "content": "I live in Lisbon."}]})).json()
            path = f"/v1/conversations/{made['id']}"
            seen = {
                "made": made, "empty_body": (await client.post("/v1/conversations")).json(), "got": (await client.get(path)).json(),
                "added": (await client.post(path + "/items", json={"items": [{"type": "message", "role": "user", "content": "Hi."}]})).json(),
                "items": (await client.get(path + "/items")).json(),
                "answer": await client.post("/v1/responses", json={**ASK, "conversation": made["id"]}),
                "deleted": (await client.delete(path)).json(), "after": await client.get(path),
                "no_items": await client.post(path + "/items", json={}),
            }
            await settle(h.sessions)
            return seen

    seen = run(body)
    made = seen["made"]
    assert made["object"] == "conversation" and seen["empty_body"]["object"] == "conversation" and seen["got"] == made
    assert [item["content"][0]["text"] for item in seen["added"]["data"]] == ["Hi."]
    assert [item["content"][0]["text"] for item in seen["items"]["data"]] == ["I live in Lisbon.", "Hi."]
    assert seen["answer"].status_code == 200 and seen["answer"].json()["conversation"]["id"] == made["id"]
    assert seen["deleted"] == {"id": made["id"], "object": "conversation.deleted", "deleted": True}
    assert seen["after"].status_code == 404 and seen["after"].json()["error"]["code"] == "conversation_not_found"
    assert seen["no_items"].status_code == 400 and seen["no_items"].json()["error"]["param"] == "items"  # the body is read first

"""``memt_proxy.http.admin_routes`` over the session harness (the proxy's whole app, called in-process): a session
inspected, saved to a snapshot under the tenant's own name, reset, restored from it and closed, each action answered in
its route's shape; an unknown session or a body with an unknown field refused."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session"))  # the session harness

from memt_proxy.session.sessions import native_session_id  # noqa: E402
from session_harness import committed_session, proxy, run  # noqa: E402

H1 = "1" * 64
SESSION = "/v1/memt/sessions/chat-1"


def test_a_session_is_inspected_saved_reset_restored_and_closed(tmp_path):
    async def body(h):
        await committed_session(h.sessions, "default", "chat-1", [5, 6, 7], [H1])
        native = native_session_id("default", "chat-1")
        async with proxy(h) as (client, _, _):
            seen = {"inspect": (await client.get(SESSION)).json()}
            seen["save"] = (await client.post(SESSION + "/snapshots", json={"name": "mine.safetensors"})).json()
            seen["unnamed"] = (await client.post(SESSION + "/snapshots")).json()  # no body: a fresh name
            seen["reset"] = (await client.post(SESSION + "/reset")).json()
            seen["emptied"] = h.memory(native)
            seen["restore"] = (await client.post(SESSION + "/restore", json={"name": "mine.safetensors"})).json()
            seen["restored"] = h.memory(native)
            seen["unknown_field"] = await client.post(SESSION + "/snapshots", json={"name": "x.safetensors", "color": "red"})
            seen["close"] = (await client.delete(SESSION)).json()
            seen["closed"] = h.memory(native)
            seen["gone"] = await client.get(SESSION)
        return seen

    seen = run(body, state=tmp_path)
    inspected = seen["inspect"]
    assert inspected["session"] == "chat-1" and inspected["native"]["published_version"] == 1 and inspected["committed_messages"] == 1
    assert seen["save"] == {"snapshot": "mine.safetensors"} and seen["unnamed"]["snapshot"].startswith("snapshot-")
    assert seen["reset"] == {"reset": True} and seen["emptied"] == ()
    assert seen["restore"] == {"restored": "mine.safetensors"} and seen["restored"] == (5, 6, 7)
    assert seen["unknown_field"].status_code == 400 and seen["unknown_field"].json()["error"]["param"] == "color"
    assert seen["close"] == {"closed": True} and seen["closed"] is None
    assert seen["gone"].status_code == 404

"""``memt_proxy.responses.stored`` on the session harness: a stored response read, its input items paged and deleted
(its thread goes on), each only under its own tenant; a conversation created with items, read, its items listed and
added to (sent with its next response), and deleted with its memory (its session closed upstream)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session"))  # the session harness

from memt_proxy.errors import ProxyError  # noqa: E402
from memt_proxy.responses.protocol import ConversationRequest, ResponseRequest  # noqa: E402
from memt_proxy.session.sessions import native_session_id  # noqa: E402
from session_harness import asked, run, settle, surfaces  # noqa: E402

SAY = [{"type": "message", "role": "user", "content": "I live in Lisbon."}, {"type": "message", "role": "user", "content": "Hi."}]


def refused(call) -> tuple[int, str]:
    with pytest.raises(ProxyError) as refusal:
        call()
    return refusal.value.status, refusal.value.code


def test_a_stored_response_is_read_paged_and_deleted_under_its_own_tenant():
    async def body(h):
        _, responses = surfaces(h)
        stored = responses.stored
        answer = await responses.create(*asked(ResponseRequest.model_validate({"model": "m", "input": SAY, "max_output_tokens": 4})))
        unstored = await responses.create(*asked(ResponseRequest.model_validate({"model": "m", "input": "Hi.", "store": False, "max_output_tokens": 4})))
        seen = dict(
            got=stored.get("t", answer["id"]) == answer,
            first=stored.input_items("t", answer["id"], after=None, limit=1, order="asc"),
            last=stored.input_items("t", answer["id"], after=None, limit=1, order="desc"),
            other_tenant=refused(lambda: stored.get("u", answer["id"])),
            unstored=refused(lambda: stored.get("t", unstored["id"])),
            deleted=stored.delete("t", answer["id"]),
            after=refused(lambda: stored.get("t", answer["id"])),
        )
        await settle(h.sessions)
        return seen, answer

    seen, answer = run(body)
    assert seen["got"]
    assert [i["content"][0]["text"] for i in seen["first"]["data"]] == ["I live in Lisbon."] and seen["first"]["has_more"]
    assert [i["content"][0]["text"] for i in seen["last"]["data"]] == ["Hi."]
    assert seen["other_tenant"] == seen["unstored"] == seen["after"] == (404, "response_not_found")
    assert seen["deleted"] == {"id": answer["id"], "object": "response.deleted", "deleted": True}


def test_a_conversation_is_created_read_added_to_and_deleted_with_its_memory():
    async def body(h):
        _, responses = surfaces(h)
        stored = responses.stored
        made = stored.create_conversation("t", ConversationRequest.model_validate({"items": SAY[:1], "metadata": {"app": "x"}}))
        added = await stored.add_items("t", made["id"], [{"type": "message", "role": "user", "content": "And you?"}])
        items = stored.conversation_items("t", made["id"], after=None, limit=10, order="asc")
        thread = responses.records.thread("t", made["id"])
        uncommitted = list(thread.uncommitted)
        await responses.create(*asked(ResponseRequest.model_validate({"model": "m", "input": "Hi.", "conversation": made["id"], "max_output_tokens": 4})))
        await settle(h.sessions)
        native = native_session_id("t", thread.session)
        upstream = h.native(native) is not None
        other = refused(lambda: stored.conversation("u", made["id"]))
        deleted = await stored.delete_conversation("t", made["id"])
        return made, stored, added, items, uncommitted, upstream, other, deleted, h.native(native)

    made, stored, added, items, uncommitted, upstream, other, deleted, native_after = run(body)
    assert made["object"] == "conversation" and made["metadata"] == {"app": "x"}
    assert [i["content"][0]["text"] for i in added["data"]] == ["And you?"]
    assert [i["content"][0]["text"] for i in items["data"]] == ["I live in Lisbon.", "And you?"]
    assert uncommitted == [{"role": "user", "content": "I live in Lisbon."}, {"role": "user", "content": "And you?"}]  # sent with the next response
    assert upstream and other == (404, "conversation_not_found")
    assert deleted == {"id": made["id"], "object": "conversation.deleted", "deleted": True} and native_after is None
    assert refused(lambda: stored.conversation("t", made["id"])) == (404, "conversation_not_found")

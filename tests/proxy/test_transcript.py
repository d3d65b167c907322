"""Transcript trimming: message hashing and splitting a resent transcript against committed hashes."""

from __future__ import annotations

import json

import pytest

from memt_proxy.errors import ProxyError
from memt_proxy.protocol import Message
from memt_proxy.transcript import _canonical, overlap, as_dict, message_hash, split_transcript


def msgs(*pairs) -> list[Message]:
    """("user", "hi"), ("assistant", "yo"), ... → Messages."""
    return [Message.model_validate({"role": role, "content": content}) for role, content in pairs]


def hashes(messages: list[Message]) -> list[str]:
    return [message_hash(m) for m in messages]


def call_message(arguments: str = '{"city": "Paris"}', call_id: str = "call_1", content=None) -> Message:
    return Message.model_validate({
        "role": "assistant", "content": content,
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}],
    })


def tool_result(call_id: str = "call_1", content: str = '{"temperature": 20}') -> Message:
    return Message.model_validate({"role": "tool", "tool_call_id": call_id, "content": content})


# ---------------------------------------------------------------------- hashing


def test_hash_is_by_meaning():
    base = message_hash(Message(role="user", content="Hello there"))
    assert base == message_hash(Message(role="user", content="  Hello there\n"))  # outer whitespace
    assert base == message_hash(Message(role="user", content=[{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]))
    assert base == message_hash({"role": "user", "content": "Hello there"})  # dicts hash like Messages
    assert base == message_hash(Message(role="user", content="Hello there", name="alice"))  # user names are not meaning here
    assert base != message_hash(Message(role="user", content="Hello  there"))
    assert base != message_hash(Message(role="assistant", content="Hello there"))
    assert base != message_hash(Message(role="system", content="Hello there"))
    assert len(base) == 64 and int(base, 16) >= 0


def test_hash_of_assistant_none_and_empty_content_agree():
    assert message_hash(Message(role="assistant", content=None)) == message_hash(Message(role="assistant", content=""))


def test_hash_of_tool_calls():
    one = message_hash(call_message('{"city": "Paris"}'))
    assert one == message_hash(call_message('{ "city" :"Paris" }'))  # arguments compared as JSON
    assert one == message_hash(call_message('{"city": "Paris"}', call_id="call_other"))  # call ids are not content
    assert one == message_hash(call_message('{"city": "Paris"}', content=""))
    assert one != message_hash(call_message('{"city": "Rome"}'))
    assert one != message_hash(Message(role="assistant", content=""))
    # arguments that are not JSON still hash (as text)
    assert message_hash(call_message("not json")) != message_hash(call_message("not  json"))
    # a tool result is identified by its call id and content
    assert message_hash(tool_result("call_1")) != message_hash(tool_result("call_2"))
    assert message_hash(tool_result("call_1", "a")) != message_hash(tool_result("call_1", "b"))


def test_hash_is_stable_across_versions():
    """Session records on disk hold these hashes: the canonical form must never change (pinned values)."""
    assert message_hash(Message(role="user", content="Hello there")) == "f85bb73b8185adc28015decfe67d84309704b28ba1dde991dd6bd956d0b39f07"
    tool = {"role": "tool", "tool_call_id": "call_1", "content": ' 20 °C, "sunny"\\n\u2028 ☀ \U0001F600'}
    assert message_hash(tool) == "54a077fd0ffe4d9ad09cafa05b54ed74ab5b32fa33d4808bad716b459d8f2eec"


@pytest.mark.parametrize("content", ["plain", ' quotes " and \\ backslash ', "tab\tnew\nline\x00\x7f", "é ☀ \U0001F600 \u2028\u00a0", "", None])
@pytest.mark.parametrize("role", ["user", "assistant", "tool", "system"])
def test_direct_canonical_text_is_json_dumps(role, content):
    """The canonical text written directly (messages without tool calls) is exactly what json.dumps writes."""
    for call_id in (None, "call_1", 'odd "id"'):
        data = {"role": role, "content": content, "tool_call_id": call_id}
        canonical = {"role": role, "content": (content or "").strip(), "tool_calls": [], "tool_call_id": call_id if role == "tool" else None}
        assert _canonical(data) == json.dumps(canonical, sort_keys=True, ensure_ascii=False)


def test_as_dict_shapes():
    assert as_dict(call_message()) == {
        "role": "assistant", "content": "",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
    }
    named_tool = Message.model_validate({"role": "tool", "tool_call_id": "c", "name": "get_weather", "content": [{"type": "text", "text": "r"}]})
    assert as_dict(named_tool) == {"role": "tool", "content": "r", "tool_call_id": "c", "name": "get_weather"}
    assert as_dict(Message(role="user", content="x", name="bob")) == {"role": "user", "content": "x"}


# ---------------------------------------------------------------------- splitting


CONVERSATION = msgs(("user", "u1"), ("assistant", "a1"), ("user", "u2"), ("assistant", "a2"), ("user", "u3"))


def test_fresh_session_sends_everything_as_context():
    split = split_transcript(CONVERSATION, [])
    assert split.committed == 0 and split.instructions is None
    assert [m.content for m in split.context] == ["u1", "a1", "u2", "a2"]
    assert [m.content for m in split.turn] == ["u3"]


def test_committed_prefix_is_trimmed():
    split = split_transcript(CONVERSATION, hashes(CONVERSATION[:4]))
    assert split.committed == 4 and split.context == [] and [m.content for m in split.turn] == ["u3"]
    # only the first turn committed (e.g. the second was truncated): it stays as context
    split = split_transcript(CONVERSATION, hashes(CONVERSATION[:2]))
    assert split.committed == 2 and [m.content for m in split.context] == ["u2", "a2"]


def test_app_that_dropped_old_messages_still_matches():
    committed = hashes(msgs(("user", "u0"), ("assistant", "a0"))) + hashes(CONVERSATION[:4])
    split = split_transcript(CONVERSATION, committed)
    assert split.committed == 4 and split.context == []
    # a sliding window that kept only the last exchange
    split = split_transcript(CONVERSATION[2:], committed)
    assert split.committed == 2 and split.context == []


def testoverlap_is_the_longest_match():
    """The longest run of incoming messages that ends what was committed, also among repeated messages."""
    assert overlap(list("abab" "c"), list("abab")) == 4
    assert overlap(list("ab"), list("abab")) == 2  # a window of the last exchange
    assert overlap(list("abx"), list("abab")) == 2
    assert overlap(list("aaab"), list("aaa")) == 3
    assert overlap(list("aab"), list("aaa")) == 2
    assert overlap(list("ba"), list("abab")) == 1 and overlap(list("ca"), list("abab")) == 0
    assert overlap([], list("ab")) == 0 and overlap(list("ab"), []) == 0


def test_instructions_are_separated_and_never_matched():
    transcript = msgs(("system", "Be brief."), ("developer", "Use English.")) + CONVERSATION
    split = split_transcript(transcript, hashes(CONVERSATION[:4]))
    assert split.instructions == "Be brief.\n\nUse English."
    assert split.committed == 4 and split.context == []
    # a system message in the middle of the conversation is still an instruction
    mixed = CONVERSATION[:2] + msgs(("system", "Now answer in French.")) + CONVERSATION[2:]
    split = split_transcript(mixed, hashes(CONVERSATION[:4]))
    assert split.instructions == "Now answer in French." and split.committed == 4


def test_edited_history_diverges():
    committed = hashes(CONVERSATION[:4])
    for edited in (
        msgs(("user", "u1 edited"), ("assistant", "a1"), ("user", "u2"), ("assistant", "a2"), ("user", "u3")),
        msgs(("user", "u1"), ("assistant", "a1"), ("user", "u2"), ("assistant", "a2 edited"), ("user", "u3")),
        msgs(("user", "another"), ("assistant", "conversation"), ("user", "u3")),
    ):
        with pytest.raises(ProxyError) as info:
            split_transcript(edited, committed)
        assert info.value.status == 409 and info.value.code == "transcript_diverged" and info.value.param == "messages"
        assert info.value.type == "conflict"


def test_new_messages_only_never_diverge():
    committed = hashes(CONVERSATION[:4])
    split = split_transcript(msgs(("user", "just the new question")), committed)
    assert split.committed == 0 and split.context == [] and len(split.turn) == 1


def test_unknown_history_is_not_guessed():
    # a session whose memory this proxy never saw (adopted): earlier messages cannot be trusted
    with pytest.raises(ProxyError) as info:
        split_transcript(CONVERSATION, [], history_known=False)
    assert info.value.code == "transcript_diverged"
    assert split_transcript(CONVERSATION[-1:], [], history_known=False).turn == CONVERSATION[-1:]


def test_matching_is_by_content_not_position():
    # same number of messages as committed, different content: no trimming by count
    committed = hashes(msgs(("user", "x1"), ("assistant", "y1")))
    with pytest.raises(ProxyError):
        split_transcript(msgs(("user", "u1"), ("assistant", "a1"), ("user", "u2")), committed)


def test_turn_with_tool_rounds():
    transcript = msgs(("user", "u1"), ("assistant", "a1"), ("user", "weather?")) + [call_message(), tool_result()]
    split = split_transcript(transcript, hashes(transcript[:2]))
    assert split.committed == 2 and split.context == []
    assert [m.role for m in split.turn] == ["user", "assistant", "tool"]


def test_pending_tool_call_followed_by_user_message_is_refused():
    transcript = msgs(("user", "weather?")) + [call_message()] + msgs(("user", "never mind"))
    with pytest.raises(ProxyError) as info:
        split_transcript(transcript, [])
    assert info.value.status == 400 and info.value.code == "tool_results_missing" and "call_1" in info.value.message
    # one of two parallel calls unanswered
    two = Message.model_validate({"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}},
    ]})
    with pytest.raises(ProxyError) as info:
        split_transcript(msgs(("user", "go")) + [two, tool_result("a")], [])
    assert info.value.code == "tool_results_missing" and "'b'" in info.value.message
    # an unanswered call earlier in the history is refused too
    with pytest.raises(ProxyError):
        split_transcript(msgs(("user", "w")) + [call_message()] + msgs(("assistant", "x"), ("user", "y")), [])


@pytest.mark.parametrize("transcript", [
    msgs(("system", "only instructions")),
    msgs(("assistant", "hello")),
    msgs(("user", "hi"), ("assistant", "ends with the assistant")),
])
def test_structure_is_checked(transcript):
    with pytest.raises(ProxyError) as info:
        split_transcript(transcript, [])
    assert info.value.status == 400 and info.value.param == "messages"


@pytest.mark.parametrize("arguments", ["[" * 3000 + "]" * 3000, "1" + "0" * 5000, json.dumps("\ud800 alone")],
                         ids=["nested-3000", "5000-digits", "lone-surrogate"])
def test_tool_call_arguments_python_cannot_read_back_are_hashed_as_text(arguments):
    """Each once made a session request with such a call in its history answer 500 (issue 38)."""
    def call(text: str) -> dict:
        return {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": text}}]}

    assert message_hash(call(arguments)) == message_hash(call(arguments))
    assert message_hash(call(arguments)) != message_hash(call(json.dumps("other")))
    assert message_hash(call('{"a": 1}')) == message_hash(call('{"a":1}'))  # readable JSON is still compared parsed

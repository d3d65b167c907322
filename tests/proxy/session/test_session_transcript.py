"""Transcript trimming: message hashing and splitting a resent transcript against committed hashes."""

from __future__ import annotations

import json

import pytest

from memt_proxy.errors import ProxyError
from memt_proxy.protocol import Message
from memt_proxy.session.transcript import LEGACY, _legacy_canonical, _rendered, as_dict, legacy_message_hash, message_hash, overlap, split_transcript


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


def test_hash_keys_on_the_text_the_template_reads():
    base = message_hash(Message(role="user", content="Hello there"))
    assert base != message_hash(Message(role="user", content="  Hello there\n"))  # outer whitespace is text the model reads
    assert base != message_hash(Message(role="user", content="Hello there "))
    assert base == message_hash(Message(role="user", content=[{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]))
    assert base == message_hash({"role": "user", "content": "Hello there"})  # dicts hash like Messages
    assert base == message_hash(Message(role="user", content="Hello there", name="alice"))  # no template reads a user's name
    assert base != message_hash(Message(role="user", content="Hello  there"))
    assert base != message_hash(Message(role="assistant", content="Hello there"))
    assert base != message_hash(Message(role="system", content="Hello there"))
    assert len(base) == 64 and int(base, 16) >= 0


def test_hash_of_assistant_none_and_empty_content_agree():
    assert message_hash(Message(role="assistant", content=None)) == message_hash(Message(role="assistant", content=""))


def test_hash_of_tool_calls():
    one = message_hash(call_message('{"city": "Paris"}'))
    assert one != message_hash(call_message('{ "city" :"Paris" }'))  # the arguments string is written verbatim
    assert one == message_hash(call_message('{"city": "Paris"}', call_id="call_other"))  # call ids are not rendered
    assert one == message_hash(call_message('{"city": "Paris"}', content=""))
    assert one != message_hash(call_message('{"city": "Rome"}'))
    assert one != message_hash(Message(role="assistant", content=""))
    two = message_hash(call_message('{"city": "Paris", "unit": "C"}'))
    assert two != message_hash(call_message('{"unit": "C", "city": "Paris"}'))  # reordered keys
    assert one != message_hash(call_message('{"city": "Rome", "city": "Paris"}'))  # a duplicate key
    assert message_hash(call_message("not json")) != message_hash(call_message("not  json"))
    # a tool result is identified by its content, the text the model reads (its call id is not rendered)
    assert message_hash(tool_result("call_1")) == message_hash(tool_result("call_2"))
    assert message_hash(tool_result("call_1", "a")) != message_hash(tool_result("call_1", "b"))
    assert message_hash(tool_result("call_1", "a")) != message_hash(tool_result("call_1", "a\n"))


def test_hash_is_stable_across_versions():
    """Session records on disk hold these hashes: a scheme's canonical form must never change (pinned values)."""
    assert message_hash(Message(role="user", content="Hello there")) == "4854c31d83b7eba2c455a4da6d484cabe3fb20a0592ad7372e2a91a587e5c485"
    tool = {"role": "tool", "tool_call_id": "call_1", "content": ' 20 °C, "sunny"\\n\u2028 ☀ \U0001F600'}
    assert message_hash(tool) == "e8b91a0aa7015eccf60d39ff325e5ded886aca354b66f423fae8ab5478be8372"
    call = call_message('{"b": 1, "a": 2}', call_id="c")
    call.tool_calls[0].function.name = "f"
    assert message_hash(call) == "9ada58b573b205c8d94f7320d8ecb052a2975a4eeacf9a6bec81e2569e277902"
    # scheme 1, as records written before scheme 2 hold them
    assert legacy_message_hash(Message(role="user", content="Hello there")) == "f85bb73b8185adc28015decfe67d84309704b28ba1dde991dd6bd956d0b39f07"
    assert legacy_message_hash(Message(role="user", content=" Hello there\n")) == "f85bb73b8185adc28015decfe67d84309704b28ba1dde991dd6bd956d0b39f07"
    assert legacy_message_hash(tool) == "54a077fd0ffe4d9ad09cafa05b54ed74ab5b32fa33d4808bad716b459d8f2eec"


@pytest.mark.parametrize("content", ["plain", ' quotes " and \\ backslash ', "tab\tnew\nline\x00\x7f", "é ☀ \U0001F600 \u2028\u00a0", "", None])
@pytest.mark.parametrize("role", ["user", "assistant", "tool", "system"])
def test_direct_canonical_text_is_json_dumps(role, content):
    """The canonical texts written directly (messages without tool calls) are exactly what json.dumps writes, and the
    two schemes' never meet (an array, an object)."""
    for call_id in (None, "call_1", 'odd "id"'):
        data = {"role": role, "content": content, "tool_call_id": call_id}
        kept = call_id if role == "tool" else None
        assert _rendered(data) == json.dumps([role, content or "", []], ensure_ascii=False)
        legacy = {"role": role, "content": (content or "").strip(), "tool_calls": [], "tool_call_id": kept}
        assert _legacy_canonical(data) == json.dumps(legacy, sort_keys=True, ensure_ascii=False)
        assert _rendered(data)[0] == "[" and _legacy_canonical(data)[0] == "{"


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
    """Each once made a session request with such a call in its history answer 500 (issue 38); scheme 1 still reads them."""
    def call(text: str) -> dict:
        return {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": text}}]}

    for hashed in (message_hash, legacy_message_hash):
        assert hashed(call(arguments)) == hashed(call(arguments))
        assert hashed(call(arguments)) != hashed(call(json.dumps("other")))
    assert message_hash(call('{"a": 1}')) != message_hash(call('{"a":1}'))  # other text
    assert legacy_message_hash(call('{"a": 1}')) == legacy_message_hash(call('{"a":1}'))  # scheme 1 compared it parsed


# ---------------------------------------------------------------------- records of hash scheme 1


def legacy(messages) -> list[str]:
    """Hashes as a scheme-1 record holds them, read back (``memt_proxy.session.store`` tags them)."""
    return [LEGACY + legacy_message_hash(m) for m in messages]


def test_a_scheme_one_history_is_matched_once_by_its_scheme_and_rewritten_as_scheme_two():
    committed = legacy(CONVERSATION[:4])
    split = split_transcript(CONVERSATION, committed)
    assert split.committed == 4 and split.context == [] and [m.content for m in split.turn] == ["u3"]
    assert committed == hashes(CONVERSATION[:4])  # rewritten in place: the session's next record holds scheme 2
    # from then on, the text memory was matched with is the only one that matches
    loose = msgs(("user", " u1"), ("assistant", "a1"), ("user", "u2"), ("assistant", "a2"), ("user", "u3"))
    with pytest.raises(ProxyError) as info:
        split_transcript(loose, committed)
    assert info.value.code == "transcript_diverged"


def test_a_scheme_one_history_keeps_its_looseness_until_then():
    """What a scheme-1 record holds is known only by the loose hash: a whitespace variant of it still matches (as
    before the upgrade), once; nothing else does."""
    committed = legacy(CONVERSATION[:2])
    variant = msgs(("user", "u1\n"), ("assistant", " a1"), ("user", "u2"))
    assert split_transcript(variant, committed).committed == 2 and committed == hashes(variant[:2])
    committed = legacy(CONVERSATION[:2])
    with pytest.raises(ProxyError):
        split_transcript(msgs(("user", "u1 edited"), ("assistant", "a1"), ("user", "u2")), committed)
    assert committed == legacy(CONVERSATION[:2])  # a refused request rewrites nothing


def test_only_the_matched_scheme_one_entries_are_rewritten():
    dropped = legacy(msgs(("user", "u0"), ("assistant", "a0")))
    committed = dropped + legacy(CONVERSATION[:2]) + hashes(CONVERSATION[2:4])  # scheme 1, then turns since the upgrade
    split = split_transcript(CONVERSATION, committed)
    assert split.committed == 4 and split.context == []
    assert committed == dropped + hashes(CONVERSATION[:4])  # the app no longer sends u0/a0: they stay as read


def test_overlap_with_scheme_one_keys():
    assert overlap(list("abc"), ["L:a", "L:b", "c"], legacy=["L:a", "L:b", "L:c"]) == 3
    assert overlap(list("bc"), ["L:a", "L:b", "c"], legacy=["L:b", "L:c"]) == 2
    assert overlap(list("ab"), ["L:a", "L:b", "c"], legacy=["L:a", "L:b"]) == 0  # must end what was committed
    assert overlap(list("abc"), ["a", "L:b", "c"], legacy=["L:x", "L:y", "L:z"]) == 0
    assert overlap([], ["L:a"], legacy=[]) == 0

"""The prompt both surfaces build (``memt_proxy.prompt``, ``memt_proxy.worker``, ``session.transcript.continued_turn_ids``), on the tiny Nano checkpoint's chat format."""

from __future__ import annotations

import pytest

from memt_core.client.chat_format import load_chat_format, load_tokenizer
from memt_proxy.errors import ProxyError
from memt_proxy.session.sessions import PendingTurn
from memt_proxy.session.transcript import message_hash
from memt_proxy.prompt import check_prefill, forced_prefix, prompt_ids
from memt_proxy.session.transcript import continued_turn_ids

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]
QUESTION = {"role": "user", "content": "Weather in Oslo?"}
CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "sunny"}


@pytest.fixture(scope="module")
def chat_format(nano_checkpoint):
    return load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))[0]


def test_forced_prefix(chat_format):
    assert forced_prefix(chat_format, TOOLS, required=True, named=None) == chat_format.tool_call_prefix()
    assert forced_prefix(chat_format, TOOLS, required=False, named="get_weather") == chat_format.tool_call_prefix("get_weather")
    assert forced_prefix(chat_format, None, required=True, named="x") == "" == forced_prefix(chat_format, TOOLS, required=False, named=None)


def test_a_turn_continues_its_pending_tool_call_only_with_the_same_messages_and_tool_results(chat_format):
    pending = PendingTurn([message_hash(QUESTION), message_hash(CALL)], [7, 8, 9], thinking=False)
    expected = [7, 8, 9] + chat_format.tool_results_ids([{"tool_call_id": "c1", "content": "sunny"}], enable_thinking=False)
    assert continued_turn_ids(chat_format, pending, [QUESTION, CALL, RESULT]) == expected
    assert continued_turn_ids(chat_format, None, [QUESTION, CALL, RESULT]) is None
    other = {**QUESTION, "content": "Weather in Bergen?"}
    assert continued_turn_ids(chat_format, pending, [other, CALL, RESULT]) is None  # another turn's call
    assert continued_turn_ids(chat_format, pending, [QUESTION]) is None  # no results


def test_prompt_and_prefill_check(chat_format):
    prompt = prompt_ids(chat_format, "Be brief.", TOOLS, [1, 2], [3])
    assert prompt == chat_format.bos_ids + chat_format.system_ids("Be brief.", TOOLS) + [1, 2, 3]
    check_prefill(prompt, len(prompt), "messages")
    check_prefill(prompt, None, "messages")
    with pytest.raises(ProxyError) as info:
        check_prefill(prompt, len(prompt) - 1, "input")
    assert info.value.status == 400 and info.value.code == "context_length_exceeded" and info.value.param == "input"


def test_a_large_request_is_prepared_in_the_worker_thread_a_small_one_in_place():
    import asyncio
    import threading

    from memt_proxy.worker import OFF_LOOP_CHARS, off_loop

    def where(tag: str) -> tuple[str, str]:
        return tag, threading.current_thread().name

    async def both():
        return await off_loop(OFF_LOOP_CHARS, where, "small"), await off_loop(OFF_LOOP_CHARS + 1, where, tag="large")

    small, large = asyncio.run(both())
    assert small == ("small", threading.current_thread().name)
    assert large[0] == "large" and large[1].startswith("memt-prepare")


def test_text_that_cannot_fit_is_refused_before_tokenizing(chat_format):
    """The bound never refuses what fits (the real count is at least chars / longest entry), and refuses a text
    far too long for the limit from its length alone."""
    from memt_proxy.prompt import check_text_fits

    longest = max(map(len, chat_format.tokenizer.get_vocab()))
    text = "lorem ipsum dolor sit amet " * 400
    tokens = len(chat_format.tokenizer.encode(text, add_special_tokens=False))
    assert tokens >= len(text) // longest
    check_text_fits(chat_format, [{"role": "user", "content": text}], None, tokens, "messages")  # fits: no refusal
    huge = [{"role": "user", "content": [{"type": "text", "text": "x" * (longest * 1001)}]}]
    with pytest.raises(ProxyError) as info:
        check_text_fits(chat_format, huge, "system text", 1000, "messages")
    assert info.value.status == 400 and info.value.code == "context_length_exceeded" and "at least 1004 tokens" in info.value.message
    check_text_fits(chat_format, huge, None, None, "messages")  # no limit known: nothing refused


CONVERSATIONS = [
    [{"role": "user", "content": "x"}] * 40,
    [{"role": "user" if i % 2 == 0 else "assistant", "content": "x" * (i % 3)} for i in range(41)],
    [{"role": "system", "content": ""}, {"role": "developer", "content": "be brief"}, QUESTION, CALL, RESULT, RESULT, {"role": "user", "content": "and now?"}],
    [{"role": "system", "content": "s"}] * 5 + [{"role": "user", "content": [{"type": "text", "text": "a b c"}]}],
    [QUESTION, {"role": "assistant", "content": "lorem ipsum " * 30}, {"role": "user", "content": "\n\n\n  tabs\t and 中文 "}],
]


@pytest.mark.parametrize("family", ["nano", "flash"])
def test_the_template_cost_never_exceeds_a_real_prompt(family, nano_checkpoint, flash_checkpoint):
    """``check_text_fits``'s bound counts the template's tokens per message (issue 48: 90,000 one-character
    messages were templated and tokenized whole, 4 s and 440 MB, before a refusal) and never refuses a prompt
    that fits: on every conversation of a grid, of both families, the bound is at most the real prompt."""
    from memt_proxy.prompt import check_text_fits, template_cost

    path = nano_checkpoint if family == "nano" else flash_checkpoint
    chat_format = load_chat_format(path, tokenizer=load_tokenizer(path))[0]
    cost = template_cost(chat_format)
    assert cost.controls["user"] >= 1  # the template's own turn markers are counted
    for messages in CONVERSATIONS:
        for instructions in (None, "Be brief."):
            body = ([{"role": "system", "content": instructions}] if instructions else []) + messages
            real = len(chat_format.conversation_ids(body))
            assert cost.least_tokens(messages, instructions) <= real, messages[:3]
            check_text_fits(chat_format, messages, instructions, real, "messages")  # fits exactly: not refused
    tiny = [{"role": "user", "content": "x"}] * 9000
    with pytest.raises(ProxyError) as info:
        check_text_fits(chat_format, tiny, None, 9000 * cost.controls["user"] - 1, "messages")
    assert info.value.code == "context_length_exceeded" and "9000 messages" in info.value.message
    with pytest.raises(ProxyError) as info:  # more messages than tokens: refused from the count alone
        check_text_fits(chat_format, tiny, None, 8999, "messages")
    assert "has 9000 messages" in info.value.message


def test_the_output_limit_fits_the_context_beside_the_prompt():
    """No limit asked: the default, or what the context leaves beside the prompt; a limit asked that cannot fit, or a
    prompt that leaves no room: 400 context_length_exceeded naming both counts and the field."""
    from memt_core.sampling_params import DEFAULT_MAX_NEW_TOKENS
    from memt_proxy.prompt import fit_output

    def fitted(prompt: int, requested, context, **sampling) -> dict:
        fit_output(sampling, [0] * prompt, requested, context, param="max_tokens", prompt_param="messages")
        return sampling

    assert fitted(10, None, None)["max_new_tokens"] == DEFAULT_MAX_NEW_TOKENS  # an upstream that states no context length
    assert fitted(10, None, 100_000)["max_new_tokens"] == DEFAULT_MAX_NEW_TOKENS
    assert fitted(4000, None, 4096)["max_new_tokens"] == 96  # never fails for a limit it did not set
    assert fitted(4000, 96, 4096, min_new_tokens=200) == {"max_new_tokens": 96, "min_new_tokens": 96}
    for prompt, requested, param in ((4000, 97, "max_tokens"), (4096, None, "messages"), (10342, None, "messages")):
        with pytest.raises(ProxyError) as info:
            fitted(prompt, requested, 4096)
        error = info.value
        assert (error.status, error.code, error.param) == (400, "context_length_exceeded", param)
        assert "4096" in error.message and str(prompt) in error.message


def test_a_pending_turn_of_a_scheme_one_record_continues_by_its_scheme(chat_format):
    """A turn waiting for tool results when the proxy was upgraded: its record's hashes (scheme 1, read back tagged)
    match the resent messages by the old function; other messages still do not continue it."""
    from memt_proxy.session.transcript import LEGACY, legacy_message_hash

    pending = PendingTurn([LEGACY + legacy_message_hash(QUESTION), LEGACY + legacy_message_hash(CALL)], [7, 8, 9], thinking=False)
    expected = [7, 8, 9] + chat_format.tool_results_ids([{"tool_call_id": "c1", "content": "sunny"}], enable_thinking=False)
    assert continued_turn_ids(chat_format, pending, [QUESTION, CALL, RESULT]) == expected
    assert continued_turn_ids(chat_format, pending, [{**QUESTION, "content": "Weather in Bergen?"}, CALL, RESULT]) is None
    mixed = PendingTurn([LEGACY + legacy_message_hash(QUESTION), message_hash(CALL)], [7], thinking=False)
    assert continued_turn_ids(chat_format, mixed, [QUESTION, CALL, RESULT]) is not None
    assert continued_turn_ids(chat_format, PendingTurn([message_hash(CALL)], [7], False), [QUESTION, CALL, RESULT]) is None

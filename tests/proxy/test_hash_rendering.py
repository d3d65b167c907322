"""``message_hash`` against the rendering itself: two messages hash alike exactly when the model reads the same tokens
for them. Each pair below differs in one thing a client may change (surrounding whitespace, argument key order, a
duplicate key, spacing, ids, names); both are rendered in the same conversation by the chat formats of this
project and the ids (Nano: the tiny checkpoint's and the bundled demo model's template) or the text (Flash's
``encoding_dsv4.py``) compared with what the hashes say."""

from __future__ import annotations

from pathlib import Path

import pytest

import memt_core.templates
from memt_core.client.chat_format import load_chat_format, load_encoder, load_tokenizer
from memt_demo import BUNDLED_MODEL
from memt_proxy.protocol import Message
from memt_proxy.session.transcript import as_dict, message_hash

QUESTION = {"role": "user", "content": "Weather?"}


def call(arguments: str, call_id: str = "c1", content=None) -> dict:
    return {"role": "assistant", "content": content, "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]}


def result(content: str, call_id: str = "c1", name: str | None = None) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": content, **({"name": name} if name else {})}


# (the messages before, one message, another): the pair is rendered after the same messages
PAIRS = {
    "user-outer-whitespace": ([], {"role": "user", "content": "Hello there"}, {"role": "user", "content": "  Hello there\n"}),
    "user-trailing-newline": ([], {"role": "user", "content": "Hello"}, {"role": "user", "content": "Hello\n"}),
    "user-inner-whitespace": ([], {"role": "user", "content": "Hello there"}, {"role": "user", "content": "Hello  there"}),
    "user-text-parts": ([], {"role": "user", "content": "Hello there"}, {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]}),
    "user-name": ([], {"role": "user", "content": "Hello"}, {"role": "user", "content": "Hello", "name": "alice"}),
    "assistant-outer-whitespace": ([QUESTION], {"role": "assistant", "content": "Sunny."}, {"role": "assistant", "content": " Sunny.\n\n"}),
    "assistant-none-or-empty": ([QUESTION], {"role": "assistant", "content": None}, {"role": "assistant", "content": ""}),
    "arguments-reordered": ([QUESTION], call('{"city": "Oslo", "unit": "C"}'), call('{"unit": "C", "city": "Oslo"}')),
    "arguments-duplicate-key": ([QUESTION], call('{"city": "Oslo", "city": "Rome"}'), call('{"city": "Rome"}')),
    "arguments-spacing": ([QUESTION], call('{"city": "Oslo"}'), call('{"city":"Oslo"}')),
    "arguments-value": ([QUESTION], call('{"city": "Oslo"}'), call('{"city": "Rome"}')),
    "call-id": ([QUESTION], call('{"city": "Oslo"}', "c1"), call('{"city": "Oslo"}', "c2")),
    "call-content-none-or-empty": ([QUESTION], call("{}", content=None), call("{}", content="")),
    "result-outer-whitespace": ([QUESTION, call("{}")], result("sunny"), result(" sunny\n")),
    "result-call-id": ([QUESTION, call("{}")], result("sunny", "c1"), result("sunny", "c2")),
    "result-name": ([QUESTION, call("{}")], result("sunny"), result("sunny", name="get_weather")),
}

#: pairs that Flash's encoder renders alike although their text differs: it parses the arguments and writes them
#: again. They hash apart (one rule for every format: the arguments string as sent), which only costs a longer prompt.
FLASH_REWRITES = {"arguments-duplicate-key", "arguments-spacing"}


def rendered_as_the_proxy_gives_it(before: list[dict], message: dict) -> list[dict]:
    """The conversation as the proxy hands it to a chat format (``as_dict`` of the request's messages)."""
    return [as_dict(Message.model_validate(m)) for m in [*before, message]]


@pytest.fixture(scope="module", params=["tiny-nano", "bundled-demo"])
def nano_format(request, nano_checkpoint):
    path = nano_checkpoint if request.param == "tiny-nano" else BUNDLED_MODEL
    return load_chat_format(path, tokenizer=load_tokenizer(path))[0]


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_nano_templates_read_the_same_tokens_exactly_when_the_hashes_agree(nano_format, pair):
    before, one, other = PAIRS[pair]
    same_tokens = nano_format.history_ids(rendered_as_the_proxy_gives_it(before, one)) == nano_format.history_ids(rendered_as_the_proxy_gives_it(before, other))
    same_hash = message_hash(Message.model_validate(one)) == message_hash(Message.model_validate(other))
    assert same_hash == same_tokens, (pair, same_hash, same_tokens)
    assert message_hash(one) == message_hash(Message.model_validate(one))  # the dicts the proxy hashes itself agree


def test_the_whitespace_and_argument_pairs_are_other_tokens_for_nano(nano_format):
    """The probe's cases, named: the template keeps surrounding whitespace and writes the arguments string as it is."""
    for pair in ("user-outer-whitespace", "assistant-outer-whitespace", "result-outer-whitespace", "arguments-reordered", "arguments-duplicate-key"):
        before, one, other = PAIRS[pair]
        assert nano_format.history_ids(rendered_as_the_proxy_gives_it(before, one)) != nano_format.history_ids(rendered_as_the_proxy_gives_it(before, other)), pair
        assert message_hash(one) != message_hash(other), pair


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_flash_encoder_reads_the_same_text_whenever_the_hashes_agree(pair):
    encoder = load_encoder(Path(memt_core.templates.__file__).parent / "encoding_dsv4.py")
    before, one, other = PAIRS[pair]

    def text(message: dict) -> str:
        return encoder.encode_messages(rendered_as_the_proxy_gives_it(before, message), thinking_mode="chat", add_default_bos_token=False)

    same_text, same_hash = text(one) == text(other), message_hash(one) == message_hash(other)
    if same_hash:
        assert same_text, pair  # never a state for other text
    else:
        assert same_text == (pair in FLASH_REWRITES), pair

"""``IncrementalDecoder`` against its reference ``decode_all``: same text, token by token, on real tokenizers.

Covers the tiny Nano and Flash tokenizers and the bundled demo model's, random token ids (special
tokens included, skipped or not), and text whose characters span several tokens (accents, CJK, emoji).
"""

from __future__ import annotations

import random

import pytest
from transformers import PreTrainedTokenizerFast

from memt_core.bundled import BUNDLED_MODEL
from memt_core.detokenize import IncrementalDecoder, decode_all

TEXTS = [
    "Hello, world! My kitten Mémé loves 🦐 shrimp.",
    "東京タワーに行きました。 Then we ate crêpes — délicieux!",
    "  leading spaces,\ttabs\nand newlines\n\n",
    "🧑‍🚀👩🏽‍🔬 emoji sequences and ∑ maths ≤ ∞",
]


@pytest.fixture(params=["nano", "flash", "demo"])
def tokenizer(request, nano_checkpoint, flash_checkpoint):
    path = {"nano": nano_checkpoint, "flash": flash_checkpoint, "demo": BUNDLED_MODEL}[request.param]
    return PreTrainedTokenizerFast.from_pretrained(str(path))


def stream(tokenizer, ids, skip):
    decoder = IncrementalDecoder(tokenizer, skip_special_tokens=skip)
    pieces = [decoder.push(token) for token in ids]
    pieces.append(decoder.flush())
    assert "".join(pieces) == decoder.text
    return decoder.text


@pytest.mark.parametrize("text", TEXTS)
def test_text_streams_equal_the_full_decode(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    for skip in (False, True):
        assert stream(tokenizer, ids, skip) == decode_all(tokenizer, ids, skip_special_tokens=skip)


@pytest.mark.parametrize("seed", range(6))
def test_random_ids_stream_equal_the_full_decode(tokenizer, seed):
    rng = random.Random(seed)
    ids = [rng.randrange(len(tokenizer)) for _ in range(300)]
    for skip in (False, True):
        assert stream(tokenizer, ids, skip) == decode_all(tokenizer, ids, skip_special_tokens=skip)


def test_incomplete_characters_are_held_until_complete(tokenizer):
    ids = tokenizer.encode("🦐", add_special_tokens=False)
    decoder = IncrementalDecoder(tokenizer)
    emitted = [decoder.push(token) for token in ids]
    assert "\ufffd" not in "".join(emitted) and "".join(emitted) + decoder.flush() == "🦐"

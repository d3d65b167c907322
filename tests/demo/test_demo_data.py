"""The demo model's synthetic data and its token conventions (no trained model needed).

The conventions are the ones the client and proxy use: a query prompt is the chat template with a
generation prompt; a committed turn is its user message's prompt followed by the generated ids; tool
calls are written exactly as the template renders them; documents are raw text in chunk_tokens pieces.
"""

from __future__ import annotations

import json
import random

import pytest

from memt_demo import episodes as ep
from memt_demo.facts import acknowledgement, fill, statement_message
from memt_demo import tool_turns
from memt_demo import pools
from memt_demo.format import DemoChatFormat, Segment


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from memt_demo.train import ModelShape, build_demo_tokenizer

    return build_demo_tokenizer(tmp_path_factory.mktemp("demo-tokenizer"), vocab_size=ModelShape().vocab_size)


@pytest.fixture(scope="module")
def fmt(tokenizer):
    return DemoChatFormat(tokenizer, value_weight=3.0)


def test_sampler_is_reproducible():
    a, b = ep.EpisodeSampler(7), ep.EpisodeSampler(7)
    for _ in range(50):
        x, y = a.sample(ep.Mix()), b.sample(ep.Mix())
        assert x.kind == y.kind and x.query.answer == y.query.answer and x.query.messages == y.query.messages


def test_every_kind_is_drawn_and_facts_are_fresh():
    sampler = ep.EpisodeSampler(0)
    kinds = {sampler.sample(ep.Mix()).kind.rstrip("0123456789") for _ in range(400)}
    assert kinds == set(ep.EpisodeSampler.KINDS)  # fact episodes are labelled by their count: facts1, facts2, …
    values = {sampler.facts(ep.Mix(), count=1).query.values for _ in range(100)}
    assert len(values) > 90  # open-vocabulary values, not a fixed set of episodes


def test_fact_episode_asks_a_told_fact_and_the_answer_restates_it():
    sampler = ep.EpisodeSampler(3)
    for _ in range(50):
        episode = sampler.facts(ep.Mix(), count=3)
        facts = episode.query.meta["facts"]
        assert len({f.attribute for f in facts}) == 3
        assert len({f.value for f in facts}) == 3
        for fact in episode.query.meta["asked"]:
            assert fact in facts
            assert fact.value in episode.query.answer
        told = " ".join(t.user for c in episode.commits if isinstance(c, list) for t in c)
        assert all(f.value in told for f in facts)
        # the prompt holds only the new user message (and maybe a system prompt): no transcript
        assert [m["role"] for m in episode.query.messages if m["role"] != "system"] == ["user"]


def test_messages_read_naturally():
    rng = random.Random(0)
    facts = [ep.Fact("name", "Alice"), ep.Fact("city", "Lisbon"), ep.Fact("food", "sushi")]
    assert acknowledgement(facts) == (
        "Nice to meet you, Alice! I will remember that you live in Lisbon and your favourite food is sushi."
    )
    assert ep.fact_answer([facts[0]]) == "Your name is Alice."
    assert ep.unknown_answer("city") == "I don't know where you live."
    message = statement_message(rng, facts)
    assert all(f.value in message for f in facts) and message.endswith(".")
    assert fill("I work as {a} {v}", "engineer") == "I work as an engineer"
    kitten = ep.Fact("pet_name", "Memmy", "kitten")
    assert fill("I have a three-month-old {animal} named {v} who loves eating small shrimp", kitten.value, kitten.animal) == (
        "I have a three-month-old kitten named Memmy who loves eating small shrimp")
    assert ep.fact_answer([kitten]) == "Your kitten is called Memmy."
    assert ep.question_message(random.Random(1), [kitten]).count("kitten") + ep.question_message(
        random.Random(1), [kitten]).count("pet") == 1


def test_tokenizer_is_open_and_splits_unseen_values(tokenizer):
    words = pools.ANIMALS + pools.JOBS + pools.COLOURS + pools.MONTHS + pools.HELDOUT_NAMES + pools.HELDOUT_CITIES
    assert all(tokenizer.decode(tokenizer.encode(" " + w, add_special_tokens=False)) == " " + w for w in words)
    # open values (names, cities, codes) are copied piece by piece: the tokenizer splits an unseen word
    for value in ("Belkavo", "Rue des Lilas 12", "Ouagadougou", "QX-4821"):
        ids = tokenizer.encode(" " + value, add_special_tokens=False)
        assert len(ids) > 1 and tokenizer.decode(ids) == " " + value


def test_tokenizer_has_the_nano_specials_and_template(tokenizer):
    from memt_core import families
    from memt_core.tiny import template_text

    for token in families.get(families.NANO).special_tokens:
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.convert_ids_to_tokens(ids[0]) == token
    assert tokenizer.chat_template == template_text("nano_chat_template.jinja")
    assert tokenizer.eos_token == "<|im_end|>"


def test_turn_commit_is_prompt_then_generated_reply(fmt, tokenizer):
    turn = ep.EpisodeTurn("Hi, my name is Alice.", "Nice to meet you, Alice!", ("Alice",))
    segment = fmt.turn(turn)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": turn.user}], add_generation_prompt=True, enable_thinking=False,
        tokenize=True, return_dict=False,
    )
    reply = tokenizer.encode(turn.reply, add_special_tokens=False) + [fmt.im_end]
    assert segment.ids == list(prompt) + reply
    assert segment.weights[: len(prompt)] == [0.0] * len(prompt)
    assert segment.ids[-1] == fmt.im_end and segment.weights[-1] > 0
    # the recalled value weighs more than the rest of the reply
    alice = tokenizer.encode(" Alice", add_special_tokens=False)
    position = segment.ids.index(alice[0], len(prompt))
    assert segment.weights[position] == 3.0 and segment.weights[position - 1] == 1.0


def test_tool_call_text_is_what_the_template_renders(tokenizer):
    call = ep.EpisodeToolCall("get_weather", {"city": "Paris"})
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"},
         {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": call.name, "arguments": call.arguments}}]}],
        tokenize=False,
    )
    assert ep.tool_call_text(call) == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert "<|im_start|>assistant\n" + ep.tool_call_text(call) + "<|im_end|>\n" in rendered


def test_tool_turn_commit_continues_with_rendered_results(fmt, tokenizer):
    turn = ep.tool_turn(random.Random(1), tool="add", text=False)
    ids = fmt.turn(turn).ids
    text = tokenizer.decode(ids, skip_special_tokens=False)
    result = json.loads(turn.result)
    assert text.startswith("<|im_start|>user\n" + turn.user + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert ep.tool_call_text(turn.call) + "<|im_end|><|im_start|>user\n<tool_response>\n" in text
    assert text.endswith(
        f"\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n{turn.reply}<|im_end|>"
    )
    assert str(result["result"]) in turn.reply


def test_documents_are_split_into_chunk_pieces(fmt):
    _, text, _ = ep.document(random.Random(2), fillers=6)
    pieces = fmt.document_pieces(text, 32)
    assert len(pieces) > 1 and all(len(p) == 32 for p in pieces[:-1])
    assert sum(pieces, []) == fmt.text(text)


def test_query_segment_weights_only_the_answer(fmt):
    sampler = ep.EpisodeSampler(5)
    for _ in range(30):
        episode = sampler.sample(ep.Mix())
        tokens = fmt.episode(episode, chunk_tokens=128)
        query = tokens.query
        assert isinstance(query, Segment) and len(query.ids) == len(query.weights)
        answer_start = next(i for i, w in enumerate(query.weights) if w > 0)
        assert all(w > 0 for w in query.weights[answer_start:])
        assert query.ids[-1] == fmt.im_end
        assert all(len(c) <= 128 or any(w > 0 for w in c.weights) or c.ids[0] == query.ids[0] for c in tokens.commits)


def test_tool_results_come_as_json_and_as_plain_text():
    rng = random.Random(4)
    turns = [ep.tool_turn(rng, tool="get_weather") for _ in range(60)]
    as_json = [t for t in turns if t.result.startswith("{")]
    assert 10 < len(as_json) < 50
    for turn in turns:
        city, condition, temperature = turn.values
        assert condition in turn.result and temperature in turn.result
        assert turn.reply == f"It is {condition} and {temperature} degrees in {city}."
    assert "17 degrees and sunny" in {tool_turns.weather_result(rng, "Oslo", 17, "sunny", text=True) for _ in range(200)}


def test_repeat_requests_include_typing_exactly():
    rng = random.Random(2)
    requests = {ep.repeat_turn(rng, "hello world").user for _ in range(300)}
    assert "Type 'hello world' exactly." in requests
    assert all("hello world" in r for r in requests)


def test_replayed_context_is_what_a_client_with_memory_off_sends():
    """In-context episodes marked ``replayed`` put the earlier turns in the prompt as committed turns, exactly
    as MemTSession replays them with memory off (the chat format's open turn + the reply + end of turn)."""
    from memt_core.client.chat_format import load_chat_format, load_tokenizer
    from memt_demo import BUNDLED_MODEL

    tokenizer = load_tokenizer(BUNDLED_MODEL)
    fmt = DemoChatFormat(tokenizer)
    client_format, _ = load_chat_format(BUNDLED_MODEL, tokenizer=tokenizer, chat_template_kwargs={"enable_thinking": False})
    sampler = ep.EpisodeSampler(3)
    mix = ep.Mix(**{**{k: 0.0 for k in ep.EpisodeSampler.KINDS}, "context": 1.0})
    episodes = [sampler.sample(mix) for _ in range(40)]
    replayed = [e for e in episodes if e.query.meta["replayed"] and not e.query.thinking]  # thinking ones stay plain
    assert 0 < len(replayed) < len(episodes)
    for episode in replayed[:5]:
        *history, question = episode.query.messages
        turns = [client_format.open_turn_ids([user]) + fmt.reply(reply["content"]) for user, reply in zip(history[::2], history[1::2])]
        expected = client_format.prompt_ids(system_prompt=None, tools=None, turns=turns, tail=client_format.open_turn_ids([question]))
        query = fmt.query(episode.query)
        assert query.ids[: len(expected)] == expected
        assert tokenizer.decode(query.ids[len(expected):]).startswith(episode.query.answer)

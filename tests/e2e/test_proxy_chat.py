"""The OpenAI-compatible proxy over a live memt_core server, driven by the official ``openai`` SDK:
/v1/models, chat with and without streaming, usage, stop, seeds, and per-turn prompt size over a
20-turn conversation that resends its whole history (with memory: bounded; with memory off: growing).

The tiny checkpoint is random: greedy decoding tends to emit the end token at once, sampled text
rarely does. Turns are therefore ended honestly with the ``stop`` parameter (a stop string ends a
turn with finish_reason "stop", which the proxy commits) and truncated with small ``max_tokens``.
"""

from __future__ import annotations

import json

import openai
import pytest
from e2e.proxies import MODEL, assistant, expected_prompt, unique

pytestmark = pytest.mark.timeout(600)

STOPS = [" ", "e"]  # frequent in the random model's text: most turns end with finish_reason "stop"


@pytest.fixture(scope="module")
def client(proxy):
    return proxy.openai()


def test_models(client, proxy):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].object == "model" and models.data[0].owned_by == "memt"
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert info.value.body["code"] == "model_not_found" and info.value.body["param"] == "model"


def test_chat_completion_shape_and_usage(client, proxy_chat_format):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
    response = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=1.0, seed=7)
    assert response.object == "chat.completion" and response.model == MODEL
    assert response.id.startswith("chatcmpl-")
    assert len(response.choices) == 1
    choice = response.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    usage = response.usage
    assert usage.prompt_tokens == len(expected_prompt(proxy_chat_format, messages, None))
    assert 1 <= usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    if choice.finish_reason == "length":
        assert usage.completion_tokens == 12


def test_streaming_equals_non_streaming(client, proxy):
    request = dict(model=MODEL, messages=[{"role": "user", "content": "Stream a few words."}], max_tokens=24, temperature=1.0, seed=11)
    whole = client.chat.completions.create(**request)
    chunks = list(client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.model == MODEL for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()
    # without include_usage no usage chunk; the wire ends with data: [DONE]
    with proxy.http() as http:
        with http.stream("POST", "/v1/chat/completions", json={**request, "stream": True}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            frames = [line[5:].strip() for line in response.iter_lines() if line.startswith("data:")]
    assert frames[-1] == "[DONE]"
    bodies = [json.loads(f) for f in frames[:-1]]
    assert all("usage" not in b for b in bodies)
    assert "".join(b["choices"][0]["delta"].get("content") or "" for b in bodies) == content


def test_stop(client):
    request = dict(model=MODEL, messages=[{"role": "user", "content": "Write a long line."}], max_tokens=32, temperature=1.0)
    for seed in range(20):  # find a seed whose text has a stop candidate past its start
        text = client.chat.completions.create(**request, seed=seed).choices[0].message.content
        candidates = [i for i in range(2, len(text) - 1) if text[i].isalnum() and text[i] not in text[:i]]
        if candidates:
            break
    else:
        pytest.fail("no seed gave a text long enough to place a stop string")
    at = candidates[0]
    stopped = client.chat.completions.create(**request, seed=seed, stop=[text[at], "\u2603never"])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[:at].strip()
    streamed = client.chat.completions.create(**request, seed=seed, stop=text[at], stream=True)
    parts, finish = [], None
    for chunk in streamed:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert "".join(parts) == text[:at].strip() and finish == "stop"


def test_seed_reproducibility(client):
    request = dict(model=MODEL, messages=[{"role": "user", "content": "Pick some random words."}], max_tokens=16, temperature=1.0)
    first = client.chat.completions.create(**request, seed=1234).choices[0].message.content
    again = client.chat.completions.create(**request, seed=1234).choices[0].message.content
    assert first == again
    others = {client.chat.completions.create(**request, seed=seed).choices[0].message.content for seed in (1, 2, 3)}
    assert len(others | {first}) >= 3, "different seeds should give different samples"
    # a session with empty memory samples exactly what stateless chat samples
    session = unique("seed")
    in_session = client.chat.completions.create(**request, seed=1234, extra_headers={"X-MemT-Session": session, "X-MemT-Memory": "read"})
    assert in_session.choices[0].message.content == first


def test_twenty_turns_prompt_stays_bounded_with_memory(client, proxy, proxy_chat_format):
    """Full history resent every turn: with memory auto only the uncommitted suffix reaches the model.

    Turns 5, 11 and 16 are truncated (max_tokens=1, no stop): finish_reason "length", not committed;
    the next completed turn commits them along with itself (their share of the prompt persists until then).
    """
    session = unique("long")
    headers = {"X-MemT-Session": session, "X-MemT-Memory": "auto"}
    truncated_turns = {5, 11, 16}
    history: list[dict] = []
    committed = 0  # conversation messages in memory, by the finish reasons seen
    prompt_tokens, finishes = [], []
    for turn in range(20):
        history.append({"role": "user", "content": f"Turn {turn}: tell me about item number {turn * 7 + 3}."})
        expected = expected_prompt(proxy_chat_format, history, committed)
        if turn in truncated_turns:
            response = client.chat.completions.create(model=MODEL, messages=history, max_tokens=1, temperature=1.0, seed=turn, extra_headers=headers)
        else:
            response = client.chat.completions.create(model=MODEL, messages=history, max_tokens=24, temperature=1.0, seed=turn, stop=STOPS, extra_headers=headers)
        finish = response.choices[0].finish_reason
        finishes.append(finish)
        prompt_tokens.append(response.usage.prompt_tokens)
        assert response.usage.prompt_tokens == len(expected), f"turn {turn}: the proxy sent something else than the uncommitted suffix"
        history.append(assistant(response.choices[0].message))
        if finish == "stop":
            committed = len(history)
        info = proxy.inspect(session)
        assert info["committed_messages"] == committed, f"turn {turn} ({finish}): {info}"
        assert info["native"]["in_flight"] == [] and info["native"]["transaction"] is None  # the lease is kept between turns
    assert [finishes[t] for t in sorted(truncated_turns)] == ["length"] * 3, finishes
    assert finishes.count("stop") >= 15, finishes
    for t in truncated_turns:  # the truncated turn's messages are context in the next request
        assert prompt_tokens[t + 1] > prompt_tokens[t]
    bound = 3 * max(prompt_tokens[:3])
    assert max(prompt_tokens) <= bound, prompt_tokens
    assert max(prompt_tokens[10:]) <= max(prompt_tokens[:10]) * 1.5, prompt_tokens

    # the same conversation without memory (X-MemT-Memory: off): the whole history every time
    stateless, plain_history = [], []
    for turn in range(20):
        plain_history.append(history[2 * turn])
        response = client.chat.completions.create(model=MODEL, messages=plain_history, max_tokens=24, temperature=1.0, seed=turn, stop=STOPS,
                                                  extra_headers={"X-MemT-Memory": "off"})
        assert response.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, plain_history, None))
        stateless.append(response.usage.prompt_tokens)
        plain_history.append(history[2 * turn + 1])
    print(f"prompt tokens per turn, memory auto: {prompt_tokens}\nwithout a session: {stateless}\nfinish reasons: {finishes}")
    assert all(b > a for a, b in zip(stateless, stateless[1:])), stateless
    assert stateless[-1] > 4 * max(prompt_tokens), (stateless, prompt_tokens)


def test_flash_checkpoint(flash_server, flash_checkpoint):
    """The proxy in front of a Flash (DeepSeek-V4 format) server: chat, streaming, trimming."""
    from memt_core.client.chat_format import load_chat_format, load_tokenizer

    from e2e.proxies import ProxyServer

    flash_format = load_chat_format(flash_checkpoint, tokenizer=load_tokenizer(flash_checkpoint))[0]
    with ProxyServer(flash_server.url, flash_checkpoint) as flash:
        client = flash.openai("unused")
        [model] = [m.id for m in client.models.list().data]
        session = unique("flash")
        history = [{"role": "user", "content": "Hello from a Flash test."}]
        for turn in range(20):
            response = client.chat.completions.create(model=model, messages=history, max_tokens=16, temperature=1.0, seed=turn,
                                                      stop=STOPS, extra_headers={"X-MemT-Session": session})
            if response.choices[0].finish_reason == "stop":
                break
        else:
            pytest.fail("no completed turn")
        history += [assistant(response.choices[0].message), {"role": "user", "content": "And again?"}]
        chunks = list(client.chat.completions.create(model=model, messages=history, max_tokens=8, temperature=1.0, seed=1, stream=True,
                                                     stream_options={"include_usage": True}, extra_headers={"X-MemT-Session": session}))
        assert chunks[-1].usage.prompt_tokens == len(expected_prompt(flash_format, history, 2))
        assert flash.inspect(session, "unused")["committed_messages"] in (2, 4)

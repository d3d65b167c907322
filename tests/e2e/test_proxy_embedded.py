"""One process (``python -m memt_proxy --embedded``): the core runs inside the proxy, called in process.

Driven by the ``openai`` SDK beside the two-process deployment (the ``proxy`` fixture) on the same
checkpoint: the same conversation gets the same answers, prompts and memory in both; a stream gives
what the two-process deployment answers; a client that leaves a stream early cancels the query in the
embedded core (the session's read log shows it stopped short) and frees the session.
"""

from __future__ import annotations

import pytest
from e2e.proxies import KEY_A, LONG_TOKENS, MODEL, STOPS, ProxyServer, ask, assistant, completed_turn, leave_stream_early, unique

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def embedded(nano_checkpoint, tmp_path_factory):
    state = tmp_path_factory.mktemp("embedded-core-state")
    core = f"--device cpu --max-sessions-per-rank 64 --state-directory {state}"
    with ProxyServer("http://127.0.0.1:9", nano_checkpoint, args=["--embedded", "--core-args", core]) as server:
        yield server


def conversation(client, session: str) -> list:
    """Three turns with fixed seeds; each completed turn goes into memory."""
    history, replies = [], []
    for turn, text in enumerate(("first question", "second question", "third question")):
        history.append({"role": "user", "content": text})
        reply = ask(client, history, session, seed=turn)
        replies.append((reply.choices[0].message.content, reply.choices[0].finish_reason, reply.usage.prompt_tokens))
        history.append(assistant(reply.choices[0].message))
    return replies


def test_one_process_answers_as_two_processes_do(embedded, proxy):
    one, two = unique("one"), unique("two")
    assert conversation(embedded.openai("unused"), one) == conversation(proxy.openai(KEY_A), two)
    one_info, two_info = embedded.inspect(one, None), proxy.inspect(two, KEY_A)
    assert one_info["committed_messages"] == two_info["committed_messages"] > 0
    assert one_info["native"]["published_version"] == two_info["native"]["published_version"]
    assert one_info["native"]["in_flight"] == [] and one_info["native"]["leased"] is True  # kept for the next turn


def test_a_stream_in_one_process(embedded, proxy):
    messages = [{"role": "user", "content": "tell me something"}]
    expected = ask(proxy.openai(KEY_A), messages, unique("two-stream"), seed=7, max_tokens=40, stop=None)
    stream = embedded.openai("unused").chat.completions.create(
        model=MODEL, messages=messages, max_tokens=40, temperature=1.0, seed=7, stream=True,
        stream_options={"include_usage": True}, extra_headers={"X-MemT-Session": unique("one-stream")},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == expected.choices[0].message.content and finish == [expected.choices[0].finish_reason]
    assert chunks[-1].usage.prompt_tokens == expected.usage.prompt_tokens


def test_leaving_a_stream_cancels_the_embedded_query(embedded, long_seed):
    session = unique("one-gone")
    # memory first, so that the stream is a query (a new session's first turn is a plain generation)
    completed_turn(embedded.openai("unused"), session, [{"role": "user", "content": "hello"}])
    leave_stream_early(embedded, session, long_seed, key=None)
    native = embedded.inspect(session, None)["native"]  # waits until the request let the session go
    assert native["in_flight"] == [] and native["transaction"] is None
    (read,) = native["reads"]
    assert read["completion_tokens"] < LONG_TOKENS, read  # stopped when the client left, not run to the end
    reply = ask(embedded.openai("unused"), [{"role": "user", "content": "still there?"}], session, max_tokens=4, stop=STOPS)
    assert reply.choices[0].finish_reason in ("stop", "length")

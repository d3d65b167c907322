"""Retry, regenerate and fork (issue 45), live through the openai SDK, with X-MemT-Session and without.

A request repeating a session's last turn is a *retry* only when the client says so (``x-stainless-retry-count``
> 0, or the ``Idempotency-Key`` it was answered under): then the kept answer, nothing generated or committed
twice. Otherwise it is a *regenerate*: a new sample, read from the state before the turn, and memory keeps the
new answer in place of the old one. A request that does not continue a named session's memory (a regenerate, an
edit, an app's background task between turns) forks from the deepest state kept before one of its turns, and the
session follows it. Checked by exact prompt sizes on the random tiny model (``expected_prompt``), the proxy's
write counter and the session's inspect.
"""

from __future__ import annotations

import asyncio

import pytest
from e2e.proxies import MODEL, STOPS, assistant, expected_prompt, proxy_metric, unique, writes_reach

pytestmark = pytest.mark.timeout(600)

MODES = ["named", "headerless"]


def answer(client, messages, headers, **sampling):
    """A completed answer (a stop string ends it), trying seeds until one does; the response."""
    for seed in range(sampling.pop("seed", 0), 40):
        response = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=12, stop=STOPS, extra_headers=headers, **{"temperature": 1.0, "seed": seed, **sampling},
        )
        if response.choices[0].finish_reason == "stop":
            return response
    pytest.fail("no completed answer in 40 seeds")


def play(client, headers, turns: int) -> list[dict]:
    history: list[dict] = []
    for turn in range(turns):
        history.append({"role": "user", "content": f"Remember number {turn}."})
        history.append(assistant(answer(client, history, headers, seed=turn).choices[0].message))
    return history


@pytest.mark.parametrize("mode", MODES)
def test_a_regenerate_samples_anew_from_the_state_before_the_turn(fresh_proxy, proxy_chat_format, mode):
    """Four regenerates of the last answer at temperature 2: more than one distinct answer, each read from the state
    before the turn (the prompt holds only the question); the conversation then goes on from the last one, its
    memory holding that answer in place of the others."""
    client = fresh_proxy.openai()
    session = unique("regenerate")
    headers = {"X-MemT-Session": session} if mode == "named" else {}
    history = play(client, headers, 3)
    history.append({"role": "user", "content": "Which numbers?"})
    original = answer(client, history, headers).choices[0].message.content
    writes = writes_reach(fresh_proxy, 4 if mode == "named" else 3)  # named: every turn; header-less: all but the first
    regenerated, finished = [], []
    for seed in range(100, 104):
        response = client.chat.completions.create(model=MODEL, messages=history, max_tokens=12, temperature=2.0, seed=seed, stop=STOPS, extra_headers=headers)
        assert response.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, history, len(history) - 1))
        regenerated.append(response.choices[0].message.content)
        finished.append(response.choices[0].finish_reason)
    assert len(set(regenerated)) > 1, regenerated
    # named: each completed answer is committed in place of the last; header-less: each new answer forks a state
    made = finished.count("stop") if mode == "named" else len(set(regenerated) - {original})
    writes = writes_reach(fresh_proxy, writes + made)
    history.append({"role": "assistant", "content": regenerated[-1]})
    history.append({"role": "user", "content": "And now?"})
    response = client.chat.completions.create(model=MODEL, messages=history, max_tokens=12, temperature=1.0, seed=1, stop=STOPS, extra_headers=headers)
    # memory holds the last answer (a named session commits completed ones only: a cut one is sent again as context)
    held = len(history) - (3 if mode == "named" and finished[-1] != "stop" else 1)
    assert response.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, history, held))


@pytest.mark.parametrize("retry", [{"x-stainless-retry-count": "1"}, {"Idempotency-Key": "turn-3"}])
def test_a_clients_retry_gets_the_kept_answer_and_commits_nothing_twice(fresh_proxy, retry):
    """The same request again, said to be a retry (the SDK's retry count, or the Idempotency-Key it was first sent
    with): the kept answer and usage, the session's version unchanged. Without either, the same request is a
    regenerate: generated and committed again, in place of the old answer."""
    client = fresh_proxy.openai()
    session = unique("retry")
    headers = {"X-MemT-Session": session}
    history = play(client, headers, 2)
    history.append({"role": "user", "content": "Once more."})
    keyed = {**headers, **({"Idempotency-Key": retry["Idempotency-Key"]} if "Idempotency-Key" in retry else {})}
    with fresh_proxy.http() as http:
        for seed in range(40):
            body = {"model": MODEL, "messages": history, "max_tokens": 12, "temperature": 1.0, "seed": seed, "stop": STOPS}
            first = http.post("/v1/chat/completions", json=body, headers=keyed).json()
            if first["choices"][0]["finish_reason"] == "stop":
                break
        assert writes_reach(fresh_proxy, 3) == 3
        version = fresh_proxy.inspect(session)["native"]["published_version"]
        retried = http.post("/v1/chat/completions", json=body, headers={**keyed, **retry}).json()
        assert retried["choices"] == first["choices"] and retried["usage"] == first["usage"]
        assert fresh_proxy.inspect(session)["native"]["published_version"] == version  # nothing committed twice
        assert proxy_metric(fresh_proxy, "memt_proxy_memory_writes_total") == 3
        again = http.post("/v1/chat/completions", json=body, headers=headers).json()  # no retry: a regenerate
    assert again["choices"][0]["message"] == first["choices"][0]["message"]  # the same seed: the same sample
    assert writes_reach(fresh_proxy, 4) == 4  # committed again, in place of the old answer
    inspected = fresh_proxy.inspect(session)
    assert inspected["committed_messages"] == len(history) + 1 and inspected["native"]["published_version"] != version


def test_background_tasks_between_turns_leave_the_conversation_in_memory(fresh_proxy, proxy_chat_format):
    """A chat web UI (Open WebUI) sends its background tasks — a title, tags — as one-message requests under the
    conversation's own session header, between its turns: each is committed as a turn, and the conversation's
    next turn, which does not continue that, forks from the state kept before it: its prompt holds only its new
    message, turn after turn, and the session follows the conversation."""
    client = fresh_proxy.openai()
    session = unique("webui")
    headers = {"X-MemT-Session": session}
    history: list[dict] = []
    prompts = []
    for turn in range(5):
        history.append({"role": "user", "content": f"Turn {turn} of the chat."})
        response = answer(client, history, headers, seed=turn)
        prompts.append(response.usage.prompt_tokens)
        if turn > 0:
            assert response.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, history, len(history) - 1)), (turn, prompts)
        history.append(assistant(response.choices[0].message))
        task = [{"role": "user", "content": "### Task: Generate a concise title for this chat: " + " ".join(m["content"] or "" for m in history)}]
        answer(client, task, headers, seed=turn)
    inspected = fresh_proxy.inspect(session)
    assert inspected["history_known"]


def test_concurrent_identical_requests_keep_one_state(fresh_proxy):
    """Twenty identical header-less requests at once (temperature 0: one answer): one state made, one write."""
    opening = [{"role": "user", "content": "Twenty at once."}]
    first = fresh_proxy.openai().chat.completions.create(model=MODEL, messages=opening, max_tokens=8, temperature=0.0, stop=STOPS)
    history = opening + [assistant(first.choices[0].message), {"role": "user", "content": "And again."}]
    client = fresh_proxy.async_openai()

    async def twenty():
        return await asyncio.gather(*(client.chat.completions.create(model=MODEL, messages=history, max_tokens=8, temperature=0.0, stop=STOPS) for _ in range(20)))

    answers = asyncio.run(twenty())
    assert len({a.choices[0].message.content for a in answers}) == 1
    assert writes_reach(fresh_proxy, 1) == 1
    assert proxy_metric(fresh_proxy, "memt_proxy_memory_states") == 1
    assert proxy_metric(fresh_proxy, "memt_proxy_memory_writes_total") == 1


@pytest.mark.parametrize("retry", [{"x-stainless-retry-count": "2"}, {"Idempotency-Key": "headerless-2"}])
def test_a_headerless_retry_gets_the_kept_answer(fresh_proxy, retry):
    """Without a header too: a client's retry of an answered request gets the kept answer, and no second state is
    made; the same request without a retry header is answered anew (temperature 2, no seed: another sample)."""
    history = play(fresh_proxy.openai(), {}, 1) + [{"role": "user", "content": "Retried."}]
    keyed = {"Idempotency-Key": retry["Idempotency-Key"]} if "Idempotency-Key" in retry else {}
    body = {"model": MODEL, "messages": history, "max_tokens": 12, "temperature": 2.0, "stop": STOPS}
    with fresh_proxy.http() as http:
        first = http.post("/v1/chat/completions", json=body, headers=keyed).json()
        assert writes_reach(fresh_proxy, 1) == 1
        for _ in range(3):
            again = http.post("/v1/chat/completions", json=body, headers={**keyed, **retry}).json()
            assert again["choices"] == first["choices"] and again["usage"] == first["usage"]
        assert proxy_metric(fresh_proxy, "memt_proxy_memory_writes_total") == 1
        anew = [http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"] for _ in range(3)]
    assert len({first["choices"][0]["message"]["content"], *anew}) > 1


@pytest.mark.parametrize("action", ["reset", "delete"])
def test_the_states_kept_for_a_session_go_with_its_memory(fresh_proxy, action):
    """The states a named session keeps before its turns hold copies of its memory: a reset or a delete of the session
    closes them too, so what a client deletes is not kept elsewhere."""
    client = fresh_proxy.openai()
    session = unique("kept")
    play(client, {"X-MemT-Session": session}, 3)
    writes_reach(fresh_proxy, 3)
    assert proxy_metric(fresh_proxy, "memt_proxy_memory_states") == 2  # before turns 2 and 3
    with fresh_proxy.http() as http:
        answer = http.post(f"/v1/memt/sessions/{session}/reset") if action == "reset" else http.delete(f"/v1/memt/sessions/{session}")
    assert answer.status_code == 200, answer.text
    assert proxy_metric(fresh_proxy, "memt_proxy_memory_states") == 0


def test_a_named_session_that_starts_over_keeps_what_it_held(fresh_proxy, proxy_chat_format):
    """A request no kept state matches (its first message edited) starts the session's memory over from its history;
    what memory held is kept first, so the conversation it was still resumes from memory afterwards."""
    client = fresh_proxy.openai()
    headers = {"X-MemT-Session": unique("over")}
    history = play(client, headers, 3)
    edited = [{"role": "user", "content": "An edited opening."}, *history[1:], {"role": "user", "content": "Edited line."}]
    response = answer(client, edited, headers)
    assert response.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, edited, 0))  # a replay
    history.append({"role": "user", "content": "The first line again."})
    response = answer(client, history, headers)
    assert response.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, history, len(history) - 1))

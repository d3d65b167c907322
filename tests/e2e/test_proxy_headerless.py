"""Header-less memory (issue 37), live through the openai SDK: a conversation without X-MemT-Session is
identified by its transcript. Checked on the random tiny model by exact prompt sizes: which messages the
model was sent, so which ones memory held (``expected_prompt``), and by the proxy's write counter.

Each test runs its own proxy (the upstream is shared), so that its ``memt_proxy_memory_writes_total`` moves
only by what the test did; tests wait for a commit behind an answer by polling that counter (state, not sleep).
"""

from __future__ import annotations

import asyncio

import pytest
from e2e.proxies import KEY_A, KEY_B, MODEL, ProxyServer, STOPS, assistant, expected_prompt, proxy_metric, unique, writes_reach

pytestmark = pytest.mark.timeout(600)


def chat(client, messages, *, seed=0, **extra):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=1.0, seed=seed, stop=STOPS, **extra)


def conversation_turn(client, history: list[dict], text: str, *, seed: int) -> int:
    """Append ``text`` and the answer to ``history``; the request's prompt tokens."""
    history.append({"role": "user", "content": text})
    response = chat(client, history, seed=seed)
    history.append(assistant(response.choices[0].message))
    return response.usage.prompt_tokens


def test_a_resent_history_resumes_from_memory_and_commits_one_exchange_per_turn(fresh_proxy, proxy_chat_format):
    """No header, 30 turns: turn 1 is plain chat and keeps nothing; turn 2 is answered from its text and its whole
    exchange kept behind the answer; from turn 3 on the prompt holds only the new message, as in a named session
    (memory the rest: each answered turn forked into the conversation's next state) — constant, unlike replay."""
    client = fresh_proxy.openai()
    history = [{"role": "system", "content": "Be brief."}]
    prompts = []
    for turn in range(1, 31):
        sent = conversation_turn(client, history, f"Message number {turn}.", seed=turn)
        prompt = history[:-1]
        held = None if turn <= 2 else 2 * (turn - 1)  # messages memory holds when the request is answered (None: plain chat)
        assert sent == len(expected_prompt(proxy_chat_format, prompt, held)), (turn, sent)
        assert writes_reach(fresh_proxy, turn - 1) == turn - 1  # turn 1: none; then one per turn
        prompts.append(sent)
    replay = len(expected_prompt(proxy_chat_format, history + [{"role": "user", "content": "Again."}], None))
    assert max(prompts[2:]) < replay / 10, (prompts, replay)
    assert 1 <= proxy_metric(fresh_proxy, "memt_proxy_memory_states") <= 29  # one state per kept turn, within the bound


def test_one_shot_requests_commit_nothing(fresh_proxy, proxy_chat_format):
    """Single questions, a few-shot request with one example exchange, a stream: answered, 0 writes, 0 states."""
    client = fresh_proxy.openai()
    for n in range(4):
        chat(client, [{"role": "user", "content": f"One question, number {n}."}], seed=n)
    few_shot = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}]
    response = chat(client, few_shot, seed=1)
    assert response.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, few_shot, None))
    list(chat(client, [{"role": "user", "content": "Streamed."}], stream=True))
    assert proxy_metric(fresh_proxy, "memt_proxy_memory_writes_total") == 0
    assert proxy_metric(fresh_proxy, "memt_proxy_memory_states") == 0


def test_a_regenerate_reads_the_state_before_the_turn_and_an_edit_forks(fresh_proxy, proxy_chat_format):
    """Regenerating the last answer: the same request again reads the state before that turn (the same prompt as
    the first answer's), and memory keeps the new answer: the turn after it reads memory alone. Editing the first
    message at turn 11: no 409, all of the edited history sent as text (no state holds it), kept behind the
    answer, so the turn after holds only its new message again."""
    client = fresh_proxy.openai()
    history: list[dict] = []
    for turn in range(1, 10):
        conversation_turn(client, history, f"Fact number {turn}.", seed=turn)
    assert writes_reach(fresh_proxy, 8) == 8  # turns 2..9
    history.append({"role": "user", "content": "Fact number 10."})
    first = chat(client, history, seed=10)
    assert writes_reach(fresh_proxy, 9) == 9
    held = len(history) - 1  # every message before the new one
    assert first.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, history, held))
    again = chat(client, history, seed=11)  # regenerate: the app drops the answer and asks again
    assert again.usage.prompt_tokens == first.usage.prompt_tokens  # the state before the turn, not the text
    assert writes_reach(fresh_proxy, 10) == 10  # the new answer forks a state of its own
    history.append(assistant(again.choices[0].message))
    after = conversation_turn(client, history, "Fact number 11.", seed=12)
    assert after == len(expected_prompt(proxy_chat_format, history[:-1], len(history) - 2))  # resumed from the new answer's state
    assert writes_reach(fresh_proxy, 11) == 11

    edited = [{"role": "user", "content": "An edited first message."}, *history[1:-2]]
    edited.append({"role": "user", "content": "Fact number 12."})
    response = chat(client, edited, seed=13)  # no 409
    assert response.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, edited, 0))
    assert writes_reach(fresh_proxy, 12) == 12
    edited.append(assistant(response.choices[0].message))
    after = conversation_turn(client, edited, "Fact number 13.", seed=14)
    assert after == len(expected_prompt(proxy_chat_format, edited[:-1], len(edited) - 2))


def test_conversations_with_one_opening_and_tenants_never_share_a_state(fresh_proxy, proxy_chat_format):
    """Two conversations of a tenant open alike (same question, same seed: same answer) and then differ: each gets
    a state of its own and reads only its own; the same transcript of another tenant finds nothing of the first's."""
    alpha = fresh_proxy.openai(KEY_A)
    x: list[dict] = []
    conversation_turn(alpha, x, "Hello there.", seed=3)
    y = [dict(m) for m in x]
    conversation_turn(alpha, x, "My dog is Rex.", seed=4)  # x's whole exchange kept
    conversation_turn(alpha, y, "My cat is Tom.", seed=5)  # y's too, in a state of its own
    writes_reach(fresh_proxy, 2)
    sent = conversation_turn(alpha, x, "And his age?", seed=6)
    assert sent == len(expected_prompt(proxy_chat_format, x[:-1], 4))  # x's memory: only the new message sent
    sent = conversation_turn(alpha, y, "And her age?", seed=7)
    assert sent == len(expected_prompt(proxy_chat_format, y[:-1], 4))  # y's own state, not x's

    beta = fresh_proxy.openai(KEY_B)
    z: list[dict] = [dict(m) for m in x[:4]]
    sent = conversation_turn(beta, z, "And his age?", seed=6)  # alpha's transcript, beta's key
    assert sent == len(expected_prompt(proxy_chat_format, z[:-1], 0))  # none of alpha's states: all of it as text


def test_header_and_strict_divergence(fresh_proxy, proxy_chat_format):
    """With X-MemT-Session an edited history branches by default (memory starts over from the request);
    X-MemT-On-Divergence: error keeps the 409."""
    client = fresh_proxy.openai()
    session = {"X-MemT-Session": unique("headed-edit")}
    history: list[dict] = []
    for turn in range(3):
        history.append({"role": "user", "content": f"Turn {turn}."})
        history.append(assistant(chat(client, history, seed=turn, extra_headers=session).choices[0].message))
    edited = [{"role": "user", "content": "Edited."}, *history[1:], {"role": "user", "content": "Next."}]
    with fresh_proxy.http() as http:
        refused = http.post("/v1/chat/completions", json={"model": MODEL, "messages": edited, "max_tokens": 4},
                            headers={**session, "X-MemT-On-Divergence": "error"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "transcript_diverged"
    response = chat(client, edited, seed=9, extra_headers=session)
    assert response.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, edited, 0))


@pytest.mark.parametrize("ending", ["sigterm", "kill -9"])
def test_a_restarted_proxy_with_a_state_directory_resumes_a_conversation(proxy_upstream, nano_checkpoint, proxy_chat_format, tmp_path, ending):
    """Kept states and what they hold are recorded in --state-directory as they are made: after a restart, graceful
    or kill -9 right after the last state was written, the next turn of a header-less conversation still sends only
    its new message."""
    server = ProxyServer(proxy_upstream.url, nano_checkpoint, args=["--state-directory", str(tmp_path / "state")])
    history: list[dict] = []
    with server:
        client = server.openai()
        for turn in range(1, 5):
            conversation_turn(client, history, f"Before the restart, {turn}.", seed=turn)
        writes_reach(server, 3)
        if ending == "kill -9":
            server.process.kill()
            server.process.wait(30)
    with server:  # the same directory, a new process
        sent = conversation_turn(server.openai(), history, "After the restart.", seed=9)
        assert sent == len(expected_prompt(proxy_chat_format, history[:-1], len(history) - 2))
        assert writes_reach(server, 1) == 1


def test_responses_input_carrying_its_history_resumes_from_memory(fresh_proxy, proxy_chat_format):
    """The Responses API without conversation or previous_response_id (store false), its input the whole
    history: turn 1 keeps nothing, turn 2 its whole exchange; from turn 3 on the model reads memory and the new
    message only, as in a named session."""
    client = fresh_proxy.openai()
    history: list[dict] = []
    sizes = []
    for turn in range(1, 7):
        history.append({"role": "user", "content": f"Responses turn {turn}."})
        response = client.responses.create(model=MODEL, input=history, store=False, max_output_tokens=8, temperature=1.0)
        if turn >= 3:  # each answered turn forks the conversation's next state
            assert response.usage.input_tokens == len(expected_prompt(proxy_chat_format, history, len(history) - 1)), (turn, sizes)
        history.append({"role": "assistant", "content": response.output_text})
        sizes.append(response.usage.input_tokens)
        assert writes_reach(fresh_proxy, turn - 1) == turn - 1
    stateless = client.responses.create(model=MODEL, input=history + [{"role": "user", "content": "Again."}], store=False, max_output_tokens=1,
                                        extra_headers={"X-MemT-Memory": "off"})
    assert max(sizes[2:]) < stateless.usage.input_tokens / 4, (sizes, stateless.usage.input_tokens)


def test_many_conversations_stay_within_the_limits_without_errors(nano_checkpoint, tmp_path):
    """60 header-less conversations of 3 turns, 6 at a time, through a proxy keeping 8 session states over a
    core with room for 4 sessions: no request fails (no 429, no 5xx); branches beyond the room are closed
    (their conversations come back as a longer prompt), and the kept states stay within the bounds."""
    from e2e.servers import MemTServer

    upstream = MemTServer(nano_checkpoint, args=["--max-sessions-per-rank", "4"]).start()
    try:
        with ProxyServer(upstream.url, nano_checkpoint, args=["--max-sessions", "8", "--lease-idle", "0"]) as server:
            client = server.async_openai("unused")

            async def conversation(index: int) -> None:
                history: list[dict] = []
                for turn in range(3):
                    history.append({"role": "user", "content": f"Conversation {index}, turn {turn}."})
                    response = await client.chat.completions.create(model=MODEL, messages=history, max_tokens=6, temperature=1.0, seed=index, stop=STOPS)
                    history.append(assistant(response.choices[0].message))

            async def run() -> None:
                gate = asyncio.Semaphore(6)

                async def one(index: int) -> None:
                    async with gate:
                        await conversation(index)

                await asyncio.gather(*(one(index) for index in range(60)))

            asyncio.run(run())  # any 4xx/5xx raises
            assert proxy_metric(server, "memt_proxy_memory_states") <= 8
            assert proxy_metric(server, "memt_proxy_sessions") <= 8
            assert proxy_metric(server, "memt_proxy_memory_states_closed_total") > 0  # states were made beyond the room, and closed
            with upstream.client() as http:
                assert http.get("/metrics").status_code == 200
    finally:
        upstream.close()


def test_max_memory_states_bounds_the_kept_conversations(proxy_upstream, nano_checkpoint, proxy_chat_format):
    """--max-memory-states 3: the fourth kept conversation closes the least recently used one, whose next turn
    is then answered from its text (and kept again), while a recent one still resumes from memory."""
    with ProxyServer(proxy_upstream.url, nano_checkpoint, args=["--max-memory-states", "3"]) as server:
        client = server.openai("unused")
        histories: list[list[dict]] = [[] for _ in range(4)]
        for index, history in enumerate(histories):
            for turn in range(2):
                conversation_turn(client, history, f"Bounded {index}, turn {turn}.", seed=turn)
            writes_reach(server, index + 1)
        assert proxy_metric(server, "memt_proxy_memory_states") == 3
        assert proxy_metric(server, "memt_proxy_memory_states_closed_total") == 1
        sent = conversation_turn(client, histories[0], "The oldest again.", seed=5)  # closed: all of it as text
        assert sent == len(expected_prompt(proxy_chat_format, histories[0][:-1], 0))
        sent = conversation_turn(client, histories[3], "The newest again.", seed=5)  # kept: the new message only
        assert sent == len(expected_prompt(proxy_chat_format, histories[3][:-1], 4))


def test_a_streamed_conversation_with_a_tool_round_resumes_from_memory(fresh_proxy, proxy_chat_format):
    """No header, streamed, with a forced tool call answered by a tool result: the round is kept once the
    conversation comes back, and the turn after that holds only its new message, as without tools."""
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
    client = fresh_proxy.openai()

    def streamed(messages, **extra) -> tuple[dict, int]:
        content, calls, usage = "", {}, None
        request = dict(model=MODEL, messages=messages, max_tokens=12, temperature=1.0, seed=len(messages), stop=STOPS, tools=tools)
        for chunk in client.chat.completions.create(**{**request, **extra}, stream=True, stream_options={"include_usage": True}):
            usage = chunk.usage or usage
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for call in choice.delta.tool_calls or []:
                    entry = calls.setdefault(call.index, {"id": call.id, "type": "function", "function": {"name": "", "arguments": ""}})
                    entry["function"]["name"] += call.function.name or ""
                    entry["function"]["arguments"] += call.function.arguments or ""
        message = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return message, usage.prompt_tokens

    history = [{"role": "user", "content": "Look something up."}]
    call, _ = streamed(history, tool_choice="required", stop=None, max_tokens=64)  # a whole call
    assert call.get("tool_calls"), call
    history += [call, {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": "found it"}]
    answer, _ = streamed(history, tool_choice="none")
    history.append({**answer, "content": answer["content"] or ""})
    assert proxy_metric(fresh_proxy, "memt_proxy_memory_writes_total") == 0  # nothing continued the conversation yet
    for turn in range(2):
        history.append({"role": "user", "content": f"And then {turn}?"})
        answer, sent = streamed(history, tool_choice="none")
        held = 0 if turn == 0 else len(history) - 1  # the tool round and turn 0 kept behind turn 0's answer
        assert sent == len(expected_prompt(proxy_chat_format, history, held)), (turn, sent)  # tool_choice none: no tools in the prompt
        history.append({**answer, "content": answer["content"] or ""})
        assert writes_reach(fresh_proxy, turn + 1) == turn + 1


def test_room_is_made_from_extended_states_before_a_live_conversations_latest(proxy_upstream, nano_checkpoint, proxy_chat_format):
    """--max-memory-states 3 (issue 58 item 10): A keeps one state, B two (its second extends its first); C's state
    needs room: B's extended state is closed, not A's latest (the least recently used), so A's next turn still reads
    only its new message. Closing a live conversation's latest state, when nothing else can go, is one log line."""
    with ProxyServer(proxy_upstream.url, nano_checkpoint, args=["--max-memory-states", "3", "--log-level", "info"]) as server:
        client = server.openai("unused")
        a, b, c = [], [], []
        for name, history, turns, writes in (("A", a, 2, 1), ("B", b, 3, 3), ("C", c, 2, 4)):
            for turn in range(turns):
                conversation_turn(client, history, f"Conversation {name}, turn {turn}.", seed=turn)
            writes_reach(server, writes)  # each state is made behind its answer: in this order
        assert proxy_metric(server, "memt_proxy_memory_states_closed_total") == 1
        live = [line for line in server.log_path.read_text().splitlines() if "live header-less conversation" in line]
        assert live == []  # the state closed was B's extended one
        sent = conversation_turn(client, a, "A again.", seed=7)
        assert sent == len(expected_prompt(proxy_chat_format, a[:-1], 4))  # A's latest state was kept: the new message only
        writes_reach(server, 5)  # A's next state: room made from B's or C's latest, both live
        live = [line for line in server.log_path.read_text().splitlines() if "live header-less conversation" in line]
        assert len(live) == 1, live

"""Battery checks of issue 58: faults that must never cost a conversation its next request or its memory.

Each check drives live servers (``scripts.reliability.servers``) with the real ``httpx`` and ``openai`` clients and
returns its figures with an ``ok`` verdict, as ``checks.py``'s do. Waits in here pace fault injection (when a client
leaves, when a process is killed) and poll for state; none decides a verdict.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
import uuid

import httpx

from memt_proxy.session.state import native_session_id
from scripts.reliability.servers import MODEL, MemTServer, ProxyServer

LONG = {"max_tokens": 300, "min_tokens": 250}  # a streamed turn still generating when its client leaves


# ---------------------------------------------------------------------- a cut stream (item 1)


def _leave(http: httpx.Client, path: str, body: dict, headers: dict, frames: int) -> int:
    """Stream ``body`` to ``path`` and close the connection after ``frames`` data frames; the stream's status."""
    with http.stream("POST", path, json=body, headers=headers) as response:
        seen = 0
        for line in response.iter_lines():
            seen += line.startswith("data:")
            if seen >= frames:
                break
        return response.status_code


def _chat(messages: list[dict], *, seed: int = 0, stream: bool = False, temperature: float = 1.0, **extra) -> dict:
    return {"model": MODEL, "messages": messages, "temperature": temperature, "seed": seed, "stream": stream, **extra}


def _completed(http: httpx.Client, messages: list[dict], headers: dict) -> list[dict]:
    """A completed (stop-string-ended) chat turn after ``messages``: the transcript with its answer."""
    for seed in range(20):
        answer = http.post("/v1/chat/completions", json=_chat(messages, seed=seed, max_tokens=24, stop=[" ", "e"]), headers=headers)
        answer.raise_for_status()
        choice = answer.json()["choices"][0]
        if choice["finish_reason"] == "stop":
            return messages + [{"role": "assistant", "content": choice["message"]["content"]}]
    raise AssertionError("no completed turn in 20 seeds")


def cut_streams(proxy: ProxyServer, core: MemTServer, *, rounds: int = 4, key: str | None = None, tenant: str = "default") -> dict:
    """A streamed turn whose client reads a frame or two and closes, then at once the same turn again without
    streaming: 200, never 409 ``session_conflict`` (issue 58 item 1: the departed query was still in flight upstream).
    On a named session with a committed turn (after 1 frame), a Responses conversation (after 2), a header-less
    conversation (after 1), and a streamed request whose client leaves while it waits for the session."""
    figures: dict = {}
    errors: list[str] = []
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    with proxy.http(key) as http, proxy.http(key) as other:
        statuses = []
        for _ in range(rounds):
            headers = {**auth, "X-MemT-Session": f"cut-{uuid.uuid4().hex[:8]}"}
            history = _completed(http, [{"role": "user", "content": "Remember the word tangerine."}], headers)
            turn = history + [{"role": "user", "content": "Tell me a long story."}]
            _leave(http, "/v1/chat/completions", _chat(turn, stream=True, **LONG), headers, 1)
            statuses.append(_status(http.post("/v1/chat/completions", json=_chat(turn, max_tokens=4), headers=headers), errors))
        figures["named"] = statuses

        statuses = []
        for _ in range(rounds):
            conversation = http.post("/v1/conversations", json={}, headers=auth).json()["id"]
            first = {"model": MODEL, "conversation": conversation, "input": "Remember the word tangerine.", "max_output_tokens": 8}
            http.post("/v1/responses", json=first, headers=auth).raise_for_status()
            ask = {"model": MODEL, "conversation": conversation, "input": "Tell me a long story.", "temperature": 0}
            _leave(http, "/v1/responses", {**ask, "max_output_tokens": 300, "stream": True}, auth, 2)
            statuses.append(_status(http.post("/v1/responses", json={**ask, "max_output_tokens": 4}, headers=auth), errors))
        figures["responses"] = statuses

        statuses = []
        for _ in range(rounds):  # two exchanges: the conversation is kept, and its third turn reads a kept state
            history = _completed(http, [{"role": "user", "content": f"My parrot is {uuid.uuid4().hex[:6]}."}], auth)
            history = _completed(http, history + [{"role": "user", "content": "And my cat?"}], auth)
            turn = history + [{"role": "user", "content": "Tell me a long story."}]
            _leave(http, "/v1/chat/completions", _chat(turn, stream=True, **LONG), auth, 1)
            statuses.append(_status(http.post("/v1/chat/completions", json=_chat(turn, max_tokens=4), headers=auth), errors))
        figures["headerless"] = statuses

        statuses = []
        for _ in range(rounds):  # a long turn holds the session; a streamed one waits for it and its client leaves
            headers = {**auth, "X-MemT-Session": f"wait-{uuid.uuid4().hex[:8]}"}
            turn = _completed(http, [{"role": "user", "content": "Remember the word tangerine."}], headers)
            turn.append({"role": "user", "content": "Tell me a long story."})
            holder = threading.Thread(target=lambda: other.post("/v1/chat/completions", json=_chat(turn, **LONG), headers=headers))
            holder.start()
            _await_in_flight(core, native_session_id(tenant, headers["X-MemT-Session"]))
            try:
                with http.stream("POST", "/v1/chat/completions", json=_chat(turn, stream=True, **LONG), headers=headers, timeout=0.5) as response:
                    response.read()
            except httpx.TimeoutException:
                pass  # the client left while its request waited for the session
            statuses.append(_status(http.post("/v1/chat/completions", json=_chat(turn, max_tokens=4), headers=headers), errors))
            holder.join(120)
        figures["left_waiting"] = statuses
    figures["errors"] = errors[:3]
    figures["ok"] = all(status == 200 for name in ("named", "responses", "headerless", "left_waiting") for status in figures[name])
    return figures


def _status(response: httpx.Response, errors: list[str]) -> int:
    """``response``'s status; an error's body goes to ``errors``."""
    if response.status_code != 200:
        errors.append(f"{response.status_code} {response.text[:300]}")
    return response.status_code


def _await_transaction(core: MemTServer, native: str, timeout: float = 30) -> None:
    """Until the native session ``native`` has a write under way on ``core`` (an open transaction), or has none to come
    (its published version moved on first, or the time is up: the fault is then injected late, and the check says so)."""
    deadline = time.monotonic() + timeout
    with core.client() as http:
        epoch = http.get("/memt/capabilities").json()["epoch"]
        version = None
        while time.monotonic() < deadline:
            state = http.post("/memt/control", json={"action": "inspect", "session": native, "epoch": epoch}).json()
            if state.get("transaction") is not None or version is not None and state.get("published_version") != version:
                return
            version = state.get("published_version") if version is None else version
            time.sleep(0.001)


def _await_in_flight(core: MemTServer, native: str, timeout: float = 60) -> None:
    """Until the native session ``native`` has a query in flight on ``core``."""
    deadline = time.monotonic() + timeout
    with core.client() as http:
        epoch = http.get("/memt/capabilities").json()["epoch"]
        while time.monotonic() < deadline:
            answer = http.post("/memt/control", json={"action": "inspect", "session": native, "epoch": epoch})
            if answer.status_code == 200 and answer.json()["in_flight"]:
                return
            time.sleep(0.02)
    raise AssertionError(f"session {native} never had a query in flight")


# ---------------------------------------------------------------------- a core restarted under a conversation (item 3)


#: a short structured answer: the grammar closes it within a few tokens, so the random model's answer completes
SHORT = {"format": {"type": "json_schema", "name": "answer", "strict": True,
                    "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}}}


def _respond(http: httpx.Client, conversation: str, said: str, *, tokens: int = 64, temperature: float = 1.0, **extra) -> httpx.Response:
    body = {"model": MODEL, "conversation": conversation, "input": said, "max_output_tokens": tokens, "temperature": temperature, **extra}
    return http.post("/v1/responses", json=body)


def _completed_response(http: httpx.Client, conversation: str, texts: list[str]) -> dict:
    """A completed answer to the first of ``texts`` (a completed turn is committed behind it); its body."""
    for text in texts:
        answer = _respond(http, conversation, text, text=SHORT)
        answer.raise_for_status()
        if answer.json()["status"] == "completed":
            return answer.json()
    raise AssertionError(f"no completed response among {len(texts)} inputs")


def _written(http: httpx.Client, conversation: str) -> None:
    """Return once the commit behind the conversation's last answer has ended: a request on it waits for that commit
    before it is refused (no user message: 400)."""
    refused = http.post("/v1/responses", json={"model": MODEL, "conversation": conversation, "input": [{"role": "assistant", "content": "x"}]})
    assert refused.status_code == 400, refused.text


FACTS = [f"My parrot is called {name}." for name in ("Kiwi", "Mango", "Pepper", "Olive", "Basil", "Cocoa", "Maple", "Hazel")]


def responses_restart(proxy: ProxyServer, core: MemTServer, *, tries: int = 8) -> dict:
    """A Responses conversation with two committed turns, the core killed (kill -9) after the commits landed and
    restarted on its state directory without a snapshot store: the conversation goes on (issue 58 item 3: it was 409
    ``memory_version_mismatch`` forever). At most one 409 (the request that finds the restart, which the openai SDK
    retries), then 200 with the conversation's items sent as context; once that turn is committed, the next one is
    trimmed again (memory holds the conversation)."""
    from openai import OpenAI

    with proxy.http(None) as http:
        conversation, agents = (http.post("/v1/conversations", json={}).json()["id"] for _ in range(2))
        for turn in range(2):
            _completed_response(http, conversation, FACTS[turn * 4: turn * 4 + 4])
            _completed_response(http, agents, FACTS[turn * 4: turn * 4 + 4])
        _written(http, conversation)
        _written(http, agents)
        fresh = http.post("/v1/conversations", json={}).json()["id"]
        alone = _respond(http, fresh, "What is my parrot called?", tokens=1).json()["usage"]["input_tokens"]
        core.restart(kill=True)
        # an app on the openai SDK (as the Agents SDK is), its default retries: the conversation goes on without an error
        sdk = OpenAI(base_url=proxy.base_url, api_key="unused", timeout=120)
        try:
            redeployed = sdk.responses.create(model=MODEL, conversation=agents, input="What is my parrot called?", max_output_tokens=1).status
        except Exception as exc:  # noqa: BLE001 — reported as this check's failure
            redeployed = f"{type(exc).__name__}: {str(exc)[:200]}"
        statuses, errors, rebuilt = [], [], None
        for _ in range(tries):
            answer = _respond(http, conversation, "What is my parrot called?", tokens=1)
            statuses.append(_status(answer, errors))
            if answer.status_code == 200:
                rebuilt = answer.json()["usage"]["input_tokens"]
                break
        if rebuilt is not None:  # a completed turn rebuilds memory; the turn after it is trimmed again
            _completed_response(http, conversation, ["Thank you."] + FACTS)
            _written(http, conversation)
        later = _respond(http, conversation, "What is my parrot called?", tokens=1)
        items = http.get(f"/v1/conversations/{conversation}/items", params={"limit": 100}).json()["data"]
    figures = {
        "statuses": statuses, "errors": errors[:2], "prompt_alone": alone, "prompt_after_restart": rebuilt,
        "later_status": later.status_code, "prompt_later": later.json().get("usage", {}).get("input_tokens") if later.status_code == 200 else None,
        "items": len(items), "sdk_after_restart": redeployed,
    }
    figures["ok"] = (
        redeployed in ("completed", "incomplete") and rebuilt is not None and statuses.count(409) <= 1 and rebuilt > alone  # the conversation's items went as context
        and later.status_code == 200 and figures["prompt_later"] == alone  # memory holds them again
    )
    return figures


# ---------------------------------------------------------------------- a core killed behind answers (item 4)


def _prompt_tokens(http: httpx.Client, messages: list[dict], headers: dict) -> int:
    """The prompt tokens of ``messages`` read as text (memory off): what a turn costs when memory holds none of it."""
    answer = http.post("/v1/chat/completions", json=_chat(messages, max_tokens=1), headers={**headers, "X-MemT-Memory": "off"})
    answer.raise_for_status()
    return answer.json()["usage"]["prompt_tokens"]


def _until_answered(http: httpx.Client, body: dict, headers: dict, errors: list[str], tries: int = 8) -> tuple[list[int], dict | None]:
    """``body`` sent until it is answered 200 (the request that finds the restart may get a 409); the statuses and the answer."""
    statuses = []
    for _ in range(tries):
        answer = http.post("/v1/chat/completions", json=body, headers=headers)
        statuses.append(_status(answer, errors))
        if answer.status_code == 200:
            return statuses, answer.json()
    return statuses, None


LONG_TEXT = " ".join(["The weather was mild and the garden was quiet that morning."] * 60)


def crash_behind_answers(proxy: ProxyServer, core: MemTServer) -> dict:
    """Three conversations (named, header-less, Responses) with two turns each send a third, and the core is killed
    (kill -9) as soon as the answers are back, their commits in flight (their outcome uncertain), then restarted
    without a snapshot store. The named session's next turn must send its whole transcript (issue 58 item 4: it was
    trimmed as if memory held it: 47 prompt tokens against ~115, the fact lost), and once that turn is committed the
    turn after it is trimmed again. The header-less and Responses conversations are answered too."""
    errors: list[str] = []
    named = {"X-MemT-Session": f"crash-{uuid.uuid4().hex[:8]}"}
    with proxy.http(None) as http, proxy.http(None) as second, proxy.http(None) as third:
        chat = _completed(http, [{"role": "user", "content": "My parrot is called Kiwi."}], named)
        chat = _completed(http, chat + [{"role": "user", "content": "My cat is called Tom."}], named)
        plain = _completed(http, [{"role": "user", "content": "My dog is called Rex."}], {})
        plain = _completed(http, plain + [{"role": "user", "content": "My fish is called Bubbles."}], {})
        conversation = http.post("/v1/conversations", json={}).json()["id"]
        for turn in range(2):
            _completed_response(http, conversation, FACTS[turn * 4: turn * 4 + 4])
        _written(http, conversation)
        # the third turns at once; the core killed as soon as all three are answered (their commits behind them in flight)
        chat.append({"role": "user", "content": LONG_TEXT + " My horse is called Star."})  # long: slow commits
        plain.append({"role": "user", "content": LONG_TEXT + " My bird is called Sky."})
        answers: dict = {}
        barrier = threading.Barrier(3, timeout=120)  # the named turn is sent once the other two are answered

        def named_turn():
            for seed in range(20):  # a completed answer, committed behind it
                answers["named"] = http.post("/v1/chat/completions", json=_chat(chat, seed=seed, max_tokens=24, stop=[" ", "e"]), headers=named)
                if answers["named"].status_code != 200 or answers["named"].json()["choices"][0]["finish_reason"] == "stop":
                    break
            _await_transaction(core, native_session_id("default", named["X-MemT-Session"]))
            core.kill()  # its commit under way behind the answer

        sends = [
            threading.Thread(target=lambda: (barrier.wait(), named_turn())),
            threading.Thread(target=lambda: (answers.__setitem__("headerless", second.post("/v1/chat/completions", json=_chat(plain, max_tokens=24, stop=[" ", "e"]))), barrier.wait())),
            threading.Thread(target=lambda: (answers.__setitem__("responses", _respond(third, conversation, LONG_TEXT + " My horse is called Star.", tokens=8)), barrier.wait())),
        ]
        for send in sends:
            send.start()
        for send in sends:
            send.join(120)
        core.restart(kill=True)
        ready = http.get("/health/ready").status_code  # a load balancer's readiness probe: the proxy sees the new epoch
        figures: dict = {name: {"third": answer.status_code} for name, answer in answers.items()}
        figures["ready"] = ready
        chat.append({"role": "assistant", "content": answers["named"].json()["choices"][0]["message"]["content"]})
        plain.append({"role": "assistant", "content": answers["headerless"].json()["choices"][0]["message"]["content"]})

        ask = chat + [{"role": "user", "content": "What is my parrot called?"}]
        statuses, answered = _until_answered(http, _chat(ask, max_tokens=4), named, errors)
        whole = _prompt_tokens(http, ask, {})
        figures["named"].update({"after": statuses, "prompt": answered["usage"]["prompt_tokens"] if answered else None, "whole_transcript": whole})
        figures["headerless"]["after"], _ = _until_answered(http, _chat(plain + [{"role": "user", "content": "What is my dog called?"}], max_tokens=4), {}, errors)
        after = _respond(http, conversation, "What is my parrot called?", tokens=4)
        figures["responses"]["after"] = [_status(after, errors)] + ([] if after.status_code == 200 else [_status(_respond(http, conversation, "What is my parrot called?", tokens=4), errors)])
        # a completed turn then commits the whole transcript; the next turn reads only its new message
        chat = _completed(http, chat + [{"role": "user", "content": "Thank you."}], named)
        ask = chat + [{"role": "user", "content": "And my cat?"}]
        later = http.post("/v1/chat/completions", json=_chat(ask, max_tokens=4), headers=named)
        figures["named"]["later_prompt"] = later.json()["usage"]["prompt_tokens"] if later.status_code == 200 else later.status_code
        figures["named"]["new_message_alone"] = _prompt_tokens(http, ask[-1:], {})
    figures["errors"] = errors[:3]
    part = figures["named"]
    figures["ok"] = (
        part["prompt"] == part["whole_transcript"] and part["after"].count(409) <= 1
        and part["later_prompt"] == part["new_message_alone"]
        and figures["headerless"]["after"][-1] == 200 and figures["responses"]["after"][-1] == 200
    )
    return figures


# ---------------------------------------------------------------------- a timing channel across tenants (item 6)


def _metrics(url: str, headers: dict | None = None) -> dict[str, float]:
    """A server's /metrics counters and gauges by series."""
    found = {}
    for line in httpx.get(url + "/metrics", headers=headers or {}, timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            found[series] = float(value)
    return found


UPSTREAM_WORK = ("memt_control_requests_total", "memt_generate_requests_total", "memt_prompt_tokens_total", "memt_generation_tokens_total")


KEEPING = ('action="renew"', 'action="release"')  # leases kept and let go by the clock, for any session: not the request's


def _work(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the core did between two /metrics readings: its requests by kind and action, and its tokens."""
    return {series: after[series] - before.get(series, 0.0) for series in after
            if series.startswith(UPSTREAM_WORK) and not any(clock in series for clock in KEEPING) and after[series] != before.get(series, 0.0)}


def tenant_timing(proxy: ProxyServer, core: MemTServer, keys: tuple[str, str], *, conversations: int = 4, tokens: int = 12) -> dict:
    """Tenant A holds header-less conversations; tenant B sends A's exact transcripts and, in one order with them, the
    same transcripts with one letter of the name changed (as many tokens). Whether another tenant sent a transcript must
    change nothing B can observe (issue 58 item 6): B's prompt tokens are equal, and the work each request makes the core
    do (its requests by kind and action, prompt and generated tokens, read from /metrics once its state is written)
    is the same for both kinds. The latency medians of both kinds are reported beside them, not judged (the machine's
    noise); ``scripts/bench/tenant_timing.py`` measures them at size."""
    a, b = ({"Authorization": f"Bearer {key}"} for key in keys)
    names = [f"Ottilie{index}" for index in range(conversations)]
    with proxy.http(None) as http:
        sent = []
        for name in names:
            history: list[dict] = []
            for text in (f"Hi, my name is {name} and I live in Samarkand.", "What do parrots eat?", "And what is my name?"):
                history.append({"role": "user", "content": text})
                answer = http.post("/v1/chat/completions", json=_chat(history, max_tokens=tokens, min_tokens=tokens), headers=a)
                answer.raise_for_status()
                history.append({"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]})
            sent.append((name, history[:-1]))
        order = [(kind, name, transcript) for name, transcript in sent for kind in ("sent", "changed")]
        random.Random(58).shuffle(order)
        seconds: dict[str, list[float]] = {"sent": [], "changed": []}
        work: dict[str, dict] = {}
        prompts: dict[str, dict] = {}
        for kind, name, transcript in order:
            if kind == "changed":
                transcript = [{**m, "content": m["content"].replace(name, "O" + name[1].upper() + name[2:])} for m in transcript]
            writes = _metrics(proxy.url, b).get("memt_proxy_memory_writes_total", 0.0)
            before = _metrics(core.url)
            began = time.perf_counter()
            answer = http.post("/v1/chat/completions", json=_chat(transcript, temperature=0.0, max_tokens=tokens, min_tokens=tokens), headers=b)
            seconds[kind].append(time.perf_counter() - began)
            answer.raise_for_status()
            _await_metric(proxy.url, b, "memt_proxy_memory_writes_total", writes + 1)  # its state kept behind the answer
            work.setdefault(name, {})[kind] = _work(before, _metrics(core.url))
            prompts.setdefault(name, {})[kind] = answer.json()["usage"]["prompt_tokens"]
    differing = [name for name in names if work[name]["sent"] != work[name]["changed"] or prompts[name]["sent"] != prompts[name]["changed"]]
    return {
        "median_ms": {kind: round(1000 * statistics.median(values), 1) for kind, values in seconds.items()},
        "n": conversations, "prompt_tokens": prompts, "differing": differing, "work_of_one": work[names[0]]["sent"],
        "ok": not differing,
    }


def _await_metric(url: str, headers: dict, name: str, value: float, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while _metrics(url, headers).get(name, 0.0) < value:
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} never reached {value}")
        time.sleep(0.02)

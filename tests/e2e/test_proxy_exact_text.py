"""A kept memory state is reused only for the exact text the model would read (issue 45): live through the openai
SDK on the tiny random model, checked by exact prompt sizes (``expected_prompt``: which messages were sent as text,
so which ones memory held) and the proxy's write counter (commits land behind answers: waited for on that state).

* Header-less conversations whose earlier messages differ from a kept state's only in surrounding whitespace, or in
  the order of a tool call's argument keys, do not resume from it: the template writes both as they are
  (``memt_proxy.session.transcript``), so the model would read other tokens; the conversation the state was kept for still
  resumes from it.
* A session record written under hash scheme 1 (a proxy before this rule) keeps the session's memory across the
  upgrade: a restarted proxy matches it by the old hash, rewrites it as scheme 2, and its kept states are found
  again from that turn on.
"""

from __future__ import annotations

import json

import pytest
from e2e.proxies import MODEL, STOPS, ProxyServer, assistant, expected_prompt, say, unique, writes_reach

from memt_proxy.session.prefix_index import chain
from memt_proxy.session.sessions import native_session_id
from memt_proxy.session.transcript import HASH_SCHEME, legacy_message_hash, message_hash

pytestmark = pytest.mark.timeout(600)


def chat(client, messages, *, seed=0, **extra):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=1.0, seed=seed, stop=STOPS, **extra)


def sent(client, messages, *, seed: int) -> int:
    """The prompt tokens of one header-less request."""
    return chat(client, messages, seed=seed).usage.prompt_tokens


def test_headerless_conversations_differing_in_surrounding_whitespace_do_not_share_a_state(fresh_proxy, proxy_chat_format):
    client = fresh_proxy.openai()
    history = [{"role": "user", "content": "Hello there."}]
    history.append(assistant(chat(client, history, seed=1).choices[0].message))
    history.append({"role": "user", "content": "My dog is Rex."})
    history.append(assistant(chat(client, history, seed=2).choices[0].message))
    assert writes_reach(fresh_proxy, 1) == 1  # a state holding these four messages, kept behind the second answer
    question = {"role": "user", "content": "How old is he?"}

    variants = {
        "user": [{"role": "user", "content": "  Hello there.\n"}, *history[1:]],
        "assistant": [history[0], {**history[1], "content": history[1]["content"] + "\n"}, *history[2:]],
    }
    for name, variant in variants.items():
        request = variant + [question]
        # with the hash of old (content stripped) this was the state's prompt: the question alone
        assert sent(client, request, seed=3) == len(expected_prompt(proxy_chat_format, request, None)), name  # all of it as text

    request = history + [question]
    assert sent(client, request, seed=3) == len(expected_prompt(proxy_chat_format, request, 4))  # the state is there: its own conversation reads it


def test_headerless_conversations_differing_in_argument_key_order_do_not_share_a_state(fresh_proxy, proxy_chat_format):
    """The template writes a call's arguments string as it is: keys in another order are other tokens."""
    client = fresh_proxy.openai()

    def call(arguments: str) -> dict:
        return {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]}

    def history(arguments: str) -> list[dict]:
        return [
            {"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Weather in Oslo, in C?"}, call(arguments),
            {"role": "tool", "tool_call_id": "call_1", "content": "12 C, rain"}, {"role": "assistant", "content": "12 C and rain."},
            {"role": "user", "content": "And tomorrow?"},
        ]

    kept = history('{"city": "Oslo", "unit": "C"}')
    kept.append(assistant(chat(client, kept, seed=1).choices[0].message))  # two exchanges before it: worth keeping
    assert writes_reach(fresh_proxy, 1) == 1
    question = {"role": "user", "content": "Thanks."}

    reordered = history('{"unit": "C", "city": "Oslo"}') + kept[-1:] + [question]
    assert sent(client, reordered, seed=2) == len(expected_prompt(proxy_chat_format, reordered, None))  # all of it as text
    request = kept + [question]
    assert sent(client, request, seed=2) == len(expected_prompt(proxy_chat_format, request, len(kept)))


def as_scheme_one(directory, tenant: str, history: list[dict]) -> int:
    """Rewrite the proxy's records under ``directory`` as a proxy before hash scheme 2 wrote them: every message hash
    (of ``history``'s messages) as ``legacy_message_hash``, no "hash_scheme", kept states' heads as chains of those.
    Returns the session records rewritten."""
    old = {message_hash(m): legacy_message_hash(m) for m in history}

    def legacy(hashes):
        assert all(h in old for h in hashes), "a record holds a hash of no message of the history"
        return [old[h] for h in hashes]

    records = 0
    for path in directory.glob("*.json"):
        record = json.loads(path.read_text())
        assert record.pop("hash_scheme") == HASH_SCHEME
        for entry in (record, record.get("next")):
            if entry and entry.get("committed") is not None:
                entry["committed"] = legacy(entry["committed"])
        path.write_text(json.dumps(record))
        records += 1
    for path in (directory / "branches").glob("*.json"):
        branch = json.loads(path.read_text())
        native = json.loads((directory / f"{path.stem}.json").read_text())
        held = native["next"]["committed"] if native.get("next") else native["committed"]
        branch["head"] = chain(tenant, held)[-1] if held else None
        path.write_text(json.dumps(branch))
    return records


def test_a_session_recorded_under_hash_scheme_one_keeps_its_memory_across_the_upgrade(proxy_upstream, nano_checkpoint, proxy_chat_format, tmp_path):
    state = tmp_path / "proxy-state"
    args = ["--state-directory", str(state)]
    session, history = unique("scheme-one"), []
    with ProxyServer(proxy_upstream.url, nano_checkpoint, args=args) as first:
        for text in ("first question", "second question"):
            say(first.openai("unused"), history, text, session)
        assert first.inspect(session, None)["committed_messages"] == 4
    assert as_scheme_one(state, "default", history) >= 2  # the session's record and its kept state's

    own = state / f"{native_session_id('default', session)}.json"
    with ProxyServer(proxy_upstream.url, nano_checkpoint, args=args) as second:
        client = second.openai("unused")
        info = second.inspect(session, None)
        assert info["committed_messages"] == 4 and info["history_known"] is True
        reply = say(client, history, "third question", session)
        assert reply.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, history[:-1], 4))  # memory kept: the question alone
        assert writes_reach(second, 1) == 1  # the turn's commit, behind the answer: its record is written before it
        record = json.loads(own.read_text())
        assert record["hash_scheme"] == HASH_SCHEME and record["next"]["committed"] == [message_hash(m) for m in history]  # rewritten
        # the state kept before that turn is named by scheme-2 hashes: a regenerate of its answer reads it
        again = chat(client, history[:-1], seed=50, extra_headers={"X-MemT-Session": session})
        assert again.usage.prompt_tokens == reply.usage.prompt_tokens

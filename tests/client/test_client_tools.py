"""Caller-executed tools across several rounds, refusals while tool results are pending, and
truncated turns — against live servers of both families.

How the model is made to call tools, honestly: a random tiny model never writes tool-call markup,
so the servers run *scripted* checkpoints (``scripted.py``). Their ``lm_head`` was solved so that,
after exactly the prompts a correct client sends, greedy decoding writes the family's real
tool-call markup (Nano ``<tool_call>{json}</tool_call>``, Flash DSML ``tool_calls`` blocks) token by
token: round 1 one call, round 2 two calls, round 3 the final answer. The server decodes for real;
the client parses the real output. A client that built any round's prompt differently (lost a
token of the replayed turn, rendered tool results another way) would meet the random model instead,
and the chain would not play out — so these tests also pin prompt exactness.
"""

from __future__ import annotations

import json

import pytest
from client.scripted import ANSWERS, CALL_ITEMS, PLAIN_FIRST, PLAIN_SECOND, TOOL_QUESTION, TOOL_RESULTS, TOOLS, TRUNCATE
from client.support import Live

from memt_core.client import MemTClientError

pytestmark = pytest.mark.timeout(300)

ROUND_TOKENS = 120  # enough for the longest scripted reply (Flash's two DSML calls)


def _results(result: dict, round_number: int) -> list[dict]:
    return [
        {"tool_call_id": call["id"], "content": value["content"]}
        for call, value in zip(result["tool_calls"], TOOL_RESULTS[round_number])
    ]


def test_tool_chain_over_several_rounds_is_one_turn(live: Live):
    client, rec = live.client()
    fmt = live.chat_format
    with live.session(client, tools=TOOLS) as session:
        # Round 1: one call. Tools configured → a result dict even without return_dict.
        mark = rec.mark()
        result = session.chat(TOOL_QUESTION, enable_memory=True, max_new_tokens=ROUND_TOKENS)
        assert rec.since(mark) == ["acquire", "query", "release"]  # nothing committed while tools are pending
        assert result["requires_action"] is True and result["generation_completed"] is True
        assert result["turn_completed"] is False and result["memory_updated"] is False
        calls = result["tool_calls"]
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("lookup", {"item": "age"})]
        assert calls[0]["type"] == "function" and calls[0]["id"]
        prompt1 = rec.records_since(mark, "query")[0].body["input_ids"]
        output1 = result["output_ids"]
        assert session.status()["pending_tool_calls"] == 1
        messages = session.messages
        assert [m["role"] for m in messages] == ["user", "assistant"] and messages[1]["tool_calls"] == calls

        _refusals_while_pending(session, rec)

        # Round 2: the prompt continues the same turn with the exact generated ids and the results.
        mark = rec.mark()
        first_results = _results(result, 0)
        result = session.submit_tool_results(first_results)
        assert rec.since(mark) == ["acquire", "query", "release"]
        prompt2 = rec.records_since(mark, "query")[0].body["input_ids"]
        assert prompt2 == prompt1 + output1 + fmt.tool_results_ids(first_results, enable_thinking=False)
        assert result["requires_action"] is True
        assert [json.loads(c["function"]["arguments"])["item"] for c in result["tool_calls"]] == CALL_ITEMS[1]
        assert len({c["id"] for c in result["tool_calls"]}) == 2
        output2 = result["output_ids"]

        # Results must name exactly the pending calls (any order); a wrong set sends nothing.
        mark = rec.mark()
        with pytest.raises(MemTClientError):
            session.submit_tool_results(_results(result, 1)[:1])
        with pytest.raises(MemTClientError):
            session.submit_tool_results([{"tool_call_id": "call_unknown", "content": "x"}] + _results(result, 1)[1:])
        assert rec.since(mark) == []

        # Round 3: results given in reverse order are put back in call order; the final answer
        # completes the logical turn, which is committed once, as one commit, then leaves the prompt.
        second_results = _results(result, 1)
        mark = rec.mark()
        result = session.submit_tool_results(list(reversed(second_results)))
        assert rec.since(mark) == ["acquire", "query", "begin", "commit", "publish", "release"]
        prompt3 = rec.records_since(mark, "query")[0].body["input_ids"]
        assert prompt3 == prompt2 + output2 + fmt.tool_results_ids(second_results, enable_thinking=False)
        assert result["answer"] == ANSWERS["final"] and result["tool_calls"] == []
        assert result["requires_action"] is False and result["turn_completed"] is True
        assert result["memory_updated"] is True and result["committed_turns"] == [1]
        commit = rec.records_since(mark, "commit")[0].body["input_ids"]
        assert commit == prompt3[len(prompt1) - len(fmt.user_ids(TOOL_QUESTION)):] + result["output_ids"]
        assert session.messages == []
        status = session.status()
        receipt = status["receipts"][rec.records_since(mark, "begin")[0].body["transaction"]]
        assert receipt["state"] == "published"
        assert [(c["tokens"], c["status"]) for c in receipt["commits"]] == [(len(commit), "applied")]

        with pytest.raises(MemTClientError):
            session.submit_tool_results([])  # nothing is pending any more


def _refusals_while_pending(session, rec) -> None:
    """A new chat, commit, ingestion or save is refused (without a request) until results arrive."""
    mark = rec.mark()
    for attempt in (
        lambda: session.chat("Something else."),
        lambda: session.commit_history(),
        lambda: session.ingest("A document."),
        lambda: session.save_state("never.safetensors"),
        lambda: session.save_state(),
    ):
        with pytest.raises(MemTClientError) as info:
            attempt()
        assert "tool results are pending" in str(info.value) and not info.value.uncertain
    assert rec.since(mark) == []


def test_truncated_reply_is_kept_and_committed_later(live: Live):
    """A truncated reply is not committed automatically; it is replayed, and committed with a later
    completed turn that has enable_memory=True (or by commit_history()/save_state())."""
    client, rec = live.client()
    fmt = live.chat_format
    with live.session(client) as session:
        mark = rec.mark()
        cut = session.chat(PLAIN_FIRST, enable_memory=True, max_new_tokens=TRUNCATE, return_dict=True)
        assert rec.since(mark) == ["acquire", "query", "release"]  # a truncated reply is not committed
        assert cut["generation_completed"] is False and cut["turn_completed"] is False
        assert cut["memory_updated"] is False and cut["committed_turns"] == []
        assert cut["finish_reason"] == "length"
        assert cut["output_ids"] == live.encode(ANSWERS["first"])[:TRUNCATE]  # the script's start, cut off
        assert len(session.messages) == 2 and session.status()["uncommitted_turns"] == 1

        # The truncated turn is replayed token for token; this reply completes (scripted), so both
        # turns are committed, the truncated one included.
        mark = rec.mark()
        done = session.chat(PLAIN_SECOND, enable_memory=True, max_new_tokens=32, return_dict=True)
        assert rec.since(mark) == ["acquire", "query", "begin", "commit", "commit", "publish", "release"]
        truncated_turn = fmt.user_ids(PLAIN_FIRST) + cut["output_ids"]
        assert rec.records_since(mark, "query")[0].body["input_ids"] == fmt.prompt_ids(
            system_prompt=None, tools=None, turns=[truncated_turn], tail=fmt.user_ids(PLAIN_SECOND)
        )
        assert done["answer"] == ANSWERS["second"] and done["turn_completed"] is True
        assert done["memory_updated"] is True and done["committed_turns"] == [1, 2]
        assert rec.records_since(mark, "commit")[0].body["input_ids"] == truncated_turn
        assert session.messages == []

    with live.session(client, tools=TOOLS) as session:
        # A truncated reply full of tool-call markup is not an action: nothing is pending.
        cut = session.chat(TOOL_QUESTION, max_new_tokens=TRUNCATE)
        assert cut["generation_completed"] is False and cut["requires_action"] is False
        mark = rec.mark()
        session.chat("Next question.", max_new_tokens=TRUNCATE, enable_memory=True)
        assert rec.since(mark) == ["acquire", "query", "release"]
        assert session.status()["uncommitted_turns"] == 2
        # commit_history() writes retained turns, truncated ones included
        mark = rec.mark()
        assert session.commit_history()["committed_turns"] == [1, 2]
        assert rec.since(mark) == ["acquire", "begin", "commit", "commit", "publish", "release"]
        # and save_state() replays a pending truncated turn
        session.chat("A last question.", max_new_tokens=TRUNCATE)
        mark = rec.mark()
        assert session.save_state()["committed_turns"] == [3]
        assert rec.since(mark) == ["acquire", "begin", "commit", "export", "publish", "release"]


@pytest.mark.parametrize("generated", [
    "Hi <tool_call>not a call</tool_call> there.",  # a malformed call block
    "Sunny</think> today.<think>\n\n</think>",  # a stray tag and a reasoning block after the answer
])
def test_a_completed_answer_is_kept_without_the_markup_the_caller_never_saw(live_nano: Live, generated):
    """What ``MemTSession`` replays and commits of an answer is what ``chat`` returned, not stray markup."""
    from memt_core.client.native import NativeClient
    from memt_core.client.session import TurnRecord

    with NativeClient(live_nano.server.url) as client:
        session = live_nano.session(client)
        try:
            eos = live_nano.tokenizer.eos_token_id
            turn = TurnRecord(number=1, messages=[{"role": "user", "content": "hi"}], ids=live_nano.encode("hi"), thinking=False)
            result = session._absorb(turn, {"output_ids": live_nano.encode(generated) + [eos], "meta_info": {"finish_reason": {"type": "stop"}}})
            kept = live_nano.chat_format.decode(session._turns[-1].ids[len(live_nano.encode("hi")):])
            assert kept == result["answer"] or kept.strip() == result["answer"]
            for tag in ("<tool_call>", "</tool_call>", "<think>", "</think>"):
                assert tag not in kept
            assert session.commit_history()["memory_updated"] is True
        finally:
            session.close()

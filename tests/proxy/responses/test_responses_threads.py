"""``memt_proxy.responses.threads``: how a conversation or a chain moves on after a response, with no upstream."""

from __future__ import annotations

from types import SimpleNamespace

from memt_proxy.responses.records import ResponseRecords, Thread
from memt_proxy.responses.threads import Threads

SAID = [{"role": "user", "content": "I live in Lisbon."}, {"role": "assistant", "content": "Noted."}]
ITEMS = [{"type": "message", "role": "user", "content": "I live in Lisbon."}]
OUTPUT = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Noted."}]}]


def threads(records: ResponseRecords) -> Threads:
    return Threads(SimpleNamespace(), records, snapshots_per_chain=2)


def test_a_committed_turn_goes_behind_and_a_chain_exports_its_snapshot_next():
    records = ResponseRecords(None)
    chain = Thread(id="chain_1", tenant="t", session="s", version=1, uncommitted=[{"role": "user", "content": "earlier"}])
    threads(records).advance(chain, "resp_2", SAID, [], OUTPUT, 2, base_version=1, items=ITEMS)
    assert (chain.head, chain.version, chain.behind, chain.uncommitted, chain.snapshot_of) == ("resp_2", 2, SAID, [], "resp_2")
    assert chain.items == [] and records.thread("t", "chain_1") is chain
    conversation = Thread(id="conv_1", tenant="t", session="s", version=1)
    threads(records).advance(conversation, "resp_3", SAID, [], OUTPUT, 2, base_version=1, items=ITEMS)
    assert conversation.snapshot_of is None and conversation.items == ITEMS + OUTPUT  # a conversation keeps its items


def test_a_pending_or_cut_turn_stays_open_at_the_version_it_read():
    records = ResponseRecords(None)
    thread = Thread(id="conv_1", tenant="t", session="s", version=4)
    threads(records).advance(thread, "resp_5", SAID, ["c1"], OUTPUT, None, base_version=4, items=ITEMS)
    assert (thread.head, thread.version, thread.uncommitted, thread.calls, thread.behind) == ("resp_5", 4, SAID, ["c1"], [])


def test_a_thread_turns_answer_is_kept_for_a_retry_in_the_runners_answers_and_the_threads_record():
    from memt_proxy.request_context import RequestContext
    from memt_proxy.session.retries import KeptAnswers
    from memt_proxy.responses.threads import ThreadAnswers

    answers, thread = KeptAnswers(), Thread(id="conv_1", tenant="t", session="s", version=1)
    context = RequestContext(tenant="t", policy="auto", size=10, digest="d1", key="k1", retry=False)
    body = {"id": "resp_7", "object": "response", "output": OUTPUT}
    ThreadAnswers(thread, answers).answered(context, body)
    assert thread.answered == {"digest": "d1", "key": "k1", "id": "resp_7", "body": body}
    assert answers.retried("t", "d1", False, "k1") is body and answers.retried("t", "d1", False, None) is None

"""``memt_proxy.session.retries``: a retry only when the client says so, answers kept per tenant and request, the newest
``limit`` of them; the two retry stores a memory plan names (``KeptAnswers``: kept when answered; ``InSessionRecord``:
kept in the record of the state a commit lands in, and only then)."""

from __future__ import annotations

from memt_proxy.request_context import RequestContext
from memt_proxy.session.retries import IN_SESSION_RECORD, KeptAnswers, request_digest, retried
from memt_proxy.session.state import SessionState


def test_a_repeat_is_a_retry_only_when_the_client_says_so_or_repeats_the_idempotency_key():
    assert retried(True, None, None)  # x-stainless-retry-count > 0
    assert retried(False, "k1", "k1")  # the key the kept answer was given under
    assert not retried(False, "k2", "k1") and not retried(False, None, None) and not retried(False, None, "k1")


def test_answers_are_kept_per_tenant_and_request_the_newest_limit():
    kept = KeptAnswers(limit=2)
    first, second, third = (request_digest(f'{{"input": "{n}"}}') for n in "abc")
    kept.keep("alpha", first, None, "answer a")
    assert kept.retried("alpha", first, True, None) == "answer a"
    assert kept.retried("alpha", first, False, None) is None  # the same request, not a retry: a regenerate
    assert kept.retried("beta", first, True, None) is None  # another tenant's request is never answered from it
    kept.keep("alpha", second, "key-b", "answer b")
    assert kept.retried("alpha", second, False, "key-b") == "answer b"
    kept.keep("alpha", third, None, "answer c")
    assert kept.retried("alpha", first, True, None) is None  # the oldest went past the limit
    assert kept.retried("alpha", third, True, None) == "answer c"


def test_a_request_digest_is_the_same_for_the_same_request_only():
    assert request_digest('{"a": 1}') == request_digest('{"a": 1}') != request_digest('{"a": 2}')


def test_the_retry_stores_keep_an_answer_where_they_say():
    context = RequestContext("t", "auto", 10, "d", key="k")
    answers, state = KeptAnswers(), SessionState(native="n")
    answers.answered(context, {"message": "a"})  # kept as soon as answered
    answers.committed(context, {"message": "a"}, state, 3)
    assert answers.retried("t", "d", False, "k") == {"message": "a"} and state.last_turn is None
    IN_SESSION_RECORD.answered(context, {"message": "b"})  # a named session's: nothing until a commit
    assert state.last_turn is None
    IN_SESSION_RECORD.committed(context, {"message": "b"}, state, 3)
    assert state.last_turn == {"digest": "d", "key": "k", "version": 3, "message": "b"}

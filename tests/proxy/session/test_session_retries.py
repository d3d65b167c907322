"""``memt_proxy.session.retries``: a retry only when the client says so, answers kept per tenant and request, the newest
``limit`` of them."""

from __future__ import annotations

from memt_proxy.session.retries import KeptAnswers, request_digest, retried


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

"""The proxy's Prometheus ``/metrics`` (issue 16), live: requests through the openai SDK move the request,
latency, token, memory-saving, session and upstream-error series by exactly what was done, read back
with prometheus_client's own text parser."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from e2e.proxies import KEY_A, MODEL, ProxyServer, ask, completed_turn, unique
from e2e.servers import MemTServer
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(600)

CHAT = {"route": "/v1/chat/completions", "method": "POST"}


def scrape(proxy, key: str | None = KEY_A) -> dict[tuple[str, frozenset], float]:
    """Every sample of ``GET /metrics`` as {(name, labels): value}."""
    with proxy.http(key) as http:
        response = http.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def moved(before: dict, after: dict, name: str, **labels) -> float:
    """How much the sample ``name{labels}`` grew between two scrapes (absent counts as 0)."""
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def settled(proxy, before: dict, name: str, count: int, **labels) -> dict:
    """A scrape once ``name{labels}`` has grown by ``count``: a request is counted as its response ends, which
    the client may see a moment before the proxy's books are done (polled, up to 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        after = scrape(proxy)
        if moved(before, after, name, **labels) >= count or time.monotonic() > deadline:
            return after
        time.sleep(0.05)


def test_requests_latency_and_tokens_are_counted(proxy):
    """Two plain and one streamed completion: 3 requests of the chat route with status 200, 3 latencies,
    and the tokens the responses' usage reports; a refused request and an unknown path by their status."""
    client = proxy.openai()
    before = scrape(proxy)
    usages = [ask(client, [{"role": "user", "content": f"Hello {n}"}], max_tokens=8, seed=n).usage for n in range(2)]
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Stream."}], max_tokens=8, seed=3, stream=True,
        stream_options={"include_usage": True},
    ))
    usages.append(chunks[-1].usage)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    with proxy.http() as http:
        assert http.get("/no/such/path").status_code == 404
    after = settled(proxy, before, "memt_proxy_request_duration_seconds_count", 4, **CHAT)

    assert moved(before, after, "memt_proxy_requests_total", **CHAT, status="200") == 3
    assert moved(before, after, "memt_proxy_requests_total", **CHAT, status="404") == 1
    assert moved(before, after, "memt_proxy_requests_total", route="other", method="GET", status="404") == 1
    assert moved(before, after, "memt_proxy_request_duration_seconds_count", **CHAT) == 4
    assert moved(before, after, "memt_proxy_request_duration_seconds_sum", **CHAT) > 0
    assert moved(before, after, "memt_proxy_completions_total", memory="false") == 3
    assert moved(before, after, "memt_proxy_prompt_tokens_total", memory="false") == sum(u.prompt_tokens for u in usages)
    assert moved(before, after, "memt_proxy_completion_tokens_total", memory="false") == sum(u.completion_tokens for u in usages)
    assert moved(before, after, "memt_proxy_memory_saved_tokens_total") == 0  # stateless: nothing in memory
    # the proxy is shared with other tests: only what these requests did counts
    assert not any(name == "memt_proxy_upstream_errors_total" and value != before.get((name, labels), 0.0) for (name, labels), value in after.items())


def test_memory_savings_and_sessions(proxy):
    """A session's first turn saves nothing; once it is committed the next turn's prompt tokens are
    counted with memory, and the tokens memory spared are counted as saved. The session is kept."""
    client = proxy.openai()
    session = unique("metrics")
    history = [{"role": "user", "content": "My parrot is called Belkavo."}]
    before = scrape(proxy)
    first = completed_turn(client, session, history)
    middle = scrape(proxy)
    history += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "What is my parrot called?"}]
    second = ask(client, history, session)
    after = scrape(proxy)

    assert moved(before, middle, "memt_proxy_memory_saved_tokens_total") == 0
    assert moved(before, middle, "memt_proxy_completions_total", memory="true") >= 1  # completed_turn may take several tries
    assert moved(middle, after, "memt_proxy_completions_total", memory="true") == 1
    assert moved(middle, after, "memt_proxy_prompt_tokens_total", memory="true") == second.usage.prompt_tokens
    assert moved(middle, after, "memt_proxy_completion_tokens_total", memory="true") == second.usage.completion_tokens
    assert moved(middle, after, "memt_proxy_memory_saved_tokens_total") > 0
    assert after[("memt_proxy_sessions", frozenset())] >= 1


def total(before: dict, after: dict, name: str) -> float:
    """How much every sample ``name{…}`` grew together between two scrapes."""
    return sum(value for (n, _), value in after.items() if n == name) - sum(value for (n, _), value in before.items() if n == name)


def test_responses_api_usage_is_counted(proxy):
    """A Responses API call counts as one completion with the tokens its usage reports."""
    client = proxy.openai()
    before = scrape(proxy)
    response = client.responses.create(model=MODEL, input="Hello there", max_output_tokens=8, temperature=1.0)
    after = settled(proxy, before, "memt_proxy_requests_total", 1, route="/v1/responses", method="POST", status="200")
    assert moved(before, after, "memt_proxy_requests_total", route="/v1/responses", method="POST", status="200") == 1
    assert total(before, after, "memt_proxy_completions_total") == 1
    assert total(before, after, "memt_proxy_prompt_tokens_total") == response.usage.input_tokens
    assert total(before, after, "memt_proxy_completion_tokens_total") == response.usage.output_tokens


def test_metrics_need_an_api_key(proxy):
    """Like every route but the health checks (and like the core's /metrics): 401 without a key."""
    with proxy.http(None) as http:
        response = http.get("/metrics")
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


@pytest.fixture
def doomed_pair(nano_checkpoint):
    """A core and a proxy of this test's own, so that the core can be stopped under the proxy."""
    core = MemTServer(nano_checkpoint, snapshots=False).start()
    try:
        with ProxyServer(core.url, nano_checkpoint) as proxy:
            yield core, proxy
    finally:
        core.close()


def test_upstream_errors_are_counted_by_kind(doomed_pair):
    """With the core gone, a plain request (503) and a session request (503) are two upstream errors of
    kind upstream_unavailable; a client's own mistake (404) is none."""
    core, proxy = doomed_pair
    client = proxy.openai()
    ask(client, [{"role": "user", "content": "hi"}], max_tokens=2)  # the upstream answers
    before = scrape(proxy, None)
    core.stop()
    for session in (None, unique("gone")):
        with pytest.raises(openai.APIStatusError) as info:
            ask(client, [{"role": "user", "content": "hi"}], session, max_tokens=2)
        assert info.value.status_code == 503 and info.value.body["code"] == "upstream_unavailable"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    after = scrape(proxy, None)
    assert moved(before, after, "memt_proxy_upstream_errors_total", kind="upstream_unavailable") == 2
    assert sum(v for (name, _), v in after.items() if name == "memt_proxy_upstream_errors_total") == 2
    assert moved(before, after, "memt_proxy_requests_total", **CHAT, status="503") == 2


def test_a_scrape_parses_with_every_family_present(proxy):
    """The exposition is valid text format and carries every documented family (with help text)."""
    with proxy.http() as http:
        text = http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("memt_proxy_requests", "memt_proxy_request_duration_seconds", "memt_proxy_completions", "memt_proxy_prompt_tokens",
                 "memt_proxy_completion_tokens", "memt_proxy_memory_saved_tokens", "memt_proxy_sessions", "memt_proxy_sessions_in_use",
                 "memt_proxy_sessions_leased", "memt_proxy_session_offloads", "memt_proxy_session_restores", "memt_proxy_upstream_errors"):
        assert name in families and families[name].documentation, name
    assert families["memt_proxy_request_duration_seconds"].type == "histogram"
    assert httpx.get(f"{proxy.url}/health").status_code == 200  # the health checks stay open

"""The proxy's session layer recovers an uncertain memory write by receipt (live memt_core server).

A commit reaches the upstream and lands, but its answer is lost: the client wrapper below sends the
real request and then reports the connection as broken, which is what a dropped connection looks
like to the proxy. The session layer must ask the upstream (recover → status), keep the commit that
landed, send only the rest, and publish: each piece written exactly once, the session's version
advanced, and its record saying what memory now holds.
"""

from __future__ import annotations

import asyncio

import pytest
from e2e.proxies import unique
from e2e.wire import metric

from memt_core.client.errors import MemTClientError
from memt_core.client.native import AsyncNativeClient
from memt_proxy.session.sessions import Sessions
from memt_proxy.session.store import SessionRecordStore

pytestmark = pytest.mark.timeout(300)


class FirstCommitAnswerLost(AsyncNativeClient):
    """Sends every request for real; the answer of the first commit is dropped after it arrived."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lost: list[str] = []

    async def commit(self, session, lease, transaction, input_ids, *, nonce=None):
        result = await super().commit(session, lease, transaction, input_ids, nonce=nonce)
        if not self.lost:
            self.lost.append(nonce)
            raise self._broken("commit", ConnectionResetError("answer lost (test)"), True)
        return result


def commits_applied(server) -> float:
    with server.client() as http:
        return metric(http.get("/metrics").text, "memt_commits_total")


def test_a_commit_whose_answer_was_lost_is_recovered_by_receipt(proxy_upstream, proxy_chat_format, tmp_path):
    ids = proxy_chat_format.tokenizer.encode("one two three four", add_special_tokens=False)
    before = commits_applied(proxy_upstream)

    async def scenario():
        client = FirstCommitAnswerLost(proxy_upstream.url)
        records = SessionRecordStore(tmp_path)
        sessions = Sessions(client, identity=proxy_chat_format.identity, records=records)
        try:
            await sessions.check_upstream()
            async with sessions.turn("t", unique("recovered")) as held:
                await held.start()
                await held.commit_turn(ids[:2], ids[2:], ["h1", "h2"])  # two commits: context, then the turn
                status = await client.control("status", held.state.native, lease=held.lease)
            state = held.state
            assert records.load(state.native, 1) == ["h1", "h2"]
            await client.control("close", state.native, lease=state.drop_lease())  # the lease the session layer kept
            return client.lost, state, status
        finally:
            await client.aclose()

    lost, state, status = asyncio.run(scenario())
    assert state.version == 1 and state.committed == ["h1", "h2"] and state.history_known
    assert status["uncertain"] is False and status["published_version"] == 1
    (receipt,) = [r for r in status["receipts"].values() if r["state"] == "published"]
    assert [c["status"] for c in receipt["commits"]] == ["applied", "applied"]
    assert receipt["commits"][0]["nonce"] == lost[0]  # the landed commit was kept, not sent again
    assert commits_applied(proxy_upstream) - before == 2  # each piece written exactly once


def test_the_wrapper_really_loses_an_answer(proxy_upstream, proxy_chat_format):
    """Without recovery the same write would fail: the first commit is reported uncertain."""

    async def scenario():
        client = FirstCommitAnswerLost(proxy_upstream.url)
        try:
            await client.capabilities()
            native = unique("lost")
            await client.control("create", native, memory_read=True)
            lease = (await client.control("acquire", native, ttl=10))["lease"]
            await client.control("begin", native, lease=lease, transaction="t-lost")
            with pytest.raises(MemTClientError) as lost:
                await client.commit(native, lease, "t-lost", [1, 2, 3])
            await client.control("close", native, lease=lease)
            return lost.value
        finally:
            await client.aclose()

    error = asyncio.run(scenario())
    assert error.uncertain is True and error.stage == "commit"

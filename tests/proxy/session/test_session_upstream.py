"""``memt_proxy.session.upstream`` on the in-process harness: the upstream's identity checked and its limits learned,
native failures mapped once (an epoch mismatch forgets every session of the table), a turn too long for one commit
cut at whole chunks, plain generations."""

from __future__ import annotations

from memt_core.client.errors import MemTClientError
from memt_core.errors import EpochMismatch, UnknownSession
from memt_proxy.errors import ProxyError, Unavailable
from memt_proxy.session.state import SessionTable
from memt_proxy.session.upstream import Upstream
from session_harness import committed_session, run

H1 = "1" * 64


def test_the_upstream_serving_another_model_is_refused_and_its_limits_are_learned():
    async def body(h):
        own = Upstream(h.client, identity=h.identity, served=None, table=SessionTable(4))
        await own.check()
        other = Upstream(h.client, identity="another-model", served=None, table=SessionTable(4))
        try:
            await other.check()
        except Unavailable as exc:
            refused = exc
        return own, refused, other.checked

    own, refused, checked = run(body, check=False)
    assert own.checked and own.max_prefill_tokens and own.chunk_tokens and own.capacity and own.epoch
    assert refused.code == "upstream_identity_mismatch" and not checked


def test_an_epoch_mismatch_forgets_every_session_and_asks_for_a_new_check():
    async def body(h):
        sessions = h.sessions
        state = await committed_session(sessions, "t", "a", [1, 2], [H1])
        known = (state.exists, list(state.committed))
        other = sessions.upstream.error(MemTClientError("query: unknown session", stage="query", status=404, cause=UnknownSession("gone")))
        still = (state.exists, sessions.upstream.checked)
        error = sessions.upstream.error(MemTClientError("query: epoch", stage="query", status=409, cause=EpochMismatch("a new epoch")))
        return known, other, still, error, (state.exists, list(state.committed), sessions.upstream.checked)

    known, other, still, error, after = run(body)
    assert known == (True, [H1])
    assert isinstance(other, ProxyError) and still == (True, True)  # any other failure is only mapped
    assert isinstance(error, ProxyError) and after == (False, [], False)


def test_a_turn_longer_than_one_prefill_goes_in_pieces_cut_at_whole_chunks():
    upstream = Upstream(None, identity=None, served=None, table=SessionTable(1))  # type: ignore[arg-type]
    ids = list(range(25))
    assert upstream.pieces(ids) == [ids]  # no limit known: one commit
    upstream.max_prefill_tokens, upstream.chunk_tokens = 10, 4
    assert upstream.pieces(ids) == [ids[0:8], ids[8:16], ids[16:24], ids[24:]]  # 8: the most whole chunks within 10
    assert upstream.pieces(ids[:10]) == [ids[:10]]  # it fits: as it is
    upstream.chunk_tokens = None
    assert upstream.pieces(ids) == [ids[0:10], ids[10:20], ids[20:]]


def test_a_plain_generation_reads_no_memory():
    async def body(h):
        sessions = h.sessions
        await committed_session(sessions, "t", "a", [1, 2], [H1])
        body = await sessions.upstream.generate([7, 8], {"max_new_tokens": 3})
        streamed = [b["output_ids"] async for b in sessions.upstream.generate_stream([7, 8], {"max_new_tokens": 3})]
        return body["output_ids"], streamed[-1]

    generated, streamed = run(body)
    assert generated == streamed and len(generated) == 3 and generated != [1, 2, 1]  # a query would answer what memory holds

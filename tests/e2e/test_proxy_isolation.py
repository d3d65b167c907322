"""Tenants and unknown sessions on the proxy's admin routes, live (the shared ``proxy`` fixture: two API keys).

Two tenants use the same session id and the same snapshot name. Neither can read, overwrite, restore,
list or probe the other's: every admin route, called by the other tenant, answers as if the session
or snapshot did not exist, and changes nothing of the owner's. Unknown sessions are 404 on every admin
route and none is created by asking. DELETE ends the session's lease keeper with it.
"""

from __future__ import annotations

import asyncio

import pytest
from e2e.proxies import KEY_A, KEY_B, ask, assert_openai_error, completed_turn, unique

from memt_core.client.native import AsyncNativeClient
from memt_proxy.session.sessions import Sessions, native_session_id, snapshot_file

pytestmark = pytest.mark.timeout(600)
QUESTION = [{"role": "user", "content": "When is the meeting?"}]


def answer(proxy, key: str, session: str) -> str:
    """A deterministic answer that reads the session's memory (and commits nothing)."""
    return ask(proxy.openai(key), QUESTION, session, memory="read", seed=9, stop=None, max_tokens=16).choices[0].message.content


def upstream_exists(upstream, tenant: str, session: str) -> bool:
    with upstream.client() as http:
        body = {"action": "inspect", "session": native_session_id(tenant, session), "epoch": upstream.epoch()}
        return http.post("/memt/control", json=body).status_code == 200


def test_two_tenants_with_the_same_session_and_snapshot_names_never_meet(proxy):
    session, snapshot = unique("shared"), f"{unique('private')}.safetensors"
    completed_turn(proxy.openai(KEY_A), session, [{"role": "user", "content": "Remember: the meeting is on Tuesday."}])
    completed_turn(proxy.openai(KEY_B), session, [{"role": "user", "content": "Remember: my cat is called Zorro."}])
    alpha_answer, beta_answer = answer(proxy, KEY_A, session), answer(proxy, KEY_B, session)
    with proxy.http(KEY_A) as alpha, proxy.http(KEY_B) as beta:
        alpha_version = alpha.get(f"/v1/memt/sessions/{session}").json()["native"]["published_version"]
        assert alpha.post(f"/v1/memt/sessions/{session}/snapshots", json={"name": snapshot}).status_code == 200
        # beta cannot restore alpha's snapshot: for beta the name does not exist (and the error does not say whose it is)
        refused = assert_openai_error(beta.post(f"/v1/memt/sessions/{session}/restore", json={"name": snapshot}), 400)
        assert not any(part in refused["message"] for part in (snapshot_file("alpha", snapshot), snapshot_file("beta", snapshot), "alpha"))
        # beta saving the same name makes beta's own file: no 409 that would reveal alpha's, no overwrite of it
        assert beta.post(f"/v1/memt/sessions/{session}/snapshots", json={"name": snapshot}).status_code == 200
        assert beta.post(f"/v1/memt/sessions/{session}/snapshots", json={"name": snapshot, "overwrite": True}).status_code == 200
        assert_openai_error(beta.post(f"/v1/memt/sessions/{session}/snapshots", json={"name": snapshot}), 409)  # its own exists now
        # alpha's snapshot still holds alpha's memory: restored into a fresh alpha session it answers like alpha
        copy = unique("copy")
        ask(proxy.openai(KEY_A), QUESTION, copy, memory="read", max_tokens=2)
        assert alpha.post(f"/v1/memt/sessions/{copy}/restore", json={"name": snapshot}).status_code == 200
    assert answer(proxy, KEY_A, copy) == alpha_answer
    assert answer(proxy, KEY_B, session) == beta_answer and answer(proxy, KEY_A, session) == alpha_answer
    with proxy.http(KEY_A) as alpha, proxy.http(KEY_B) as beta:
        only_alpha = unique("only-alpha")
        ask(proxy.openai(KEY_A), QUESTION, only_alpha, memory="read", max_tokens=2)
        # every admin route of beta on a session only alpha has: 404, and alpha's session is untouched
        for method, path, body in (
            ("GET", "", None), ("POST", "/snapshots", {"name": snapshot}), ("POST", "/restore", {"name": snapshot}),
            ("POST", "/reset", None), ("DELETE", "", None),
        ):
            response = beta.request(method, f"/v1/memt/sessions/{only_alpha}{path}", json=body)
            assert_openai_error(response, 404, code="session_not_found")
        assert alpha.get(f"/v1/memt/sessions/{only_alpha}").status_code == 200
        assert alpha.get(f"/v1/memt/sessions/{session}").json()["native"]["published_version"] == alpha_version
        for who, key_session in ((alpha, session), (beta, session), (alpha, copy), (alpha, only_alpha)):
            assert who.delete(f"/v1/memt/sessions/{key_session}").status_code == 200


def test_unknown_sessions_are_404_on_every_admin_route_and_nothing_is_created(proxy, proxy_upstream):
    session = unique("never")
    with proxy.http(KEY_A) as http:
        for method, path, body in (
            ("GET", "", None), ("POST", "/snapshots", None), ("POST", "/snapshots", {"name": "x.safetensors"}),
            ("POST", "/restore", {"name": "x.safetensors"}), ("POST", "/reset", None), ("DELETE", "", None),
        ):
            assert_openai_error(http.request(method, f"/v1/memt/sessions/{session}{path}", json=body), 404, code="session_not_found")
    assert not upstream_exists(proxy_upstream, "alpha", session)


def test_closing_a_session_ends_its_lease_keeper(proxy_upstream, proxy_chat_format):
    """DELETE while the session's lease is kept: the renewal task ends with the session, it does not outlive it."""

    async def scenario():
        sessions = Sessions(AsyncNativeClient(proxy_upstream.url), identity=proxy_chat_format.identity)
        try:
            await sessions.check_upstream()
            async with sessions.turn("t", unique("closing")) as held:
                await held.start()
                keeper = held.state.keeper
                assert keeper is not None and not keeper.done()
                await held.close()
            await asyncio.wait({keeper}, timeout=5)
            return keeper.done(), held.state.keeper, held.state.lease
        finally:
            await sessions.aclose()

    assert asyncio.run(scenario()) == (True, None, None)

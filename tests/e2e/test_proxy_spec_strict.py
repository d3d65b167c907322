"""The proxy and the client over a core that says only what the memt-http-v1 spec promises (``--spec-strict``).

Such a core names no error kind (no ``code``: every conflict is a bare 409), reports no identity hash
in its capabilities and no fields beyond the spec's. The proxy must still adopt sessions that exist,
wait for a lease another client holds, notice a restart of the core and keep its sessions' memory,
working from the statuses and the spec's routes alone (``memt_core.client.native.named_conflict``).
"""

from __future__ import annotations

import asyncio

import pytest
from e2e.proxies import KEY_A, ProxyServer, say, unique
from e2e.servers import MemTServer

from memt_core.client.chat_format import load_chat_format, load_tokenizer
from memt_core.client.errors import MemTClientError
from memt_core.client.native import AsyncNativeClient, NativeClient, named_conflict
from memt_core.client.session import MemTSession
from memt_core.errors import Conflict, EpochMismatch, LeaseConflict, SessionExists, UnknownSession
from memt_proxy.session.sessions import native_session_id


@pytest.fixture(scope="module")
def strict_core(nano_checkpoint, tmp_path_factory):
    server = MemTServer(nano_checkpoint, state_directory=tmp_path_factory.mktemp("strict-state"), args=["--spec-strict"]).start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def strict_proxy(strict_core, nano_checkpoint, tmp_path_factory):
    keys = tmp_path_factory.mktemp("strict-keys") / "keys.json"
    keys.write_text('{"key-alpha": "alpha"}')
    server = ProxyServer(strict_core.url, nano_checkpoint, args=["--api-keys-file", str(keys), "--lease-wait", "20"]).start()
    yield server
    server.stop()


def test_named_conflict_from_what_the_spec_shows():
    assert named_conflict("query", epoch_changed=True, exists=None) is EpochMismatch
    assert named_conflict("create", epoch_changed=False, exists=True) is SessionExists
    assert named_conflict("acquire", epoch_changed=False, exists=True) is LeaseConflict
    assert named_conflict("acquire", epoch_changed=False, exists=False) is UnknownSession
    assert named_conflict("inspect", epoch_changed=False, exists=False) is UnknownSession
    assert named_conflict("renew", epoch_changed=False, exists=None) is None


def test_the_strict_core_says_only_what_the_spec_promises(strict_core):
    with strict_core.client() as http:
        capabilities = http.get("/memt/capabilities").json()
        assert "identity" not in capabilities and "engine" not in capabilities
        assert {"protocol", "epoch", "chunk_tokens", "max_prefill_tokens"} <= set(capabilities)
        identity = http.get("/memt/identity").json()
        assert "extra" not in identity and identity["model"] == "memt-nano"
        epoch = capabilities["epoch"]
        session = unique("strict")
        created = http.post("/memt/control", json={"action": "create", "session": session, "epoch": epoch}).json()
        assert "restored_version" not in created
        inspected = http.post("/memt/control", json={"action": "inspect", "session": session, "epoch": epoch}).json()
        assert "reads" not in inspected
        for body in (
            {"action": "create", "session": session, "epoch": epoch},  # exists
            {"action": "inspect", "session": unique("nobody"), "epoch": epoch},  # unknown
        ):
            refused = http.post("/memt/control", json=body)
            assert refused.status_code == 409
            assert refused.json() == {"error": {"type": "invalid_memory_request", "message": refused.json()["error"]["message"]}}
        too_big = http.post("/memt/control", content=b"{" + b" " * (9 * 1024 * 1024) + b"}", headers={"content-type": "application/json"})
        assert too_big.status_code == 400 and "code" not in too_big.json()["error"]  # 413 is not a spec status


def test_client_names_the_conflicts_of_a_strict_core(strict_core):
    """The proxy's client (``AsyncNativeClient``) finds out the kind of each bare 409."""

    async def kind(client, action, session, **fields):
        with pytest.raises(MemTClientError) as info:
            await client.control(action, session, **fields)
        return type(info.value.cause)

    async def run():
        client = AsyncNativeClient(strict_core.url)
        try:
            session = unique("named")
            await client.control("create", session)
            assert await kind(client, "create", session) is SessionExists
            lease = (await client.control("acquire", session))["lease"]
            assert await kind(client, "acquire", session) is LeaseConflict
            assert await kind(client, "inspect", unique("nobody")) is UnknownSession
            assert await kind(client, "renew", session, lease="not-the-lease") is Conflict  # not found out: left bare
            await client.control("release", session, lease=lease)
        finally:
            await client.aclose()

    asyncio.run(run())


def test_memt_session_works_over_a_strict_core(strict_core, nano_checkpoint):
    chat_format, parser = load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))
    with NativeClient(strict_core.url) as client:
        session = MemTSession(client, chat_format, parser)
        session.chat("My name is Ada.", max_new_tokens=4)
        session.commit_history()
        assert client.control("inspect", session.session_id)["published_version"] == 1
        session.close()


def test_proxy_conversation_over_a_strict_core(strict_proxy):
    client = strict_proxy.openai(KEY_A)
    session, history = unique("conv"), []
    for text in ("I live in Lyon.", "My cat is Tom.", "Where do I live?"):
        say(client, history, text, session)
    info = strict_proxy.inspect(session)
    assert info["committed_messages"] == 6 and info["native"]["published_version"] == 3
    stream = client.chat.completions.create(
        model="tiny-random-nano", messages=[*history, {"role": "user", "content": "And my cat?"}], max_tokens=4, stream=True,
        extra_headers={"X-MemT-Session": session},
    )
    assert any(chunk.choices and chunk.choices[0].finish_reason for chunk in stream)


def test_restarted_proxy_adopts_the_session_a_strict_core_holds(strict_core, nano_checkpoint, tmp_path):
    """create answers a bare 409 for an existing session: the proxy finds out it exists and adopts it."""
    session, history = unique("adopt"), []
    with ProxyServer(strict_core.url, nano_checkpoint, args=["--state-directory", str(tmp_path)]) as first:
        say(first.openai("unused"), history, "I live in Lyon.", session)
    with ProxyServer(strict_core.url, nano_checkpoint, args=["--state-directory", str(tmp_path)]) as second:
        say(second.openai("unused"), history, "Where do I live?", session)
        info = second.inspect(session, None)
        assert info["native"]["published_version"] == 2 and info["committed_messages"] == 4


def test_proxy_waits_for_a_lease_another_client_holds(strict_core, nano_checkpoint):
    """acquire answers a bare 409 while another client holds the lease: the proxy waits, then proceeds."""
    session, history = unique("held"), []
    native = native_session_id("default", session)
    with ProxyServer(strict_core.url, nano_checkpoint, args=["--lease-idle", "0", "--lease-wait", "20"]) as proxy:
        client = proxy.openai("unused")
        say(client, history, "Hello.", session)
        with NativeClient(strict_core.url) as other:
            lease = None
            for _ in range(200):  # the proxy releases its lease once the turn's commit is done
                try:
                    lease = other.control("acquire", native, ttl=2)["lease"]  # lapses in 2 s unless renewed
                    break
                except Exception as exc:
                    assert exc.status == 409, exc  # held by the proxy until its release
            assert lease is not None
            reply = say(client, history, "Hello again.", session)  # waits (up to --lease-wait 20 s) for the lapse
            assert reply.choices[0].message.content is not None
            assert proxy.inspect(session, None)["native"]["published_version"] == 2
            with pytest.raises(Exception):
                other.control("renew", native, lease=lease)  # the lease lapsed; the proxy took the session


def test_proxy_notices_a_restart_of_a_strict_core(nano_checkpoint, tmp_path):
    """After a restart every request names the old epoch: a bare 409; the proxy finds the epoch changed,
    forgets the old sessions and starts them again."""
    core = MemTServer(nano_checkpoint, state_directory=tmp_path / "state", args=["--spec-strict"]).start()
    try:
        with ProxyServer(core.url, nano_checkpoint) as proxy:
            client, session, history = proxy.openai("unused"), unique("epoch"), []
            say(client, history, "I live in Lyon.", session)
            core.restart()
            for _ in range(3):  # the request that meets the restart may fail; the next ones must not
                try:
                    say(client, [], "Where do I live?", session)  # the app starts over: its memory is gone
                    break
                except Exception:
                    continue
            else:
                pytest.fail(f"the proxy did not recover from the core's restart:\n{proxy.log_tail()}")
            assert proxy.inspect(session, None)["native"]["published_version"] == 1  # the new session's first turn
    finally:
        core.close()

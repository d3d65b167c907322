"""Header-less states' bounds (issue 45), on the in-process stack: the chat service over the session layer over the
``--embedded`` core (tiny Nano checkpoint, engine in this process). No servers, no HTTP: fast.

Kept states hold ``--max-memory-states`` however many conversations make them at once, and one tenant's
conversations push out another's states only while it holds fewer (none takes more than its share).
"""

from __future__ import annotations

import asyncio

import pytest

from memt_core.client.chat_format import load_chat_format, load_tokenizer
from memt_proxy.http.embedded import InProcessNativeClient, build_core, core_plan
from memt_proxy.http.route_inputs import Controls, request_context
from memt_proxy.protocol import ChatCompletionRequest
from memt_proxy.chat.service import ChatService
from memt_proxy.session.sessions import Sessions

MODEL = "m"


@pytest.fixture(scope="module")
def chat(nano_checkpoint):
    return load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))


def run(nano_checkpoint, chat, body, **limits):
    """``body(service)`` with a chat service over a fresh embedded core, the core's engine running; ``body`` may take
    ``lives`` too: ``body(service, lives)``, where ``lives()`` makes another proxy's service over the same core."""
    app, core = build_core(core_plan(str(nano_checkpoint), "--device cpu --max-sessions-per-rank 64"))
    chat_format, parser = chat

    def life(**more) -> ChatService:
        sessions = Sessions(InProcessNativeClient(app, service=core, max_body_bytes=8 << 20), identity=chat_format.identity, **{**limits, **more})
        return ChatService(sessions, chat_format, parser, model_names=[MODEL])

    async def main():
        async with app.router.lifespan_context(app):
            service = life()
            try:
                return await (body(service) if body.__code__.co_argcount == 1 else body(service, life, core))
            finally:
                await service.sessions.aclose()

    return asyncio.run(main())


def kept(sessions: Sessions, tenant: str | None = None) -> list:
    return [s for s in sessions.table if s.is_kept and s.exists and (tenant is None or s.tenant == tenant)]


async def converse(service: ChatService, tenant: str, name: str, turns: int) -> list[int]:
    """A header-less conversation of ``turns`` turns; each turn waits for the state its answer made. Prompt sizes."""
    history, prompts = [], []
    for turn in range(turns):
        history.append({"role": "user", "content": f"{name}, turn {turn}."})
        request = ChatCompletionRequest.model_validate({"model": MODEL, "messages": history, "max_tokens": 4, "temperature": 1.0, "seed": turn})
        body = await service.complete(request, request_context(tenant, request, Controls(), service.default_memory), session=None)
        prompts.append(body["usage"]["prompt_tokens"])
        history.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
        while service.sessions.behind:  # the states made behind this conversation's answers (and any other's)
            await asyncio.gather(*set(service.sessions.behind), return_exceptions=True)
    return prompts


def test_kept_states_hold_their_bound_under_concurrent_conversations(nano_checkpoint, chat):
    """Eight conversations at once, three turns each, with room for three states: never more than three kept."""
    async def body(service):
        seen = []
        done = asyncio.Event()

        async def watch():
            while not done.is_set():
                seen.append(len(kept(service.sessions)))
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        await asyncio.gather(*(converse(service, "t", f"conversation {i}", 3) for i in range(8)))
        done.set()
        await watcher
        return seen, len(kept(service.sessions)), service.sessions.kept.closed

    seen, left, closed = run(nano_checkpoint, chat, body, max_memory_states=3)
    assert max(seen) <= 3 and left <= 3, max(seen)
    assert closed > 0  # states were made beyond the room, and closed to make it


def test_a_tenant_cannot_push_out_another_tenants_share(nano_checkpoint, chat):
    """Room for four states: one conversation of tenant b keeps its state while tenant a's six conversations come
    and go (a's own least recently used states make a's room once a holds the most), so b's next turn reads memory."""
    async def body(service):
        b = await converse(service, "b", "b's conversation", 2)
        for index in range(6):
            await converse(service, "a", f"a's conversation {index}", 2)
        held = {tenant: len(kept(service.sessions, tenant)) for tenant in ("a", "b")}
        return b, held

    b, held = run(nano_checkpoint, chat, body, max_memory_states=4)
    assert held == {"a": 3, "b": 1}, held


def test_after_a_crash_the_states_on_the_upstream_stay_within_the_bound(nano_checkpoint, chat, tmp_path):
    """A proxy with --state-directory makes its three states and dies without a word (its leases still held): the
    next one takes the recorded states into its table, so the upstream never holds more kept states than the bound,
    however many new conversations it keeps, and every native session it made has its record."""
    from memt_proxy.session.store import SessionRecordStore

    async def body(service, life, core):
        for index in range(5):
            await converse(service, "t", f"before {index}", 2)
        for state in service.sessions.table:  # killed: nothing released, its leases lapse in their own time
            state.drop_lease()
        first = {s.native for s in kept(service.sessions)}
        after = life(records=SessionRecordStore(tmp_path))
        try:
            upstream = []
            for index in range(6):
                await converse(after, "t", f"after {index}", 2)
                upstream.append(len([name for name in core.protocol.sessions if name.startswith("p-")]))
            recorded = set(after.sessions.records.sessions())
            native = {name for name in core.protocol.sessions if name.startswith("p-")}
            return first, upstream, native, recorded
        finally:
            await after.sessions.aclose()

    first, upstream, native, recorded = run(nano_checkpoint, chat, body, max_memory_states=3, lease_ttl=1, records=SessionRecordStore(tmp_path))
    assert len(first) == 3
    assert max(upstream) <= 3, upstream
    assert native <= recorded  # no native session outlives its record

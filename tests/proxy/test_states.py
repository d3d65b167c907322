"""Header-less states' bounds (issue 45), on the in-process stack: the chat service over the session layer over the
``--embedded`` core (tiny Nano checkpoint, engine in this process). No servers, no HTTP: fast.

Kept states hold ``--max-memory-states`` however many conversations make them at once, and one tenant's
conversations push out another's states only while it holds fewer (none takes more than its share).
"""

from __future__ import annotations

import asyncio

import pytest

from memt_core.client.chat_format import load_chat_format, load_tokenizer
from memt_proxy.embedded import InProcessNativeClient, build_core, core_plan
from memt_proxy.protocol import ChatCompletionRequest
from memt_proxy.serving import ChatService
from memt_proxy.sessions import Sessions

MODEL = "m"


@pytest.fixture(scope="module")
def chat(nano_checkpoint):
    return load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))


def run(nano_checkpoint, chat, body, **limits):
    """``body(service)`` with a chat service over a fresh embedded core, the core's engine running."""
    app, core = build_core(core_plan(str(nano_checkpoint), "--device cpu --max-sessions-per-rank 64"))
    chat_format, parser = chat

    async def main():
        async with app.router.lifespan_context(app):
            sessions = Sessions(InProcessNativeClient(app, service=core, max_body_bytes=8 << 20), identity=chat_format.identity, **limits)
            service = ChatService(sessions, chat_format, parser, model_names=[MODEL])
            try:
                return await body(service)
            finally:
                await sessions.aclose()

    return asyncio.run(main())


def kept(sessions: Sessions, tenant: str | None = None) -> list:
    return [s for s in sessions.table if s.branch and s.exists and (tenant is None or s.tenant == tenant)]


async def converse(service: ChatService, tenant: str, name: str, turns: int) -> list[int]:
    """A header-less conversation of ``turns`` turns; each turn waits for the state its answer made. Prompt sizes."""
    history, prompts = [], []
    for turn in range(turns):
        history.append({"role": "user", "content": f"{name}, turn {turn}."})
        request = ChatCompletionRequest.model_validate({"model": MODEL, "messages": history, "max_tokens": 4, "temperature": 1.0, "seed": turn})
        body = await service.complete(request, tenant=tenant, session=None, memory=None)
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
        return seen, len(kept(service.sessions)), service.sessions.branches_closed

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

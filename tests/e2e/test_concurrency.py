"""Many sessions at once over HTTP: concurrent greedy queries on sessions with different memories give
exactly the answers each gives alone (Nano rows share batched decode steps; Flash rows run side by side).
"""

from __future__ import annotations

import asyncio

import pytest
from e2e.wire import Wire, metric, nonce

pytestmark = pytest.mark.timeout(300)

SESSIONS = 8
NEW_TOKENS = 12
# different prompt lengths, so batched rows are left-padded differently
PROMPTS = [[17, 42, 99, 123, 7][: 1 + i % 5] + [30 + i] * (i % 3) for i in range(SESSIONS)]


def _memories(i: int) -> list[list[int]]:
    """Session i's committed turns: different contents and lengths (session 0 keeps empty memory)."""
    if i == 0:
        return []
    return [[(i * 37 + t * 11) % 400 + 10 for t in range(8 + 9 * i)]]


@pytest.mark.parametrize("server_fixture", ["nano_server", "flash_server"])
def test_concurrent_sessions_answer_as_they_do_alone(server_fixture, request):
    server = request.getfixturevalue(server_fixture)
    with server.client() as http:
        wire = Wire(http)
        handles = [wire.open() for _ in range(SESSIONS)]
        for i, handle in enumerate(handles):
            if _memories(i):
                wire.write(handle, *_memories(i))
        alone = [wire.query(h, PROMPTS[i], NEW_TOKENS)["output_ids"] for i, h in enumerate(handles)]
        assert len({tuple(a) for a in alone}) > SESSIONS // 2, "memories should make the answers differ"
        before = http.get("/metrics").text

        async def together():
            async with server.async_client() as client:
                bodies = [wire.query_body(h, PROMPTS[i], NEW_TOKENS, nonce_=nonce()) for i, h in enumerate(handles)]
                responses = await asyncio.gather(*(client.post("/generate", json=body) for body in bodies))
            assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
            return [r.json()["output_ids"] for r in responses]

        concurrent = asyncio.run(together())
        after = http.get("/metrics").text
        assert concurrent == alone
        generated = metric(after, "memt_generation_tokens_total") - metric(before, "memt_generation_tokens_total")
        steps = metric(after, "memt_decode_steps_total") - metric(before, "memt_decode_steps_total")
        assert generated == sum(len(a) for a in alone)
        if server_fixture == "nano_server":
            # rows shared decode steps: fewer steps than tokens decoded one request at a time
            assert steps < generated - SESSIONS
        wire.close_all()

"""The one-process transport (``memt_proxy.http.embedded``): control actions and plain generations answered by
calling the core's service give exactly what the core's routes give (answers, errors with their status and
kind), without going through the app; a caller that gives up does not cut the core's work short."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from memt_core.client.errors import MemTClientError
from memt_proxy.http.embedded import InProcessNativeClient, build_core, core_plan

GREEDY = {"temperature": 0, "max_new_tokens": 4}


class CountedApp:
    """The core's ASGI app, counting the HTTP requests that reach it by path."""

    def __init__(self, app):
        self.app, self.paths = app, []

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            self.paths.append(scope["path"])
        await self.app(scope, receive, send)


async def outcome(call) -> tuple:
    """An answer's shape, or an error's status, kind and message (session names and request ids made alike)."""
    try:
        answer = await call
    except MemTClientError as exc:
        message = re.sub(r"memt\|[^' ]+", "RID", exc.message).replace("direct-", "").replace("routed-", "")
        return ("error", exc.status, type(exc.cause).__name__, message)
    return ("ok", answer.get("output_ids"), answer.get("meta_info", {}).get("finish_reason"), sorted(answer))


async def scenario(client: InProcessNativeClient, tag: str) -> list[tuple]:
    """The same requests on a session of its own: good ones and refused ones."""
    session = f"{tag}-s"
    seen = [await outcome(client.control("create", session, memory_read=True))]
    seen.append(await outcome(client.control("create", session)))  # exists
    lease = (await client.control("acquire", session))["lease"]
    seen.append(await outcome(client.control("acquire", session)))  # held
    seen.append(await outcome(client.query(session, lease, [5, 6, 7], sampling_params=GREEDY)))
    seen.append(await outcome(client.query(session, "not-the-lease", [5, 6, 7], sampling_params=GREEDY)))
    seen.append(await outcome(client.query(session, lease, [10 ** 9], sampling_params=GREEDY)))  # outside the vocabulary
    seen.append(await outcome(client.generate([5, 6, 7], sampling_params=GREEDY)))
    seen.append(await outcome(client.generate([5, 6, 7], sampling_params={"temperature": -1})))
    seen.append(await outcome(client.control("no-such-action", session)))
    seen.append(await outcome(client.control("inspect", f"{tag}-missing")))
    seen.append(await outcome(client.control("release", session, lease=lease)))
    return seen


@pytest.fixture()
def core(nano_checkpoint):
    """The core of ``--embedded`` on the tiny Nano checkpoint: its app (counted) and service, engine not started."""
    app, service = build_core(core_plan(str(nano_checkpoint), "--device cpu"))
    return CountedApp(app), service


def run_with_engine(app: CountedApp, body):
    """Run ``body()`` inside the core app's lifespan (the engine started)."""
    async def main():
        async with app.app.router.lifespan_context(app.app):
            return await body()

    return asyncio.run(main())


def test_a_direct_call_answers_what_the_route_answers(core):
    app, service = core
    direct = InProcessNativeClient(app, service=service, max_body_bytes=8 * 1024 * 1024)
    routed = InProcessNativeClient(app)

    async def body():
        seen_routed = await scenario(routed, "routed")
        before = list(app.paths)
        seen_direct = await scenario(direct, "direct")
        return seen_routed, seen_direct, app.paths[len(before):]

    seen_routed, seen_direct, paths = run_with_engine(app, body)
    assert seen_direct == seen_routed
    assert [kind for kind, *_ in seen_direct].count("error") >= 5 and seen_direct[3][0] == "ok"
    assert "/memt/control" not in paths and "/generate" not in paths, "the direct client went through the app"


def test_a_large_body_goes_through_the_app_which_refuses_it(nano_checkpoint):
    """A body over the core's --max-request-bytes is not handed to the service: the app refuses it (413)."""
    plan = core_plan(str(nano_checkpoint), "--device cpu --max-request-bytes 2048")
    app, service = build_core(plan)
    app = CountedApp(app)
    direct = InProcessNativeClient(app, service=service, max_body_bytes=plan.max_request_bytes)

    async def body():
        small = await direct.generate([5] * 10, sampling_params=GREEDY)
        try:
            await direct.generate([5] * 1500, sampling_params=GREEDY)
        except MemTClientError as exc:
            return small, exc.status
        return small, 200

    small, status = run_with_engine(app, body)
    assert len(small["output_ids"]) == GREEDY["max_new_tokens"] and status == 413
    assert app.paths.count("/generate") == 1, "only the large body goes through the app"


def test_a_query_whose_caller_gave_up_runs_to_its_end(core):
    """Over HTTP a plain (not streamed) query goes on when the proxy stops waiting for it; so does a direct one."""
    app, service = core
    direct = InProcessNativeClient(app, service=service)
    tokens = 6

    async def body():
        await direct.control("create", "s", memory_read=True)
        lease = (await direct.control("acquire", "s"))["lease"]
        waiting = asyncio.ensure_future(direct.query("s", lease, [5, 6, 7], sampling_params={"temperature": 0, "max_new_tokens": tokens}))
        await asyncio.sleep(0)  # the query is under way: its first step ran up to the core
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            reads = (await direct.control("inspect", "s")).get("reads") or []
            if reads:
                return reads
            await asyncio.sleep(0.05)
        raise AssertionError("the query never finished")

    reads = run_with_engine(app, body)
    assert reads[-1]["finish_reason"] == "length" and reads[-1]["completion_tokens"] == tokens

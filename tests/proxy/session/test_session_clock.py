"""``memt_proxy.session.clock``: the session layer's one source of time, and the harness's ``StoppedClock`` the lease
tests run on (its time moves only when a test, or a sleeper, moves it)."""

from __future__ import annotations

import asyncio

from memt_proxy.session.clock import Clock
from session_harness import StoppedClock


def test_the_wall_clock_waits_until_the_event_or_the_time_whichever_comes_first():
    async def body():
        clock, event = Clock(), asyncio.Event()
        event.set()
        await asyncio.wait_for(clock.wait(event, clock.now() + 3600), 5)  # set: at once, not in an hour
        await asyncio.wait_for(clock.wait(asyncio.Event(), clock.now()), 5)  # the time is now: at once
        return True

    assert asyncio.run(body())


def test_a_stopped_clock_wakes_a_waiter_when_time_reaches_it_and_not_before():
    async def body():
        clock, woke = StoppedClock(), []

        async def waiter():
            await clock.wait(asyncio.Event(), clock.now() + 1.0)
            woke.append(clock.now())

        task = asyncio.create_task(waiter())
        await clock.advance(0.75, step=0.25)
        assert woke == [] and not task.done()
        await clock.advance(0.25)
        await asyncio.wait_for(task, 5)
        await clock.sleep(5.0)  # a sleeper's time passes at once
        return woke, clock.now()

    woke, now = asyncio.run(body())
    assert woke == [1001.0] and now == 1006.0

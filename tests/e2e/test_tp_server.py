"""``python -m memt_core.launch --tp-size 2`` on the CPU: two rank processes behind one server. It answers as a one-rank
server does; a killed rank makes it answer 503 and exit non-zero within seconds; stopping it ends every rank."""

from __future__ import annotations

import os
import signal
import time

import httpx
import psutil
import pytest
from e2e.servers import MemTServer

from memt_core.client import NativeClient
from memt_core.parallel.ranks import EXIT_DEAD_RANK, GRACE_S

pytestmark = pytest.mark.timeout(300)

PROMPT = [17, 42, 99, 123, 5, 6]


def ranks_of(server: MemTServer) -> list[psutil.Process]:
    """The server's rank processes (``memt_core.parallel.worker``)."""
    return [child for child in psutil.Process(server.process.pid).children(recursive=True)
            if "memt_core.parallel.worker" in " ".join(child.cmdline())]


def answer(server: MemTServer) -> list[int]:
    client = NativeClient(server.url)
    return client.generate(PROMPT, sampling_params={"max_new_tokens": 8, "temperature": 0})["output_ids"]


def test_a_two_rank_server_answers_as_one_and_stops_every_rank(nano_checkpoint):
    one = MemTServer(nano_checkpoint).start()
    two = MemTServer(nano_checkpoint, args=["--tp-size", "2"]).start()
    try:
        ranks = ranks_of(two)
        assert len(ranks) == 1
        assert answer(two) == answer(one)
        assert httpx.get(f"{two.url}/memt/capabilities").json()["engine"]["name"] == "torch"
    finally:
        one.close()
        two.stop()
    gone = psutil.wait_procs(ranks, timeout=15)[0]
    assert len(gone) == 1, "stopping the server ends its ranks"


def test_a_killed_rank_makes_the_server_answer_503_then_exit(nano_checkpoint):
    server = MemTServer(nano_checkpoint, args=["--tp-size", "2"]).start()
    try:
        assert answer(server)
        [rank] = ranks_of(server)
        os.kill(rank.pid, signal.SIGKILL)
        killed = time.monotonic()
        statuses = []
        while server.process.poll() is None and time.monotonic() - killed < 30:
            try:
                statuses.append(httpx.get(f"{server.url}/health", timeout=2).status_code)
            except httpx.HTTPError:
                statuses.append(None)  # going away
            time.sleep(0.1)
        assert server.process.poll() == EXIT_DEAD_RANK, "the server exits non-zero"
        assert time.monotonic() - killed < GRACE_S + 10, "within seconds"
        assert 503 in statuses and 200 not in statuses[statuses.index(503):], statuses
    finally:
        server.close()


def sessions_answers(server: MemTServer) -> list[list[int]]:
    """Three sessions, each written then queried (greedy), and a query without memory, all over the native protocol."""
    from e2e.wire import Wire

    with server.client() as http:
        wire = Wire(http)
        answers = []
        for i in range(3):
            handle = wire.open()
            wire.write(handle, [20 + i, 21, 22, 23, 24, 25, 26, 27 + i])
            answers.append(wire.query(handle, PROMPT, 6)["output_ids"])
        wire.close_all()
    return answers + [answer(server)]


def test_flash_with_dp_attention_on_two_ranks_answers_as_one(flash_checkpoint):
    """Flash as the seed serves it, at 2 ranks: --tp-size = --ep-size = --dp-size 2 with DP attention; its sessions
    spread over both ranks, each answering as on one device; --max-sessions-per-rank counts on each rank."""
    from e2e.wire import Wire

    one = MemTServer(flash_checkpoint).start()
    two = MemTServer(flash_checkpoint, args=["--tp-size", "2", "--ep-size", "2", "--dp-size", "2", "--enable-dp-attention",
                                             "--max-sessions-per-rank", "2"]).start()
    try:
        assert len(ranks_of(two)) == 1
        assert sessions_answers(two) == sessions_answers(one)
        with two.client() as http:
            wire = Wire(http)
            assert wire.capabilities["max_sessions_per_rank"] == 2
            for _ in range(4):  # two ranks of two
                wire.open()
            wire.control("create", "one-too-many", expect=429)
            wire.close_all()
    finally:
        one.close()
        two.stop()

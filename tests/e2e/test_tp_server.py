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

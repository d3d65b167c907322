"""The KV budget and the queue's bound over HTTP: a server started with ``--max-total-tokens`` and
``--max-queued-requests`` answers a query beyond the queue's bound with 503, ``Retry-After`` and the error body
(``engine_busy``), while the running and the waiting queries answer as they would alone."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import pytest
from e2e.servers import MemTServer

pytestmark = pytest.mark.timeout(300)

FIRST, SECOND = [17, 42, 99, 123], [5, 6, 7, 8]


def body(prompt: list[int], n: int, stream: bool) -> dict:
    return {"input_ids": prompt, "sampling_params": {"max_new_tokens": n, "temperature": 0}, "stream": stream}


def queued(server: MemTServer) -> float:
    metrics = httpx.get(f"{server.url}/metrics").text
    return float(re.search(r"^memt_queued_requests (\S+)$", metrics, re.M).group(1))


def test_beyond_the_queues_bound_the_server_answers_503_with_retry_after(nano_checkpoint):
    alone = MemTServer(nano_checkpoint).start()
    server = MemTServer(nano_checkpoint, args=["--max-total-tokens", "304", "--max-queued-requests", "1"]).start()
    try:
        expected = [httpx.post(f"{alone.url}/generate", json=body(p, n, False), timeout=120).json()["output_ids"]
                    for p, n in ((FIRST, 300), (SECOND, 5))]
        assert len(expected[0]) > 100, "the first query runs long (greedy), holding the whole budget meanwhile"
        answers = {}

        def later():  # waits for the first query's budget
            answers["second"] = httpx.post(f"{server.url}/generate", json=body(SECOND, 5, False), timeout=120).json()["output_ids"]

        with httpx.Client(timeout=120) as http, http.stream("POST", f"{server.url}/generate", json=body(FIRST, 300, True)) as running:
            lines = running.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))  # running: it holds the whole budget
            waiting = threading.Thread(target=later)
            waiting.start()
            deadline = time.monotonic() + 60
            while queued(server) < 1:  # the second query is in the queue
                assert time.monotonic() < deadline, "the second query never reached the queue"
                time.sleep(0.02)
            refused = httpx.post(f"{server.url}/generate", json=body(SECOND, 5, False), timeout=120)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "engine_busy"
            assert "--max-queued-requests" in refused.json()["error"]["message"]
            frames = [first] + [line for line in lines if line.startswith("data:")]
        waiting.join(120)
        outputs = [json.loads(frame[5:]) for frame in frames if frame[5:].strip() != "[DONE]"]
        assert outputs[-1]["output_ids"] == expected[0]
        assert answers["second"] == expected[1]
        assert "memt_refused_queue_full_total 1.0" in httpx.get(f"{server.url}/metrics").text
    finally:
        alone.close()
        server.close()

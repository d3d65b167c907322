"""The tests' wait for a server to be ready is bounded and says why it gave up (issue 46: a GPU test held past 150 s)."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from e2e.servers import HOST, ServerStartError, free_port, wait_healthy


class _Warming(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        body = json.dumps({"error": {"type": "memt_error", "message": "the engine is warming up (phase prompts and commits, shapes_done 3, shapes 29)"}}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _Stub:
    """What ``wait_healthy`` reads of a server: its URL, process, timeout and log."""

    def __init__(self, port: int, timeout: float):
        self.url, self.startup_timeout, self.killed = f"http://{HOST}:{port}", timeout, False
        self.process = type("Process", (), {"poll": lambda _self: None, "returncode": None})()

    def log_tail(self) -> str:
        return "INFO memt.engine: captured 36 CUDA graphs"


def test_a_server_still_warming_up_fails_the_wait_in_time_saying_so():
    port = free_port()
    httpd = http.server.ThreadingHTTPServer((HOST, port), _Warming)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        stub = _Stub(port, timeout=1.0)
        started = time.monotonic()
        with pytest.raises(ServerStartError) as failure:
            wait_healthy(stub, "server", on_timeout=lambda: setattr(stub, "killed", True))
        assert time.monotonic() - started < 10 and stub.killed
        message = str(failure.value)
        assert "not ready within 1 s" in message and "503" in message and "shapes_done 3, shapes 29" in message
        assert "captured 36 CUDA graphs" in message  # the log's tail
    finally:
        httpd.shutdown()


def test_nothing_listening_is_reported_as_no_answer():
    stub = _Stub(free_port(), timeout=0.5)
    with pytest.raises(ServerStartError, match=r"last answered: no answer \(ConnectError\)"):
        wait_healthy(stub, "server", on_timeout=lambda: None)

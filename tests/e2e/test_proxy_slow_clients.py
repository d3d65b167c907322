"""Slow clients and readiness on a live proxy: a stalled header is cut off, a stalled body is a 408, and
/health/ready says whether the upstream answers while /health stays cheap.

The proxy runs with ``--header-timeout 1 --body-timeout 1``; the tests wait for the server's own action
(the connection closing, the 408 arriving), bounded by a socket timeout far above those limits.
"""

from __future__ import annotations

import json
import socket

import pytest
from e2e.proxies import ProxyServer
from e2e.servers import HOST

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def impatient(proxy_upstream, nano_checkpoint):
    with ProxyServer(proxy_upstream.url, nano_checkpoint, args=["--header-timeout", "1", "--body-timeout", "1"]) as proxy:
        yield proxy


def connect(proxy: ProxyServer) -> socket.socket:
    sock = socket.create_connection((HOST, proxy.port), timeout=60)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (or the 60 s socket timeout raises)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_half_a_header_is_cut_off_while_others_are_served(impatient):
    with connect(impatient) as stalled:
        stalled.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Half: ")
        with impatient.http(None) as http:
            assert http.get("/health").json() == {"status": "ok"}  # another client is served meanwhile
        assert read_all(stalled) == b""  # closed by the server, nothing answered


def test_a_stalled_body_is_a_408(impatient):
    with connect(impatient) as stalled:
        stalled.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\": "
        )
        head, _, body = read_all(stalled).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert json.loads(body)["error"]["code"] == "request_timeout"


def test_readiness_reflects_the_upstream(impatient, memt_servers, nano_checkpoint):
    with impatient.http(None) as http:
        assert http.get("/health/ready").json() == {"status": "ready"}
    upstream = memt_servers(nano_checkpoint)
    with ProxyServer(upstream.url, nano_checkpoint) as proxy, proxy.http(None) as http:
        assert http.get("/health/ready").status_code == 200
        upstream.stop()
        not_ready = http.get("/health/ready")
        assert not_ready.status_code == 503 and not_ready.json()["error"]["message"].startswith("not ready")
        assert http.get("/health").json() == {"status": "ok"}  # liveness asks nobody

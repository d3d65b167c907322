"""A real Redis for tests of session ownership: ``redis-server`` on 127.0.0.1, a free port, no persistence.

Import the fixture into a test module (``from coordination import redis_url``). Where the binary is
not installed the tests skip, saying so (``scripts/setup.sh`` installs it from Debian's packages).
"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from e2e.servers import free_port


def redis_server_binary() -> str:
    """The ``redis-server`` binary's path; the calling test skips, saying how to install it, where there is none."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; scripts/setup.sh does it)")
    return binary


@pytest.fixture
def redis_url(tmp_path):
    binary = redis_server_binary()
    redis = pytest.importorskip("redis", reason="the redis client package is not installed (pip install redis)")
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 30
    while True:  # until it answers PING (its state), not a fixed sleep
        try:
            if client.ping():
                break
        except redis.ConnectionError:
            assert process.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    yield url
    client.close()
    process.terminate()
    process.wait(10)

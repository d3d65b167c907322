"""Fixtures of the client tests: scripted tiny checkpoints of both families, live servers on them,
and a Bearer-protected server with long chunks for crash tests.

Servers are real ``python -m memt_core.launch`` processes (``e2e.servers.MemTServer``); the client
talks to them over real sockets through ``httpx.HTTPTransport``. Nothing of the server is mocked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e.servers import MemTServer

from client.scripted import make_scripted_checkpoint
from client.support import API_KEY, ENCODER_MARKER_CODE, ENCODER_MARKER_ENV, Live
from memt_core.families import FLASH, NANO


def _scripted(tmp_path_factory, family: str) -> Path:
    directory = make_scripted_checkpoint(tmp_path_factory.mktemp(f"scripted-{family}"), family)
    if family == FLASH:
        encoder = directory / "encoding_dsv4.py"
        encoder.write_text(encoder.read_text(encoding="utf-8") + ENCODER_MARKER_CODE, encoding="utf-8")
    return directory


@pytest.fixture(scope="session")
def encoder_marker(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("encoder-marker") / "executed-by.txt"


@pytest.fixture(scope="session")
def _live_servers(tmp_path_factory, encoder_marker):
    made: dict[str, Live] = {}

    def get(family: str) -> Live:
        if family not in made:
            checkpoint = _scripted(tmp_path_factory, family)
            server = MemTServer(
                checkpoint, state_directory=tmp_path_factory.mktemp(f"state-{family}"),
                env={ENCODER_MARKER_ENV: str(encoder_marker)},
            ).start()
            made[family] = Live(family, checkpoint, server)
        return made[family]

    yield get
    for live in made.values():
        live.close()
        live.server.close()


@pytest.fixture(params=[NANO, FLASH], ids=["nano", "flash"])
def live(request, _live_servers) -> Live:
    """Each family's scripted server in turn (started once per test session)."""
    return _live_servers(request.param)


@pytest.fixture
def live_nano(_live_servers) -> Live:
    return _live_servers(NANO)


@pytest.fixture
def live_flash(_live_servers) -> Live:
    return _live_servers(FLASH)


@pytest.fixture(scope="session")
def long_chunk_checkpoint(tmp_path_factory) -> Path:
    """A tiny Nano with chunk_tokens 4096, so one ingestion commit runs long enough to be interrupted."""
    from memt_core.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("nano-long-chunk"), NANO, chunk_tokens=4096)


@pytest.fixture(scope="session")
def _keyed_server(long_chunk_checkpoint, tmp_path_factory):
    server = MemTServer(long_chunk_checkpoint, state_directory=tmp_path_factory.mktemp("keyed-state"), api_key=API_KEY)
    yield server
    server.close()


@pytest.fixture
def keyed_server(_keyed_server) -> MemTServer:
    """A Nano server (chunk_tokens 4096) that requires ``Authorization: Bearer client-test-key``.

    Tests may kill it; the next test that asks for it gets it started again (a new epoch).
    """
    if not _keyed_server.running:
        _keyed_server.start()
    return _keyed_server

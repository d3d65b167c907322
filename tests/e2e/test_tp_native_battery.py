"""The native protocol battery (``tests/e2e/test_native_http.py``) against a ``--tp-size 2`` server: the same tests,
re-collected here with its ``nano_server`` a server of two CPU ranks."""

from __future__ import annotations

import pytest
from e2e.servers import MemTServer
from e2e.test_native_http import *  # noqa: F401,F403 (the battery's tests and fixtures)


@pytest.fixture(scope="module")
def nano_server(nano_checkpoint, tmp_path_factory):  # overrides the session's one-rank server for this module
    server = MemTServer(nano_checkpoint, state_directory=tmp_path_factory.mktemp("tp2-state"), args=["--tp-size", "2"]).start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def flash_server(flash_checkpoint, tmp_path_factory):  # its own: a battery test exports a fixed file name into it
    server = MemTServer(flash_checkpoint, state_directory=tmp_path_factory.mktemp("tp2-flash-state")).start()
    yield server
    server.close()

"""The examples' own refusals: what an example says when the server lacks what it needs.

Their working runs are tested through the docs (``test_readme_commands.py`` runs every example as
docs/quickstart.md starts the servers); here, ``commit_history.py`` against a core started without
``--state-directory`` must stop with a message naming the flag, not crash with a traceback (issue 16).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from e2e.servers import REPO_ROOT, MemTServer

pytestmark = pytest.mark.timeout(600)

BUNDLED = REPO_ROOT / "memt_core" / "bundled" / "memt-tiny-demo"


def test_commit_history_names_the_missing_state_directory():
    """Snapshots need --state-directory: the example checks the server's capabilities first and says so."""
    server = MemTServer(BUNDLED, snapshots=False).start()
    try:
        done = subprocess.run([sys.executable, "examples/commit_history.py", str(BUNDLED), "--url", server.url],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    finally:
        server.stop()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "keeps no snapshots: start it with --state-directory" in done.stderr
    assert "Traceback" not in done.stderr

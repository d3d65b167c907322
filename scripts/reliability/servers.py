"""Live servers for the reliability battery: a tiny checkpoint, a core, a proxy, and their memory use.

The battery drives the real processes the end-to-end tests start (``tests/e2e/servers.py`` and
``tests/e2e/proxies.py``: ``python -m memt_core.launch`` and ``python -m memt_proxy`` on 127.0.0.1,
ephemeral ports), so this module only puts ``tests/`` on the import path and adds what the battery
needs beyond them: one tiny checkpoint per run, and the resident set size of a process.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from e2e.proxies import ProxyServer  # noqa: E402
from e2e.servers import MemTServer  # noqa: E402

__all__ = ["MemTServer", "ProxyServer", "tiny_checkpoint", "memory_of", "MODEL"]

MODEL = "tiny-random-nano"


def tiny_checkpoint(directory: Path | None = None) -> Path:
    """The tiny random Nano checkpoint the tests use (made fresh under ``directory``)."""
    from memt_core.families import NANO
    from memt_core.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(Path(directory or tempfile.mkdtemp(prefix="memt-battery-ckpt-")), NANO)


def memory_of(pid: int | None) -> dict[str, float]:
    """``{"rss_mib", "peak_mib"}`` of a live process (VmRSS and VmHWM), or zeros when it is gone."""
    found = {"rss_mib": 0.0, "peak_mib": 0.0}
    if pid is None:
        return found
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found["rss_mib" if key == "VmRSS" else "peak_mib"] = round(int(value.split()[0]) / 1024, 1)
    except OSError:
        pass
    return found

"""A server's state directory that the battery makes full or read-only under it (issue 58's disk checks).

The directory is a small tmpfs mounted in a private mount namespace of the server's own process (``unshare
--mount``, and without root inside a user namespace of its own, ``--user --map-root-user``): nothing is mounted
on the host, and the mount ends with the process. ``fill()`` writes a file into it from outside, through
``/proc/<pid>/root``, until not one byte more fits, ``free()`` deletes that file again; ``read_only(True)``
remounts it read-only from inside the namespace (``nsenter``), ``read_only(False)`` writable again. The server
sees what it would see on a real full or read-only disk: ``ENOSPC`` and ``EROFS`` from the kernel.

Where a mount namespace cannot be made (no root and no unprivileged user namespaces), ``unavailable()`` says
why: a read-only directory is then made with ``chmod`` (``ChmodDisk``: without root, the permission bits hold), and
the checks that need a full one report themselves skipped.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

from scripts.reliability.servers import MemTServer, ProxyServer

SIZE = "4m"  # the tmpfs: room for a few tiny-model snapshots and many records, until filled
_MOUNT = 'mount -t tmpfs -o "size=$1" tmpfs "$2" && shift 2 && exec "$@"'


def _namespace() -> list[str]:
    return ["unshare", "--mount", "--propagation", "private"] + ([] if os.geteuid() == 0 else ["--user", "--map-root-user"])


def unavailable() -> str | None:
    """Why a small disk cannot be made here, or None when it can."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "unshare/nsenter (util-linux) not installed"
    probe = Path(os.environ.get("TMPDIR", "/tmp"))
    tried = subprocess.run([*_namespace(), "sh", "-c", _MOUNT, "sh", "64k", str(probe), "true"], capture_output=True, text=True)
    if tried.returncode != 0:
        return f"no private mount namespace here ({tried.stderr.strip()[:200] or tried.returncode}): needs root or unprivileged user namespaces"
    return None


class SmallDisk:
    """The tmpfs at ``directory`` inside the namespace of the server process given to ``attach``."""

    def __init__(self, directory: Path, *, size: str = SIZE):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.size = size
        self.pid: int | None = None

    def wrap(self, command: list[str]) -> list[str]:
        """``command`` run in a new mount namespace where ``directory`` is the tmpfs (the same process: exec all the way)."""
        return [*_namespace(), "sh", "-c", _MOUNT, "sh", self.size, str(self.directory), *command]

    @property
    def seen(self) -> Path:
        """The tmpfs as seen from outside the namespace."""
        assert self.pid is not None, "the server has not started"
        return Path(f"/proc/{self.pid}/root") / self.directory.relative_to("/")

    def fill(self) -> int:
        """Write until the tmpfs has no byte left; the bytes written."""
        written, block = 0, 1 << 16
        with open(self.seen / ".fill", "ab", buffering=0) as out:
            while block:
                try:
                    written += out.write(b"\0" * block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    block //= 2
        return written

    def free(self) -> None:
        (self.seen / ".fill").unlink(missing_ok=True)

    def read_only(self, on: bool) -> None:
        enter = ["nsenter", "-t", str(self.pid), "-m"] + ([] if os.geteuid() == 0 else ["-U", "--preserve-credentials"])
        subprocess.run([*enter, "mount", "-o", f"remount,{'ro' if on else 'rw'}", str(self.directory)], check=True, capture_output=True)


class ChmodDisk(SmallDisk):
    """A plain directory made read-only by its permission bits (which only bind a server not running as root)."""

    def wrap(self, command: list[str]) -> list[str]:
        return command

    @property
    def seen(self) -> Path:
        return self.directory

    def fill(self) -> int:
        raise RuntimeError("a directory is made full only on a tmpfs (SmallDisk)")

    def read_only(self, on: bool) -> None:
        for path in [self.directory, *(p for p in self.directory.rglob("*") if p.is_dir())]:
            path.chmod(0o555 if on else 0o755)


class DiskMemTServer(MemTServer):
    """A core whose ``--state-directory`` is ``disk``."""

    def __init__(self, model_path, disk: SmallDisk, **kwargs):
        super().__init__(model_path, state_directory=disk.directory, **kwargs)
        self.disk = disk

    def command(self) -> list[str]:
        return self.disk.wrap(super().command())

    def start(self) -> "DiskMemTServer":
        super().start()
        self.disk.pid = self.process.pid
        return self


class DiskProxyServer(ProxyServer):
    """A proxy whose ``--state-directory`` is ``disk``."""

    def __init__(self, upstream: str, model_path, disk: SmallDisk, *, args: list[str] = (), **kwargs):
        super().__init__(upstream, model_path, args=["--state-directory", str(disk.directory), *args], **kwargs)
        self.disk = disk

    def command(self) -> list[str]:
        return self.disk.wrap(super().command())

    def start(self) -> "DiskProxyServer":
        super().start()
        self.disk.pid = self.process.pid
        return self

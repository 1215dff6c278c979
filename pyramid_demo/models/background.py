"""Background jobs (corpus generation, training) a benchmark pauses while it times: pid files, SIGSTOP then SIGCONT."""

from __future__ import annotations

import atexit
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from .bundled import cache_root


def pid_dir() -> Path:
    return cache_root() / "background"


def register(name: str) -> Path:
    """Write this process's pid file `name-PID.pid` (removed at exit; per process: two jobs never hide each other)."""
    pid = os.getpid()
    path = pid_dir() / f"{name}-{pid}.pid"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{pid}")
    tmp.write_text(str(pid))
    os.replace(tmp, path)

    def _remove() -> None:
        with suppress(OSError):
            if path.read_text().strip() == str(pid):
                path.unlink()

    atexit.register(_remove)
    return path


def live_pids() -> list[int]:
    """The registered jobs still running as this project's processes (not this one)."""
    out = []
    for p in sorted(pid_dir().glob("*.pid")):
        try:
            pid = int(p.read_text().strip())
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if pid != os.getpid() and b"pyramid_demo" in cmd:
            out.append(pid)
    return out


@contextmanager
def paused() -> Iterator[list[int]]:
    """Stop every registered background job while the block runs (yields their pids), then continue them."""
    pids = []
    for pid in live_pids():
        with suppress(OSError):
            os.kill(pid, signal.SIGSTOP)
            pids.append(pid)
    try:
        yield pids
    finally:
        for pid in pids:
            with suppress(OSError):
                os.kill(pid, signal.SIGCONT)

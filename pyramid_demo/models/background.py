"""Background jobs (corpus generation, training) that a benchmark pauses while it times: registered by pid
file, sent SIGSTOP inside `paused()` and SIGCONT after; a stale pid file is ignored."""
from __future__ import annotations

import atexit
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .bundled import cache_root


def pid_dir() -> Path:
    return cache_root() / "background"


def register(name: str) -> Path:
    """Write this process's pid file `name-PID.pid` (removed at exit; one per process, so two jobs of one kind
    never hide each other); returns its path."""
    path = pid_dir() / f"{name}-{os.getpid()}.pid"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, path)
    pid = os.getpid()

    def _remove() -> None:
        try:
            if path.read_text().strip() == str(pid):
                path.unlink()
        except OSError:
            pass
    atexit.register(_remove)
    return path


def live_pids(folder: Path | None = None) -> list[int]:
    """The registered jobs still running as this project's processes (not this one)."""
    out = []
    for p in sorted((folder or pid_dir()).glob("*.pid")):
        try:
            pid = int(p.read_text().strip())
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if pid != os.getpid() and b"pyramid_demo" in cmd:
            out.append(pid)
    return out


@contextmanager
def paused(folder: Path | None = None) -> Iterator[list[int]]:
    """Stop every registered background job while the block runs (yields their pids), then continue them."""
    pids = []
    for pid in live_pids(folder):
        try:
            os.kill(pid, signal.SIGSTOP)
            pids.append(pid)
        except OSError:
            pass
    try:
        yield pids
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass

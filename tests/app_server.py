"""The app's own `build_demo()`, launched in this process on a free port (shared by the API and hostile tests)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def serve_app() -> Iterator[tuple[str, object]]:
    """Yield (url, demo); one torch thread meanwhile (tiny models; the CPU is shared)."""
    import app

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo = app.build_demo()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/", demo
    finally:
        demo.close()
        torch.set_num_threads(before)

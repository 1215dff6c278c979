"""The app on a free port: its own `build_demo()` in this process (the API and hostile tests), or `python app.py` in
a process of its own, as a user starts it (the browser tests)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


# the page's settings as a browser sends them (floats from sliders), small and fast: a test changes what it needs
FAST = dict(
    max_new_tokens=8.0,
    temperature=0.0,
    seed=0.0,
    gamma=3.0,
    l_d=2.0,
    l_q=4.0,
    tau_q=0.4,
    tau_t=0.5,
    divergence="js",
    div_support="subset",
    fallback="none",
    stage2="fuzzy",
    conf_stop=0.0,
    lookup_first=0.0,
    shape="auto",
    tree_nodes=8.0,
    tree_depth=3.0,
    tree_k=2.0,
    qualifier_prompt="own",
)


@contextlib.contextmanager
def serve_app() -> Iterator[tuple[str, object]]:
    """Yield (url, demo); one torch thread meanwhile (tiny models; the CPU is shared)."""
    import app

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    port = free_port()
    demo = app.build_demo()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/", demo
    finally:
        demo.close()
        torch.set_num_threads(before)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def app_process(log_path: Path) -> Iterator[str]:
    """`python app.py` on tiny-random at a free port; yields its URL once it serves, stops it after."""
    port = free_port()
    env = {
        **os.environ,
        "GRADIO_SERVER_PORT": str(port),
        "GRADIO_SERVER_NAME": "127.0.0.1",
        "PYRAMID_DEMO_PRESET": "tiny-random",
        "GRADIO_ANALYTICS_ENABLED": "False",
        "OMP_NUM_THREADS": "1",
    }  # tiny models: one thread avoids oversubscribing a shared CPU
    log = log_path.open("w")
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(240):
            if proc.poll() is not None:
                pytest.fail(f"app.py exited: {log_path.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("app.py did not start serving within 120 s")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()

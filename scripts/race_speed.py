"""AR's tok/s in a race watched in headless Chromium against the same race through `gradio_client`.

The race's clocks run in the server; a page that re-renders too much takes CPU from the models on a small
machine, and the lanes then report a slower AR than an API caller sees. This script runs the page's default
race (its default prompt, family and settings) alternately through the API and in the browser, on one
server, and prints AR's tok/s for each and the ratio of the medians.

    python scripts/race_speed.py --rounds 2                 # starts `python app.py` on a free port
    python scripts/race_speed.py --url http://127.0.0.1:7860/ --warm-only   # load, probe, profile once

Needs gradio_client, Playwright for Python and a Chromium (Debian's /usr/bin/chromium, or $PYRAMID_CHROMIUM).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CHROMIUM = os.environ.get("PYRAMID_CHROMIUM", "/usr/bin/chromium")
CHROME_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]
AR_SPEED = re.compile(r"([\d.]+) tok/s")


def ar_tok_s(lanes_html: str) -> float:
    """AR's tok/s from the lanes' HTML (its headline: "… · 71.3 tok/s · …")."""
    lane = lanes_html.split("lane-ar", 1)[1].split("lane-", 1)[0]
    found = AR_SPEED.search(re.sub(r"<[^>]+>", " ", lane))
    if not found:
        raise ValueError("no tok/s in AR's lane")
    return float(found.group(1))


@contextlib.contextmanager
def server(url: str | None, log: Path) -> Iterator[str]:
    """The given server, or `python app.py` on a free port for the duration."""
    if url:
        yield url
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_SERVER_NAME": "127.0.0.1",
           "GRADIO_ANALYTICS_ENABLED": "False"}
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        address = f"http://127.0.0.1:{port}/"
        try:
            for _ in range(240):
                if proc.poll() is not None:
                    raise RuntimeError(f"app.py exited: {log.read_text()[-2000:]}")
                try:
                    urllib.request.urlopen(address, timeout=2)
                    break
                except OSError:
                    time.sleep(0.5)
            yield address
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) of every living descendant of process `root`: here, the browser's."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    total, todo, tick = 0.0, list(children.get(root, [])), os.sysconf("SC_CLK_TCK")
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def api_race(url: str, prompt: str, preset: str) -> float:
    from gradio_client import Client

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client = Client(url, verbose=False)
        status, lanes, *_ = client.predict(prompt=prompt, preset=preset, api_name="/race")
    if "finished" not in status:
        raise RuntimeError(status)
    return ar_tok_s(lanes)


def browser_races(url: str, n: int, api_between: bool, prompt: str, preset: str) -> tuple[list[float], list[float]]:
    """`n` races clicked in one page (the page's default prompt and settings); with `api_between`, an API race
    before each. Returns (browser tok/s, API tok/s)."""
    from playwright.sync_api import sync_playwright

    web, api = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url, wait_until="domcontentloaded")
        page.wait_for_selector("#run-btn")
        for i in range(n):
            if api_between:
                api.append(api_race(url, prompt, preset))
                print(f"round {i + 1}: API AR {api[-1]:.1f} tok/s", flush=True)
            cpu0, t0 = tree_cpu_s(os.getpid()), time.perf_counter()
            page.locator("#run-btn").click()
            page.wait_for_function(f"document.querySelector('#status').innerText.includes('Race {i + 1} finished')",
                                   timeout=600_000, polling=1000)
            cpu, wall = tree_cpu_s(os.getpid()) - cpu0, time.perf_counter() - t0
            web.append(ar_tok_s(page.locator("#lanes").inner_html()))
            print(f"round {i + 1}: browser AR {web[-1]:.1f} tok/s (the browser used {cpu:.1f} CPU s in the "
                  f"{wall:.0f} s race)", flush=True)
        browser.close()
    return web, api


def main() -> int:
    from pyramid_demo.app.text import EXAMPLE_PROMPTS, START_PRESET

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running app (default: start `python app.py` here)")
    ap.add_argument("--rounds", type=int, default=2, help="API race + browser race pairs")
    ap.add_argument("--warm-only", action="store_true", help="one API race (load, probe, cost profile), no timing")
    a = ap.parse_args()
    prompt, preset = EXAMPLE_PROMPTS[0], START_PRESET
    with server(a.url, Path(os.environ.get("TMPDIR", "/tmp")) / "race_speed_server.log") as url:
        if a.warm_only:
            print(f"warm-up race: AR {api_race(url, prompt, preset):.1f} tok/s")
            return 0
        web, api = browser_races(url, a.rounds, True, prompt, preset)
    ratio = statistics.median(web) / statistics.median(api)
    print(f"median: API {statistics.median(api):.1f}, browser {statistics.median(web):.1f} tok/s; "
          f"browser / API = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One real-browser check: start `python app.py` on a free port, run a race on tiny-random, look at the page.

Needs Playwright for Python and a Chromium binary (Debian's `chromium`; no `playwright install`).
Screenshots land in pytest's tmp_path (race.png, inspector.png, tree.png: the inspector at 1280×800 with the
pass's candidate tree in view, on a tree method when the race has one).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pyramid_demo.app.text import RACE_METHODS, SETTINGS_TITLE, TABS
from pyramid_demo.core.config import METHOD_LABELS
from pyramid_demo.core.methods import method_spec

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("PYRAMID_CHROMIUM", "/usr/bin/chromium")
CHROME_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
    pytest.skip(
        f"no Chromium at {CHROMIUM} (apt-get install chromium, or set PYRAMID_CHROMIUM)", allow_module_level=True
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def server(tmp_path: Path):
    port = _free_port()
    env = {
        **os.environ,
        "GRADIO_SERVER_PORT": str(port),
        "GRADIO_SERVER_NAME": "127.0.0.1",
        "PYRAMID_DEMO_PRESET": "tiny-random",
        "GRADIO_ANALYTICS_ENABLED": "False",
        "OMP_NUM_THREADS": "1",
    }  # tiny models: one thread avoids oversubscribing a shared CPU
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(240):
            if proc.poll() is not None:
                pytest.fail(f"app.py exited: {(tmp_path / 'server.log').read_text()[-2000:]}")
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


@pytest.mark.slow
def test_race_in_browser(server: str, tmp_path: Path) -> None:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(server, wait_until="domcontentloaded")
        page.get_by_text(SETTINGS_TITLE).click()  # open the accordion and keep the race short
        box = page.locator("#max-new input[type=number]")
        box.fill("16")
        box.press("Enter")
        page.get_by_text(SETTINGS_TITLE).click()  # fold it again: the screenshots show the results
        page.locator("#run-btn").click()
        page.wait_for_selector("#lanes .lane-psd_f .tok.o-draft, #lanes .lane-psd_f .tok.o-qualifier", timeout=180_000)
        page.wait_for_function("document.querySelector('#status').innerText.includes('finished')", timeout=180_000)
        assert page.locator("#lanes .lane-ar .tok").count() >= 1
        assert page.locator("#lanes .lane .tok.o-target, #lanes .lane .tok.o-bonus").count() >= 1
        assert page.locator("#race-plot .js-plotly-plot").count() == 1
        assert page.locator("#race-plot .scatterlayer .trace").count() == len(RACE_METHODS)  # a line per method
        proposing = [m for m in RACE_METHODS if method_spec(m).proposer]
        page.wait_for_selector("#race-hist .barlayer .trace", timeout=30_000)  # drawn just after the race ends
        page.wait_for_timeout(500)
        assert page.locator("#race-hist .barlayer .trace").count() == len(proposing)  # a panel per method
        page.wait_for_timeout(500)
        page.screenshot(path=str(tmp_path / "race.png"), full_page=True)

        page.get_by_role("tab", name=TABS["inspect"]).click()
        page.wait_for_selector("#chips .st-accepted, #chips .st-rejected", timeout=30_000)
        assert page.locator("#div-plot .js-plotly-plot").count() == 1
        page.wait_for_timeout(500)
        page.screenshot(path=str(tmp_path / "inspector.png"), full_page=True)
        _tree_at_1280(page, tmp_path)
        for tab, name in ((TABS["stats"], "stats.png"), (TABS["explain"], "explain.png")):
            page.get_by_role("tab", name=tab).click()
            page.wait_for_timeout(800)
            page.screenshot(path=str(tmp_path / name), full_page=True)
        browser.close()


def _tree_at_1280(page, tmp_path: Path) -> None:
    """The inspector on the last method raced (its proposals a tree or a chain, as its shape ran; a chain is a
    tree too) at 1280×800: the tree plot draws its nodes and legend, and a screenshot with it in view is saved
    as tree.png."""
    method = list(RACE_METHODS)[-1]
    page.set_viewport_size({"width": 1280, "height": 800})
    dd = page.locator("#method-dd input")
    dd.click()
    page.get_by_role("option", name=METHOD_LABELS[method]).click()
    page.wait_for_timeout(1500)
    tree = page.locator("#tree-plot")
    assert tree.locator(".js-plotly-plot").count() == 1
    assert tree.locator(".scatterlayer .point").count() >= 2  # the root's child and the verifier's token at least
    assert "accepted path" in tree.locator(".legend").text_content()
    tree.evaluate("e => e.scrollIntoView({block: 'start'})")  # the tree's top at the screen's top
    page.wait_for_timeout(300)
    box = tree.bounding_box()
    assert box is not None and box["height"] <= 800, box  # the whole tree fits the screen
    page.screenshot(path=str(tmp_path / "tree.png"))
    tree.screenshot(path=str(tmp_path / "tree_plot.png"))

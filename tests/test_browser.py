"""One real-browser check: start `python app.py` on a free port, run a race on tiny-random, look at the page.

Needs Playwright for Python and a Chromium binary (Debian's `chromium`; no `playwright install`).
Screenshots land in pytest's tmp_path (race.png, inspector.png, tree.png: the inspector at 1280×800 with the
pass's candidate tree in view, on a tree method when the race has one).
"""

from __future__ import annotations

import html
import os
import re
import shutil
from pathlib import Path

import pytest
from app_server import app_process

from pyramid_demo.app.play_view import PACE_S, counter_line
from pyramid_demo.app.text import RACE_METHODS, SETTINGS_TITLE, TABS
from pyramid_demo.core.methods import METHOD_LABELS, method_spec

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


@pytest.fixture()
def server(tmp_path: Path):
    with app_process(tmp_path / "server.log") as url:
        yield url


def short_race(page) -> None:
    """Run a 16-token race in the page and wait until it has finished and its lanes show."""
    page.get_by_text(SETTINGS_TITLE).click()  # open the accordion and keep the race short
    box = page.locator("#max-new input[type=number]")
    box.fill("16")
    box.press("Enter")
    page.get_by_text(SETTINGS_TITLE).click()  # fold it again: the screenshots show the results
    page.locator("#run-btn").click()
    page.wait_for_selector("#lanes .lane-psd_f .tok.o-draft, #lanes .lane-psd_f .tok.o-qualifier", timeout=180_000)
    page.wait_for_function("document.querySelector('#status').innerText.includes('finished')", timeout=180_000)


@pytest.mark.slow
def test_race_in_browser(server: str, tmp_path: Path) -> None:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(server, wait_until="domcontentloaded")
        short_race(page)
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


# ------------------------------------------------------------------ tables that read, and the race as a web page
BROKEN_WORDS = """() => {  // the words of visible table cells that the browser broke inside themselves
  const bad = [];
  let cells = 0;
  for (const cell of document.querySelectorAll('table td, table th')) {
    if (!cell.getClientRects().length) continue;
    cells++;
    const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let n = walk.nextNode(); n; n = walk.nextNode()) {
      for (const m of n.data.matchAll(/\\S+/g)) {
        const r = document.createRange();
        r.setStart(n, m.index);
        r.setEnd(n, m.index + m[0].length);
        const tops = [...r.getClientRects()].filter(x => x.width > 0).map(x => x.top);
        if (tops.length && Math.max(...tops) - Math.min(...tops) > 4) bad.push(m[0]);
      }
    }
  }
  return {cells, bad};
}"""


@pytest.fixture(scope="module")
def raced(tmp_path_factory):
    """A finished 16-token race in a real page served by `python app.py`: (the Playwright browser, page, a folder)."""
    folder = tmp_path_factory.mktemp("browser")
    with app_process(folder / "server.log") as url, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url, wait_until="domcontentloaded")
        short_race(page)
        yield browser, page, folder
        browser.close()


@pytest.mark.slow
@pytest.mark.parametrize("width", [1280, 1024])
def test_no_table_breaks_a_number_or_a_name(raced, width: int) -> None:
    """Rule: at a projector's width (1024 px) and a laptop's (1280 px), no word in any table of the page (a number,
    a method's name, a short label) is broken across lines: long prose wraps between words or sits under the table."""
    _, page, folder = raced
    page.set_viewport_size({"width": width, "height": 900})
    seen = {}
    for key in ("race", "inspect", "stats", "explain", "export"):
        page.get_by_role("tab", name=TABS[key]).click()
        page.wait_for_timeout(800)
        seen[key] = page.evaluate(BROKEN_WORDS)
    page.get_by_role("tab", name=TABS["stats"]).click()
    page.screenshot(path=str(folder / f"stats_{width}.png"), full_page=True)
    assert seen["stats"]["cells"] >= 10 and seen["race"]["cells"] >= 10, seen  # the tables were there to check
    assert all(not v["bad"] for v in seen.values()), {k: v["bad"] for k, v in seen.items() if v["bad"]}


def _exported_page(page, folder: Path) -> Path:
    """Press Export in the page and save the race's web page as the visitor downloads it."""
    page.get_by_role("tab", name=TABS["export"]).click()
    page.locator("#export-btn").click()
    link = page.locator("#race-page-file a[download]").first
    link.wait_for(timeout=60_000)
    page.wait_for_function(  # the size comes in the label with the chained update after the file
        "/ · \\d+(\\.\\d)? (kB|MB)/.test(document.querySelector('#race-page-file').innerText)", timeout=30_000
    )
    label = page.locator("#race-page-file").inner_text()
    assert re.search(r"Race as a web page \(HTML\) · \d+(\.\d)? (kB|MB)", label), label  # its size, printed
    with page.expect_download() as download:
        link.click()
    path = folder / "race.html"
    download.value.save_as(path)
    return path


def _clock(page) -> float:
    return float(page.locator(".replay .clock").first.inner_text().split()[0])


@pytest.mark.slow
def test_the_exported_race_replays_from_disk_with_no_network(raced) -> None:
    """Rule: the export's web page, opened from disk with every request outside the file blocked, replays each lane
    to its end on the measured clock (×½ and ×¼ at half and a quarter of its pace; a finished lane's figures stay
    put) and plays a target pass through to its last beat, with the app's own counter line."""
    browser, page, folder = raced
    path = _exported_page(page, folder)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    asked: list[str] = []
    context.route(
        "**/*",
        lambda r: r.continue_() if r.request.url.startswith("file://") else (asked.append(r.request.url), r.abort()),
    )
    view = context.new_page()
    view.clock.install()
    view.goto(path.as_uri())
    view.wait_for_function("[...document.querySelectorAll('.lane[data-end]')].every(l => l.classList.contains('done'))")
    assert view.locator(".lane[data-end] .tok[data-t]:not(.on)").count() == 0  # every token shown at the end
    # stretch the recorded times so every lane lasts seconds, then time the replay on the page's (fake) clock
    view.evaluate("""() => document.querySelectorAll('[data-t], [data-end]').forEach(e => {
        if (e.dataset.t) e.dataset.t = 100 * e.dataset.t; if (e.dataset.end) e.dataset.end = 100 * e.dataset.end; })""")
    ends = dict(view.locator(".lane[data-end]").evaluate_all("ls => ls.map(l => [l.classList[1], +l.dataset.end])"))
    soonest = min(ends, key=ends.get)
    view.clock.pause_at(view.evaluate("Date.now()") + 1000)  # from here the page's time moves only with run_for
    wall = 0.5 * min(ends.values())  # seconds of wall time: no lane has finished at ×1
    for label, speed in (("×1", 1.0), ("×½", 0.5), ("×¼", 0.25)):
        view.get_by_role("button", name=label).click()
        view.get_by_role("button", name="↺ Replay").click()
        view.clock.run_for(round(1000 * wall))
        assert _clock(view) == pytest.approx(wall * speed, abs=0.05), label
    view.get_by_role("button", name="×1").click()
    view.get_by_role("button", name="↺ Replay").click()
    view.clock.run_for(round(1000 * (ends[soonest] + 0.2)))  # the first lane to finish has just finished
    first = view.locator(f".{soonest} .live")
    assert "done" in view.locator(f".{soonest}").get_attribute("class")
    said = first.inner_text()
    view.clock.run_for(round(1000 * (max(ends.values()) - ends[soonest]) / 2))
    assert first.inner_text() == said  # a finished lane's live figures no longer move
    # the pass player: the last lane's busiest pass, played to its last beat
    counter = view.locator(".player .play-counter").first
    n = int(re.search(r"beat 1 / (\d+)", counter.inner_text()).group(1))
    view.locator(".player [data-act=play]").first.click()
    view.clock.run_for(round(1000 * PACE_S * (n + 1)))
    text = counter.inner_text()
    label = text.split(" · beat")[0]
    assert html_text(counter_line(label, n - 1, n, False)) == text, text
    assert view.locator(".player .beat-sentence").first.inner_text().startswith("the pass commits")
    assert not asked, asked  # nothing outside the file was even asked for
    context.close()


def html_text(fragment: str) -> str:
    """The text a browser shows for a small HTML fragment (tags dropped, entities read)."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))

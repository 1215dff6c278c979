"""The race as one web page (`race_page`), from hand-built records: one file that asks for nothing outside itself,
every race newest first with its table, each lane on its recorded clock, and the app's own beats in its player.
The browser half (it opens from disk with the network blocked and plays) is `test_browser.py`'s."""

from __future__ import annotations

import base64
import gzip
import html
import json
import re
from dataclasses import replace

from test_race_view import AR_ENDS, AR_PASSES, SD_ENDS, SD_PASSES, check_replay, race_of, run

from pyramid_demo.app import play_view, race_page, race_view, render
from pyramid_demo.app.races import Session


def session_of(*numbers: int) -> Session:
    """A session whose races (numbered as given) each hold an AR lane and an SD lane that kept some guesses."""
    races = []
    for n in numbers:
        race = race_of([{"ar": run("ar", AR_ENDS, AR_PASSES), "sd": run("sd", SD_ENDS, SD_PASSES)}])
        race.n, race.prompt = n, f"prompt of race {n}"
        race.vocab = {i: f"w{i} " for i in range(100)}
        races.append(race)
    return Session(races=races)


def unpacked(page: str) -> dict:
    """The player's data as the page's script unpacks it (base64, gzip, JSON)."""
    packed = re.search(r'<script id="beats" type="application/octet-stream">([^<]*)</script>', page)[1]
    return json.loads(gzip.decompress(base64.b64decode(packed)))


def test_the_page_asks_for_nothing_outside_itself():
    """Rule: the page is one file: no script, style sheet, image, font or link is fetched from anywhere."""
    page = race_page.page(session_of(1))
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    for asks in ("src=", "href=", "<link", "url(", "@import", "http://", "https://", "//cdn"):
        assert asks not in page.lower(), asks


def test_every_race_newest_first_with_its_prompt_and_table():
    """Rule: every race of the session is in the page, newest first, with its whole prompt and the app's results
    table (the same columns and rows as the race tab and the CSV)."""
    session = session_of(1, 2)
    page = race_page.page(session)
    assert page.index('id="race-2"') < page.index('id="race-1"')
    section = page.split('id="race-1"')[1]
    assert "prompt of race 1" in section
    cells = [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", section.split("</table>")[0])]
    want = [race_page._cell(x) for row in race_view.race_rows([session.races[0]]) for x in row]
    assert cells == [html.unescape(w) for w in want] and len(cells) == 2 * 12


def test_each_lane_replays_on_its_recorded_clock():
    """Rule: in the page, as in the app, each chip appears at the end of the pass that committed it in its own
    lane's run, and each lane ends at its last pass (the app's replay, its script included)."""
    page = race_page.page(session_of(1))
    check_replay(page)
    assert "function replayIn(element, watch)" in page and "requestAnimationFrame(frame)" in page


def test_the_player_shows_the_apps_own_beats():
    """Rule: each target pass of each lane carries, beat for beat, what the app's ▶ Play panel shows for it (the
    same chips, colours and sentences under the same counter line), and opens on the app's choice: the last lane's
    busiest pass."""
    session = session_of(1)
    race = session.races[0]
    data = unpacked(race_page.page(session))["1"]
    assert data["start"] == "sd" and list(data["lanes"]) == ["ar", "sd"]
    for m, lane in data["lanes"].items():
        assert lane["busiest"] == play_view.busiest(race.results[m].steps)
        assert len(lane["passes"]) == len(race.results[m].steps)
        for k, beats in enumerate(lane["passes"], start=1):
            ps = play_view.load(session, 1, m, k)
            assert ps.label == f"Race 1 · {lane['label']} · target pass {k} of {len(lane['passes'])}"  # as JS builds it
            assert len(beats) == len(ps.beats) >= 1
            for i, body in enumerate(beats):
                head = play_view.counter_line(ps.label, i, len(beats), False)
                shown = f'{render.STYLE}<div class="play" style="padding:6px 4px">{head}{body}</div>'
                assert play_view.beat_html(replace(ps, i=i)) == shown, (m, k, i)
    sd = data["lanes"]["sd"]["passes"]
    assert any("in place of the refused guess" in b for beats in sd for b in beats)  # a judged pass is there

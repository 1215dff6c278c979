"""While a race runs the page gets only what changed: the running lane throttled, the chart rarely and thin,
the earlier races before the clocks, the table at the end; and the lanes' chips are rendered once each."""
from __future__ import annotations

import dataclasses
import warnings

import plotly.graph_objects as go
import pytest

from pyramid_demo.app import charts, render
from pyramid_demo.app import handlers as h
from pyramid_demo.app.race_view import CHART_INTERVAL_S, LANES_INTERVAL_S, LiveView, before_race, race_lanes
from pyramid_demo.app.session import Race, Session
from pyramid_demo.app.text import RACE_METHODS
from pyramid_demo.core.config import DecodeConfig
from pyramid_demo.core.run import stream
from pyramid_demo.models.tiny import tiny_random_triplet

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def snaps():
    t = dataclasses.replace(tiny_random_triplet(), eos_ids=())
    return {m: list(stream(t, "hello", DecodeConfig(method=m, max_new_tokens=30))) for m in ("ar", "psd_f")}


def _skipped(x) -> bool:
    return isinstance(x, dict) and x.get("__type__") == "update" and len(x) == 1


def test_lane_bodies_append_chips_and_equal_a_full_render(snaps):
    """Rule: the incremental chips of every snapshot equal `coloured_tokens` of it; a new run starts afresh."""
    bodies = render.LaneBodies()
    for m, runs in snaps.items():
        for r in runs:
            assert bodies(m, r) == render.coloured_tokens(r)
    assert bodies("ar", snaps["ar"][3]) == render.coloured_tokens(snaps["ar"][3])  # an earlier, other snapshot


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_live_view_sends_only_what_is_due(snaps):
    """Rule: nothing before LANES_INTERVAL_S unless the status changed or a method ended; the chart at most every
    CHART_INTERVAL_S from the race's start (and at a method's end), thinned and without markers; the table and
    the earlier races never while a lane runs; an unchanged status is skipped."""
    session = Session()
    race = Race(1, "tiny-random", ["d", "q", "t"], "hello", DecodeConfig().to_dict(), running="ar")
    session.races.append(race)
    clock = Clock()
    live = LiveView(session, race, clock)
    race.results["ar"] = snaps["ar"][0]
    first = live.update("running AR", False)
    assert first is not None and first[0] == "running AR" and "lane-ar" in first[1]
    assert _skipped(first[2]) and _skipped(first[3]) and _skipped(first[4])  # no chart at the start of a lane
    clock.t += LANES_INTERVAL_S / 2
    assert live.update("running AR", False) is None  # not due yet
    clock.t += LANES_INTERVAL_S
    race.results["ar"] = snaps["ar"][10]
    out = live.update("running AR", False)
    assert out is not None and _skipped(out[0]) and "lane-ar" in out[1] and _skipped(out[2])
    clock.t += CHART_INTERVAL_S
    race.results["ar"] = snaps["ar"][-1]
    chart = live.update("running AR", False)[2]
    assert isinstance(chart, go.Figure) and chart.data[0].mode == "lines"
    clock.t += 0.01
    ended = live.update("running AR", True)  # a method's last pass: due at once, with the chart
    assert ended is not None and isinstance(ended[2], go.Figure) and _skipped(ended[3]) and _skipped(ended[4])


def test_before_the_clocks_the_page_gets_the_empty_lanes_and_the_earlier_races(snaps):
    """Rule: what is big and fixed (the earlier races, the coming race's empty lanes, an empty chart) is sent
    before any lane is timed."""
    old = Race(1, "tiny-random", ["d", "q", "t"], "hello", DecodeConfig().to_dict(), results={"ar": snaps["ar"][-1]})
    session = Session(races=[old], next=2)
    upcoming = Race(2, "tiny-random", ["d", "q", "t"], "hi", DecodeConfig().to_dict())
    status, lanes, fig, table, earlier, _ = before_race(session, upcoming, session.races, "loading")
    assert "Race 2" in lanes and "waiting" in lanes and "Race 1" in earlier and "Race 2" not in earlier
    assert isinstance(fig, go.Figure) and not fig.data and _skipped(table)


def test_the_live_chart_is_thin():
    """A long run's live chart carries at most LIVE_POINTS points per line, ending at the run's last pass."""
    t = dataclasses.replace(tiny_random_triplet(), eos_ids=())
    r = list(stream(t, "hello", DecodeConfig(method="ar", max_new_tokens=120)))[-1]
    live, full = charts.race_figure({"ar": r}, "ar", live=True), charts.race_figure({"ar": r})
    assert len(live.data[0].x) <= charts.LIVE_POINTS < len(full.data[0].x) == len(r.steps) + 1
    assert live.data[0].x[-1] == full.data[0].x[-1] and live.data[0].y[-1] == 120


def test_a_race_streams_fewer_charts_than_lanes_and_ends_complete(monkeypatch):
    """Through the handler: every intermediate output after loading carries the lanes; the chart and the table
    come far less often; the last output is complete."""
    monkeypatch.setenv("PYRAMID_DEMO_PROBE", "0")
    settings = dict(max_new_tokens=48.0, temperature=0.0, seed=0.0, gamma=3.0, l_d=2.0, l_q=4.0, tau_q=0.4, tau_t=0.5,
                    divergence="js", div_support="subset", fallback="none", stage2="fuzzy", conf_stop=0.0)
    monkeypatch.setattr("pyramid_demo.app.race_view.LANES_INTERVAL_S", 0.0)  # every pass due: count what is sent
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs = list(h.run_race("tiny-random", ("", "", ""), "hello", settings, Session()))
    live = [o for o in outs if isinstance(o[1], str) and "lane-" in o[1]][:-1]
    charts_sent = sum(isinstance(o[2], go.Figure) for o in live)
    assert len(live) > 20 and charts_sent < len(live) / 2
    assert not any(isinstance(o[3], list) for o in live)  # the table: once the race is over
    assert sum(isinstance(o[4], str) for o in live) == 1  # earlier races: once, before the clocks
    status, lanes, fig, table, earlier, _ = outs[-1]
    assert "finished" in status and isinstance(fig, go.Figure) and isinstance(earlier, str)
    assert len(table) == len(RACE_METHODS)
    assert lanes == race_lanes(outs[-1][-1].latest)

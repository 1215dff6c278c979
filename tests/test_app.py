"""The app's handlers called directly on tiny-random: no browser, no server, a few seconds."""

from __future__ import annotations

import csv
import json
import sys
import warnings
from pathlib import Path

import plotly.graph_objects as go
import pytest
import torch
from app_server import FAST

from pyramid_demo import clock
from pyramid_demo.app import charts, inspector, race_view, render, views
from pyramid_demo.app import handlers as h
from pyramid_demo.app.races import Session
from pyramid_demo.app.text import DEFAULT, MSG, RACE_COLUMNS, RACE_METHODS
from pyramid_demo.core.settings import APP_SETTINGS, TUNABLE
from pyramid_demo.core.trace import StageRound, TokenRec


@pytest.fixture(scope="module", autouse=True)
def own_cache(tmp_path_factory):
    """A fresh cache folder, not the user's, where setup's step (`prepare`) has recorded the tiny family's checks and
    cost profile: a race reads that record and never measures one itself."""
    from pyramid_demo.models.loading import load_triplet
    from pyramid_demo.models.runtime import measure_family

    mp = pytest.MonkeyPatch()
    mp.setenv("PYRAMID_DEMO_CACHE", str(tmp_path_factory.mktemp("app_cache")))
    measure_family(load_triplet("tiny-random"))
    yield
    mp.undo()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run ~20× faster on one thread when the CPU is shared (no thread oversubscription)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def race(session: Session | None, prompt: str = "hello", preset: str = "tiny-random", ids=("", "", ""), **over) -> list:
    s = {**FAST, **over}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gr.Warning outside a request is a plain UserWarning
        return list(h.race_event(prompt, preset, *ids, session, **s))


@pytest.fixture(scope="module")
def done() -> tuple[Session, list]:
    session = Session()
    return session, race(session)


def test_race_streams_coloured_tokens_and_a_chart(done) -> None:
    session, outs = done
    status, lanes, fig, table, earlier, state = outs[-1]
    assert "finished" in status and (" won: " in status or "Tie within" in status) and state is session
    assert "bitwise" not in status and "One-time costs" not in status  # who won and by how much, nothing else
    assert len(outs) >= 3  # loading message, then live snapshots
    for m in RACE_METHODS:
        assert f"lane-{m}" in lanes
    psd_lane = lanes.split("lane-psd_f")[1]  # past the legend, which shows every colour
    assert 'class="tok o-draft' in psd_lane or 'class="tok o-qualifier' in psd_lane
    assert "background:" in lanes and "<style>" in lanes  # coloured chips (one style block, classed spans)
    assert isinstance(fig, go.Figure) and len(fig.data) == len(RACE_METHODS)
    assert "tok/s" in fig.data[-1].name
    assert [row[1] for row in table] == list(RACE_METHODS)
    res = session.races[0].results
    assert all(res[m].stats.stopped == "max_new_tokens" for m in RACE_METHODS)
    # while the lanes are timed the page gets no lanes and no chart: they come once, at the end, to be replayed
    assert not any(isinstance(o[2], go.Figure) and o[2].data for o in outs[:-1])
    assert '<div class="replay playing">' in lanes and "data-t=" in lanes


def test_chain_vs_tree_side_by_side_adds_a_lane_per_shape() -> None:
    """Rule: the switch races every proposing method twice, once held to a chain and once to a tree, AR once; each
    lane's record runs the shape its lane names (keys name lanes; `methods.LANES` says what each runs), and the
    lossless tree lane still writes AR's text at T=0."""
    from pyramid_demo.core.methods import LANES, lanes

    session = Session()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs = list(
            h.race_event(
                "hello", "tiny-random", "", "", "", session, **{**FAST, "max_new_tokens": 6.0}, side_by_side=True
            )
        )
    race = session.races[0]
    keys = [lane.key for lane in lanes(True)]
    assert list(race.lanes) == keys and set(race.results) == set(keys) and len(keys) == 9
    for k in keys:
        want = LANES[k].shape or "chain"
        assert race.results[k].method == LANES[k].method and race.results[k].config["shape"] == want
        assert f"lane-{k}" in outs[-1][1]
    assert race.results["sd+tree"].token_ids == race.results["ar"].token_ids
    from pyramid_demo.app import views

    picked = views.pick_race(session)  # the inspector's choices and the statistics tab, for every lane
    assert [v for _, v in picked[1]["choices"]] == keys
    for k in ("sd+tree", "psd_f+tree", "fsd+chain"):
        chips, *_ = views.inspect_round(session, race.n, k, 1, 0.4, 0.5, 1)
        assert "tok" in chips


def test_greedy_lossless_methods_match_ar(done) -> None:
    session, _ = done
    res = session.races[0].results
    assert res["sd"].token_ids == res["ar"].token_ids


def _round(divs: list[float], n_acc: int, rule: str = "fuzzy", tau: float = 0.5) -> StageRound:
    statuses = ["accepted"] * n_acc + ["rejected"] + ["discarded"] * len(divs)
    toks = [TokenRec(i, "draft", statuses[i], div=d, tau=tau) for i, d in enumerate(divs)]
    toks.append(TokenRec(99, "target", "resampled" if n_acc < len(divs) else "bonus"))
    return StageRound(
        "target", "draft", "target", rule, toks, n_acc, exact=rule in ("sd", "greedy"), sd_fallback=rule == "fuzzy+sd"
    )


def test_reevaluate_is_the_leading_run_under_tau() -> None:
    rnd = _round([0.1, 0.3, 0.6, 0.2], 2)
    assert inspector.reevaluate(rnd, 0.5) == 2
    assert inspector.reevaluate(rnd, 0.05) == 0
    assert inspector.reevaluate(rnd, 0.2) == 1
    assert inspector.reevaluate(rnd, 0.7) == 4
    assert inspector.whatif_statuses(rnd, 0.2) == ["accepted", "rejected", "discarded", "discarded"]
    exact = _round([0.1, 0.9], 1, rule="greedy", tau=None)
    assert inspector.reevaluate(exact, 0.0) == 1  # τ does not apply to the exact rule
    fb = _round([0.8, 0.1], 2, rule="fuzzy+sd")  # token 0 passed by the SD fallback
    assert inspector.reevaluate(fb, 0.5) == 2


def test_tau_change_reevaluates_a_recorded_round(done) -> None:
    session, _ = done
    n = session.races[0].n
    r = session.races[0].results["psd_f"]
    rnd = r.steps[0].target_round
    assert rnd is not None
    chips, div_fig, top5_fig, md, tree_fig = views.inspect_round(session, n, "psd_f", 1, 0.4, 0.5, 1)
    assert "st-" in chips and isinstance(div_fig, go.Figure) and isinstance(top5_fig, go.Figure)
    assert isinstance(tree_fig, go.Figure) and tree_fig.data  # the pass drawn as a (one-branch) tree
    assert f"kept **{rnd.n_accepted} of" in md
    chips0, fig0, _, md0, _ = views.inspect_round(session, n, "psd_f", 1, 0.0, 0.0, 1)
    assert "would accept **0**" in md0  # nothing passes Div ≤ 0 (tiny models never agree exactly)
    red = render.STATUS_COLOURS["rejected"][1]
    assert red in list(fig0.data[-1].marker.color)  # the first target-round bar turns red
    top = max(t.div or 0 for t in rnd.tokens[:-1]) + 1
    _, _, _, md_hi, _ = views.inspect_round(session, n, "psd_f", 1, top, top, 1)
    assert f"would accept **{len(rnd.tokens) - 1}**" in md_hi
    chips_sd, _, _, md_sd, _ = views.inspect_round(session, n, "sd", 1, 0.4, 0.5, 1)
    assert "τ does not apply" in md_sd and "a fuzzy test at τ = 0.5" in chips_sd  # SD: what FSD would keep
    chips_ar, _, _, _, _ = views.inspect_round(session, n, "ar", 1, 0.4, 0.5, 1)
    assert "no drafts" in chips_ar


def test_top5_decodes_every_role(done) -> None:
    session, _ = done
    race0 = session.races[0]
    step = race0.results["psd_f"].steps[0]
    dists = inspector.position_top5(step, 0)
    assert set(dists) >= {"qualifier", "target"}
    assert all(int(i) in race0.vocab for pairs in dists.values() for i, _ in pairs)


def test_a_winner_only_beyond_the_races_noise(done, monkeypatch) -> None:
    """Rule: the banner and the × AR / × SD cells call a method faster only when its margin exceeds the
    race's timing noise (clock.race_noise); within it they say tie, and without a noise figure the
    banner says it cannot judge."""
    session, _ = done
    race_ = session.races[-1]
    x_ar = RACE_COLUMNS.index("× AR")
    monkeypatch.setattr(clock, "race_noise", lambda r, reps=None: 10.0)  # everything within the noise
    assert "Tie within this race's noise band (1000%)" in h.winner_line(race_)
    rows = race_view.race_rows([race_])
    assert all("tie" in str(row[x_ar]) for row in rows if row[1] != "ar") and rows[0][x_ar] == 1.0
    monkeypatch.setattr(clock, "race_noise", lambda r, reps=None: 0.0)
    speeds = sorted(clock.speed_ratio(m, "ar", race_.results, race_.repeats) for m in race_.results)
    if speeds[-1] > speeds[-2]:  # a strict winner at zero noise
        assert "🏆" in h.winner_line(race_) and " won: " in h.winner_line(race_) and "(0%)" in h.winner_line(race_)
    monkeypatch.setattr(clock, "race_noise", lambda r, reps=None: None)
    assert "too few forwards" in h.winner_line(race_)


def test_pick_race_fills_inspector_and_statistics(done) -> None:
    session, _ = done
    out = views.pick_race(session)
    assert out[1]["value"] == RACE_METHODS[-1]  # the last raced
    assert all(isinstance(f, go.Figure) for f in out[6:9])
    assert isinstance(out[12], go.Figure) and "Race" in out[12].layout.title.text  # the race tab's histogram
    assert "Noise band" in out[9] and "| PSD_F |" in out[9] and "idle machine" in out[9]
    assert "the profile" in out[9] and "- **PSD_F**: " in out[9]  # each verdict in words, under the table
    cost_fig, cost_md = out[10], out[11]
    assert isinstance(cost_fig, go.Figure)
    assert {t.name for t in cost_fig.data} >= {"target (profile)", "draft (profile)"}
    assert any("in this race" in t.name for t in cost_fig.data)  # per-forward times measured in the race
    assert "Cost profile" in cost_md and "| SD |" in cost_md and "To match AR" in cost_md
    assert "Teaching aid" in cost_md


def test_models_are_warmed_before_the_clocks_and_one_time_costs_shown_apart(monkeypatch) -> None:
    """Every model is warmed (the cost profile read from setup's record) before the first lane's clock starts; the
    load and warm-up times are shown under the finished race's lanes, in no lane's time (the status line
    says who won)."""
    from pyramid_demo.predict import measure

    events = []
    real_warm, real_stream = measure.warm_up, clock.stream
    monkeypatch.setattr(measure, "warm_up", lambda m, *a: events.append(("warm", sorted(m))) or real_warm(m, *a))
    monkeypatch.setattr(clock, "stream", lambda *a, **k: events.append(("stream", a[2].method)) or real_stream(*a, **k))
    session = Session()
    status, lanes = race(session)[-1][:2]
    assert events[0] == ("warm", ["draft", "qualifier", "target"]) and events[1][0] == "stream"
    foot = lanes.split('class="lanes-foot"')[1]
    assert "One-time costs" in foot and "warm-up" in foot and "load" in foot and "One-time" not in status
    r = session.races[-1]
    assert r.profile["ms"]["target"] and all(res.stats.decode_s > 0 for res in r.results.values())
    assert "prefill" in h.race_lanes(r)


@pytest.mark.parametrize(
    "over,prompt,needle",
    [
        ({}, "   ", "empty"),
        ({"l_d": 9.0, "l_q": 4.0}, "hi", "must not exceed"),
        ({"temperature": -1.0}, "hi", "temperature"),
        ({}, "the " * 2000, "context"),
    ],
)
def test_bad_inputs_give_messages(over: dict, prompt: str, needle: str) -> None:
    session = Session()
    outs = race(session, prompt, **over)
    assert len(outs) >= 1 and needle in outs[-1][0] and outs[-1][0].startswith("⚠️")
    assert session.races == []


def test_custom_family_errors_are_messages() -> None:
    outs = race(Session(), preset="custom", ids=("a", "", ""))
    assert MSG["custom_missing"] in outs[-1][0]
    outs = race(Session(), preset="custom", ids=("/nonexistent/d", "/nonexistent/q", "/nonexistent/t"))
    assert "Could not load" in outs[-1][0]


def _until_lanes_run(gen) -> None:
    """Advance a race past its loading stages until its first lane is timed and the second about to be."""
    while "decoding SD" not in next(gen)[0]:
        pass


def test_stop_keeps_partial_results_and_next_run_works() -> None:
    session = Session()
    gen = h.race_event("hello", "tiny-random", "", "", "", session, **FAST)
    _until_lanes_run(gen)
    status, *_ = h.stop_race(session)  # the Stop button, while the race runs
    assert status == MSG["stopping"]
    outs = list(gen)  # the race sees the flag after its current target pass and ends cleanly
    assert "stopped" in outs[-1][0] and "tok " in outs[-1][1]
    partial = session.races[0].results
    assert session.races[0].stopped and 0 < len(partial) < len(RACE_METHODS)
    assert not session.busy
    assert "stopped" in h.stop_race(session)[0]  # a second press just reports
    outs = race(session)
    assert "finished" in outs[-1][0] and len(session.races) == 2
    assert "Race 1" in outs[-1][4]  # the earlier, stopped race stays visible
    assert [row[0] for row in outs[-1][3]].count(1) == len(partial)  # its rows stay in the table


def test_cancelled_generator_leaves_a_usable_session() -> None:
    session = Session()
    gen = h.race_event("hello", "tiny-random", "", "", "", session, **FAST)
    _until_lanes_run(gen)
    gen.close()  # a closed page or a cancelled event
    assert not session.busy and set(session.races[0].results) == {"ar"}  # what finished is kept
    assert "finished" in race(session)[-1][0]


def test_a_visitor_whose_race_must_wait_reads_so_at_once() -> None:
    """While any visitor's race holds the models, a new press gets the queued line straight away; once that race
    ends (finished, stopped or its page closed), a press changes nothing before its own race starts."""
    assert h.queue_line() is not MSG["queued"]
    gen = h.race_event("hello", "tiny-random", "", "", "", Session(), **FAST)
    _until_lanes_run(gen)
    assert h.queue_line() == MSG["queued"]
    gen.close()
    assert h.queue_line() != MSG["queued"]


def test_export_writes_json_csv_and_a_page(done) -> None:
    """Rule: an export writes the trace, the table and the races' web page into the visitor's own folder, the same
    one each time (no folder left per export), which goes when the session's folder is cleaned up."""
    session, _ = done
    jpath, cpath, hpath = h.export_files(session)
    assert h.export_files(session) == (jpath, cpath, hpath) and Path(jpath).parent == Path(cpath).parent
    assert Path(hpath).parent == Path(jpath).parent
    trace = json.loads(open(jpath, encoding="utf-8").read())
    assert trace[0]["results"]["psd_f"]["steps"]
    rows = list(csv.reader(open(cpath, encoding="utf-8")))
    assert rows[0][:3] == ["race", "preset", "prompt"] and len(rows) == 1 + len(RACE_METHODS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert h.export_files(Session()) == (None, None, None)
    session.exports.cleanup()
    assert not Path(jpath).parent.exists()
    session.exports = None  # the fixture's session serves other tests


def test_the_export_labels_the_pages_size(done) -> None:
    """Rule: the web page's download names its size, as the file on disk has it."""
    session, _ = done
    _, _, path = h.export_files(session)
    size = Path(path).stat().st_size
    assert h.page_label(path)["label"].endswith(f" · {size / 1e6:.1f} MB" if size >= 1e5 else f" · {size / 1e3:.0f} kB")
    session.exports.cleanup()
    session.exports = None


def test_clear_and_presets() -> None:
    out = h.clear_results(Session(next=3))
    assert out[0] == MSG["cleared"] and out[-1].races == []
    text, fold, vis = h.preset_info("custom")
    assert vis["visible"] is True
    text, fold, vis = h.preset_info("smollm2-offline")
    assert "GB" in text and "GB" in fold and vis["visible"] is False
    assert h.make_config(**{k: FAST[k] for k in APP_SETTINGS}).l_q == 4


def test_app_builds_without_loading_models(monkeypatch) -> None:
    import pyramid_demo.models.loading as loading

    def boom(*a, **k):
        raise AssertionError("models must load lazily, on the first race")

    monkeypatch.setattr(loading, "load_triplet", boom)
    monkeypatch.setitem(sys.modules, "spaces", None)  # no `spaces`: the GPU decorator is a no-op
    sys.modules.pop("app", None)
    import app

    assert app._gpu(len) is len

    class FakeSpaces:  # what a ZeroGPU Space provides
        @staticmethod
        def GPU(duration: int):
            return lambda fn: ("on-gpu", fn)

    monkeypatch.setitem(sys.modules, "spaces", FakeSpaces)
    assert app._gpu(len) == ("on-gpu", len)
    assert app.demo is not None
    assert charts.race_figure({}).layout.annotations  # the empty chart says what will appear


def test_choosing_a_family_resets_the_settings_to_its_tuned_values():
    """The preset dropdown's handler sends the family's tuned settings to the sliders (in
    TUNABLE order); a custom family gets the papers' defaults."""
    from pyramid_demo.models.presets import tuned_settings

    ups = h.preset_settings("smollm2-offline")
    got = dict(zip(TUNABLE, (u["value"] for u in ups)))
    assert tuned_settings("smollm2-offline") and all(got[k] == v for k, v in tuned_settings("smollm2-offline").items())
    got = dict(zip(TUNABLE, (u["value"] for u in h.preset_settings("custom"))))
    assert got == {k: getattr(DEFAULT, k) for k in TUNABLE}


def test_notes_in_html_panels_show_bold_not_asterisks():
    """Status texts are Markdown (shared with the status line); the HTML lanes render **x** as bold
    and still escape markup."""
    out = render.message_html("Press **Run** <now>")
    assert "<b>Run</b>" in out and "**" not in out and "&lt;now&gt;" in out


def test_a_race_encodes_its_prompt_once(monkeypatch):
    """The handler checks and encodes the prompt once; every method's run reuses the ids."""
    import pyramid_demo.core.run as run

    calls = []
    real = run.encode_prompt
    monkeypatch.setattr(run, "encode_prompt", lambda *a, **k: calls.append(1) or real(*a, **k))
    session = Session()
    race(session, prompt="once")
    assert len(calls) == 1
    assert all(r.prompt == "once" for r in session.races[0].results.values())


def test_a_race_without_an_exactness_record_says_lossless_methods_may_differ(monkeypatch) -> None:
    """Claims come from the probe's record: a family loaded with the probe off (no record) gets a note above
    the race saying SD and lossless PSD_A may differ from AR, with the reason; an exact one does not."""
    import dataclasses

    from pyramid_demo.models import loading
    from pyramid_demo.models.checks import describe

    real = loading.load_triplet
    unchecked = {"exact": None, "tree_exact": None, "exact_note": describe(None)}  # whatever an earlier test recorded
    monkeypatch.setattr(loading, "load_triplet", lambda *a, **k: dataclasses.replace(real(*a, **k), **unchecked))
    session = Session()
    race(session)
    note = session.races[-1].exact_note  # shown under the finished race, beside its agreement figures
    assert "may differ from AR" in note and "not checked" in note and note not in session.races[-1].note
    monkeypatch.setattr(
        loading,
        "load_triplet",
        lambda *a, **k: dataclasses.replace(real(*a, **k), exact=True, tree_exact=True, exact_note="exact: checked"),
    )
    race(session)
    assert "may differ" not in session.races[-1].exact_note

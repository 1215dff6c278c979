"""The Statistics tab's one story (`app/story.py`), on hand-built records."""

from __future__ import annotations

import itertools

import pytest
from helpers import compute_stats

from pyramid_demo import clock
from pyramid_demo.app import charts, story
from pyramid_demo.core.trace import RunResult, Step

PROFILE = {"ms": {"target": {"1": 20.0}}, "dtype": "bfloat16", "backend": "no-onednn", "how": "cached"}


def _ar_run(step_s: float, n: int = 10) -> RunResult:
    """AR on hand-built steps: n one-token target forwards of `step_s` seconds each."""
    steps = [
        Step(
            i,
            [],
            None,
            [i],
            ["target"],
            i * step_s,
            (i + 1) * step_s,
            time_s={"target": step_s},
            n_forward={"target": 1},
            fed={"target": [1]},
        )
        for i in range(n)
    ]
    stats = compute_stats("ar", steps, 0.0, "max_new_tokens")
    return RunResult("ar", {}, [], "", [], list(range(n)), [], ["target"] * n, "", stats, steps)


def test_a_busy_machine_is_a_warning_only_where_it_changes_a_verdict():
    """Rule: the race's forwards against the profile are stated per model; the "machine was busy" warning, with
    the target's factor, appears only when some method's measured outcome is not the profile's (`disagrees`),
    i.e. when the load changes a verdict. The idle-machine column still shows the profile's prediction."""
    res = {"ar": _ar_run(0.062)}  # 62 ms a forward against the profile's 20 ms
    assert story.load_factors(list(res.values()), PROFILE) == {"target": pytest.approx(3.1)}
    text = story.markdown(res, PROFILE)  # AR alone: no verdict for the load to change
    assert "busy" not in text and "Forward time ÷ the profile's in this race, per model: target 3.1×" in text
    warned = story.load_line(res, PROFILE, changed=True)
    assert "This machine was busy: target forwards took 3.1× the profile" in warned and "change a verdict" in warned
    row = story.rows(res, PROFILE)[0]
    assert row["predicted"] == pytest.approx(50.0) and row["measured"] == pytest.approx(1 / 0.062, rel=1e-3)
    calm = story.markdown({"ar": _ar_run(0.021)}, PROFILE)
    assert "busy" not in calm and "target 1.1×" in calm
    assert story.disagrees({"method": "sd", "x_ar": 1.32, "x_ar_predicted": 0.9}, 0.1)  # faster, predicted slower
    assert not story.disagrees({"method": "sd", "x_ar": 1.05, "x_ar_predicted": 0.9}, 0.1)  # a tie never does
    assert not story.disagrees({"method": "sd", "x_ar": 1.32, "x_ar_predicted": 1.2}, 0.1)


VERDICT = dict(alpha=0.33, factor=4.1, per_pass=1.2, per_pass_needed=1.3)


def test_the_verdict_never_contradicts_the_measured_outcome():
    """Rule: the verdict starts from the measured outcome against AR (faster / a tie within noise /
    slower, clock.compare) whatever the profile predicts; where the profile disagrees it says so."""
    for x, xp, spread in itertools.product((0.8, 0.97, 1.15, 1.32), (0.9, 1.2), (0.05, 0.2)):
        v = story.verdict("sd", {**VERDICT, "x_ar": x, "x_ar_predicted": xp}, spread, 6.0)
        want = {1: "**faster**", 0: "**a tie with AR** within noise", -1: "**slower**"}[clock.compare(x, 1, spread)]
        assert v.startswith(want), (x, xp, spread, v)
        assert f"profile predicts {xp:.2f}× AR" in v
    v = story.verdict("sd", {**VERDICT, "x_ar": 1.32, "x_ar_predicted": 0.9}, 0.1, 6.0)
    assert "not what the profile predicts: this lane's forwards took 4.1× the profile, AR's 6.0×" in v
    tie = story.verdict("sd", {**VERDICT, "x_ar": 1.15, "x_ar_predicted": 0.9}, 0.2, 6.0)
    assert "not what" not in tie and "1.20 tokens per target pass" in tie and "needs 1.30" in tie


def test_each_lane_s_forwards_stand_beside_the_profile_s_price_for_the_same_forwards():
    """Rule: per lane and model, the forwards counted, their mean measured ms and the profile's ms for the same k,
    and the ratio: 10 one-token target forwards of 62 ms against the profile's 20 ms read 62.0, 20.0, 3.10×."""
    md = story.pass_costs_markdown({"ar": _ar_run(0.062)}, PROFILE)
    assert md.splitlines()[2] == "| AR | target | 10 | 62.0 | 20.0 | 3.10× |"
    assert story.pass_costs_markdown({"ar": _ar_run(0.062)}, None) == ""


def test_the_paper_formula_is_a_labelled_teaching_aid_fed_by_the_profile():
    """Rule: the §3 formula appears only as a teaching aid, with the profile's one-token speeds."""
    res = {"ar": _ar_run(0.05)}
    aid = story.teaching_aid(res, PROFILE)
    assert aid.startswith("**Teaching aid, not this machine's prediction**") and "V_T 50/s" in aid
    assert "predicted" not in story.passes_markdown(res)  # the counts table carries no second prediction


def test_tokens_needed_per_pass_agree_with_the_idle_prediction():
    """Rule: the 'to match AR' figure comes from the same sums as the idle-machine prediction, so a
    method commits more tokens per target pass than it needs exactly when it is predicted faster than AR."""

    def sd_run(k: int, committed: int, n: int = 6) -> RunResult:
        steps = [
            Step(
                i,
                [],
                None,
                list(range(committed)),
                ["target"] * committed,
                i * 0.05,
                (i + 1) * 0.05,
                time_s={"target": 0.03, "draft": 0.02},
                n_forward={"target": 1, "draft": k - 1},
                fed={"target": [k], "draft": [1] * (k - 1)},
            )
            for i in range(n)
        ]
        stats = compute_stats("sd", steps, 0.0, "max_new_tokens")
        return RunResult("sd", {}, [], "", [], [], [], [], "", stats, steps)

    prof = {"ms": {"target": {"1": 20.0, "5": 24.0}, "draft": {"1": 4.0}}}
    for committed in (1, 2, 3):
        row = {r["method"]: r for r in story.rows({"ar": _ar_run(0.02), "sd": sd_run(5, committed)}, prof)}["sd"]
        assert (row["per_pass"] > row["per_pass_needed"]) == (row["x_ar_predicted"] > 1), row
    assert row["per_pass_needed"] == pytest.approx((24 + 4 * 4) / 20)  # a pass's 40 ms at AR's 50 tok/s


def test_the_speed_chart_draws_the_story_rows():
    """Rule: the chart draws the rows it is given (measured, idle-machine prediction), computing nothing."""
    rows = [
        {"method": "ar", "measured": 16.1, "predicted": 50.0},
        {"method": "sd", "measured": 12.0, "predicted": None},
    ]
    fig = charts.throughput_figure(rows)
    assert list(fig.data[0].y) == [16.1, 12.0] and list(fig.data[1].y) == [50.0, 0]
    assert fig.data[1].text[1] == "n/a" and "idle machine" in fig.data[1].name


def test_the_memory_floor_sets_each_step_against_reading_the_weights():
    """The profile's memory floor is shown per model with the step's multiple of it and a 5-token pass's
    multiple of a step (the physics of cheap verification); no floor, no line."""
    prof = {
        "ms": {"target": {"1": 20.0, "5": 22.0}},
        "floor": {"target": {"floor_ms": 5.0, "gemv_ms": 1.0, "gb_per_s": 50.0, "mb": 250.0}},
    }
    line = story.floor_line(prof)
    assert "target 5.0 ms" in line and "4.0× it" in line and "1.10× a step" in line
    assert story.floor_line({"ms": prof["ms"]}) == ""


def test_the_verdicts_sit_under_the_table_in_words():
    """Rule: the story's table holds figures only (a prose column squeezes the others until their numbers break at a
    projector's width); each method's verdict follows it as one line of words, in the table's order."""
    res = {"ar": _ar_run(0.020), "sd": _ar_run(0.010)}
    text = story.markdown(res, PROFILE)
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert table[0].startswith("| method |") and "verdict" not in table[0]
    assert all(line.count("|") == table[0].count("|") for line in table)  # no row carries an extra cell
    verdicts = [line for line in text.splitlines() if line.startswith("- **")]
    assert verdicts == [f"- **{story.short_name(r['method'])}**: {r['verdict']}" for r in story.rows(res, PROFILE)]
    assert text.index(table[-1]) < text.index(verdicts[0])

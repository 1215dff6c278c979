"""The race tab's outputs: in full before and after a race, only the status line while lanes are timed."""

from __future__ import annotations

import gradio as gr

from .. import clock
from ..core.config import METHOD_LABELS, METHOD_SHORT
from ..core.methods import LANES, lane_label, method_spec
from ..core.trace import RunResult, first_divergence
from ..predict.costs import leaders
from . import charts, inspector, render, replay
from .session import Race, Session
from .text import MSG


def divergence_words(out: list[int], ref: list[int], greedy: bool = True) -> str:
    """Where a run's tokens `out` leave the AR lane's `ref` (AR's sampled text when sampling), or which ends first."""
    words = MSG["ref_greedy" if greedy else "ref_sampled"]
    k = first_divergence(out, ref)
    if k is None:
        return MSG["same_text"].format(ref=words, n=len(ref))
    if k == len(out):
        return MSG["ends_early"].format(ref=words, n=k)
    return MSG["goes_on"].format(ref=words, n=k) if k == len(ref) else MSG["leaves_text"].format(ref=words, k=k + 1)


def _against_ar(m: str, race: Race) -> list[str]:
    """A finished reference lane's comparison with the finished AR lane (none for another lane, or before AR)."""
    lane, r, ar = LANES.get(m), race.results.get(m), race.results.get("ar")
    if lane is None or lane.solo is None or r is None or ar is None or not ar.stats.stopped:
        return []
    return [divergence_words(r.token_ids, ar.token_ids, not race.config.get("temperature"))]


def headline(m: str, r: RunResult | None, race: Race) -> str:
    """A lane's figures: its median run's time, median speed, speed-ups, acceptance (or where it leaves AR's text)."""
    if r is None:
        return "waiting…"
    s, reps = r.stats, race.repeats
    parts = [
        f"{s.n_new_tokens} tokens in {s.decode_s:.2f} s (prefill {s.prefill_s:.2f} s apart)",
        f"{clock.speed(m, race.results, reps):.1f} tok/s",
        *inspector.speedups(m, race.results, reps),
    ]
    if s.acceptance:
        parts.append(
            "accepted " + ", ".join(f"{'→Q' if k == 'qualifier' else '→T'} {v:.0%}" for k, v in s.acceptance.items())
        )
    parts += _against_ar(m, race)
    if not s.stopped:
        parts.append("stopped")
    return " · ".join(parts)


def shape_words(r: RunResult) -> str:
    """ "tree of 8 (depth 2)" or "chain of 4": the shape (budget) a run was asked for ("" when it proposes nothing)."""
    spec, cfg = method_spec(r.method), r.config
    if not spec.shaped:
        return ""
    if cfg.get("shape") == "tree":
        return f"tree of {cfg.get('tree_nodes')} (depth {cfg.get('tree_depth')})"
    length = next(s.length for s in spec.stages if s.shaped)
    return f"chain of {cfg.get(length)}"


def winner_line(race: Race) -> str:
    """The fastest lane, or a tie within the race's noise band, on speed-ups over AR paired by repeat (as the bench
    states them); a reference lane is no contender."""
    res = {m: r for m, r in race.results.items() if r.solo is None}
    if not res:
        return ""
    reps = [{m: r for m, r in rep.items() if m in res} for rep in race.repeats]
    spread = clock.race_noise(res, reps)
    ar = clock.baseline_lane("ar", res)
    top = leaders(
        {m: (clock.speed_ratio(m, ar, res, reps) if ar else None) or clock.speed(m, res, reps) for m in res},
        spread or 0.0,
    )
    m = top[0]
    figures = ", ".join([f"{clock.speed(m, res, reps):.1f} tok/s", *inspector.speedups(m, res, reps)])
    if spread is None:
        return MSG["winner_unsure"].format(label=METHOD_LABELS[m], figures=figures)
    if len(top) > 1:
        return MSG["tie"].format(
            labels=", ".join(METHOD_SHORT[x] for x in top), noise=spread, label=METHOD_LABELS[m], figures=figures
        )
    return MSG["winner"].format(label=METHOD_LABELS[m], figures=figures, noise=spread)


def lane_title(key: str, r: RunResult | None, models: list[str] | tuple[str, ...] = ()) -> str:
    """A lane's title: its method and the shape it ran, else its lane label (naming a reference lane's model)."""
    shape = shape_words(r) if r is not None else ""
    return f"{method_spec(r.method).label} · {shape}" if r is not None and shape else lane_label(key, models)


def race_lanes(race: Race | None, played: bool = False) -> str:
    """Every lane of one race, its one-time costs and exactness note under them; `played`: replayed in the browser."""
    if race is None:
        return render.legend_html() + render.message_html(MSG["idle"])
    res = race.results
    lanes = [
        render.lane_html(m, res.get(m), headline(m, res.get(m), race), lane_title(m, res.get(m), race.models), played)
        for m in race.lanes
    ]
    if played and res:
        lanes.insert(0, replay.controls(len(race.repeats) or 1, race.machine))
    foot = " ".join(x for x in (race.setup, race.exact_note) if x) if res else ""
    body = render.lanes_html(lanes, f"Race {race.n} · {race.preset} · prompt: {race.prompt[:80]}", race.note, foot)
    return render.legend_html() + (f'<div class="replay playing">{body}</div>' if played and res else body)


def earlier_lanes(session: Session) -> str:
    """Every finished race before the latest, newest first, for comparison."""
    races = session.races[:-1][::-1]
    return "".join(map(race_lanes, races)) or render.message_html("Earlier races appear here until you clear them.")


def full_outputs(session: Session, status: str) -> tuple:
    """Every output, computed afresh: before and after a race (the latest race replayed)."""
    race = session.latest
    fig = charts.race_figure(race.results, race.repeats) if race else charts.race_figure({})
    return status, race_lanes(race, True), fig, inspector.race_rows(session.races), earlier_lanes(session), session


def status_only(status: str, session: Session) -> tuple:
    return status, gr.skip(), gr.skip(), gr.skip(), gr.skip(), session


def before_race(session: Session, upcoming: Race, kept: list[Race], status: str) -> tuple:
    """Before the clocks: the empty lanes, an empty chart and the earlier races, drawn while the models warm up."""
    earlier = earlier_lanes(Session(races=[*kept, upcoming]))
    return status, race_lanes(upcoming), charts.race_figure({}), gr.skip(), earlier, session

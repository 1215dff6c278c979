"""The race tab's outputs: in full before and after a race, only the status line while lanes are timed; the race
table's rows; the race replayed in the browser, each token at the time its method produced it: the lanes' HTML
carries the times (`render.token_times`, data-end) and `JS` animates them on the visitor's clock, no server round trip
per frame."""

from __future__ import annotations

import html
import statistics

import gradio as gr

from .. import clock
from ..core.methods import METHOD_LABELS, METHOD_SHORT, lane_label, method_spec
from ..core.trace import RunResult, agreement, first_divergence
from . import charts, render
from .races import Race, Session
from .text import MSG

SPEEDS = (("×1", 1.0), ("×½", 0.5), ("×¼", 0.25))  # the replay's pace against the measured clock

JS = """
const S = {speed: 1, pos: 0, last: 0, raf: 0, lanes: [], root: null};
function show(L) {  // reveal the lane's chips due by now; its live counter; done at its finish line
  while (L.n < L.chips.length && +L.chips[L.n].dataset.t <= S.pos) L.chips[L.n++].classList.add('on');
  const t = Math.min(S.pos, L.end);
  if (L.live) L.live.textContent = L.n + ' tokens · ' + (t > 0 ? L.n / t : 0).toFixed(1) + ' tok/s';
  return L.el.classList.toggle('done', S.pos >= L.end);
}
function frame(now) {
  S.pos += Math.max(0, now - S.last) / 1000 * S.speed;
  S.last = now;
  const done = S.lanes.map(show).every(Boolean), clock = S.root.querySelector('.clock');
  if (clock) clock.textContent = S.pos.toFixed(2) + ' s';
  if (done) S.root.classList.remove('playing'); else S.raf = requestAnimationFrame(frame);
}
function start() {
  cancelAnimationFrame(S.raf);
  S.root = element.querySelector('.replay');
  if (!S.root) return;
  S.lanes = [...S.root.querySelectorAll('.lane[data-end]')].map(el => ({el, n: 0, end: +el.dataset.end,
    live: el.querySelector('.live'), chips: [...el.querySelectorAll('.tok[data-t]')]}));
  S.root.querySelectorAll('.tok.on, .lane.done').forEach(x => x.classList.remove('on', 'done'));
  S.root.querySelectorAll('[data-speed]').forEach(b => b.classList.toggle('on', +b.dataset.speed === S.speed));
  S.root.classList.add('playing');
  [S.pos, S.last, S.raf] = [0, performance.now(), requestAnimationFrame(frame)];
}
element.addEventListener('click', e => {
  const b = e.target.closest('[data-speed]');
  if (b) element.querySelectorAll('[data-speed]').forEach(x => x.classList.toggle('on', x === b));
  if (b) S.speed = +b.dataset.speed;
  if (e.target.closest('[data-replay]')) start();
});
watch('value', start);
start();
"""


def controls(n_repeats: int, machine: str) -> str:
    """The line above a replayed race: what it shows, its speed buttons and the replay's clock."""
    buttons = "".join(f'<button data-speed="{v:g}" class="{"on" if v == 1 else ""}">{k}</button>' for k, v in SPEEDS)
    said = (
        f"▶ Replaying measured timings: each token appears when its method produced it (each lane's median run "
        f"of {n_repeats}, prefill excluded), timed on {machine or 'this machine'} with nothing drawn meanwhile."
    )
    return (
        f'<div class="replay-bar" style="color:#444;font-size:.92rem;margin:4px 0">{html.escape(said)} '
        f'<span style="white-space:nowrap">Speed {buttons}<button data-replay="1">↺ Replay</button> '
        f'<span class="clock" style="font-family:monospace"></span></span></div>'
    )


def divergence_words(out: list[int], ref: list[int], greedy: bool = True) -> str:
    """Where a run's tokens `out` leave the AR lane's `ref` (AR's sampled text when sampling), or which ends first."""
    words = MSG["ref_greedy" if greedy else "ref_sampled"]
    k = first_divergence(out, ref)
    if k is None:
        return MSG["same_text"].format(ref=words, n=len(ref))
    if k == len(out):
        return MSG["ends_early"].format(ref=words, n=k)
    return MSG["goes_on"].format(ref=words, n=k) if k == len(ref) else MSG["leaves_text"].format(ref=words, k=k + 1)


def headline(m: str, r: RunResult | None, race: Race) -> str:
    """A lane's figures: its median run's time, median speed, speed-ups, acceptance (or where it leaves AR's text)."""
    if r is None:
        return "waiting…"
    s, reps = r.stats, race.repeats
    parts = [
        f"{s.n_new_tokens} tokens in {s.decode_s:.2f} s (prefill {s.prefill_s:.2f} s apart)",
        f"{clock.speed(m, race.results, reps):.1f} tok/s",
        *charts.speedups(m, race.results, reps),
    ]
    if s.acceptance:
        parts.append(
            "accepted " + ", ".join(f"{'→Q' if k == 'qualifier' else '→T'} {v:.0%}" for k, v in s.acceptance.items())
        )
    ar = race.results.get("ar")
    if r.solo is not None and ar is not None and ar.stats.stopped:  # a reference lane against the finished AR lane
        parts.append(divergence_words(r.token_ids, ar.token_ids, not race.config.get("temperature")))
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
    top = clock.leaders(
        {m: (clock.speed_ratio(m, ar, res, reps) if ar else None) or clock.speed(m, res, reps) for m in res},
        spread or 0.0,
    )
    m = top[0]
    figures = ", ".join([f"{clock.speed(m, res, reps):.1f} tok/s", *charts.speedups(m, res, reps)])
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
        lanes.insert(0, controls(len(race.repeats) or 1, race.machine))
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
    return status, race_lanes(race, True), fig, race_rows(session.races), earlier_lanes(session), session


def status_only(status: str, session: Session) -> tuple:
    return status, gr.skip(), gr.skip(), gr.skip(), gr.skip(), session


def before_race(session: Session, upcoming: Race, kept: list[Race], status: str) -> tuple:
    """Before the clocks: the empty lanes, an empty chart and the earlier races, drawn while the models warm up."""
    earlier = earlier_lanes(Session(races=[*kept, upcoming]))
    return status, race_lanes(upcoming), charts.race_figure({}), gr.skip(), earlier, session


def _times(m: str, base: str | None, race: Race, spread: float | None) -> float | str | None:
    """A table's × cell (m's speed ÷ base's, `speed_ratio`), marked when the gap is within the noise band."""
    x = clock.speed_ratio(m, base, race.results, race.repeats) if base else None
    if x is None:
        return None
    return f"{x:.2f} (tie: band {spread:.0%})" if m != base and clock.within_noise(x, spread) else round(x, 2)


def race_rows(races: list[Race]) -> list[list]:
    """A `RACE_COLUMNS` row per (race, lane), for the table and the CSV export; times and speeds: medians of repeats."""
    rows = []
    for race in races:
        res, reps = race.results, race.repeats
        ar, sd = clock.baseline_lane("ar", res), clock.baseline_lane("sd", res)
        greedy = not race.config.get("temperature")
        spread = clock.race_noise(res, reps)
        for m, r in res.items():
            s = r.stats
            acc = ", ".join(f"{k} {v:.0%}" for k, v in s.acceptance.items()) or "—"
            # agreement with target greedy output (the bench's figure): AR is that reference at T=0 only
            same = agreement(r.token_ids, res[ar].token_ids) if ar is not None and greedy else None
            done = [rep[m].stats.decode_s for rep in reps if m in rep]
            rows.append(
                [
                    race.n,
                    m,
                    len(done) if reps else 1,
                    s.n_new_tokens,
                    round(statistics.median(done or [s.decode_s]), 2),
                    round(clock.speed(m, res, reps), 1),
                    _times(m, ar, race, spread),
                    _times(m, sd, race, spread),
                    acc,
                    round(s.tokens_per_target_pass, 2),
                    None if same is None else f"{same:.0%}",
                    s.stopped or "stopped by user",
                ]
            )
    return rows

"""The Statistics tab's story of a race: the measured outcome, whether the idle-machine profile agrees, the load."""

from __future__ import annotations

from ..clock import Repeats, compare, race_noise, speed, speed_ratio
from ..core.methods import short_name
from ..core.trace import RunResult
from ..predict import costs, insertion
from ..predict.expected import best_tree, cost_ms
from ..predict.throughput import predict
from ..predict.walk_stats import stage_counts
from ..spec_bench import find
from .inspector import proposes_trees, shape_summary
from .render import fmt
from .text import FIRST_TURN, SPEC_BENCH_LINE, TASK_NOTES, task_label

BUSY = 1.25  # forwards this much slower than the profile: the machine was busy during the race
ROLES = ("draft", "qualifier", "target")


def load_factors(runs: list[RunResult], profile: dict) -> dict[str, float]:
    """Per role: forward seconds measured in these runs ÷ the profile's for the same forwards (3.1: 3.1× slower)."""
    took: dict[str, float] = {}
    want: dict[str, float] = {}
    for r in runs:
        for role, s in costs.predict_counts(costs.forward_counts(r.steps), profile).items():
            t = r.stats.forward_time_s.get(role)
            if t is not None and s > 0:
                took[role], want[role] = took.get(role, 0.0) + t, want.get(role, 0.0) + s
    return {role: round(took[role] / want[role], 3) for role in took}


def pass_costs_markdown(results: dict[str, RunResult], profile: dict | None) -> str:
    """Each lane's forwards per model: how many, their mean ms in the race and the profile's for the same forwards."""
    if not profile or not results:
        return ""
    out = [
        "| lane | model | forwards | ms per forward, this race | the profile's, same forwards | race ÷ profile |",
        "|---|---|---|---|---|---|",
    ]
    for m, r in results.items():
        want = costs.predict_counts(costs.forward_counts(r.steps), profile)
        for role in ROLES:
            n, took = r.stats.forward_passes.get(role, 0), r.stats.forward_time_s.get(role)
            if not n or took is None or not want.get(role):
                continue
            out.append(
                f"| {short_name(m)} | {role} | {n} | {1000 * took / n:.1f} | {1000 * want[role] / n:.1f} "
                f"| {took / want[role]:.2f}× |"
            )
    return "\n".join(out) if len(out) > 2 else ""


def run_factor(r: RunResult, profile: dict) -> float | None:
    """All of one run's forward seconds ÷ the profile's for its forwards."""
    f = load_factors([r], profile)
    pred = costs.predict_counts(costs.forward_counts(r.steps), profile)
    total = sum(pred.values())
    return round(sum(f[k] * pred[k] for k in f) / total, 3) if total > 0 else None


def rows(results: dict[str, RunResult], profile: dict | None, repeats: Repeats | None = None) -> list[dict]:
    """Per lane: measured and predicted tok/s and × AR, load factor, acceptance, tokens per pass, the verdict."""
    spread = race_noise(results, repeats)
    ar = results.get("ar")
    ar_pred = costs.predict_run(ar.steps, profile)["tokens_per_s"] if ar and profile else None
    ar_factor = run_factor(ar, profile) if ar and profile else None
    out = []
    for m, r in results.items():
        row = {"method": m, "measured": speed(m, results, repeats), "predicted": None, "factor": None}
        if ar is not None and (x := speed_ratio(m, "ar", results, repeats)) is not None:
            row["x_ar"] = x
        if profile:
            pred = costs.predict_run(r.steps, profile)
            row.update(predicted=pred["tokens_per_s"], factor=run_factor(r, profile))
            model = costs.model_from_counts(r.method, stage_counts(r.steps), r.config, profile)
            row.update({k: model[k] for k in ("alpha", "alpha_qualifier") if k in model})
            if ar_pred and row["predicted"]:
                row["x_ar_predicted"] = row["predicted"] / ar_pred
            if ar_pred and r.stats.target_passes and m != "ar" and r.solo is None:  # AR's speed × a pass's time
                row["per_pass"] = r.stats.tokens_per_target_pass
                row["per_pass_needed"] = ar_pred * pred["time_s"] / r.stats.target_passes
        row["verdict"] = verdict(m, row, spread, ar_factor)
        out.append(row)
    return out


def verdict(method: str, row: dict, spread: float | None, ar_factor: float | None) -> str:
    """The measured outcome against AR (or a tie), the idle profile's expectation, the load behind a disagreement."""
    if method == "ar":
        return "the baseline: one target forward per token"
    x = row.get("x_ar")
    if x is None:
        return "no AR lane in this race to compare with"
    outcome = compare(x, 1.0, spread or 0.0)
    said = {1: "**faster** than AR", 0: "**a tie with AR** within noise", -1: "**slower** than AR"}[outcome]
    said += f" ({x:.2f}×" + (f", noise band {spread:.0%})" if spread is not None else ")")
    xp = row.get("x_ar_predicted")
    if xp is None:
        return said
    said += f"; on an idle machine the profile predicts {xp:.2f}× AR"
    if row.get("per_pass_needed") is not None:
        said += (
            f" (it commits {row['per_pass']:.2f} tokens per target pass; matching AR on the profile "
            f"needs {row['per_pass_needed']:.2f})"
        )
    if disagrees(row, spread):
        f = row.get("factor")
        said += " — not what the profile predicts" + (
            f": this lane's forwards took {f:.1f}× the profile, AR's {ar_factor:.1f}×" if f and ar_factor else ""
        )
    return said


def disagrees(row: dict, spread: float | None) -> bool:
    """Whether the measured outcome against AR (faster, slower) is not the idle profile's (a tie never disagrees)."""
    x, xp = row.get("x_ar"), row.get("x_ar_predicted")
    if x is None or xp is None or row.get("method") == "ar":
        return False
    return compare(x, 1.0, spread or 0.0) not in (0, compare(xp, 1.0, 0.0))


def load_line(results: dict[str, RunResult], profile: dict | None, changed: bool = False) -> str:
    """The race's forward time against the profile's, per model; a warning only where the load changed a verdict."""
    if not profile or not results:
        return ""
    f = load_factors(list(results.values()), profile)
    parts = ", ".join(f"{role} {f[role]:.1f}×" for role in ROLES if role in f)
    t = f.get("target")
    if t is not None and t >= BUSY and changed:
        return (
            f"⚠️ **This machine was busy: target forwards took {t:.1f}× the profile**, enough to change a "
            f"verdict below (forward time ÷ the profile's, per model: {parts}); the *idle* columns show what "
            "the profile predicts without the load."
        )
    return f"Forward time ÷ the profile's in this race, per model: {parts}."


def prompt_line(prompt: str | None) -> str:
    """The Spec-Bench question and task a race's prompt is, with what that task asks of a draft ("" for another)."""
    q = find(prompt)
    if q is None:
        return ""
    turn = FIRST_TURN if len(q.turns) > 1 else ""
    return SPEC_BENCH_LINE.format(id=q.id, task=task_label(q), turn=turn, note=TASK_NOTES[q.task])


def markdown(
    results: dict[str, RunResult], profile: dict | None, repeats: Repeats | None = None, prompt: str | None = None
) -> str:
    """The story: the prompt's task, noise, load, a row of figures per method, then the verdicts under the table
    (prose in a cell would squeeze the figures' columns)."""
    if not results:
        return ""
    spread = race_noise(results, repeats)
    said = prompt_line(prompt)
    lines = [said, ""] if said else []  # a paragraph of its own
    lines += [
        (
            f"Noise band of this race: **{spread:.0%}**, the widest spread (interquartile range ÷ median) of a "
            "lane's ratio to the AR run of its repeat (one repeat: of same-size forwards), ÷ √repeats; a gap smaller "
            "than that is a tie. Race again with the same prompt and settings to add repeats and narrow it."
        )
        if spread is not None
        else "Too few same-size forwards in this race to measure its noise band."
    ]
    table = rows(results, profile, repeats)
    lines.append(
        load_line(results, profile, any(disagrees(row, spread) for row in table))
        if profile
        else "No cost profile for this family on this machine: `python -m pyramid_demo prepare --models …` "
        "(what setup runs for the default family) records one, and the next race reads it."
    )
    lines += [
        "",
        "| method | tok/s | × AR | idle tok/s | idle × AR | × profile | α | tokens / pass (to match AR) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in table:
        alpha = fmt(row.get("alpha"))
        if row.get("alpha_qualifier") is not None:
            alpha = f"α_Q {fmt(row['alpha_qualifier'])} · α_T {alpha}"
        need = "—" if row.get("per_pass_needed") is None else f"{row['per_pass']:.2f} ({row['per_pass_needed']:.2f})"
        lines.append(
            f"| {short_name(row['method'])} | {row['measured']:.1f} | {fmt(row.get('x_ar'))} "
            f"| {fmt(row['predicted'], 1)} | {fmt(row.get('x_ar_predicted'))} | {fmt(row['factor'], 1)} "
            f"| {alpha} | {need} |"
        )
    lines += ["", *(f"- **{short_name(row['method'])}**: {row['verdict']}" for row in table)]
    if profile:  # the insertion test (predict.insertion) from the α of this race's SD and pyramid lanes
        m = {row["method"]: row for row in table}
        pyr = m.get("psd_a") or m.get("psd_f") or {}
        alphas = m.get("sd", {}).get("alpha"), pyr.get("alpha_qualifier"), pyr.get("alpha")
        lines += ["", insertion.markdown(insertion.insertion(profile, *alphas))]
    return "\n".join(lines)


def passes_markdown(results: dict[str, RunResult]) -> str:
    """Forward passes per model and acceptance per stage, a row per method; the shape read from the rounds."""
    head = (
        "| method | proposal | draft passes | qualifier passes | target passes | accepted D→Q | accepted →T "
        "| tokens / target pass |\n|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for m, r in results.items():
        s = r.stats
        f = [str(s.forward_passes.get(k, "—")) for k in ROLES]
        acc = [f"{s.acceptance[k]:.0%}" if k in s.acceptance else "—" for k in ("qualifier", "target")]
        shape = shape_summary(r) if s.rounds else "—"
        cells = [short_name(m), shape, *f, *acc, f"{s.tokens_per_target_pass:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if any(proposes_trees(r) for r in results.values()):
        lines += [
            "",
            "*Accepted* is the accepted tokens ÷ the positions proposed: for a tree, its accepted path's "
            "length ÷ its depth (a tree of 7 candidates over 3 positions whose path is 2 counts 2 of 3, "
            "not 2 of 7); for a chain, ÷ its length.",
        ]
    return "\n".join(lines)


def teaching_aid(results: dict[str, RunResult], profile: dict | None) -> str:
    """The PyramidSD §3 formula, fed with the profile's one-token speeds, labelled as what it is."""
    if not profile or not results:
        return ""
    speeds = {role: 1000 / cost_ms(profile, role, 1) for role in ROLES if role in profile["ms"]}
    got = [(m, predict(r, speeds)) for m, r in results.items() if m != "ar" and r.solo is None]  # the formula: methods
    vals = ", ".join(f"{short_name(m)} {fmt(p, 1)}" for m, p in got)
    return (
        "**Teaching aid, not this machine's prediction** — the PyramidSD §3 throughput formula "
        "(V_SD = β·(ℓ+1) / (ℓ/V_D + 1/V_T), V_PSD likewise through the qualifier), fed with the profile's "
        "one-token speeds ("
        + ", ".join(f"V_{r[0].upper()} {v:.0f}/s" for r, v in speeds.items())
        + f") and this race's acceptance β: {vals} tok/s. It assumes checking k tokens costs one step; "
        "the profile's prediction above counts what each forward really costs."
    )


def floor_line(profile: dict) -> str:
    """Each model's step against its memory floor, and a 5-token pass against a step: why checking k tokens is cheap."""
    parts = []
    for role, f in (profile.get("floor") or {}).items():
        if f and role in profile["ms"]:
            step, five = cost_ms(profile, role, 1), cost_ms(profile, role, 5)
            parts.append(
                f"{role} {f['floor_ms']:.1f} ms ({f['mb']:.0f} MB at {f['gb_per_s']:.0f} GB/s): a step is "
                f"{step / f['floor_ms']:.1f}× it, a 5-token pass {five / step:.2f}× a step"
            )
    if not parts:
        return ""
    return (
        "**Memory floor** (the largest matrix's one-row product scaled to every weight byte; a step that "
        "only reads its weights costs this, and then checking 5 tokens costs about what 1 does): "
        + "; ".join(parts)
        + "."
    )


def tree_line(profile: dict) -> str:
    """The tree budget this profile predicts best (`expected.best_tree`) with the shipped draft's acceptance."""
    try:
        b = best_tree(profile)
    except KeyError:  # a profile without a draft row
        return ""
    return (
        f" *Trees*: a {b['tree_nodes']}-node tree pass costs "
        f"{cost_ms(profile, 'target', b['tree_nodes'] + 1) / cost_ms(profile, 'target', 1):.2f}× "
        f"a step here; with the shipped draft's acceptance by rank (a prior) the best budget is {b['tree_nodes']} "
        f"nodes, depth {b['tree_depth']}, k {b['tree_k']}: {b['tokens_per_pass']:.2f} tokens per pass against "
        f"{b['chain_tokens_per_pass']:.2f} for the best chain ({b['tokens_per_s']:.1f} vs "
        f"{b['chain_tokens_per_s']:.1f} tok/s predicted)."
    )


def profile_markdown(profile: dict | None) -> str:
    """Where the profile comes from and what one forward costs, for the cost chart."""
    if not profile:
        return ""
    return (
        f"**Cost profile** ({profile.get('dtype', '?')}, {profile.get('device', '?')}, recorded on this machine by "
        "setup): one cached forward of k new tokens, ms — "
        + "; ".join(
            f"{role} k=1 {cost_ms(profile, role, 1):.1f}, k=5 {cost_ms(profile, role, 5):.1f}" for role in profile["ms"]
        )
        + ". "
        + floor_line(profile)
        + tree_line(profile)
        + " *Idle machine*: the profile's time summed over the forwards each run made (engine time outside "
        "forwards not counted). *To match AR*: the tokens each target pass would have to commit for the run's "
        "forwards, at the profile's cost, to be as fast as AR's; more than that is a win on an idle machine."
    )

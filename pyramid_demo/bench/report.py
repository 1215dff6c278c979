"""Benchmark summaries (medians, pooled acceptance, Pareto frontier) and results.csv/.json and report.html."""

from __future__ import annotations

import csv
import html
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..clock import ratio
from ..core.methods import METHODS, method_spec
from . import costs_report, spec_table

MEDIANS = """
tokens_per_s_incl_prefill tokens_per_s_wall speedup_vs_ar speedup_vs_sd speedup_vs_ar_wall speedup_vs_sd_wall
engine_overhead_share agreement prefix_agreement target_logprob predicted_tokens_per_s predicted_plus_one_tokens_per_s
predicted_speedup_vs_ar predicted_profile_speedup_vs_ar n_new_tokens fwd_draft fwd_qualifier fwd_target
""".split()  # the per-run figures a variant's summary gives as medians over its runs


def _vals(rows: list[dict], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key) is not None and not _nan(r[key])]


def _nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _med(rows: list[dict], key: str) -> float | None:
    v = _vals(rows, key)
    return statistics.median(v) if v else None


def _pooled(rows: list[dict], num: str, den: str) -> float | None:
    n, d = sum(_vals(rows, num)), sum(_vals(rows, den))
    return n / d if d else None


def summarize(rows: list[dict]) -> list[dict]:
    """One record per variant: speeds, speed-ups and quality as medians over runs, acceptance pooled over runs."""
    order: dict[str, list[dict]] = {}
    for r in rows:
        order.setdefault(r["variant"], []).append(r)
    out = []
    for label, rs in order.items():
        first = rs[0]
        speed = _vals(rs, "tokens_per_s" if first["kind"] != "peer" else "tokens_per_s_wall")  # peers: wall time only
        q25, med, q75 = np.quantile(speed, (0.25, 0.5, 0.75)).tolist() if speed else (None, None, None)
        s = dict(
            variant=label,
            method=first["method"],
            kind=first["kind"],
            lossless=first["lossless"],
            runs=len(rs),
            **{k: first.get(k) for k in ("temperature", "gamma", "l_d", "l_q", "tau_q", "tau_t", "fallback", "stage2")},
            tokens_per_s=med,
            tokens_per_s_q25=q25,
            tokens_per_s_q75=q75,
            tokens_per_s_min=min(speed) if speed else None,
            tokens_per_s_max=max(speed) if speed else None,
            speed_basis="decode (prefill excluded)" if first["kind"] != "peer" else "wall incl. prefill",
        )
        s.update({k: _med(rs, k) for k in MEDIANS})
        s["acceptance_qualifier"] = _pooled(rs, "accepted_qualifier", "proposed_qualifier")
        s["acceptance_target"] = _pooled(rs, "accepted_target", "proposed_target")
        s["mean_accepted_per_target_pass"] = _pooled(rs, "accepted_target", "target_passes")
        s["tokens_per_target_pass"] = _pooled(rs, "n_new_tokens", "target_passes")
        s["csqa_accuracy"] = statistics.mean(_vals(rs, "csqa_correct")) if _vals(rs, "csqa_correct") else None
        out.append(s)
    return out


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated when both coordinates are maximised (NaN/None skipped), by x."""
    ok = [i for i, p in enumerate(points) if not any(v is None or _nan(v) for v in p)]

    def beaten(i: int) -> bool:  # another point as good on both coordinates and better on one
        x, y = points[i]
        return any(a >= x and b >= y and (a > x or b > y) for a, b in (points[j] for j in ok))

    return sorted((i for i in ok if not beaten(i)), key=lambda i: (points[i][0], points[i][1]))


def quality_key(summary: list[dict]) -> str:
    """Agreement with target greedy output at T=0, else the target's mean log-prob."""
    return "agreement" if any(s.get("agreement") is not None for s in summary) else "target_logprob"


def frontier(summary: list[dict]) -> list[dict]:
    """Speed (median speed-up vs AR, else tok/s) against quality, engine methods only."""
    eng = [s for s in summary if s["kind"] == "engine"]
    sk = "speedup_vs_ar" if any(s.get("speedup_vs_ar") is not None for s in eng) else "tokens_per_s"
    qk = quality_key(summary)
    front = [eng[i] for i in pareto_frontier([(s.get(qk), s.get(sk)) for s in eng])]
    return [dict(variant=s["variant"], speed=s[sk], speed_key=sk, quality=s[qk], quality_key=qk) for s in front]


def recommend(summary: list[dict], min_agreement: float = 0.9) -> dict | None:
    """The fastest frontier point whose agreement with target greedy output is ≥ min_agreement."""
    pts = [p for p in frontier(summary) if p["quality_key"] != "agreement" or p["quality"] >= min_agreement]
    return max(pts, key=lambda p: p["speed"]) if pts else None


def check_targets(summary: list[dict], min_agreement: float = 0.9) -> list[dict]:
    """The project's speed goals with the measured value and whether each is met (peers: wall time both sides)."""
    by = {s["variant"]: s for s in summary}
    out = []

    def add(name: str, value: float | None, goal: float, at_most: bool = False) -> None:
        met = None if value is None else (value <= goal if at_most else value >= goal)
        out.append(dict(target=name, value=value, goal=goal, at_most=at_most, met=met))

    if "hf_generate" in by and "ar" in by:
        add("our AR ÷ HF generate() (wall tok/s)", ratio(1, by["hf_generate"]["speedup_vs_ar_wall"]), 1.0)
    if "hf_assisted" in by and "sd" in by:
        add("our SD ÷ HF assisted (wall tok/s)", ratio(1, by["hf_assisted"]["speedup_vs_sd_wall"]), 1.0)
    good = [s for s in summary if s["method"] == "psd_f" and (s.get("agreement") or 0) >= min_agreement]
    if any(s["method"] == "psd_f" for s in summary):
        for key, goal in (("speedup_vs_sd", 1.5), ("speedup_vs_ar", 2.0)):
            vals = [s[key] for s in good if s.get(key) is not None]
            add(f"best PSD_F × {key[-2:].upper()} at agreement ≥ {min_agreement}", max(vals, default=None), goal)
    if shares := [s["engine_overhead_share"] for s in summary if s.get("engine_overhead_share") is not None]:
        add("engine time outside forwards ÷ decode time (worst method's median)", max(shares), 0.10, at_most=True)
    if errs := speedup_errors(summary):
        add(
            "|predicted ÷ measured speed-up over AR − 1| (worst variant, medians per prompt)",
            max(abs(e) for e in errs.values()),
            0.10,
            at_most=True,
        )
    return out


def speedup_errors(summary: list[dict]) -> dict[str, float]:
    """Per engine variant but AR: predicted ÷ measured speed-up over AR − 1 (medians per prompt)."""
    return {
        s["variant"]: s["predicted_speedup_vs_ar"] / s["speedup_vs_ar"] - 1
        for s in summary
        if s["kind"] == "engine" and s["method"] != "ar" and s.get("speedup_vs_ar") and s.get("predicted_speedup_vs_ar")
    }


def best_per_method(summary: list[dict], min_agreement: float = 0.9) -> dict[str, str]:
    """Per engine method, the fastest variant with agreement ≥ min_agreement (else the most faithful one)."""
    out = {}
    qk, eng = quality_key(summary), [s for s in summary if s["kind"] == "engine" and s.get("speedup_vs_ar") is not None]
    for m in dict.fromkeys(s["method"] for s in eng):
        ss = [s for s in eng if s["method"] == m]
        ok = [s for s in ss if qk != "agreement" or (s.get("agreement") or 0) >= min_agreement]
        best = max(ok, key=lambda s: s["speedup_vs_ar"]) if ok else max(ss, key=lambda s: s.get(qk) or -1e9)
        out[m] = best["variant"]
    return out


def _f(x, nd: int = 2) -> str:
    return "–" if x is None or _nan(x) else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


TABLE = [
    ("variant", "variant", 0),
    ("tok/s (IQR)", None, 1),
    ("tok/s incl. prefill", "tokens_per_s_incl_prefill", 1),
    ("× AR", "speedup_vs_ar", 2),
    ("× AR predicted", "predicted_speedup_vs_ar", 2),
    ("× SD", "speedup_vs_sd", 2),
    ("× AR wall", "speedup_vs_ar_wall", 2),
    ("× SD wall", "speedup_vs_sd_wall", 2),
    ("acc. Q", "acceptance_qualifier", 2),
    ("acc. T", "acceptance_target", 2),
    ("accepted/pass", "mean_accepted_per_target_pass", 2),
    ("fwd D/Q/T", None, 0),
    ("overhead", "engine_overhead_share", 3),
    ("agreement", "agreement", 3),
    ("logprob", "target_logprob", 3),
    ("predicted tok/s", "predicted_tokens_per_s", 1),
    ("predicted, +1/round", "predicted_plus_one_tokens_per_s", 1),
    ("CSQA acc.", "csqa_accuracy", 3),
]


def markdown_table(summary: list[dict]) -> str:
    cols = [c for c in TABLE if c[1] != "csqa_accuracy" or any(s.get("csqa_accuracy") is not None for s in summary)]
    lines = ["| " + " | ".join(c[0] for c in cols) + " |", "|" + "---|" * len(cols)]
    for s in summary:
        made = {  # the columns of several figures (no key in TABLE)
            "tok/s (IQR)": f"{_f(s['tokens_per_s'], 1)} ({_f(s['tokens_per_s_q25'], 1)}–"
            f"{_f(s['tokens_per_s_q75'], 1)})" + ("*" if s["kind"] == "peer" else ""),
            "fwd D/Q/T": "/".join(_f(s.get(f"fwd_{r}"), 0) for r in ("draft", "qualifier", "target")),
        }
        cells = [made[name] if key is None else _f(s.get(key), nd) for name, key, nd in cols]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(
        "\n*peers: wall time of the `generate()` call, prefill included. Engine tok/s exclude prefill; "
        "'incl. prefill' and '× AR wall' include it. acc./accepted per pass pooled over runs (bonus token "
        "not counted); fwd: median decode forward passes per run; overhead: engine time outside model "
        "forwards ÷ decode time; × AR predicted: the cost profile's time for each run's forwards and engine "
        "work, rescaled by this bench's forward times, against AR's for the same tokens (median per prompt)."
    )
    if any(s["kind"] == "reference" for s in summary):
        lines.append(
            "\n*reference rows* (--solo): one member of the family decoding alone, as AR does with the "
            "target; its agreement says how far its text follows the target's. Not a method: no baseline, no "
            "frontier."
        )
    return "\n".join(lines)


def targets_table(targets: list[dict]) -> str:
    lines = ["| target | measured | goal | met |", "|---|---|---|---|"]
    for t in targets:
        met = "–" if t["met"] is None else ("yes" if t["met"] else "no")
        goal = ("≤ " if t.get("at_most") else "≥ ") + f"{t['goal']:g}"
        lines.append(f"| {t['target']} | {_f(t['value'], 3)} | {goal} | {met} |")
    return "\n".join(lines)


def write_outputs(result: dict, out_dir: str | Path, columns: list[str]) -> list[Path]:
    """results.csv, results.json and report.html in `out_dir`; adds summary/frontier/markdown to result."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = result["runs"]
    summary = summarize(rows)
    targets = check_targets(summary)
    skipped = "".join(f"\n\nNot run: {why}." for why in result.get("meta", {}).get("skipped", []))
    result.update(
        summary=summary,
        frontier=frontier(summary),
        recommended=recommend(summary),
        targets=targets,
        best_per_method=best_per_method(summary),
        markdown=markdown_table(summary) + "\n\n" + targets_table(targets) + skipped,
    )
    paths = [write_csv(out / "results.csv", columns, rows), out / "results.json", out / "report.html"]
    paths[1].write_text(json.dumps(_clean(result), indent=1, default=str), encoding="utf-8")
    paths[2].write_text(render_html(result), encoding="utf-8")
    return paths


def write_csv(path: Path, columns: list[str], rows: list[dict]) -> Path:
    """`rows` as CSV in `columns` (other keys left out, None written as an empty cell)."""
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")  # None and a missing key: an empty cell
        w.writeheader()
        w.writerows(rows)
    return path


def _clean(obj):
    """NaN/inf → None so results.json is strict JSON."""
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    return [_clean(v) for v in obj] if isinstance(obj, (list, tuple)) else obj


def _figures(result: dict) -> list:
    import plotly.graph_objects as go

    summary = result["summary"]
    names = [s["variant"] for s in summary]
    err_hi = [(s["tokens_per_s_q75"] or 0) - (s["tokens_per_s"] or 0) for s in summary]
    err_lo = [(s["tokens_per_s"] or 0) - (s["tokens_per_s_q25"] or 0) for s in summary]
    bars = go.Figure()
    bars.add_bar(
        x=names,
        y=[s["tokens_per_s"] for s in summary],
        name="tok/s (engine: decode; peers: wall incl. prefill)",
        error_y=dict(type="data", symmetric=False, array=err_hi, arrayminus=err_lo),
    )
    bars.add_bar(x=names, y=[s["tokens_per_s_wall"] for s in summary], name="tok/s, wall incl. prefill")
    bars.add_bar(x=names, y=[s["predicted_tokens_per_s"] for s in summary], name="predicted (paper's model)")
    bars.add_bar(
        x=names, y=[s["predicted_plus_one_tokens_per_s"] for s in summary], name="predicted (β·ℓ + 1 tokens per round)"
    )
    bars.update_layout(title="Speed: median tokens/s, error bars = IQR", barmode="group", yaxis_title="tokens/s")
    qk = quality_key(summary)
    eng = [s for s in summary if s["kind"] == "engine"]
    fr = result["frontier"]
    sk = fr[0]["speed_key"] if fr else "tokens_per_s"
    sc = go.Figure()
    for m in dict.fromkeys(s["method"] for s in eng):
        pts = [s for s in eng if s["method"] == m]
        sc.add_scatter(
            x=[s[qk] for s in pts],
            y=[s[sk] for s in pts],
            mode="markers",
            name=m,
            text=[s["variant"] for s in pts],
            marker=dict(size=10),
        )
    sc.add_scatter(
        x=[p["quality"] for p in fr],
        y=[p["speed"] for p in fr],
        mode="lines+markers",
        name="Pareto frontier",
        text=[p["variant"] for p in fr],
        line=dict(dash="dash", color="black"),
        marker=dict(symbol="circle-open", size=16, color="black"),
    )
    sc.update_layout(
        title="Speed vs quality (engine methods; frontier dashed)",
        xaxis_title="agreement with target greedy output" if qk == "agreement" else "target mean log-prob",
        yaxis_title="median speed-up vs AR" if sk == "speedup_vs_ar" else "tokens/s",
    )
    return [bars, sc, _acceptance_figure(eng)]


def _lines(fig, pts: list[dict], x: str, y: str, label: str, col: int, symbol: str = "circle") -> None:
    """`y` against `x` in subplot `col`, one line per name (`label` formatted with each point's fields)."""
    groups: dict[str, list[dict]] = {}
    for s in sorted(pts, key=lambda s: s[x]):
        groups.setdefault(label.format(**s), []).append(s)
    for g, ss in groups.items():
        fig.add_scatter(
            x=[s[x] for s in ss],
            y=[s[y] for s in ss],
            mode="lines+markers",
            name=g,
            marker=dict(symbol=symbol),
            row=1,
            col=col,
        )


def _acceptance_figure(eng: list[dict]):
    """Left: target-stage acceptance vs τ_T; right: PSD_F's qualifier-stage acceptance vs τ_Q."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("target stage vs τ_T", "qualifier stage (PSD_F) vs τ_Q"))
    fuzzy = [s for s in eng if s.get("tau_t") is not None and s.get("acceptance_target") is not None]
    for m in (m for m in METHODS if "tau_t" in method_spec(m).thresholds):  # one line per other setting
        spec = method_spec(m)  # named by its settings besides τ_T: ℓ_D, ℓ_Q for a pyramid, τ_Q where stage 1 is fuzzy
        pyramid = " lD={l_d} lQ={l_q}" if spec.pyramid else ""
        label = m + pyramid + (" tauQ={tau_q:g}" if "tau_q" in spec.thresholds else "")
        _lines(fig, [s for s in fuzzy if s["method"] == m], "tau_t", "acceptance_target", label, 1)
    for m in (m for m in METHODS if "tau_q" in method_spec(m).thresholds):
        mine = [s for s in fuzzy if s["method"] == m and s.get("acceptance_qualifier") is not None]
        label = "{method} lD={l_d} lQ={l_q} tauT={tau_t:g} (Q stage)"
        _lines(fig, mine, "tau_q", "acceptance_qualifier", label, 2, "x")
    fig.update_layout(title="Acceptance vs threshold (pooled over runs)")
    fig.update_xaxes(title_text="τ_T", row=1, col=1)
    fig.update_xaxes(title_text="τ_Q", row=1, col=2)
    fig.update_yaxes(title_text="acceptance", row=1, col=1)
    return fig


def render_html(result: dict) -> str:
    """A self-contained page: plotly JS inlined, so it opens offline."""
    figs = _figures(result)
    parts = [f.to_html(full_html=False, include_plotlyjs=(i == 0), default_height=460) for i, f in enumerate(figs)]
    meta = result.get("meta", {})
    m = {k: html.escape(str(v)) for k, v in meta.items()}  # as page text
    stopped = " — <b>stopped early</b>: only completed prompts are included" if meta.get("stopped_early") else ""
    rec = result.get("recommended")
    speeds = ", ".join(f"V_{k[0].upper()} {v:.1f} tok/s" for k, v in result.get("speeds", {}).items())
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>PyramidSD bench</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1300px}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}td:first-child{{text-align:left}}</style></head><body>
<h1>PyramidSD Explorer — benchmark</h1>
<p><b>Models:</b> {html.escape(", ".join(meta["models"]))} ({m["preset"]}); <b>machine:</b> {m["processor"]},
{m["cpu_count"]} CPUs, torch {m["torch"]} ({m["torch_threads"]} threads), {m["device"]} {m["dtype"]};
{m["n_prompts"]} prompts × {m["repeats"]} repeats, {m["time_utc"]}{stopped}.</p>
<p><b>Command:</b> <code>{m["command"]}</code></p>
<p><b>Single-model speeds</b> (for the throughput model): {html.escape(speeds)}.
<b>Recommended setting</b> (fastest frontier point with agreement ≥ 0.9):
{html.escape(str(rec["variant"]) if rec else "none")}.</p>
{costs_report.html_table(markdown_table(result["summary"]))}
<h3>Speed targets</h3>{costs_report.html_table(targets_table(result.get("targets", [])))}
<p>Engine tok/s exclude prefill; peers (Hugging Face <code>generate()</code>) are timed as the wall time of the call,
prefill included — compare them with the "wall" columns. Speed-ups are computed per prompt, then the median is shown.
Acceptance and accepted tokens per target pass are pooled over runs (bonus token not counted). Agreement: position-wise
match with target-only greedy output over its length (T=0 only); log-prob: the target's mean log-probability of the
produced text (one teacher-forced pass).</p>
{"".join(parts)}
{spec_table.html_section(result["suite"]) if result.get("suite") else ""}
{costs_report.html_section(result)}
</body></html>"""

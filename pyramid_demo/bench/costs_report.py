"""The cost profile in `bench`: per-run records and predictions, and the section saying why each method wins here."""

from __future__ import annotations

import html

from ..core.methods import METHODS
from ..core.trace import Step
from ..predict import costs, insertion, throughput
from ..predict.expected import ar_ms, priced, shape_of
from ..predict.walk_stats import stage_counts
from . import costs_fit


def row_record(steps: list[Step], method: str, config: dict) -> dict:
    """What one run adds to its row: {"cost_record": {...}}, its forwards, stages and engine work."""
    ms = {
        role: {k: [round(sum(ts), 4), len(ts)] for k, ts in by_k.items()}
        for role, by_k in costs.measured_by_k(steps).items()
    }
    rec = {"forwards": costs.forward_counts(steps), "ms_by_k": ms, "stages": stage_counts(steps)}
    rec["engine"] = costs.census(steps, method, config)
    rec["tree_forwards"] = costs.tree_forward_counts(steps, method, config)
    rec["shape"] = shape_of(config)  # the run's own, whether or not the row has a column for it
    return {"cost_record": rec}


def _add(into: dict, more: dict) -> None:
    for k, v in more.items():
        if isinstance(v, dict):
            _add(into.setdefault(str(k), {}), v)
        elif isinstance(v, list):
            into[str(k)] = [a + b for a, b in zip(into.get(str(k), [0, 0]), v)]
        else:
            into[str(k)] = into.get(str(k), 0) + v


def finish(rows: list[dict], prof: dict | None) -> dict:
    """results.json's "cost_profile": each row's predictions (`costs_fit.predict_rows`) and the variants' summary."""
    if not prof or "ms" not in prof:
        return {"profile": prof, "variants": []}
    busy = costs_fit.predict_rows(rows, prof)
    by: dict[str, dict] = {}
    for row in rows:
        rec = row.get("cost_record")
        if row.get("kind") != "engine" or not rec:
            continue
        cfg = {k: row[k] for k in ("gamma", "l_d", "l_q", "tree_nodes", "tree_depth", "tree_k", "stage2") if row.get(k)}
        sums = {"method": row["method"], "tokens": 0, "decode_s": 0.0, "profile_s": 0.0, "predicted_s": 0.0}
        v = by.setdefault(row["variant"], sums | {k: {} for k in ("forwards", "ms_by_k", "stages", "engine")})
        v.setdefault("config", cfg)["shape"] = rec["shape"]  # the run's own (an "auto" variant's last)
        v["tokens"] += row["n_new_tokens"]
        v["decode_s"] += row["decode_s"] or 0.0
        v["profile_s"] += row["predicted_profile_s"]
        v["predicted_s"] += row["predicted_s"]
        for key in ("forwards", "ms_by_k", "stages", "engine"):
            _add(v[key], rec[key])
    out = [_variant(label, v, prof, by) for label, v in by.items()]
    ar = next((d["measured_tokens_per_s"] for d in out if d["method"] == "ar"), None)
    for d in out:
        d["why"] = costs.verdict(d["method"], d, (d["measured_tokens_per_s"], ar) if ar else None)
    out.sort(key=lambda d: (METHODS.index(d["method"]) if d["method"] in METHODS else 99, d["variant"]))
    sd = next((d for d in out if d["method"] == "sd" and shape_of(d.get("config")) == "chain"), {})
    pyr = next((d for k in ("psd_a", "psd_f") for d in out if d["method"] == k), {})
    ins = insertion.insertion(prof, sd.get("alpha"), pyr.get("alpha_qualifier"), pyr.get("alpha"))
    worst = max(
        (abs(d["speedup_error"]) for d in out if d.get("speedup_error") is not None and d["method"] != "ar"),
        default=None,
    )
    return {
        "profile": prof,
        "variants": out,
        "insertion": ins,
        "busy": busy,
        "worst_speedup_error": worst,
        "engine_priced": priced(prof),
        "engine_fit_ms": costs_fit.fitted_prices(rows),
    }


def _variant(label: str, v: dict, prof: dict, by: dict[str, dict]) -> dict:
    """One variant's summary: measured and predicted tok/s and speed-ups over AR (pooled), and its model."""
    model = costs.model_from_counts(v["method"], v["stages"], v["config"], prof)
    tok = v["tokens"]
    measured = tok / v["decode_s"] if v["decode_s"] else None
    predicted = tok / v["predicted_s"] if v["predicted_s"] else None
    ar_v = next((a for a in by.values() if a["method"] == "ar" and a["decode_s"] and a["tokens"]), None)
    x_meas = measured / (ar_v["tokens"] / ar_v["decode_s"]) if measured and ar_v else None
    ar_per = ar_v["predicted_s"] / ar_v["tokens"] if ar_v else None
    x_pred = ar_per * tok / v["predicted_s"] if ar_per and v["predicted_s"] else None
    x_prof = tok * ar_ms(prof) / 1000 / v["profile_s"] if v["profile_s"] else None
    micro = costs.price(v["engine"], prof) / 1000
    return dict(
        variant=label,
        method=v["method"],
        config=v["config"],
        measured_tokens_per_s=measured,
        predicted_tokens_per_s=predicted,
        prediction_error=predicted / measured - 1 if measured and predicted else None,
        measured_speedup_vs_ar=x_meas,
        predicted_speedup_vs_ar=x_pred,
        predicted_profile_speedup_vs_ar=x_prof,
        speedup_error=x_pred / x_meas - 1 if x_pred and x_meas else None,
        engine_share_predicted=micro / v["profile_s"] if v["profile_s"] else None,
        ms_per_forward_by_k={
            r: {k: s / n for k, (s, n) in sorted(d.items(), key=lambda kv: int(kv[0])) if n}
            for r, d in v["ms_by_k"].items()
        },
        forwards_by_k=v["forwards"],
        **model,
    )


def _f(x, nd: int = 2) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def markdown(section: dict) -> str:
    """The summary as a markdown table (printed by bench, shown in report.html)."""
    prof = section.get("profile") or {}
    if "ms" not in prof:
        return "No cost profile" + (f": {prof['error']}" if prof.get("error") else ".")
    lines = [
        f"Cost profile ({prof.get('dtype')}, "
        f"{'cached' if prof.get('how') == 'cached' else 'measured now'}), ms per cached forward of k new tokens: "
        + "; ".join(
            f"{r} " + ", ".join(f"k={k} {float(v):.1f}" for k, v in row.items()) for r, row in prof["ms"].items()
        ),
        "",
        _busy_line(section),
        "",
        "| variant | × AR measured | × AR predicted | error | × AR, profile only | × AR from acceptance "
        "| tok/s measured | tok/s predicted | engine share, profile | measured α | break-even α "
        "| why |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in section["variants"]:
        a = _f(v.get("alpha"))
        if v.get("alpha_qualifier") is not None:
            a = f"α_Q {_f(v['alpha_qualifier'])} · α_T {a}"
        be = "never" if "break_even_alpha" in v and v["break_even_alpha"] is None else _f(v.get("break_even_alpha"))
        err = "—" if v.get("speedup_error") is None else f"{v['speedup_error']:+.1%}"
        lines.append(
            f"| {v['variant']} | {_f(v.get('measured_speedup_vs_ar'), 3)} "
            f"| {_f(v.get('predicted_speedup_vs_ar'), 3)} | {err} "
            f"| {_f(v.get('predicted_profile_speedup_vs_ar'), 3)} | {_f(v.get('expected_speedup_vs_ar'), 3)} "
            f"| {_f(v['measured_tokens_per_s'], 1)} | {_f(v.get('predicted_tokens_per_s'), 1)} "
            f"| {_f(v.get('engine_share_predicted'), 3)} | {a} | {be} | {v['why']} |"
        )
    worst = section.get("worst_speedup_error")
    lines.append(
        "\nSpeed-ups over AR are pooled over the prompts (Σ tokens ÷ Σ decode time, prefill excluded). "
        "Predicted: the profile's time for the forwards each run made, each role's rescaled by the other "
        "variants' measured ÷ profiled time, plus the engine's work the run did (steps, feeds, rounds, "
        "divergences, a tree's growth and compaction) priced per unit from the other variants' runs; "
        "'profile only': the profile alone (engine at its timed prices); 'from acceptance': the "
        "expected chain, tree or pyramid at the measured acceptance (by rank for a tree) on the profile. "
        "Break-even α: the acceptance at which the expected speed equals AR's on this profile (PSD: the "
        "target stage's). Worst |error| of the predicted speed-up: "
        + ("—" if worst is None else f"{worst:.1%}")
        + " (target ≤ 10%)."
    )
    if section.get("insertion"):
        lines += ["", insertion.markdown(section["insertion"])]
    return "\n".join(lines)


def _busy_line(section: dict) -> str:
    busy = section.get("busy") or {}
    if not busy:
        return "No forward time measured in the runs: nothing to rescale by."
    roles = ", ".join(f"{r} {x:.2f}×" for r, x in busy.items() if r != "all")
    timed = (section.get("profile") or {}).get("engine_ms") or {}
    fit = ", ".join(
        f"{u} {ms:.3f}" + (f" (timed {float(timed[u]):.3f})" if isinstance(timed.get(u), (int, float)) else "")
        for u, ms in (section.get("engine_fit_ms") or {}).items()
    )
    return (
        f"This bench's forwards took {busy.get('all', 1.0):.2f}× the profile's time for the same forwards "
        f"({roles}). "
        + (
            "The profile times the engine's own work per unit; "
            if section.get("engine_priced")
            else "This profile has no engine prices (measured before they were: measure it again); "
        )
        + (f"fitted on this bench's runs, ms per unit: {fit}." if fit else "no engine work was counted.")
    )


def figure(section: dict):
    """ms per forward vs k: the profile's line per model, and the forwards measured in the runs (pooled)."""
    import plotly.graph_objects as go

    prof = section.get("profile") or {}
    if "ms" not in prof:
        return None
    colours = {"draft": "#009E73", "qualifier": "#0072B2", "target": "#E69F00"}
    fig = go.Figure()
    for role, row in prof["ms"].items():
        ks = sorted(int(k) for k in row)
        fig.add_scatter(
            x=ks,
            y=[row[str(k)] for k in ks],
            mode="lines+markers",
            name=f"{role} (profile)",
            line=dict(color=colours.get(role), width=3),
        )
    pooled: dict[str, dict[int, list[float]]] = {}
    for v in section["variants"]:
        for role, d in v["ms_per_forward_by_k"].items():
            for k, ms in d.items():
                pooled.setdefault(role, {}).setdefault(int(k), []).append(ms)
    for role, d in pooled.items():
        ks = sorted(d)
        fig.add_scatter(
            x=ks,
            y=[sum(d[k]) / len(d[k]) for k in ks],
            mode="markers",
            name=f"{role} (in the runs)",
            marker=dict(color=colours.get(role), size=11, symbol="x"),
        )
    fig.update_layout(
        title="What one cached forward costs on this machine",
        template="plotly_white",
        xaxis_title="new tokens in the forward (k)",
        yaxis_title="ms per forward",
    )
    return fig


def html_section(result: dict) -> str:
    """report.html's section: the table, then the chart (plotly.js is already on the page)."""
    section = result["cost_profile"]
    md = markdown(section).split("\n")
    table = [line for line in md if line.startswith("|")]
    fig = figure(section)
    notes = [line.strip() for line in md[1:] if line.strip() and not line.startswith("|")]
    return (
        f"<h3>Why each method wins or loses here: the cost profile</h3><p>{html.escape(md[0])}</p>"
        + (f"<p>{html.escape(notes[0])}</p>" if notes else "")
        + (html_table("\n".join(table + notes[1:])) if table else "")  # the notes below the table
        + (fig.to_html(full_html=False, include_plotlyjs=False, default_height=420) if fig else "")
    )


def html_table(markdown: str) -> str:
    """A markdown table as HTML, the lines after it (its footnotes) below it."""
    md = markdown.split("\n")
    head = [c.strip() for c in md[0].strip("|").split("|")]
    body = [[c.strip() for c in line.strip("|").split("|")] for line in md[2:] if line.startswith("|")]
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body)
    notes = [line.strip() for line in md[2:] if line.strip() and not line.startswith("|")]
    foot = "".join(f"<p><small>{html.escape(line)}</small></p>" for line in notes)
    return f"<table><tr>{th}</tr>{trs}</table>{foot}"


def row_prediction(row: dict, speeds: dict[str, float], plus_one: bool = False) -> float | None:
    """The paper's throughput model for one run, from its acceptance rates, its lengths (measured means under
    conf_stop) and `speeds` (`plus_one`: β·ℓ + 1 tokens per round); None for a peer or a reference row."""
    if row["kind"] != "engine":
        return None
    st = ("qualifier", "target")
    acc = {k: row[f"acceptance_{k}"] for k in st if row[f"acceptance_{k}"] is not None}
    lengths = throughput.lengths(
        {k: row.get(k) for k in ("gamma", "l_d", "l_q", "conf_stop", "tree_nodes", "tree_depth", "tree_k", "shape")},
        {k: row[f"proposed_{k}"] for k in st if row.get(f"proposed_{k}")},
        {k: row[f"rounds_{k}"] for k in st if row.get(f"rounds_{k}")},
        {k: row[f"accepted_{k}"] for k in st if row.get(f"accepted_{k}") is not None},
        row["method"],
    )
    return throughput.predict_parts(row["method"], lengths, acc, speeds, plus_one)

"""The cost profile in `bench`: per-run forward records, the profile's prediction per run, and a
section of results.json / report.html that says why each method wins or loses on this machine.

Each engine row gets `cost_record` (JSON only): forwards per role by k new tokens, the forward time
measured in the run by k (sum of ms and count, where a step pins a forward's time down) and the
acceptance counts per stage. After the runs, `finish` adds the profile's predicted tok/s to every
row and a per-variant summary: measured vs predicted tok/s, time per forward by k (measured in the
runs and in the probe), measured α and the break-even α.
"""
from __future__ import annotations

import html
from typing import Any

from ..core import costs, insertion, throughput
from ..core.config import METHODS
from ..core.trace import Step


def row_record(steps: list[Step]) -> dict:
    """What one run adds to its row: {"cost_record": {...}} (see the module's doc)."""
    ms = {role: {k: [round(sum(ts), 4), len(ts)] for k, ts in by_k.items()}
          for role, by_k in costs.measured_by_k(steps).items()}
    return {"cost_record": {"forwards": costs.forward_counts(steps), "ms_by_k": ms,
                            "stages": costs.stage_counts(steps)}}


def profile(triplet: Any) -> dict | None:
    """The family's cost profile (cached for this machine, else measured now: a few seconds)."""
    from ..models.probe import cost_profile

    try:
        return cost_profile(triplet)
    except Exception as e:  # noqa: BLE001 - the bench's other results stand without it
        return {"error": repr(e)}


def _add(into: dict, more: dict, depth: int) -> None:
    for k, v in more.items():
        if depth > 1:
            _add(into.setdefault(str(k), {}), v, depth - 1)
        elif isinstance(v, list):
            into[str(k)] = [a + b for a, b in zip(into.get(str(k), [0, 0]), v)]
        elif isinstance(v, dict):
            _add(into.setdefault(str(k), {}), v, 1)
        else:
            into[str(k)] = into.get(str(k), 0) + v


def finish(rows: list[dict], prof: dict | None) -> dict:
    """Predicted tok/s per row and the per-variant summary; returns results.json's "cost_profile"."""
    if not prof or "ms" not in prof:
        return {"profile": prof, "variants": []}
    by: dict[str, dict] = {}
    for row in rows:
        rec = row.get("cost_record")
        if row.get("kind") != "engine" or not rec:
            continue
        t = sum(costs.predict_counts(rec["forwards"], prof).values())
        row["predicted_profile_tokens_per_s"] = row["n_new_tokens"] / t if t > 0 else None
        v = by.setdefault(row["variant"], {"method": row["method"], "tokens": 0, "decode_s": 0.0, "predicted_s": 0.0,
                                           "forwards": {}, "ms_by_k": {}, "stages": {},
                                           "config": {k: row[k] for k in ("gamma", "l_d", "l_q", "tree_nodes",
                                                                             "tree_depth", "tree_k") if row.get(k)}})
        v["tokens"] += row["n_new_tokens"]
        v["decode_s"] += row["decode_s"] or 0.0
        v["predicted_s"] += t
        _add(v["forwards"], rec["forwards"], 2)
        _add(v["ms_by_k"], rec["ms_by_k"], 2)
        _add(v["stages"], rec["stages"], 2)
    out = []
    for label, v in by.items():
        cfg = {k: x for k, x in v["config"].items() if x is not None}
        model = costs.model_from_counts(v["method"], v["stages"], cfg, prof)
        measured = v["tokens"] / v["decode_s"] if v["decode_s"] else None
        predicted = v["tokens"] / v["predicted_s"] if v["predicted_s"] else None
        out.append(dict(variant=label, method=v["method"], measured_tokens_per_s=measured,
                        predicted_tokens_per_s=predicted,
                        prediction_error=predicted / measured - 1 if measured and predicted else None,
                        ms_per_forward_by_k={r: {k: s / n for k, (s, n) in sorted(d.items(), key=lambda kv: int(kv[0]))
                                                 if n} for r, d in v["ms_by_k"].items()},
                        forwards_by_k=v["forwards"], **model))
    ar = next((d["measured_tokens_per_s"] for d in out if d["method"] == "ar"), None)
    for d in out:
        d["why"] = costs.verdict(d["method"], d, (d["measured_tokens_per_s"], ar) if ar else None)
    out.sort(key=lambda d: (METHODS.index(d["method"]) if d["method"] in METHODS else 99, d["variant"]))
    sd = next((d for d in out if d["method"] == "sd"), {})
    pyr = next((d for k in ("psd_a", "psd_f") for d in out if d["method"] == k), {})
    ins = insertion.insertion(prof, sd.get("alpha"), pyr.get("alpha_qualifier"), pyr.get("alpha"))
    return {"profile": prof, "variants": out, "insertion": ins}


def _f(x, nd: int = 2) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def markdown(section: dict) -> str:
    """The summary as a markdown table (printed by bench, shown in report.html)."""
    prof = section.get("profile") or {}
    if "ms" not in prof:
        return "No cost profile" + (f": {prof['error']}" if prof.get("error") else ".")
    lines = [f"Cost profile ({prof.get('dtype')}, {prof.get('backend')}, "
             f"{'cached' if prof.get('how') == 'cached' else 'measured now'}), ms per cached forward of k new tokens: "
             + "; ".join(f"{r} " + ", ".join(f"k={k} {float(v):.1f}" for k, v in row.items())
                         for r, row in prof["ms"].items()),
             "", "| variant | tok/s measured | tok/s predicted | error | measured α | break-even α | why |",
             "|---|---|---|---|---|---|---|"]
    for v in section["variants"]:
        a = _f(v.get("alpha"))
        if v.get("alpha_qualifier") is not None:
            a = f"α_Q {_f(v['alpha_qualifier'])} · α_T {a}"
        be = ("—" if "break_even_alpha" not in v else "never" if v["break_even_alpha"] is None
              else _f(v["break_even_alpha"]))
        err = "—" if v["prediction_error"] is None else f"{v['prediction_error']:+.0%}"
        lines.append(f"| {v['variant']} | {_f(v['measured_tokens_per_s'], 1)} | {_f(v['predicted_tokens_per_s'], 1)} "
                     f"| {err} | {a} | {be} | {v['why']} |")
    lines.append("\nMeasured tok/s exclude prefill; predicted: the profile's time summed over the forwards each run "
                 "made. Break-even α: the per-token acceptance at which the method's expected speed equals AR's "
                 "on this profile (PSD: the target stage's, at the measured stage-1 α_Q).")
    if section.get("insertion"):
        lines += ["", insertion.markdown(section["insertion"])]
    return "\n".join(lines)


def figure(section: dict):
    """ms per forward vs k: the probe's line per model, and the forwards measured in the runs (pooled)."""
    import plotly.graph_objects as go

    prof = section.get("profile") or {}
    if "ms" not in prof:
        return None
    colours = {"draft": "#009E73", "qualifier": "#0072B2", "target": "#E69F00"}
    fig = go.Figure()
    for role, row in prof["ms"].items():
        ks = sorted(int(k) for k in row)
        fig.add_trace(go.Scatter(x=ks, y=[row[str(k)] for k in ks], mode="lines+markers", name=f"{role} (probe)",
                                 line=dict(color=colours.get(role), width=3)))
    pooled: dict[str, dict[int, list[float]]] = {}
    for v in section["variants"]:
        for role, d in v["ms_per_forward_by_k"].items():
            for k, ms in d.items():
                pooled.setdefault(role, {}).setdefault(int(k), []).append(ms)
    for role, d in pooled.items():
        ks = sorted(d)
        fig.add_trace(go.Scatter(x=ks, y=[sum(d[k]) / len(d[k]) for k in ks], mode="markers",
                                 name=f"{role} (in the runs)",
                                 marker=dict(color=colours.get(role), size=11, symbol="x")))
    fig.update_layout(title="What one cached forward costs on this machine", template="plotly_white",
                      xaxis_title="new tokens in the forward (k)", yaxis_title="ms per forward")
    return fig


def html_section(result: dict, plotly_loaded: bool = True) -> str:
    """report.html's section: the table, then the chart (plotly.js is already on the page)."""
    section = result.get("cost_profile")
    if not section:
        return ""
    md = markdown(section).split("\n")
    first, table = md[0], [line for line in md if line.startswith("|")]
    head = [c.strip() for c in table[0].strip("|").split("|")] if table else []
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in line.strip("|").split("|")) + "</tr>"
                   for line in table[2:])
    fig = figure(section)
    return (f"<h3>Why each method wins or loses here: the cost profile</h3><p>{html.escape(first)}</p>"
            + (f"<table><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in head)}</tr>{body}</table>" if table else "")
            + f"<p><small>{html.escape(md[-1].strip())}</small></p>"
            + (fig.to_html(full_html=False, include_plotlyjs=not plotly_loaded, default_height=420) if fig else ""))


def row_lengths(row: dict) -> dict:
    """The γ / ℓ_D / ℓ_Q the throughput formulas use for a row (measured means under conf_stop)."""
    st = ("qualifier", "target")
    return throughput.lengths({k: row[k] for k in ("gamma", "l_d", "l_q", "conf_stop")},
                              {k: row[f"proposed_{k}"] for k in st if row.get(f"proposed_{k}")},
                              {k: row[f"rounds_{k}"] for k in st if row.get(f"rounds_{k}")})


def row_prediction(row: dict, speeds: dict[str, float]) -> float | None:
    """The paper's throughput model for one run, from its acceptance rates and `speeds`."""
    if row["kind"] != "engine":
        return None
    acc = {k: row[f"acceptance_{k}"] for k in ("qualifier", "target") if row[f"acceptance_{k}"] is not None}
    return throughput.predict_parts(row["method"], row_lengths(row), acc, speeds)

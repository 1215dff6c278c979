"""Plotly figures built from trace and stats records only (plus decoded token texts for labels)."""

from __future__ import annotations

import itertools

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..clock import Repeats, baseline_lane, race_noise, speed, speed_ratio, within_noise
from ..core.methods import METHOD_SHORT, short_name
from ..core.trace import RunResult, StageRound, Step, stage_rounds
from ..predict.costs import measured_by_k
from .inspector import positions, round_tau, stage_names, whatif_statuses
from .render import METHOD_COLOURS, STATUS_COLOURS, fmt, token_label

FONT_SIZE = 15  # large enough to read on a projector
ROLE_COLOURS = {"draft": "#009E73", "qualifier": "#0072B2", "target": "#E69F00"}


def _layout(fig: go.Figure, title: str, height: int = 360, **kw) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, x=0.01, font=dict(size=FONT_SIZE + 2)),
        template="plotly_white",
        height=height,
        font=dict(size=FONT_SIZE),
        margin=dict(l=60, r=20, t=56, b=50),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1, xanchor="right"),
        **kw,
    )
    return fig


def empty_figure(message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(
        text=message, showarrow=False, font=dict(size=FONT_SIZE, color="#888"), x=0.5, y=0.5, xref="paper", yref="paper"
    )
    fig.update_layout(xaxis_visible=False, yaxis_visible=False)
    return _layout(fig, "", 300)


def speedups(m: str, results: dict[str, RunResult], repeats: Repeats | None = None) -> list[str]:
    """["×1.80 vs AR", "×1.05 vs SD (tie within noise)"] for lane m: what the lanes, legend and status show."""
    out = []
    spread = race_noise(results, repeats)
    for base in ("ar", "sd"):
        key = baseline_lane(base, results)
        if key is None or m == key or (base == "sd" and results[m].method == "ar"):
            continue
        x = speed_ratio(m, key, results, repeats)
        if x is not None:
            out.append(f"×{x:.2f} vs {short_name(key)}" + (" (tie within noise)" if within_noise(x, spread) else ""))
    return out


def race_figure(results: dict[str, RunResult], repeats: Repeats | None = None) -> go.Figure:
    """Tokens generated vs time for every lane's median run; the legend: median tok/s and speed-ups over `repeats`."""
    if not results:
        return empty_figure("The race chart appears here: tokens generated vs time for each method.")
    fig = go.Figure(
        [
            go.Scatter(
                x=[0.0, *(s.t_end for s in r.steps)],
                y=[0, *itertools.accumulate(len(s.new_tokens) for s in r.steps)],  # tokens so far at each pass's end
                mode="lines+markers",
                line_shape="hv",
                name=" · ".join(
                    [f"{short_name(m)}: {speed(m, results, repeats):.1f} tok/s", *speedups(m, results, repeats)]
                ),
                line=dict(color=METHOD_COLOURS.get(m), width=3),
                marker=dict(size=5),
                hovertemplate="%{y} tokens at %{x:.2f} s<extra>" + short_name(m) + "</extra>",
            )
            for m, r in results.items()
        ]
    )
    _layout(fig, "Tokens generated vs time (steeper is faster)", 440)
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.22, x=0, xanchor="left"), margin=dict(b=120))
    fig.update_xaxes(title="seconds after the prompt (prefill excluded)", rangemode="tozero")
    fig.update_yaxes(title="tokens generated", rangemode="tozero")
    return fig


def _bars(fig: go.Figure, rnds: list[StageRound], tau: float | None, texts: dict[int, str], row: int) -> None:
    """A bar per position of each round (`inspector.positions`): its Div coloured by the fate at τ, others on hover."""
    xs, ys, colours, hover, marks = [], [], [], [], []
    for j, rnd in enumerate(rnds):
        what = whatif_statuses(rnd, tau)
        for at in positions(rnd):
            if at.node is None:
                continue
            t = rnd.tokens[at.node]
            tok = token_label(texts, t.token_id)
            xs.append(f"r{j + 1}·{at.depth} {tok}" if len(rnds) > 1 else f"{at.depth} {tok}")
            ys.append(t.div or 0.0)
            colours.append(STATUS_COLOURS[what[at.node]][1])
            tip = (
                f"{tok} at position {at.depth}: Div {fmt(t.div, 3)}<br>"
                f"recorded: {t.status}<br>at this τ: {what[at.node]}"
            )
            if at.siblings:
                tip += "<br>other candidates here (same context, same Div): " + ", ".join(
                    f"{token_label(texts, rnd.tokens[i].token_id)} ({what[i]})" for i in at.siblings
                )
            hover.append(tip)
            marks.append(f"+{len(at.siblings)} other(s)" if at.siblings else "")
    fig.add_trace(
        go.Bar(
            x=xs,
            y=ys,
            marker_color=colours,
            hovertext=hover,
            hoverinfo="text",
            showlegend=False,
            text=marks,
            textposition="outside",
        ),
        row=row,
        col=1,
    )
    if tau is not None:
        fig.add_hline(
            y=tau,
            line=dict(color="#D55E00", dash="dash", width=2),
            row=row,
            col=1,
            annotation_text=f"τ = {tau:g}",
            annotation_position="top left",
        )


def divergence_figure(step: Step, tau_q: float, tau_t: float, texts: dict[int, str]) -> go.Figure:
    """The divergence at each position of each round against the threshold, coloured by the outcome at τ."""
    if step.target_round is None:
        return empty_figure("AR: no drafted tokens in this pass.")
    rows = [rnds for rnds in (step.qualifier_rounds, [step.target_round]) if rnds]  # a panel per stage
    taus = [round_tau(rnds[0], tau_q, tau_t) for rnds in rows]
    titles = []
    for rnds, tau in zip(rows, taus):
        rnd = rnds[0]
        rule = "exact rule, τ unused" if tau is None else f"τ_{'Q' if rnd.stage == 'qualifier' else 'T'} = {tau:g}"
        titles.append(f"{rnd.proposer} → {rnd.verifier}: Div({rnd.verifier}, {rnd.proposer}) · {rule}")
    fig = make_subplots(rows=len(rows), cols=1, subplot_titles=titles, vertical_spacing=0.25)
    for k, (rnds, tau) in enumerate(zip(rows, taus), start=1):
        _bars(fig, rnds, tau, texts, k)
        top = max([y for y in fig.data[-1].y if y is not None and y < float("inf")] + [tau or 0.0, 0.1])
        fig.update_yaxes(title="Div", range=[0, top * 1.25], row=k, col=1)  # room for the "+n other(s)" labels
    _layout(fig, "", 250 + 210 * (len(rows) - 1))
    fig.update_layout(margin=dict(t=40))
    fig.update_annotations(font_size=FONT_SIZE - 1)
    return fig


def top5_figure(dists: dict[str, list[list[float]]], texts: dict[int, str], title: str) -> go.Figure:
    """Each model's five most likely next tokens at one position (raw probabilities)."""
    if not dists:
        return empty_figure("No distributions recorded at this position.")
    fig = make_subplots(rows=1, cols=len(dists), subplot_titles=list(dists), horizontal_spacing=0.12)
    for c, (role, pairs) in enumerate(dists.items(), start=1):
        # the rank keeps labels unique (two ids can decode to the same text, e.g. partial UTF-8 bytes)
        labels = [f"{k}. {token_label(texts, i)}" for k, (i, _) in enumerate(pairs, 1)][::-1]
        probs = [p for _, p in pairs][::-1]
        fig.add_trace(
            go.Bar(
                x=probs,
                y=labels,
                orientation="h",
                marker_color=ROLE_COLOURS.get(role),
                text=[f"{p:.2f}" for p in probs],
                textposition="auto",
                showlegend=False,
                hovertemplate="%{y}: %{x:.3f}<extra>" + role + "</extra>",
            ),
            row=1,
            col=c,
        )
        fig.update_xaxes(range=[0, 1], row=1, col=c)
        fig.update_yaxes(type="category", row=1, col=c)
    _layout(fig, title, 320)
    if "<br>" in title:  # a second line (a tree's other candidates at this position): room above the panels
        fig.update_layout(height=360, margin=dict(t=104))
    return fig


def position_figure(results: dict[str, RunResult]) -> go.Figure:
    """Per method and stage, by position (a tree's depth), the share of rounds proposing there whose path reached it."""
    fig = go.Figure()
    for m, r in results.items():
        for stage in stage_names(r):
            ys = r.stats.per_position_acceptance.get(stage, [])
            if not ys:
                continue
            first = stage_rounds(r.steps, stage)[0]
            fig.add_trace(
                go.Scatter(
                    x=list(range(1, len(ys) + 1)),
                    y=ys,
                    mode="lines+markers",
                    name=f"{short_name(m)} · {first.proposer}→{first.verifier}",
                    line=dict(color=METHOD_COLOURS.get(m), dash="dot" if stage == "qualifier" else "solid", width=3),
                )
            )
    if not fig.data:
        return empty_figure("Per-position acceptance appears after a race.")
    _layout(fig, "Acceptance by position in the proposal", 460)
    fig.update_xaxes(title="position in the proposal (a tree's depth)", dtick=1)
    fig.update_yaxes(title="P(accepted | proposed there)", range=[0, 1.05], tickformat=".0%")
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.25, x=0, xanchor="left"), margin=dict(b=150))
    return fig


def throughput_figure(rows: list[dict]) -> go.Figure:
    """Measured tok/s next to the cost profile's idle-machine prediction, per method (`story.rows`)."""
    if not rows:
        return empty_figure("Measured and predicted speeds appear after a race.")
    names = [METHOD_SHORT[r["method"]] for r in rows]
    measured, pred = [r["measured"] for r in rows], [r.get("predicted") for r in rows]
    bars = (("measured in this race", "#0072B2", measured), ("idle machine (cost profile)", "#bbbbbb", pred))
    fig = go.Figure(
        [
            go.Bar(
                x=names,
                y=[y or 0 for y in ys],
                name=name,
                marker_color=colour,
                text=["n/a" if y is None else f"{y:.1f}" for y in ys],
                textposition="outside",
            )
            for name, colour, ys in bars
        ]
    )
    _layout(fig, "Tokens per second: measured vs the profile's idle-machine prediction", 380, barmode="group")
    top = max([y or 0 for y in measured + pred] + [1.0])
    fig.update_yaxes(title="tokens / s", range=[0, top * 1.18])  # room for the value labels
    return fig


def cost_figure(profile: dict | None, results: dict[str, RunResult]) -> go.Figure:
    """ms per cached forward vs k, per model: the profile's line and this race's measured forwards."""
    if not profile:
        return empty_figure("The cost profile appears after a race.")
    fig = go.Figure()
    for role, row in profile["ms"].items():
        ks = sorted(int(k) for k in row)
        fig.add_trace(
            go.Scatter(
                x=ks,
                y=[row[str(k)] for k in ks],
                mode="lines+markers",
                name=f"{role} (profile)",
                line=dict(color=ROLE_COLOURS.get(role), width=3),
            )
        )
    seen = measured_by_k([s for r in results.values() for s in r.steps])  # every lane's forwards, pooled
    for role, by_k in seen.items():
        ks = sorted(by_k)
        fig.add_trace(
            go.Scatter(
                x=ks,
                y=[sorted(by_k[k])[len(by_k[k]) // 2] for k in ks],
                mode="markers",
                name=f"{role} (in this race)",
                marker=dict(color=ROLE_COLOURS.get(role), size=11, symbol="x"),
            )
        )
    _layout(fig, "What one forward costs on this machine", 420)
    fig.update_xaxes(title="new tokens in the forward (k)", dtick=1)
    fig.update_yaxes(title="ms per forward", rangemode="tozero")
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.22, x=0, xanchor="left"), margin=dict(b=120))
    return fig

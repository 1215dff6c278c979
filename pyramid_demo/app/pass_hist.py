"""Accepted drafted tokens per target pass, one small histogram per method (`Stats.accepted_hist`).

Why small multiples: with four methods as chains and as trees, eight bars grouped at every k cannot be told
apart; one panel per lane can. Chains fill the top row and each tree lane sits under its method's chain (same
hue, hatched), so a learner reads "the tree moved the mass to the right" straight down a column. AR drafts
nothing (every pass accepts 0), so it gets no panel.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..core.methods import TABLE, method_spec
from ..core.trace import RunResult
from .charts import FONT_SIZE, _layout, empty_figure
from .render import METHOD_COLOURS

TREE_PATTERN = "/"  # tree lanes' bars are hatched: a cue that is not colour


def chain_of(r: RunResult) -> str:
    """The method a lane runs, whose column it is drawn in (a chain and a tree of it share one)."""
    return r.method


def _is_tree(r: RunResult) -> bool:
    """Whether the lane's proposals were trees (the shape that ran, in its config)."""
    return r.config.get("shape") == "tree"


def _short(r: RunResult) -> str:
    try:
        short = method_spec(r.method).short
    except ValueError:
        short = r.method.upper()
    return short + (" · tree" if _is_tree(r) else "")


def panels(results: dict[str, RunResult]) -> dict[str, tuple[int, int]]:
    """lane → (row, col): a column per method in the table's order; with trees, chains on the top row and the
    trees below them."""
    shown = [m for m, r in results.items() if sum(r.stats.accepted_hist) and method_spec(r.method).proposer]
    order = [m.key for m in TABLE if any(chain_of(results[s]) == m.key for s in shown)]
    order += [chain_of(results[m]) for m in shown if chain_of(results[m]) not in order]  # not in the table: last
    trees = any(_is_tree(results[m]) for m in shown)
    chains = any(not _is_tree(results[m]) for m in shown)
    return {m: (2 if trees and chains and _is_tree(results[m]) else 1, order.index(chain_of(results[m])) + 1)
            for m in shown}


def accepted_figure(results: dict[str, RunResult], title: str = "Drafted tokens accepted per target pass"
                    ) -> go.Figure:
    """Share of target passes that accepted k drafted tokens (bonus not counted), one panel per method; the
    panel's title gives the mean."""
    where = panels(results)
    if not where:
        return empty_figure("Accepted-length histograms appear after a race (AR drafts nothing).")
    rows = max(r for r, _ in where.values())
    cols = max(c for _, c in where.values())
    slots = {rc: "" for rc in ((r, c) for r in range(1, rows + 1) for c in range(1, cols + 1))}
    for m, rc in where.items():
        s = results[m].stats
        slots[rc] = f"{_short(results[m])} · mean {s.mean_accepted_per_target_pass:.2f}"
    top_k = max(max(k for k, v in enumerate(results[m].stats.accepted_hist) if v) for m in where)
    fig = make_subplots(rows=rows, cols=cols, shared_yaxes=True, subplot_titles=list(slots.values()),
                        horizontal_spacing=0.03, vertical_spacing=0.22 if rows > 1 else 0.0)
    for m, (r, c) in where.items():
        h = results[m].stats.accepted_hist[:top_k + 1]  # the bins past every method's longest run are empty
        total = sum(h)
        shares = [v / total for v in h]
        r_m = results[m]
        fig.add_trace(go.Bar(x=list(range(len(h))), y=shares, name=_short(r_m), showlegend=False,
                             marker=dict(color=METHOD_COLOURS.get(chain_of(r_m), "#777"),
                                         pattern_shape=TREE_PATTERN if _is_tree(r_m) else "",
                                         line=dict(color="#333", width=0.5)),
                             customdata=h, hovertemplate="%{x} accepted: %{y:.0%} of passes (%{customdata})"
                             "<extra>" + _short(r_m) + "</extra>"), row=r, col=c)
    _layout(fig, f"{title} <span style='font-size:{FONT_SIZE - 2}px;color:#666'>(the verifier's own token not "
                 "counted)</span>", 150 + 230 * rows)
    fig.update_layout(margin=dict(l=70, r=20, t=90, b=70), bargap=0.15)
    fig.update_xaxes(dtick=1 if top_k <= 8 else 2, range=[-0.6, max(top_k, 2) + 0.6], showgrid=False)
    top = max(max(tr.y) for tr in fig.data)
    fig.update_yaxes(tickformat=".0%", range=[0, top * 1.08])  # one scale in every panel: compare down a column
    fig.update_yaxes(title="share of passes", col=1)
    for c in range(1, cols + 1):
        fig.update_xaxes(title="accepted (bonus not counted)" if cols < 4 else "accepted", row=rows, col=c)
    fig.update_annotations(font_size=FONT_SIZE - 1)
    return fig

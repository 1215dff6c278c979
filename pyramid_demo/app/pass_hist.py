"""Accepted drafted tokens per target pass, a small histogram per run (grouped bars cannot be told apart): chains on
the top row, each tree run hatched under its chain, so a shift reads down a column. AR drafts nothing: no panel."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..core.methods import TABLE, Method, method_spec
from ..core.trace import RunResult
from .charts import FONT_SIZE, _layout, empty_figure
from .inspector import proposes_trees
from .render import METHOD_COLOURS

TREE_PATTERN = "/"  # tree runs' bars are hatched: a cue that is not colour


def family(m: Method) -> tuple:
    """What a method's column is: its cascade (roles and rules), the same for its chain and tree."""
    return m.roles, m.stage1, m.target


def tree_lane(r: RunResult) -> bool:
    """Whether a lane is drawn as a tree: it ran the tree shape or its rounds proposed trees (never its key)."""
    return r.config.get("shape") == "tree" or proposes_trees(r)


def _short(key: str, r: RunResult) -> str:
    try:
        return method_spec(key).short
    except ValueError:  # a lane named otherwise: its method's short name, and its shape
        return method_spec(r.method).short + (" tree" if tree_lane(r) else "")


def panels(results: dict[str, RunResult]) -> dict[str, tuple[int, int]]:
    """lane → (row, col): a column per method family in the table's order, chains on top, each tree run below."""
    shown = [m for m, r in results.items() if sum(r.stats.accepted_hist) and method_spec(r.method).proposer]
    fams = {m: family(method_spec(results[m].method)) for m in shown}
    order = [f for f in dict.fromkeys(family(m) for m in TABLE) if f in fams.values()]
    two = len({tree_lane(results[m]) for m in shown}) == 2  # chains and trees: trees in the second row
    where: dict[str, tuple[int, int]] = {}
    for m in shown:
        col = order.index(fams[m]) + 1
        row = 2 if two and tree_lane(results[m]) else 1
        if (row, col) in where.values():
            row = 3 - row
        where[m] = (row, col)
    return where


def accepted_figure(results: dict[str, RunResult], title: str = "Drafted tokens accepted per target pass") -> go.Figure:
    """Share of target passes that accepted k drafted tokens (bonus not counted), a panel per method with its mean."""
    where = panels(results)
    if not where:
        return empty_figure("Accepted-length histograms appear after a race (AR drafts nothing).")
    rows, cols = max(r for r, _ in where.values()), max(c for _, c in where.values())
    slots = {(r, c): "" for r in range(1, rows + 1) for c in range(1, cols + 1)}  # an empty slot: no title
    for m, rc in where.items():
        slots[rc] = f"{_short(m, results[m])} · mean {results[m].stats.mean_accepted_per_target_pass:.2f}"
    top_k = max(max(k for k, v in enumerate(results[m].stats.accepted_hist) if v) for m in where)
    fig = make_subplots(
        rows=rows,
        cols=cols,
        shared_yaxes=True,
        subplot_titles=list(slots.values()),
        horizontal_spacing=0.03,
        vertical_spacing=0.22 if rows > 1 else 0.0,
    )
    for m, (r, c) in where.items():
        h = results[m].stats.accepted_hist[: top_k + 1]  # the bins past every method's longest run are empty
        name = _short(m, results[m])
        fig.add_trace(
            go.Bar(
                x=list(range(len(h))),
                y=[v / sum(h) for v in h],
                name=name,
                showlegend=False,
                marker=dict(
                    color=METHOD_COLOURS.get(m, METHOD_COLOURS.get(results[m].method, "#777")),
                    pattern_shape=TREE_PATTERN if tree_lane(results[m]) else "",
                    line=dict(color="#333", width=0.5),
                ),
                customdata=h,
                hovertemplate="%{x} accepted: %{y:.0%} of passes (%{customdata})<extra>" + name + "</extra>",
            ),
            row=r,
            col=c,
        )
    _layout(
        fig,
        f"{title} <span style='font-size:{FONT_SIZE - 2}px;color:#666'>(the verifier's own token not counted)</span>",
        150 + 230 * rows,
    )
    fig.update_layout(margin=dict(l=70, r=20, t=90, b=70), bargap=0.15)
    fig.update_xaxes(dtick=1 if top_k <= 8 else 2, range=[-0.6, max(top_k, 2) + 0.6], showgrid=False)
    top = max(max(tr.y) for tr in fig.data)
    fig.update_yaxes(tickformat=".0%", range=[0, top * 1.08])  # one scale in every panel: compare down a column
    fig.update_yaxes(title="share of passes", col=1)
    fig.update_xaxes(title="accepted (bonus not counted)" if cols < 4 else "accepted", row=rows)
    fig.update_annotations(font_size=FONT_SIZE - 1)
    return fig

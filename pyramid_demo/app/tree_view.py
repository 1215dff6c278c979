"""One target pass's candidate trees as a Plotly figure, from trace records only: the accepted path along the top,
other branches below, the verifier's top-1 above; fill the fate, shape the stage (● stage 1, ■ target, ◆ own token)."""

from __future__ import annotations

from dataclasses import dataclass, field

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..core import rules
from ..core.trace import StageRound, Step, TokenRec, accepted_path, parents_of
from .charts import FONT_SIZE, _layout, empty_figure
from .render import STATUS_COLOURS, fmt, token_label

FATE_NAMES = {
    "accepted": "accepted path",
    "rejected": "tried, rejected",
    "discarded": "never reached",  # legend order
    "bonus": "verifier's bonus",
    "resampled": "verifier's replacement",
}
FATE_COLOURS = {fate: STATUS_COLOURS[fate][1] for fate in FATE_NAMES}
STAGE_SYMBOLS = {"qualifier": "circle", "target": "square"}  # proposed tokens, by the round's stage
OWN_SYMBOL = "diamond"  # the verifier's own token
TEXT_COLOURS = {"draft": "#007A5A", "qualifier": "#0072B2", "target": "#9A5B00"}  # role hues, legible on the grey strip
EDGE_PATH = "#009E73"  # edges along the accepted path
EDGE_OTHER = "#b0b0b0"
ROOT_COLOUR = "#333333"
SLOT_PX = 46  # vertical room per branch: a marker, its label and a gap
MAX_SLOTS = 9  # a row with more branches than this folds every never-reached subtree into its first node,
# so a pyramid pass of several 16-node trees still fits a 1280×800 screen
WANT_Y = -0.95  # the row of the verifier's top-1 labels, above the path (y grows downwards)


@dataclass
class Node:
    """A drawn token: a proposed one or the verifier's own; x, y in the figure's units."""

    rec: TokenRec
    own: bool
    x: float  # the position after the committed text
    y: float = 0.0
    parent_xy: tuple[float, float] = (0.0, 0.0)
    on_path: bool = False
    hidden: bool = False  # folded into the off-path node it descends from
    folded: list[TokenRec] = field(default_factory=list)  # what this node holds folded beneath it


def fate(node: Node) -> str:
    """The colour key: the recorded status (the own token's is bonus, resampled or, after an EOS, discarded)."""
    return node.rec.status if node.rec.status in FATE_NAMES else "discarded"


def place_round(rnd: StageRound, x0: float, top: dict[int, int], fold: bool = False) -> list[Node]:
    """Lay one round out from its root at x0 on the path line (y 0), each branch as high as the column slots `top[x]`
    (shared by a row's rounds) allow; `fold` folds a branch into its first node. The proposed nodes, then the own."""
    props, parents = rnd.tokens[:-1], parents_of(rnd)
    depth = rules.depths(parents)
    nodes = [Node(t, False, x0 + depth[i]) for i, t in enumerate(props)]
    accepted = accepted_path(rnd)
    end = accepted[-1] if accepted else -1  # the accepted path's last node
    own = len(nodes)
    nodes.append(Node(rnd.tokens[-1], True, x0 + len(accepted) + 1))
    kids = rules.children(parents) + [[]]  # context c: 0 the root, i + 1 node i (the own token's: none)
    kids[end + 1].insert(0, own)  # the verifier's token continues the path
    for i in [*accepted, own]:
        nodes[i].on_path = True

    def branch(k: int, rel: list[tuple[int, int]], y: int) -> int:
        """The slots of node k's subtree (a leaf each, a parent level with its first child); returns the next free."""
        rel.append((k, y))
        nxt = y
        for j, c in enumerate(kids[k + 1]):
            nxt = branch(c, rel, nxt if j else y)
        return max(nxt, y + 1)

    def walk(c: int, xy: tuple[float, float]) -> None:
        for k in sorted(kids[c], key=lambda i: not nodes[i].on_path):  # stable: the rest in ranked order
            node = nodes[k]
            node.parent_xy = xy
            if node.on_path:
                walk(k + 1, (node.x, 0.0))
                continue
            rel: list[tuple[int, int]] = []
            branch(k, rel, 0)
            if fold and len(rel) > 1:
                for i, _ in rel[1:]:
                    nodes[i].hidden = True
                    node.folded.append(nodes[i].rec)
                rel = rel[:1]
            base = max(top.get(int(nodes[i].x), 1) - r for i, r in rel)  # the highest slots free in every column
            for i, r in rel:
                nodes[i].y = float(base + r)
                top[int(nodes[i].x)] = max(top.get(int(nodes[i].x), 1), base + r + 1)
                for c2 in kids[i + 1]:  # edges inside the branch (a parent comes before its children in `rel`)
                    nodes[c2].parent_xy = (nodes[i].x, nodes[i].y)

    walk(0, (x0, 0.0))
    return nodes


def _short(label: str, chars: int) -> str:
    return label if len(label) <= chars else label[: max(1, chars - 1)] + "…"


def top1(rec: TokenRec, role: str) -> tuple[int, float] | None:
    """The verifier's most likely token at this token's context (its parent's), from the top-5 record."""
    pairs = rec.top5.get(role) or []
    return (int(pairs[0][0]), float(pairs[0][1])) if pairs else None


def hover(node: Node, rnd: StageRound, texts: dict[int, str], pos: int) -> str:
    """What one node says on hover: its fate, each model's probability (p, q, Div) and the verifier's wish."""
    t, who = node.rec, rnd.verifier if node.own else rnd.proposer
    lines = [
        f"<b>{token_label(texts, t.token_id)}</b> · {who}'s token at position {pos}",
        f"fate: {FATE_NAMES.get(fate(node), t.status)} ({t.status})",
        f"p = {fmt(t.p, 3)} ({rnd.verifier}, the verifier)",
    ]
    if not node.own:
        lines.append(f"q = {fmt(t.q, 3)} ({rnd.proposer}, the proposer)")
        lines.append(f"Div = {fmt(t.div, 3)}" + ("" if t.tau is None else f" against τ = {t.tau:g}"))
    want = top1(t, rnd.verifier)
    if want is not None:
        lines.append(f"{rnd.verifier}'s top-1 here: {token_label(texts, want[0])} ({want[1]:.3f})")
    if node.folded:
        names = ", ".join(token_label(texts, r.token_id) for r in node.folded[:8]) + (
            ", …" if len(node.folded) > 8 else ""
        )
        lines.append(f"+{len(node.folded)} candidate(s) below it, never reached: {names}")
    return "<br>".join(lines)


@dataclass
class Row:
    """One subplot: the rounds of one stage, laid along the pass's positions."""

    title: str
    rounds: list[StageRound]
    placed: list[tuple[StageRound, float, list[Node]]] = field(default_factory=list)
    slots: int = 1


def _rows(step: Step) -> list[Row]:
    rows = []
    if step.qualifier_rounds:
        q = step.qualifier_rounds
        shape = "chains" if all(rules.is_chain(parents_of(r)) for r in q) else "trees"
        rounds = f"{len(q)} rounds" if len(q) > 1 else "one round"
        rows.append(Row(f"Stage 1 (●) · draft → qualifier: {rounds} of {shape} build the block", q))
    t = step.target_round
    assert t is not None
    n = len(t.tokens) - 1
    what = f"a chain of {n}" if rules.is_chain(parents_of(t)) else f"a tree of {n} candidates"
    stage = "Stage 2 (■) · " if step.qualifier_rounds else ""
    rows.append(Row(f"{stage}{t.proposer} → target: {what}, accepted path of {t.n_accepted}", [t]))
    for row in rows:
        for fold in (False, True):
            x0, top = 0.0, {}
            row.placed = []
            for rnd in row.rounds:
                nodes = place_round(rnd, x0, top, fold)
                row.placed.append((rnd, x0, nodes))
                x0 = nodes[-1].x  # the next round grows from this one's own token
            row.slots = max(top.values(), default=1)
            if row.slots <= MAX_SLOTS + 1:
                break
        if fold:  # never-reached subtrees drawn folded (see MAX_SLOTS)
            row.title += " · branches never reached folded (+n)"
    return rows


def _draw_row(fig: go.Figure, row: Row, k: int, texts: dict[int, str], chars: int, seen: set[str]) -> None:
    edges: dict[bool, tuple[list, list]] = {True: ([], []), False: ([], [])}
    groups: dict[tuple[str, bool, str], dict[str, list]] = {}
    wants: dict[str, list] = {"x": [], "text": [], "hover": []}
    at = dict(row=k, col=1)  # this row's subplot
    for j, (rnd, x0, nodes) in enumerate(row.placed):
        for node in nodes:
            if node.hidden:
                continue
            ex, ey = edges[node.on_path]
            ex += [node.parent_xy[0], node.x, None]
            ey += [node.parent_xy[1], node.y, None]
            g = groups.setdefault((fate(node), node.own, rnd.stage), {"x": [], "y": [], "text": [], "hover": []})
            g["x"].append(node.x)
            g["y"].append(node.y)
            label = _short(token_label(texts, node.rec.token_id), chars)
            g["text"].append(f"{label} +{len(node.folded)}" if node.folded else label)
            g["hover"].append(hover(node, rnd, texts, int(node.x)))
            want = top1(node.rec, rnd.verifier) if node.on_path else None
            if want is not None:
                wants["x"].append(node.x)
                wants["text"].append(_short(token_label(texts, want[0]), chars))
                wants["hover"].append(
                    f"{rnd.verifier}'s top-1 at position {int(node.x)}: {token_label(texts, want[0])} ({want[1]:.3f})"
                )
        if len(row.placed) > 1:
            fig.add_annotation(
                x=x0,
                y=WANT_Y - 0.55,
                text=f"round {j + 1}",
                showarrow=False,
                xanchor="left",
                font=dict(size=FONT_SIZE - 3, color="#666"),
                **at,
            )
    traces = [
        go.Scatter(
            x=ex,
            y=ey,
            mode="lines",
            hoverinfo="skip",
            showlegend=False,
            line=dict(color=EDGE_PATH if on_path else EDGE_OTHER, width=4 if on_path else 1.5),
        )
        for on_path, (ex, ey) in edges.items()
    ]
    traces.append(
        go.Scatter(
            x=[0.0],  # the first round's root (a row's rounds start at x 0)
            y=[0.0],
            mode="markers",
            showlegend=False,
            marker=dict(size=12, color=ROOT_COLOUR, symbol="triangle-right"),
            hovertext=["the committed text so far (the tree's root)"],
            hoverinfo="text",
            name="root",
        )
    )
    for (fate_key, own, stage), g in sorted(groups.items(), key=lambda kv: list(FATE_NAMES).index(kv[0][0])):
        hollow = fate_key == "discarded"
        symbol = OWN_SYMBOL if own else STAGE_SYMBOLS.get(stage, "circle")
        symbol += "-open" if hollow else "-x" if fate_key == "rejected" else ""
        traces.append(
            go.Scatter(
                x=g["x"],
                y=g["y"],
                mode="markers+text",
                text=g["text"],
                textposition="top center",
                textfont=dict(size=FONT_SIZE - 2),
                hovertext=g["hover"],
                hoverinfo="text",
                name=FATE_NAMES[fate_key],
                legendgroup=fate_key,
                showlegend=fate_key not in seen,
                marker=dict(
                    size=17,
                    color=FATE_COLOURS[fate_key],
                    symbol=symbol,
                    line=dict(width=2.5 if hollow else 1, color=FATE_COLOURS[fate_key] if hollow else "#333"),
                ),
            )
        )
        seen.add(fate_key)
    verifier = row.rounds[0].verifier
    if wants["x"]:
        traces.append(
            go.Scatter(
                x=wants["x"],
                y=[WANT_Y] * len(wants["x"]),
                mode="text",
                text=wants["text"],
                textfont=dict(size=FONT_SIZE - 2, color=TEXT_COLOURS.get(verifier, "#333")),
                hovertext=wants["hover"],
                hoverinfo="text",
                showlegend=False,
                name=f"{verifier} top-1",
            )
        )
    fig.add_traces(traces, rows=k, cols=1)
    if wants["x"]:
        fig.add_annotation(
            x=0,
            y=WANT_Y,
            text=f"<b>{verifier}'s top-1</b>",
            showarrow=False,
            xanchor="right",
            xshift=-14,
            font=dict(size=FONT_SIZE - 3, color=TEXT_COLOURS.get(verifier, "#333")),
            **at,
        )
        fig.add_hrect(y0=WANT_Y - 0.32, y1=WANT_Y + 0.32, fillcolor="#f3f3f3", line_width=0, layer="below", **at)
    fig.update_yaxes(range=[row.slots - 0.4, WANT_Y - 0.8], visible=False, **at)


def tree_figure(step: Step, texts: dict[int, str]) -> go.Figure:
    """Every round of one target pass as a tree of candidates (a chain as a one-branch tree)."""
    if step.target_round is None:
        return empty_figure("AR: no candidates in this pass (the target makes one token alone).")
    rows = _rows(step)
    width = max(n.x for row in rows for _, _, nodes in row.placed for n in nodes if not n.hidden)
    chars = max(4, min(12, int(110 / max(width, 1))))  # labels shorten as positions crowd (about 1,150 px)
    heights = [row.slots + 2 for row in rows]
    fig = make_subplots(
        rows=len(rows),
        cols=1,
        shared_xaxes=True,
        subplot_titles=[r.title for r in rows],
        row_heights=[h / sum(heights) for h in heights],
        vertical_spacing=0.12 if rows[1:] else 0.0,
    )
    seen: set[str] = set()
    for k, row in enumerate(rows, start=1):
        _draw_row(fig, row, k, texts, chars, seen)
    plot_px = SLOT_PX * sum(heights) + 50 * (len(rows) - 1)
    _layout(fig, "", plot_px + 40 + 130)
    fig.update_layout(
        margin=dict(l=130, r=30, t=40, b=130),
        hoverlabel=dict(font_size=FONT_SIZE - 1),
        legend=dict(orientation="h", y=-75 / plot_px, yanchor="top", x=0, xanchor="left"),
    )
    fig.update_xaxes(dtick=1, range=[-0.4, width + 0.6], showgrid=False, zeroline=False)
    fig.update_xaxes(title="position after the committed text", row=len(rows), col=1)
    for row in rows:  # subplot titles: left-aligned, like the page's other charts
        fig.update_annotations(selector=dict(text=row.title), x=0, xanchor="left", font_size=FONT_SIZE)
    return fig

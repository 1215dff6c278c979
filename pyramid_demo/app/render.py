"""Token chips as HTML: short classed <span>s coloured by one <style> block sent with every legend."""

from __future__ import annotations

import html
import re

from ..core import rules
from ..core.methods import LANES, method_spec
from ..core.trace import RunResult, StageRound, accepted_path, parents_of
from .text import ORIGIN_NAMES, STATUS_NAMES

# Okabe-Ito hues (colour-blind safe) as pale backgrounds with a strong underline: readable when projected.
ORIGIN_COLOURS = {
    "draft": ("#cdeedd", "#009E73"),
    "qualifier": ("#d3e6f8", "#0072B2"),
    "target": ("#fde3c0", "#E69F00"),
    "bonus": ("#f2d6ec", "#CC79A7"),
}
STATUS_COLOURS = {
    "accepted": ORIGIN_COLOURS["draft"],
    "rejected": ("#fbd3c4", "#D55E00"),
    "discarded": ("#eeeeee", "#9e9e9e"),
    "resampled": ORIGIN_COLOURS["target"],
    "bonus": ORIGIN_COLOURS["bonus"],
}
# a lane: its own colour (a reference lane's), else its method's
METHOD_COLOURS = {lane.key: lane.colour or method_spec(lane.method).colour for lane in LANES.values()}

FONT = "font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;"


def fmt(x: float | None, nd: int = 2) -> str:
    """A figure with `nd` decimals, "—" when there is none."""
    return "—" if x is None else f"{x:.{nd}f}"


def token_label(texts: dict[int, str], tid: float) -> str:
    """A token id's decoded text, quoted as Python does (`#id` when the vocabulary lacks it): labels and hovers."""
    return repr(texts.get(int(tid), f"#{int(tid)}"))


def token_text(text: str) -> str:
    """Escape a token for HTML and make whitespace visible (a newline shows as ↵ and breaks the line)."""
    return html.escape(text).replace("\n", "↵<br>").replace("\t", "⇥") if text else "∅"


def _rule(cls: str, colours: tuple[str, str]) -> str:
    return f".tok.{cls}{{background:{colours[0]};border-bottom-color:{colours[1]}}}"


STYLE = (
    "<style>.tok{border-radius:4px;padding:1px 2px;margin:0 1px;white-space:pre-wrap;"
    "border-bottom:3px solid #999}.tok.strike{text-decoration:line-through;opacity:.65}"
    + "".join(_rule(f"o-{o}", c) for o, c in ORIGIN_COLOURS.items())
    + "".join(_rule(f"st-{k}", c) for k, c in STATUS_COLOURS.items())
    # the replay (`race_view.JS`): a chip waits for its time, a lane's final figures for its finish line
    + ".replay.playing .tok[data-t]:not(.on),.replay.playing .lane:not(.done) .final{visibility:hidden}"
    ".replay:not(.playing) .live{display:none}.replay .live{margin-right:10px}"
    ".replay button{margin:0 2px;padding:0 8px;border:1px solid #bbb;border-radius:4px;background:#fff}"
    ".replay button.on{font-weight:700;border-color:#333}</style>"
)


def chip(text: str, cls: str, title: str, strike: bool = False, attrs: str = "") -> str:
    """One token; `cls` is o-<origin> or st-<status>; `attrs` trusted extra attributes."""
    extra = " strike" if strike else ""
    return f'<span class="tok {cls}{extra}" title="{html.escape(title)}"{attrs}>{token_text(text)}</span>'


def _legend(kind: str, names: dict[str, str], gap: int, size: str, tail: str = "") -> str:
    """Chips of one colour scheme (`kind` o or st) with their names (carries the chip styles); `tail` trusted HTML."""
    items = "".join(
        f'<span style="margin-right:{gap}px">{chip(k, f"{kind}-{k}", v, k == "discarded")} {html.escape(v)}</span>'
        for k, v in names.items()
    )
    return f'{STYLE}<div class="legend" style="font-size:{size};line-height:2">{items}{tail}</div>'


def legend_html() -> str:
    """The origin colours, shown above the lanes."""
    return _legend("o", ORIGIN_NAMES, 14, "1.0rem")


def status_legend_html() -> str:
    """The status colours, shown above the inspector's rounds."""
    marks = (
        '<span style="color:#555">· ✓ / ✗ / · under a token: kept / tried and refused / never reached at the '
        "what-if τ · numbers: positions after the committed text; the top row is what the round kept, the "
        "other candidates at a position stand below it (dashed), what hangs under them after →</span>"
    )
    return _legend("st", STATUS_NAMES, 12, ".95rem", marks)


def token_times(result: RunResult) -> list[float]:
    """When each token was produced: the end of the target pass that committed it (engine clock, after prefill)."""
    return [s.t_end for s in result.steps for _ in s.new_tokens]


def coloured_tokens(result: RunResult, timed: bool = False) -> str:
    """The run's text, a chip per token coloured by origin; `timed`: each carries its `token_times` for the replay."""
    times, passes = token_times(result), [s.index + 1 for s in result.steps for _ in s.new_tokens]
    spans = []
    for i, (t, o) in enumerate(zip(result.token_texts, result.origins)):
        attrs = f' data-t="{times[i]:.4f}"' if timed and i < len(times) else ""
        spans.append(chip(t, f"o-{o}", f"{o} · target pass {passes[i] if i < len(passes) else '?'}", attrs=attrs))
    return "".join(spans)


def lane_html(method: str, result: RunResult | None, headline: str, title: str, timed: bool = False) -> str:
    """One lane: its title, figures (with a replay's live counter) and coloured text; data-end: the replay's finish."""
    colour = METHOD_COLOURS.get(method, "#333")
    body = coloured_tokens(result, timed) if result is not None else '<span style="color:#999">waiting…</span>'
    end = f' data-end="{result.stats.decode_s:.4f}"' if result is not None else ""
    return (
        f'<div class="lane lane-{method}"{end} style="border-left:6px solid {colour};padding:6px 10px;'
        f'margin:6px 0;background:#fff;border-radius:6px;box-shadow:0 1px 2px rgba(0,0,0,.08)">'
        f'<div style="font-weight:700;color:{colour};font-size:1.05rem">'
        f"{html.escape(title)}"
        f'<span style="font-weight:400;color:#444;margin-left:12px;font-size:.95rem">'
        f'<span class="live"></span><span class="final">{html.escape(headline)}</span></span></div>'
        f'<div style="{FONT}font-size:1.05rem;line-height:1.9;color:#111">{body}</div></div>'
    )


def lanes_html(lanes: list[str], title: str = "", note: str = "", foot: str = "") -> str:
    head = f'<div style="font-weight:600;margin:4px 0">{html.escape(title)}</div>' if title else ""
    if note:  # e.g. the loader's "the draft and qualifier ARE the target" warning
        head += (
            f'<div class="note" style="background:#fff6dd;border:1px solid #f0d58a;border-radius:6px;'
            f'padding:6px 10px;margin:4px 0;color:#5a4500">ℹ️ {html.escape(note)}</div>'
        )
    tail = (
        f'<div class="lanes-foot" style="color:#666;font-size:.85rem;margin:4px 0">{html.escape(foot)}</div>'
        if foot
        else ""
    )
    return f'<div class="lanes">{head}{"".join(lanes)}{tail}</div>'


CELL_STYLES = {"sibling": "border-left:2px dashed #bbb;padding-left:3px;font-size:.9rem;", "below": "font-size:.9rem;"}
MARKS = {"accepted": ("✓", "#009E73"), "rejected": ("✗", "#D55E00"), "discarded": ("·", "#9e9e9e")}


def _token_chip(rnd: StageRound, i: int, texts: dict[int, str], whatif: list[str] | None, extra: str = "") -> str:
    """One proposed token's chip with its what-if mark (✓ accepted, ✗ rejected, · discarded at the what-if τ)."""
    t = rnd.tokens[i]
    tip = STATUS_NAMES.get(t.status, t.status)
    if t.div is not None:
        tip += f" · Div {t.div:.3f}" + (f" vs τ {t.tau:g}" if t.tau is not None else "")
    c = chip(
        texts.get(t.token_id, f"#{t.token_id}"),
        f"st-{t.status}",
        tip + extra,
        strike=t.status in ("rejected", "discarded"),
    )
    if whatif is None or i >= len(whatif):
        return c
    sym, colour = MARKS.get(whatif[i], ("·", "#9e9e9e"))
    return c + f'<div style="font-size:.8rem;text-align:center;color:{colour}">{sym}</div>'


def round_chips_html(
    rnd: StageRound, texts: dict[int, str], title: str, whatif: list[str] | None = None, note: str = ""
) -> str:
    """One round on a grid of positions: the accepted path and the own token on top, other candidates on dashed rows
    below; `whatif` adds a ✓/✗/· mark under each proposed token; `note` is trusted HTML."""
    ps = parents_of(rnd)
    kids, depth = rules.children(ps), rules.depths(ps)
    path = accepted_path(rnd)
    cells: list[tuple[int, int, str, str]] = []  # (row, column, class, html); row 1 the header, 2 the path

    def branch(k: int, row: int, rows: list[int], first: bool) -> None:
        extra = f" · another candidate at position {depth[k]}" if first else " · never reached, below a candidate"
        cells.append((row, depth[k], "sibling" if first else "below", _token_chip(rnd, k, texts, whatif, extra)))
        for j, c in enumerate(kids[k + 1]):
            if j:
                rows.append(rows[-1] + 1)
            branch(c, row if not j else rows[-1], rows, False)

    for d, i in enumerate(path, start=1):
        cells.append((2, d, "line", _token_chip(rnd, i, texts, whatif)))
    own = f" · the verifier's own token, at position {len(path) + 1}"  # no Div, no what-if mark: it was not proposed
    cells.append((2, len(path) + 1, "line own", _token_chip(rnd, len(rnd.tokens) - 1, texts, whatif, own)))
    rows = [2]
    for c in [0] + [i + 1 for i in path]:  # the contexts on the path, root first
        for j in kids[c]:
            if j not in path:
                rows.append(rows[-1] + 1)
                branch(j, rows[-1], rows, True)
    n_cols = max(col for _, col, _, _ in cells)
    grid = "".join(
        f'<div style="grid-row:1;grid-column:{d};font-size:.7rem;color:#888;text-align:center">{d}</div>'
        for d in range(1, n_cols + 1)
    )
    for r, col, cls, h in cells:
        style = CELL_STYLES.get(cls, "")
        arrow = '<span style="color:#aaa;font-size:.8rem">→</span>' if cls == "below" else ""
        grid += f'<div class="{cls}" style="grid-row:{r};grid-column:{col};text-align:center;{style}">{arrow}{h}</div>'
    return (
        f'<div class="round" style="display:flex;align-items:flex-start;gap:12px;margin:4px 0;'
        f'border-bottom:1px solid #eee;padding:4px 0"><div style="flex:0 0 300px;font-weight:600;color:#333">'
        f'{html.escape(title)}<div style="font-weight:400;font-size:.9rem;color:#555">{note}</div></div>'
        f'<div style="{FONT}font-size:1.05rem;display:grid;gap:2px 3px;align-items:start">{grid}</div></div>'
    )


def bold(text: str) -> str:
    """A Markdown-light text (the shared messages: `**bold**`) as HTML."""
    return re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(text))


def message_html(text: str) -> str:
    """A grey note."""
    return f'<div style="color:#555;padding:8px">{bold(text)}</div>'

"""The ▶ Play panel: a recorded target pass replayed beat by beat (`playback`); a gr.Timer ticks every PACE_S while
playing. Every handler returns (state, the beat's HTML, the timer); bad input gives a message, never a traceback."""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import gradio as gr

from ..core import rules
from ..core.methods import METHOD_LABELS
from . import playback, render
from .playback import HIDDEN, PROPOSED, Beat, Chip
from .races import Race, Session
from .text import MSG

PACE_S = 0.8  # seconds a beat stays on screen while playing: readable aloud in a classroom
LIT = "outline:3px solid #111;outline-offset:2px;border-radius:4px"


@dataclass(frozen=True)
class PlayState:
    """A visitor's player: the pass's beats, the beat shown, whether it plays, and a label or a message."""

    beats: tuple[Beat, ...] = ()
    i: int = 0
    playing: bool = False
    label: str = ""
    message: str = MSG["play_none"]


# ------------------------------------------------------------------ loading a pass
def decoder(race: Race) -> Callable[[int], str]:
    """A token id's text from the race's own vocabulary (the player needs no tokenizer)."""
    return lambda t: race.vocab.get(t, f"#{t}")


def load(session: Session | None, race_n: Any, method: str | None, pass_no: Any) -> PlayState:
    """The beats of target pass `pass_no` (1-based) of lane `method` in race `race_n` (None: the latest race)."""
    race: Race | None = session.find(race_n) if session is not None else None
    if race is None or not race.results:
        return PlayState()
    r = race.results.get(method) if method else None
    if r is None:
        lanes = ", ".join(METHOD_LABELS.get(m, m) for m in race.results)
        return PlayState(message=MSG["play_lane"].format(race=race.n, lanes=lanes))
    total = len(r.steps)
    try:
        k = int(pass_no)
    except (TypeError, ValueError):
        k = 0
    if not 1 <= k <= total:
        return PlayState(message=MSG["play_range"].format(n=pass_no, total=total))
    beats = playback.beats(r.steps[k - 1], decoder(race))
    label = f"Race {race.n} · {METHOD_LABELS.get(method, method)} · target pass {k} of {total}"
    return PlayState(tuple(beats), 0, False, label, "")


def outputs(ps: PlayState) -> tuple[PlayState, str, Any]:
    """What every handler returns: the state, the beat's HTML and the timer on only while playing."""
    return ps, beat_html(ps), gr.Timer(active=ps.playing)


def show(session: Session | None, race_n: Any, method: str | None, pass_no: Any) -> tuple:
    """A pass was chosen (the inspector's race, method and round): load it, stopped at its first beat."""
    return outputs(load(session, race_n, method, pass_no))


# ------------------------------------------------------------------ the controls
def play(ps: PlayState) -> tuple:
    """▶ Play: run from the beat shown (from the first again when at the last)."""
    n = len(ps.beats)
    i = 0 if ps.i >= n - 1 else ps.i  # no beats: i stays 0, not playing
    return outputs(replace(ps, i=i, playing=i < n - 1))


def pause(ps: PlayState) -> tuple:
    """Pause: stay on the beat shown."""
    return outputs(replace(ps, playing=False))


def step_forward(ps: PlayState) -> tuple:
    """Step ▶: the next beat (it stays on the last); pauses."""
    return outputs(replace(ps, i=max(0, min(ps.i + 1, len(ps.beats) - 1)), playing=False))


def step_back(ps: PlayState) -> tuple:
    """◀ Step: the previous beat (it stays on the first); pauses."""
    return outputs(replace(ps, i=max(0, ps.i - 1), playing=False))


def tick(ps: PlayState) -> tuple:
    """One tick of the timer while playing: the next beat; at the last beat play stops (and the timer with it)."""
    if not ps.playing or not ps.beats:
        return outputs(replace(ps, playing=False))
    i = min(ps.i + 1, len(ps.beats) - 1)
    return outputs(replace(ps, i=i, playing=i < len(ps.beats) - 1))


CONTROLS = {"play": play, "pause": pause, "back": step_back, "forward": step_forward}  # the buttons, in order


# ------------------------------------------------------------------ the race tab's player
def busiest(steps: list) -> int:
    """The 1-based pass that committed the most tokens (the earliest on a tie): a pass worth watching."""
    return max(range(len(steps)), key=lambda k: (len(steps[k].new_tokens), -k), default=0) + 1


def pass_slider(n: int, value: int) -> Any:  # over a run's n target passes (Gradio needs max > min)
    return gr.update(minimum=1, maximum=max(n, 2), value=value, step=1, interactive=n > 1)


def race_choices(session: Session | None) -> tuple:
    """After a race (or Clear): the lane dropdown, the pass slider (the last lane's busiest), that pass loaded."""
    race = session.latest if session is not None else None
    lanes = list(race.results) if race is not None else []
    lane = lanes[-1] if lanes else None  # the last raced: the fullest pyramid
    return gr.update(choices=[(METHOD_LABELS.get(m, m), m) for m in lanes], value=lane), *pick_lane(session, lane)


def pick_lane(session: Session | None, lane: str | None) -> tuple:
    """A lane was chosen in the race tab: its busiest pass, loaded: (pass slider, state, HTML, timer)."""
    race = session.latest if session is not None else None
    r = race.results.get(lane) if race is not None and lane else None
    k = busiest(r.steps) if r is not None else 1
    return (pass_slider(len(r.steps) if r is not None else 1, k), *show(session, None, lane, k))


# ------------------------------------------------------------------ the beat as HTML
def _chip(c: Chip, lit: bool, committed: bool = False) -> str:
    """One token chip: origin colours while unjudged (and in the committed text), status colours once judged."""
    cls = f"o-{c.origin}" if committed or c.state == PROPOSED else f"st-{c.state}"
    tip = c.origin if committed else f"{c.origin} · {c.state}"
    out = render.chip(c.text, cls, tip, strike=not committed and c.state in ("rejected", "discarded"))
    return f'<span style="{LIT}">{out}</span>' if lit else out


def _cell(beat: Beat, i: int) -> str:
    mark = playback.mark(beat, i)
    colour = {"✓": "#009E73", "✗": "#D55E00", "+": "#CC79A7"}.get(mark, "#9e9e9e")
    return (
        f'<span style="display:inline-flex;flex-direction:column;align-items:center;margin:0 3px">'
        f'{_chip(beat.chips[i], i in beat.lit)}<span style="font-size:.85rem;color:{colour};min-height:1.1em">'
        f"{mark}</span></span>"
    )


def round_html(beat: Beat) -> str:
    """The round's tokens out so far: a chain in one line, a tree indented under its parents; the own token last."""
    ps = list(beat.parents)
    n = len(ps)
    if rules.is_chain(ps):
        cells = [_cell(beat, i) for i in range(n + 1) if i < len(beat.chips) and beat.chips[i].state != HIDDEN]
        return (
            f'<div style="{render.FONT}font-size:1.1rem;display:flex;flex-wrap:wrap;align-items:flex-start">'
            f"{''.join(cells)}</div>"
        )
    kids, depth = rules.children(ps), rules.depths(ps)
    rows: list[str] = []

    def visit(c: int) -> None:
        for i in kids[c]:
            if beat.chips[i].state != HIDDEN:
                pad = 1.6 * (depth[i] - 1)
                rows.append(
                    f'<div style="padding-left:{pad}em;line-height:1.5"><span style="color:#aaa">└ </span>'
                    f"{_cell(beat, i)}</div>"
                )
            visit(i + 1)

    visit(0)
    if n < len(beat.chips) and beat.chips[n].state != HIDDEN:
        rows.append(
            f'<div style="line-height:1.5"><span style="color:#555;font-size:.9rem">the verifier\'s own token: '
            f"</span>{_cell(beat, n)}</div>"
        )
    return f'<div style="{render.FONT}font-size:1.05rem">{"".join(rows)}</div>'


def counter_line(label: str, i: int, n: int, playing: bool) -> str:
    """The line over a beat: which pass, which beat of how many, playing or paused (`race_page.JS` writes the same)."""
    return (
        f'<div class="play-counter" style="color:#555;font-size:.9rem">{html.escape(label)} · '
        f"<b>beat {i + 1} / {n}</b> · {'▶ playing' if playing else '❚❚ paused'}</div>"
    )


def beat_body(beat: Beat) -> str:
    """One beat under its counter line: the round's title, its tokens, the sentence and the text committed so far."""
    title = f'<div style="font-weight:600;margin:4px 0">{html.escape(beat.title)}</div>'
    committed = "".join(_chip(c, False, True) for c in beat.committed) or '<span style="color:#999">nothing yet</span>'
    sentence = (
        f'<div class="beat-sentence" style="font-size:1.15rem;margin:10px 0;padding:6px 10px;'
        f'background:#f6f6f6;border-radius:6px">{html.escape(beat.sentence)}</div>'
    )
    body = round_html(beat) if beat.round >= 0 else ""
    return (
        f'{title}{body}{sentence}<div style="font-size:.95rem;color:#333">committed this pass: '
        f'<span style="{render.FONT}">{committed}</span></div>'
    )


def beat_html(ps: PlayState) -> str:
    """The beat shown: its counter line over its body, with the chip styles."""
    if not ps.beats:
        return render.message_html(ps.message)
    i = max(0, min(ps.i, len(ps.beats) - 1))
    head = counter_line(ps.label, i, len(ps.beats), ps.playing)
    return f'{render.STYLE}<div class="play" style="padding:6px 4px">{head}{beat_body(ps.beats[i])}</div>'

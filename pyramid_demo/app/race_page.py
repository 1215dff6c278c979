"""A visitor's races as one self-contained HTML file that opens offline in any current browser: the lanes replayed
(`race_view.JS`), verdicts and tables, and any target pass beat by beat (`play_view.beat_body`, gzip-compressed)."""

from __future__ import annotations

import base64
import gzip
import html
import json

from ..core.methods import METHOD_LABELS
from . import play_view, playback, race_view, render, story
from .races import Race, Session
from .text import BUTTONS, RACE_COLUMNS

CSS = """
body {font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; background: #f4f5f7;
  color: #111; font-size: 17px}
main {max-width: 1200px; margin: 0 auto; padding: 12px 16px 40px}
h1 {font-size: 1.5rem; margin: 8px 0 2px} h2 {font-size: 1.2rem; margin: 18px 0 6px}
section.race {background: #fff; border-radius: 8px; padding: 8px 14px 14px; margin: 14px 0;
  box-shadow: 0 1px 3px rgba(0,0,0,.1)}
.verdict {font-size: 1.1rem; margin: 6px 0}
.table-box {overflow-x: auto; margin: 8px 0}
table {border-collapse: collapse; font-size: .92rem}
th, td {border-bottom: 1px solid #e3e3e3; padding: 3px 8px; text-align: left; overflow-wrap: normal;
  word-break: normal; white-space: nowrap}
th {background: #f2f2f2}
ul.verdicts {margin: 4px 0 8px; padding-left: 1.2em; font-size: .95rem; color: #333}
.player {border-top: 1px solid #eee; margin-top: 10px; padding-top: 6px}
.player .controls {display: flex; flex-wrap: wrap; gap: 8px; align-items: center; margin: 6px 0}
.player button {padding: 2px 10px; border: 1px solid #bbb; border-radius: 4px; background: #fff; font-size: .95rem}
.player button.play {background: #f97316; color: #fff; border-color: #ea580c}
.player input[type=range] {width: 260px}
.muted {color: #666; font-size: .9rem}
"""

JS = """
function replayIn(element, watch) {
%(replay)s
}
document.querySelectorAll('section.race').forEach(sec => replayIn(sec, () => {}));

const PACE_MS = %(pace_ms)d;
function counter(label, i, n, playing) {  // play_view.counter_line, the same words
  const b = document.createElement('b');
  b.textContent = 'beat ' + (i + 1) + ' / ' + n;
  const d = document.createElement('div');
  d.className = 'play-counter';
  d.style.cssText = 'color:#555;font-size:.9rem';
  d.append(label + ' · ', b, ' · ' + (playing ? '▶ playing' : '❚❚ paused'));
  return d;
}
function player(root, race) {
  const lane = root.querySelector('.lane-pick'), pass = root.querySelector('.pass-pick'),
    shown = root.querySelector('.pass-no'), view = root.querySelector('.beat');
  const P = {beats: [], i: 0, timer: 0, label: ''};
  function draw() {
    view.replaceChildren(counter(P.label, P.i, P.beats.length, !!P.timer));
    view.insertAdjacentHTML('beforeend', P.beats[P.i]);
    root.dataset.beat = P.i + 1;
  }
  function halt() { clearInterval(P.timer); P.timer = 0; }
  function load() {
    halt();
    const L = race.lanes[lane.value], k = Math.min(Math.max(+pass.value, 1), L.passes.length);
    pass.max = Math.max(L.passes.length, 1);
    shown.textContent = k + ' of ' + L.passes.length;
    P.beats = L.passes[k - 1]; P.i = 0;
    P.label = 'Race ' + race.n + ' · ' + L.label + ' · target pass ' + k + ' of ' + L.passes.length;
    draw();
  }
  function tick() {
    P.i = Math.min(P.i + 1, P.beats.length - 1);
    if (P.i >= P.beats.length - 1) halt();
    draw();
  }
  const act = {
    play() {
      halt();
      if (P.i >= P.beats.length - 1) P.i = 0;
      if (P.i < P.beats.length - 1) P.timer = setInterval(tick, PACE_MS);
      draw();
    },
    pause() { halt(); draw(); },
    back() { halt(); P.i = Math.max(0, P.i - 1); draw(); },
    forward() { halt(); P.i = Math.min(P.i + 1, P.beats.length - 1); draw(); },
  };
  root.querySelectorAll('[data-act]').forEach(b => b.addEventListener('click', () => act[b.dataset.act]()));
  lane.addEventListener('change', () => { pass.value = race.lanes[lane.value].busiest; load(); });
  pass.addEventListener('input', load);
  lane.value = race.start; pass.value = race.lanes[race.start].busiest;
  load();
}
(async () => {
  const box = document.getElementById('beats');
  try {
    const bytes = Uint8Array.from(atob(box.textContent.trim()), c => c.charCodeAt(0));
    const text = await new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'))).text();
    const data = JSON.parse(text);
    document.querySelectorAll('.player').forEach(p => player(p, data[p.dataset.race]));
  } catch (e) {
    document.querySelectorAll('.player .beat').forEach(v => v.textContent =
      'This browser cannot unpack the recorded passes (it needs DecompressionStream: Chrome 80, Firefox 113, ' +
      'Safari 16.4 or newer); the lanes above still replay.');
  }
})();
"""


def _cell(x: object) -> str:
    return "—" if x is None or x == "" else html.escape(str(x))


def table_html(race: Race) -> str:
    """The race's results table (the app's columns and rows: `race_view.race_rows`)."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in RACE_COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(x)}</td>" for x in row) + "</tr>" for row in race_view.race_rows([race])
    )
    return f'<div class="table-box"><table class="results"><tr>{head}</tr>{body}</table></div>'


def verdicts_html(race: Race) -> str:
    """Each lane's verdict against AR as the Statistics tab words it, a line each under the table."""
    items = "".join(
        f"<li><b>{html.escape(METHOD_LABELS.get(row['method'], row['method']))}</b>: {render.bold(row['verdict'])}</li>"
        for row in story.rows(race.results, race.profile, race.repeats)
    )
    return f'<ul class="verdicts">{items}</ul>' if items else ""


def passes(race: Race) -> dict:
    """What the player needs of a race: per lane its label, busiest pass and each pass's beats as HTML."""
    decode = play_view.decoder(race)
    lanes = {
        m: {
            "label": METHOD_LABELS.get(m, m),
            "busiest": play_view.busiest(r.steps),
            "passes": [[play_view.beat_body(b) for b in playback.beats(step, decode)] for step in r.steps],
        }
        for m, r in race.results.items()
        if r.steps
    }
    return {"n": race.n, "start": list(lanes)[-1] if lanes else "", "lanes": lanes}


def _player_html(race: Race, lanes: dict) -> str:
    options = "".join(f'<option value="{html.escape(m)}">{html.escape(v["label"])}</option>' for m, v in lanes.items())
    buttons = "".join(
        f'<button data-act="{act}" class="{act}">{html.escape(BUTTONS[act])}</button>' for act in play_view.CONTROLS
    )
    return (
        f'<div class="player" data-race="{race.n}"><b>▶ Play a target pass</b> '
        f'<span class="muted">beat by beat, as the app plays it</span><div class="controls">'
        f'<label>Lane <select class="lane-pick">{options}</select></label><label>Target pass '
        f'<input class="pass-pick" type="range" min="1" max="2" value="1" step="1"></label>'
        f'<span class="pass-no"></span>{buttons}</div><div class="beat play" style="padding:6px 4px"></div></div>'
    )


def race_section(race: Race, lanes: dict) -> str:
    """One race: its prompt, verdict, replayed lanes, results table with the verdicts, and its pass player."""
    return (
        f'<section class="race" id="race-{race.n}"><h2>Race {race.n} · {html.escape(race.preset)}</h2>'
        f'<div class="muted">Prompt: {html.escape(race.prompt)}</div>'
        f'<div class="verdict">{render.bold(race_view.winner_line(race).strip())}</div>'
        f"{race_view.race_lanes(race, True)}{table_html(race)}{verdicts_html(race)}"
        f"{_player_html(race, lanes) if lanes else ''}</section>"
    )


def page(session: Session) -> str:
    """The whole file: every race of the session, newest first, each replaying on its own."""
    races = [r for r in session.races if r.results][::-1]
    data = {r.n: passes(r) for r in races}
    packed = base64.b64encode(gzip.compress(json.dumps(data).encode("utf-8"), mtime=0)).decode("ascii")
    sections = "".join(race_section(r, data[r.n]["lanes"]) for r in races)
    n = len(races)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>PyramidSD Explorer · {n} race{'s' if n != 1 else ''}</title><style>{CSS}</style>{render.STYLE}"
        f'</head><body><main><h1>▲ PyramidSD Explorer</h1><div class="muted">{n} race{"s" if n != 1 else ""}, '
        "newest first. Each lane replays at the times its method produced its tokens; ↺ Replay starts again, "
        "the speed buttons slow it down. Below each race, ▶ Play walks through one target pass.</div>"
        f'{sections}</main><script id="beats" type="application/octet-stream">{packed}'
        f"</script><script>{JS % {'replay': race_view.JS, 'pace_ms': round(1000 * play_view.PACE_S)}}</script>"
        "</body></html>"
    )

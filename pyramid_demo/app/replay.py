"""The race replayed in the browser, each token at the time its method produced it: the lanes' HTML carries the times
(`render.token_times`, data-end) and `JS` animates them on the visitor's clock, no server round trip per frame."""

from __future__ import annotations

import html

SPEEDS = (("×1", 1.0), ("×½", 0.5), ("×¼", 0.25))  # the replay's pace against the measured clock

JS = """
const S = {speed: 1, pos: 0, last: 0, raf: 0, lanes: [], root: null};
function show(L) {  // reveal the lane's chips due by now; its live counter; done at its finish line
  while (L.n < L.chips.length && +L.chips[L.n].dataset.t <= S.pos) L.chips[L.n++].classList.add('on');
  const t = Math.min(S.pos, L.end);
  if (L.live) L.live.textContent = L.n + ' tokens · ' + (t > 0 ? L.n / t : 0).toFixed(1) + ' tok/s';
  return L.el.classList.toggle('done', S.pos >= L.end);
}
function frame(now) {
  S.pos += Math.max(0, now - S.last) / 1000 * S.speed;
  S.last = now;
  const done = S.lanes.map(show).every(Boolean), clock = S.root.querySelector('.clock');
  if (clock) clock.textContent = S.pos.toFixed(2) + ' s';
  if (done) S.root.classList.remove('playing'); else S.raf = requestAnimationFrame(frame);
}
function start() {
  cancelAnimationFrame(S.raf);
  S.root = element.querySelector('.replay');
  if (!S.root) return;
  S.lanes = [...S.root.querySelectorAll('.lane[data-end]')].map(el => ({el, n: 0, end: +el.dataset.end,
    live: el.querySelector('.live'), chips: [...el.querySelectorAll('.tok[data-t]')]}));
  S.root.querySelectorAll('.tok.on, .lane.done').forEach(x => x.classList.remove('on', 'done'));
  S.root.querySelectorAll('[data-speed]').forEach(b => b.classList.toggle('on', +b.dataset.speed === S.speed));
  S.root.classList.add('playing');
  [S.pos, S.last, S.raf] = [0, performance.now(), requestAnimationFrame(frame)];
}
element.addEventListener('click', e => {
  const b = e.target.closest('[data-speed]');
  if (b) element.querySelectorAll('[data-speed]').forEach(x => x.classList.toggle('on', x === b));
  if (b) S.speed = +b.dataset.speed;
  if (e.target.closest('[data-replay]')) start();
});
watch('value', start);
start();
"""


def controls(n_repeats: int, machine: str) -> str:
    """The line above a replayed race: what it shows, its speed buttons and the replay's clock."""
    buttons = "".join(f'<button data-speed="{v:g}" class="{"on" if v == 1 else ""}">{k}</button>' for k, v in SPEEDS)
    said = (
        f"▶ Replaying measured timings: each token appears when its method produced it (each lane's median run "
        f"of {n_repeats}, prefill excluded), timed on {machine or 'this machine'} with nothing drawn meanwhile."
    )
    return (
        f'<div class="replay-bar" style="color:#444;font-size:.92rem;margin:4px 0">{html.escape(said)} '
        f'<span style="white-space:nowrap">Speed {buttons}<button data-replay="1">↺ Replay</button> '
        f'<span class="clock" style="font-family:monospace"></span></span></div>'
    )

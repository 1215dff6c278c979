"""The app's event handlers: plain functions, testable without a browser; a visitor's `Session` is mutated in place."""

from __future__ import annotations

import csv
import json
import logging
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import gradio as gr

from ..core.methods import DecodeConfig, lanes
from ..core.run import prepare_prompt, takes_trees
from ..core.settings import APP_SETTINGS, TUNABLE
from ..models.presets import PRESETS, family_config
from ..models.runtime import cpu_class
from ..models.warm import prepare
from . import family, hosting, inspector, race_page, races
from .race_view import before_race, full_outputs, race_rows, status_only, winner_line
from .race_view import earlier_lanes as earlier_lanes  # re-exported: app.py draws the page's first state
from .race_view import race_lanes as race_lanes
from .races import Race, Session
from .text import CUSTOM, DEFAULT, LABELS, MSG, RACE_COLUMNS, START

log = logging.getLogger(__name__)
MAX_RACES = 20  # per user; older races are dropped to bound a hosted app's memory
INT_SETTINGS = tuple(k for k in APP_SETTINGS if isinstance(getattr(DEFAULT, k), int))


def _notify(msg: str) -> str:
    """Show a toast in the page (a plain warning outside a request) and return the message for the status line."""
    gr.Warning(msg)
    return f"⚠️ {msg}"


# ------------------------------------------------------------------ controls
def preset_info(preset: str) -> tuple[str, str, Any]:
    """The family box (three short lines), the fold with its figures, and whether the custom id boxes show."""
    if preset == CUSTOM:
        return family.CUSTOM_BOX, family.CUSTOM_FOLD, gr.update(visible=True)
    return (*family.texts(preset), gr.update(visible=False))


def preset_settings(preset: str) -> tuple:
    """Widget updates that reset the tunable settings (`TUNABLE` order) to the family's."""
    cfg = family_config(preset)
    return tuple(gr.update(value=getattr(cfg, k)) for k in TUNABLE)


def model_spec(preset: str, draft: str, qualifier: str, target: str) -> str:
    """The loader's spec: a preset name, or "draft,qualifier,target" for a custom family."""
    if preset != CUSTOM:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}")
        return preset
    ids = [(x or "").strip() for x in (draft, qualifier, target)]
    if not all(ids):
        raise ValueError(MSG["custom_missing"])
    return ",".join(ids)


def make_config(**settings: Any) -> DecodeConfig:
    """A DecodeConfig from widget values (sliders send floats; ints are cast only when whole)."""
    return DecodeConfig(
        **{
            k: int(v) if k in INT_SETTINGS and isinstance(v, float) and v.is_integer() else v
            for k, v in settings.items()
        }
    )


# ------------------------------------------------------------------ race
def _learn_vocab(race: Race, tokenizer: Any) -> None:
    """Decode every id the shown runs hold (tokens and top-5) so the inspector never needs the tokenizer."""
    ids: set[int] = set()
    for step in (s for r in race.results.values() for s in r.steps):
        ids.update(step.new_tokens)
        for t in (t for rnd in step.rounds for t in rnd.tokens):
            ids.add(t.token_id)
            ids.update(int(i) for pairs in t.top5.values() for i, _ in pairs)
    for i in ids - race.vocab.keys():
        race.vocab[i] = tokenizer.decode([i])


_RACING = [0]  # races holding the models now, every visitor's (a race is timed alone: the queue lets one run)
_RACING_LOCK = threading.Lock()


def queue_line() -> Any:
    """The status line a visitor reads at once when their race must wait for another to finish (no change else)."""
    with _RACING_LOCK:
        return MSG["queued"] if _RACING[0] else gr.skip()


def _show_stages(staged: Iterator, session: Session, progress: gr.Progress) -> Any:
    """Show each stage's status and progress while `staged` (`races.run_staged`) runs; return its result."""
    while True:
        try:
            text, frac, _ = next(staged)
        except StopIteration as done:
            return done.value
        progress(frac, desc=text)
        yield status_only(text, session)


def race_event(
    prompt: str,
    preset: str,
    draft: str | None = None,
    qualifier: str | None = None,
    target: str | None = None,
    session: Session | None = None,
    progress: gr.Progress = gr.Progress(),
    side_by_side: bool = False,
    qualifier_alone: bool = False,
    **settings: Any,
) -> Iterator[tuple]:
    """The public `/race` endpoint and the Run button; `settings`: DecodeConfig fields by name (left out: the page's
    first values). Times every lane with nothing drawn (`races.decode`), then replays the race; yields (status, lanes,
    chart, table, earlier, session). Stop is cooperative (`session.stop`): cancelling the event would race a late
    snapshot."""
    session = session if session is not None else Session()
    settings = {**START_SETTINGS, **settings}
    race_lanes_ = lanes(bool(side_by_side), bool(qualifier_alone))
    try:  # on ZeroGPU the whole race must fit one allocation: cut the tokens, say so
        settings["max_new_tokens"], cut = hosting.fit_race(preset, len(race_lanes_), int(settings["max_new_tokens"]))
    except (TypeError, ValueError):
        cut = ""  # make_config reports the bad value
    budget_note = _notify(cut) if cut else ""
    session.stop, session.busy = False, True
    with _RACING_LOCK:
        _RACING[0] += 1
    try:
        from ..models.loading import LoadError, load_triplet

        try:
            spec = model_spec(preset, draft, qualifier, target)
            base = make_config(**settings)
        except (ValueError, TypeError) as e:
            yield status_only(_notify(MSG["bad_settings"].format(err=e)), session)
            return
        if not (prompt or "").strip():
            yield status_only(
                _notify(MSG["bad_prompt"].format(err="the prompt is empty: type a question or instruction")), session
            )
            return
        loading = MSG["loading"].format(preset=preset)
        yield status_only(loading, session)
        progress(0.0, desc=loading)
        t0 = time.perf_counter()

        def load() -> tuple:
            triplet = load_triplet(spec, **hosting.placement_options(), max_len=512 + int(base.max_new_tokens) + 32)
            return triplet, prepare_prompt(triplet, prompt, base), time.perf_counter() - t0  # encoded once for all

        try:  # the one-time stages, named as they happen (converting, loading, warming)
            staged = races.run_staged(load, lambda: races.loading_stage(preset))
            triplet, ids, load_s = yield from _show_stages(staged, session, progress)
            chains = tuple(lane for lane in race_lanes_ if lane.shape != "tree" or takes_trees(triplet, lane.method))
            if len(chains) < len(race_lanes_):  # side by side over models that take no tree: the chains race alone
                budget_note = " ".join(x for x in (budget_note, MSG["chains_only"]) if x)
                race_lanes_ = chains
            upcoming = Race(
                n=session.next,
                preset=preset,
                models=list(triplet.names),
                prompt=prompt,
                config=base.to_dict(),
                lanes=tuple(lane.key for lane in race_lanes_),
            )
            kept = session.races[-(MAX_RACES - 1) :]
            again = session.latest if races.same_work(session.latest, upcoming) else None
            if again is None:  # a new race: its empty lanes drawn as the models warm (Race again keeps what is shown)
                yield before_race(session, upcoming, kept, loading)
            staged = races.run_staged(lambda: prepare(triplet, ids), lambda: "warm")
            prep = yield from _show_stages(staged, session, progress)  # warm-up and cost profile, before any clock
        except ValueError as e:
            yield status_only(_notify(MSG["bad_prompt"].format(err=e)), session)
            return
        except Exception as e:  # a LoadError, or an unexpected loader failure: it must not take the page down
            if not isinstance(e, LoadError):
                log.exception("loading %s failed", spec)
            yield status_only(_notify(MSG["load_failed"].format(err=e)), session)
            return
        if session.stop:  # Stop or Clear while the models loaded
            yield full_outputs(session, MSG["stopped_early"])
            return
        race = again or replace(upcoming, profile=prep["profile"], machine=triplet.machine or cpu_class())
        race.stopped = False
        race.note = " ".join(x for x in (triplet.note, budget_note) if x)
        if not triplet.exact:
            why = MSG["why_unchecked" if triplet.exact is None else "why_inexact"]
            race.exact_note = MSG["not_exact"].format(why=why)
        else:
            race.exact_note = MSG["trees_not_exact"] if triplet.tree_exact is False else ""
        race.setup = MSG["setup"].format(load=load_s, warm=prep["warm_s"])
        if again is None:
            if session.latest is not None:
                races.slim(session.latest)
            session.next += 1
            session.races = kept + [race]
        try:  # the page hears only a progress line between lanes; it replays the records once they are all in
            repeats = 1 if hosting.on_zerogpu() else None
            for i, line in enumerate(
                races.decode(triplet, ids, race, race_lanes_, base, lambda: session.stop, repeats)
            ):
                progress(min(0.95, i / (1 + races.MAX_REPEATS * len(race_lanes_))), desc=line)
                yield status_only(line, session)
        except Exception as e:  # keep serving: report, keep what ran, stop this race
            log.exception("race %s failed", race.n)
            _learn_vocab(race, triplet.tokenizer)
            yield full_outputs(session, _notify(MSG["run_failed"].format(err=e)))
            return
        _learn_vocab(race, triplet.tokenizer)
        if session.stop:
            race.stopped = True
            shown = any(r is race for r in session.races)  # not after Clear
            yield full_outputs(session, MSG["stopped"].format(n=race.n) if shown else MSG["cleared"])
            return
        hosting.record(preset, race.results)  # the next race's ZeroGPU budget uses this family's speed
        yield full_outputs(session, MSG["done"].format(n=race.n, k=len(race.repeats)) + winner_line(race))
    finally:
        session.busy = False
        with _RACING_LOCK:
            _RACING[0] -= 1


def stop_race(session: Session) -> tuple:
    """Ask a running race to stop after its current target pass; its partial results stay."""
    if session.busy:
        session.stop = True
        return status_only(MSG["stopping"], session)
    race = session.latest
    if race is None:
        return full_outputs(session, MSG["idle"])
    return full_outputs(session, MSG["stopped" if race.stopped else "done"].format(n=race.n, k=len(race.repeats)))


def clear_results(session: Session) -> tuple:
    """Forget this user's races; during a race, stop it and empty the session in place (no late update refills it)."""
    if session.busy:
        session.stop = True
        session.races, session.next = [], 1
        return full_outputs(session, MSG["cleared"])
    return full_outputs(Session(), MSG["cleared"])


# ------------------------------------------------------------------ export
def export_files(session: Session) -> tuple[str | None, str | None, str | None]:
    """The trace (JSON), the race table (CSV) and the races' web page (HTML), in this visitor's own folder."""
    if not session.races:
        _notify(MSG["no_race"])
        return None, None, None
    session.exports = session.exports or tempfile.TemporaryDirectory(prefix="pyramid_demo_")  # removed with it
    folder = Path(session.exports.name)
    trace = [
        {
            "race": r.n,
            "preset": r.preset,
            "models": r.models,
            "prompt": r.prompt,
            "config": r.config,
            "results": {m: inspector.result_export(res) for m, res in r.results.items()},
        }
        for r in session.races
    ]
    jpath, cpath = folder / "pyramid_trace.json", folder / "pyramid_race_results.csv"
    jpath.write_text(json.dumps(trace), encoding="utf-8")
    with cpath.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["race", "preset", "prompt", *RACE_COLUMNS[1:]])
        w.writerows([r.n, r.preset, r.prompt, *row[1:]] for r in session.races for row in race_rows([r]))
    hpath = folder / "pyramid_race.html"
    hpath.write_text(race_page.page(session), encoding="utf-8")
    return str(jpath), str(cpath), str(hpath)


def page_label(path: str | None) -> Any:
    """The web page's download label with its size (a teacher checks it fits a message or a stick)."""
    if not path:
        return gr.update(label=LABELS["race_page"])
    size = Path(path).stat().st_size
    shown = f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.0f} kB"
    return gr.update(label=f"{LABELS['race_page']} · {shown}")


START_SETTINGS = {k: getattr(START, k) for k in APP_SETTINGS}  # the page's first values, the API's defaults

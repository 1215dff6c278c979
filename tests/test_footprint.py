"""How much of the project one decode, and one race from the page's handler, runs: the decoding loop is small on
purpose. Counted with a profiler around `engine.decode` (from the first target pass to the last; loading, prefill and
the run's summary are not the decode) and around the whole race handler: every project file one of whose functions
is called, and every project class one of whose methods is."""

import os
import sys

import pytest

import pyramid_demo
from pyramid_demo.core import engine
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.run import generate

ROOT = os.path.dirname(os.path.abspath(pyramid_demo.__file__))
LIMIT = 9  # project files, and project classes, one decode of SD or PSD_A may touch (the core's linears included)


def footprint(triplet, method: str, monkeypatch) -> tuple[set[str], set[str]]:
    """(files, classes) one decode of `method` runs, counted as the module docstring says."""
    files: set[str] = set()
    classes: set[str] = set()

    def prof(frame, event, arg) -> None:
        if event != "call":
            return
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(ROOT):
            files.add(os.path.relpath(path, ROOT))
            head = frame.f_code.co_qualname.split(".")[0]
            if isinstance(frame.f_globals.get(head), type):
                classes.add(head)

    real = engine.decode

    def traced(*args, **kw):
        steps = real(*args, **kw)
        while True:
            sys.setprofile(prof)
            try:
                step = next(steps)
            except StopIteration:
                return
            finally:
                sys.setprofile(None)
            yield step

    monkeypatch.setattr(engine, "decode", traced)
    generate(
        triplet,
        [5, 17, 42, 99, 7],
        DecodeConfig(method=method, max_new_tokens=12, shape="chain", stage2="sd"),
        chat=False,
    )
    return files, classes


@pytest.mark.parametrize("method", ["sd", "psd_a"])
def test_a_decode_touches_few_files_and_classes(method, monkeypatch, one_thread):
    """One decode of SD or PSD_A on the core forward runs at most 9 project files and 9 project classes, and the
    count sees the loop itself (a profiler that saw nothing would pass any limit)."""
    from pyramid_demo.models.tiny import tiny_random_triplet

    files, classes = footprint(tiny_random_triplet(), method, monkeypatch)
    assert {"core/engine.py", "forward/core.py"} <= files and "CoreLM" in classes
    assert len(files) <= LIMIT, sorted(files)
    assert len(classes) <= LIMIT, sorted(classes)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sd", "psd_a"])
def test_the_offline_family_decode_touches_few_files_and_classes(method, offline_cache, monkeypatch):
    """The offline family as users run it after setup (the feature draft over the qualifier, the int4 qualifier
    and the target on their compiled passes, built here where missing as `prepare` builds them): one decode of SD or
    PSD_A runs at most 9 project files and 9 project classes."""
    from pyramid_demo.models import runtime
    from pyramid_demo.models.loading import load_triplet, planned

    t = load_triplet("smollm2-offline")
    notes = {role: runtime.ensure_package(t.model(role)) for role in ("target", "qualifier")}
    t = planned(t)
    assert t.forwards == {"draft": "feature", "qualifier": "compiled", "target": "compiled"}, (notes, t.runs)
    files, classes = footprint(t, method, monkeypatch)
    assert "FeatureLM" in classes and "CoreLM" in classes
    assert len(files) <= LIMIT, sorted(files)
    assert len(classes) <= LIMIT, sorted(classes)


RACE_FILES, RACE_CLASSES = 20, 20  # one race from its handler down


def race_footprint(preset: str) -> tuple[set[str], set[str], str]:
    """(files, classes, status) of one whole race from the page's handler (`handlers.race_event`): its family already
    loaded (a first race loads it), then the warm-up, the timed lanes, the predictions and the replay's pages."""
    from app_server import FAST

    from pyramid_demo.app import handlers as h
    from pyramid_demo.app.races import Session

    list(h.race_event("Name three colours.", preset, "", "", "", Session(), **FAST))
    files: set[str] = set()
    classes: set[str] = set()

    def prof(frame, event, arg) -> None:
        if event == "call" and os.path.abspath(frame.f_code.co_filename).startswith(ROOT):
            files.add(os.path.relpath(os.path.abspath(frame.f_code.co_filename), ROOT))
            head = frame.f_code.co_qualname.split(".")[0]
            if isinstance(frame.f_globals.get(head), type):
                classes.add(head)

    sys.setprofile(prof)
    try:
        out = list(h.race_event("Name three colours of the rainbow.", preset, "", "", "", Session(), **FAST))
    finally:
        sys.setprofile(None)
    return files, classes, str(out[-1][0])


@pytest.mark.slow
def test_a_race_from_its_handler_touches_few_files_and_classes(one_thread):
    """One race on the tiny family, profiled over the whole handler, runs at most 20 project files and 20 project
    classes, and the count sees the handler, the loop and the forward (a profiler that saw nothing would pass)."""
    files, classes, status = race_footprint("tiny-random")
    assert "finished" in status, status
    assert {"app/handlers.py", "core/engine.py", "forward/core.py"} <= files and "CoreLM" in classes
    assert len(files) <= RACE_FILES, sorted(files)
    assert len(classes) <= RACE_CLASSES, sorted(classes)


@pytest.mark.slow
def test_the_offline_familys_race_from_its_handler_touches_few_files_and_classes(offline_cache, one_thread):
    """The same over the offline family as users race it after setup (the feature draft, the int4 qualifier and the
    target on their compiled passes, built here where missing as `prepare` builds them, then loaded afresh)."""
    from helpers import clear_loaded

    from pyramid_demo.models import runtime
    from pyramid_demo.models.loading import load_triplet, loaded

    t = load_triplet("smollm2-offline")
    for role in ("target", "qualifier"):
        runtime.ensure_package(t.model(role))
    clear_loaded()  # the handler's load plans the packages, as a page started after setup does
    files, classes, status = race_footprint("smollm2-offline")
    assert loaded("smollm2-offline").forwards == {"draft": "feature", "qualifier": "compiled", "target": "compiled"}
    assert "finished" in status, status
    assert "FeatureLM" in classes and "CoreLM" in classes
    assert len(files) <= RACE_FILES, sorted(files)
    assert len(classes) <= RACE_CLASSES, sorted(classes)

"""The first race names its one-time stages as they happen, with progress, instead of a silent 0.0 %."""

from __future__ import annotations

import time

import pytest

from pyramid_demo.app import races


def test_the_stage_is_read_from_what_is_cached(monkeypatch):
    """Offline family: converting until the GGUF copy exists, then plain loading (nothing is probed on a
    visitor's request); any other family only loads."""
    from pyramid_demo.models import bundled

    monkeypatch.setattr(bundled, "is_converted", lambda: False)
    assert races.loading_stage("smollm2-offline") == "convert"
    assert races.loading_stage("tiny-random") == "load"
    monkeypatch.setattr(bundled, "is_converted", lambda: True)
    assert races.loading_stage("smollm2-offline") == "load"


def test_run_staged_reports_each_stage_then_returns_or_raises(monkeypatch):
    """While the work runs, each poll names the stage it is in with a progress below 1; the stage's clock
    restarts when the stage changes; the work's result comes back, and its exception is raised."""
    monkeypatch.setattr(races, "POLL_S", 0.05)
    state = {"stage": "convert"}

    def work():
        time.sleep(0.3)
        state["stage"] = "load"
        time.sleep(0.3)
        return 42

    gen = races.run_staged(work, lambda: state["stage"])
    seen = []
    while True:
        try:
            seen.append(next(gen))
        except StopIteration as done:
            assert done.value == 42
            break
    texts = [t for t, _, _ in seen]
    assert any("Converting" in t for t in texts) and any("Loading" in t for t in texts)
    assert all(0 <= f < 1 for _, f, _ in seen)
    first_load = next(f for t, f, _ in seen if "Loading" in t)
    assert first_load < 0.05  # a new stage starts its own clock

    def boom():
        raise ValueError("bad prompt")

    with pytest.raises(ValueError, match="bad prompt"):
        list(races.run_staged(boom, lambda: "load"))


def test_work_done_within_a_poll_names_no_stage():
    """Rule: work that ends before the first poll (a family already loaded) asks no stage and yields no status."""
    asked = []
    gen = races.run_staged(lambda: 7, lambda: asked.append(1) or "load")
    with pytest.raises(StopIteration) as done:
        next(gen)
    assert done.value.value == 7 and not asked

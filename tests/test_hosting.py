"""ZeroGPU budgets and the app's hosting hooks (no GPU and no `spaces` needed)."""

from __future__ import annotations

import sys
import warnings

import pytest
from app_server import FAST as APP_FAST

from pyramid_demo.app import handlers as h
from pyramid_demo.app import hosting
from pyramid_demo.app.races import Session
from pyramid_demo.app.text import RACE_METHODS
from pyramid_demo.core.settings import APP_SETTINGS

FAST = {**APP_FAST, "max_new_tokens": 400.0}


def test_budget_grows_with_methods_and_tokens_within_the_cap(monkeypatch):
    monkeypatch.setattr(hosting, "_MEASURED", {"smollm2-offline": 0.02, "x": 0.02})
    monkeypatch.setenv(hosting.CAP_ENV, "120")
    small = hosting.plan_budget("smollm2-offline", 5, 32)
    big = hosting.plan_budget("smollm2-offline", 5, 128)
    assert not small.message and not big.message and hosting.MIN_S <= small.duration_s < big.duration_s <= 120
    assert big.duration_s == pytest.approx(hosting.START_S + hosting.SAFETY * 5 * 128 * 0.02, abs=1)
    assert hosting.plan_budget("x", 1, 32).duration_s < small.duration_s


def test_too_long_a_race_is_cut_to_fit_with_a_message(monkeypatch):
    monkeypatch.setattr(hosting, "_MEASURED", {"llama3": 0.09})
    monkeypatch.setenv(hosting.CAP_ENV, "120")
    b = hosting.plan_budget("llama3", 5, 512)
    assert b.message and b.duration_s == 120 and b.max_new_tokens < 512
    assert hosting.START_S + hosting.SAFETY * 5 * b.max_new_tokens * 0.09 <= 120
    assert "512" in b.message and str(b.max_new_tokens) in b.message and "120 s" in b.message


def test_measured_speed_replaces_the_guess(monkeypatch):
    monkeypatch.setattr(hosting, "_MEASURED", {})
    assert hosting.per_token_s("tiny-random") == hosting.GUESS_S_PER_TOKEN["tiny-random"]

    class S:  # the RunStats fields record() reads
        n_new_tokens, decode_s, prefill_s = 10, 0.9, 0.1

    hosting.record("tiny-random", {"ar": type("R", (), {"stats": S})()})
    assert hosting.per_token_s("tiny-random") == pytest.approx(0.1)


def test_duration_reads_race_events_arguments(monkeypatch):
    """spaces.GPU calls the duration function with the decorated function's own arguments."""
    monkeypatch.setattr(hosting, "_MEASURED", {"tiny-random": 0.01})
    args = ("hello", "tiny-random", "", "", "", None, None)
    want = hosting.plan_budget("tiny-random", len(RACE_METHODS), 400).duration_s
    assert hosting.race_duration(*args, **{k: FAST[k] for k in APP_SETTINGS}) == want


def test_a_zerogpu_race_runs_every_method_in_one_call_and_is_cut_to_fit(monkeypatch, one_thread):
    """On ZeroGPU the whole race is the one decorated call; settings that cannot fit are cut (and said)."""
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setenv(hosting.CAP_ENV, "20")
    monkeypatch.setattr(hosting, "_MEASURED", {"tiny-random": 0.1})
    calls = []

    class FakeSpaces:
        @staticmethod
        def GPU(duration):
            def wrap(fn):
                def run(*a, **k):
                    calls.append(duration(*a, **k))
                    yield from fn(*a, **k)

                return run

            return wrap

    monkeypatch.setitem(sys.modules, "spaces", FakeSpaces)
    sys.modules.pop("app", None)
    import app

    session = Session()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        list(
            app._gpu(h.race_event)(
                "hello",
                "tiny-random",
                "",
                "",
                "",
                session,
                lambda *a, **k: None,
                **{k: FAST[k] for k in APP_SETTINGS},
            )
        )
    sys.modules.pop("app", None)
    race = session.races[-1]
    assert calls == [20] and set(race.results) == set(RACE_METHODS)  # one allocation, every method
    assert race.config["max_new_tokens"] < 400 and "cut from 400" in race.note


def test_placement_comes_from_space_variables(monkeypatch):
    monkeypatch.setenv("PYRAMID_DEMO_DEVICE_MAP", "auto")
    monkeypatch.delenv("PYRAMID_DEMO_QUANTIZE", raising=False)
    assert hosting.placement_options() == {"device_map": "auto", "quantize": None}


def test_family_box_shows_the_estimate_without_the_network():
    text = h.preset_info("tiny-random")[1]  # the fold under the family box
    assert "Estimate here" in text and "MB" in text
    assert "Estimate here" in h.preset_info("llama3")[1]  # unknown offline, but no error and no wait


def test_memory_line_uses_the_dtype_the_family_loads_in(monkeypatch):
    """Rule: the family box's memory estimate is in the dtype the family will load in: its reference precision on a
    CPU (float32, and only that: nothing probed may lower it), the device's default elsewhere (float16 on MPS)."""
    import torch

    from pyramid_demo.models import loading, memory

    cpu = hosting.memory_line("tiny-random")
    assert "in float32 for" in cpu and "bfloat16" not in cpu and "probe" not in cpu, cpu
    monkeypatch.setattr(loading, "pick_device", lambda device=None: torch.device("mps"))
    monkeypatch.setattr(memory, "available_bytes", lambda dev: None)
    mps = hosting.memory_line("tiny-random")
    assert "in float16 for" in mps and "(mps)" in mps, mps

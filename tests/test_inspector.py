"""The inspector's what-if re-checks recorded rounds with the engine's own rule, keyed by the records' data."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import leading_run
from mock_lm import BigramLM, as_run

from pyramid_demo.app import inspector
from pyramid_demo.core import rules
from pyramid_demo.core.engine import decode, roles_for
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.trace import StageRound, TokenRec

pytestmark = pytest.mark.usefixtures("one_thread")


def rounds(method: str, temperature: float, fallback: str, stop: float) -> list[StageRound]:
    g = torch.Generator().manual_seed(5)
    tables = {r: 2.0 * torch.randn(8, 8, generator=g) for r in ("draft", "qualifier", "target")}
    cfg = DecodeConfig(
        method=method,
        temperature=temperature,
        fallback=fallback,
        conf_stop=stop,
        tau_q=0.4,
        tau_t=0.5,
        gamma=4,
        l_d=3,
        l_q=6,
        max_new_tokens=60,
    )
    lms = {r: BigramLM(tables[r], r) for r in roles_for(method)}
    gen = torch.Generator().manual_seed(1) if temperature else None
    steps = list(decode(lms, [0], as_run(cfg), (), gen))
    return [r for s in steps for r in s.qualifier_rounds + [s.target_round] if r is not None]


@pytest.mark.parametrize("method", ["fsd", "psd_a", "psd_f"])
@pytest.mark.parametrize("temperature,fallback", [(0.0, "none"), (1.0, "none"), (1.0, "sd")])
@pytest.mark.parametrize("stop", [0.0, 0.5])
def test_a_round_rechecked_at_its_own_tau_keeps_its_count(method, temperature, fallback, stop):
    """The what-if at the τ a round was decided with gives the count the engine recorded, for every rule,
    fallback, and cut (a block's size or confidence cut keeps what it kept, whatever τ)."""
    taus = {"qualifier": 0.4, "target": 0.5}
    for rnd in rounds(method, temperature, fallback, stop):
        tau = inspector.round_tau(rnd, taus["qualifier"], taus["target"])
        assert inspector.reevaluate(rnd, tau) == rnd.n_accepted, f"{rnd.stage} {rnd.rule}: {rnd.tokens}"


def test_the_what_if_is_the_engines_fuzzy_test():
    """A fuzzy round's what-if is the leading run of `rules.fuzzy_passes` over the recorded divergences
    (τ 0 accepts none; Div = τ passes), not a second copy of the rule."""
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        divs = [round(float(v), 2) for v in torch.rand(5, generator=g)]
        toks = [TokenRec(i, "draft", "discarded", div=d, tau=0.5) for i, d in enumerate(divs)]
        rnd = StageRound("target", "draft", "target", "fuzzy", toks + [TokenRec(9, "target", "resampled")], 0)
        for tau in (0.0, divs[0], 0.3, 0.77):
            assert inspector.reevaluate(rnd, tau) == leading_run(rules.fuzzy_passes(divs, tau))


def test_the_what_if_reads_data_not_the_displayed_rule_name():
    """The displayed rule name is for people: renaming it changes nothing; the `exact` and `sd_fallback`
    fields decide (an exact round ignores τ; under the fallback an SD-accepted token still passes)."""
    toks = [
        TokenRec(1, "draft", "accepted", div=0.9, tau=0.5),
        TokenRec(2, "draft", "accepted", div=0.1, tau=0.5),
        TokenRec(3, "target", "bonus"),
    ]
    fb = StageRound("target", "draft", "target", "a display name", toks, 2, sd_fallback=True)
    assert inspector.reevaluate(fb, 0.5) == 2
    assert inspector.reevaluate(dataclasses.replace(fb, sd_fallback=False), 0.5) == 0
    exact = StageRound("target", "draft", "target", "another name", toks, 2, exact=True)
    assert inspector.reevaluate(exact, 0.05) == 2 and inspector.round_tau(exact, 0.4, 0.5) is None


def test_a_confidence_cut_round_keeps_what_it_kept_under_any_tau():
    """PSD_F, τ_Q 100 (every drafted token passes), conf_stop 0.5: the block ends after the qualifier's unsure
    second token, so the round kept 2 of 4 accepted. Re-checked at any τ it keeps at most those 2."""
    from test_records import chain, unsure_qualifier

    tables = {"draft": chain(), "qualifier": unsure_qualifier(), "target": chain()}
    cfg = DecodeConfig(method="psd_f", l_d=4, l_q=8, conf_stop=0.5, tau_q=100.0, max_new_tokens=4)
    lms = {r: BigramLM(tables[r], r) for r in roles_for("psd_f")}
    rnd = next(iter(decode(lms, [0], as_run(cfg), (), None))).qualifier_rounds[0]
    assert rnd.n_accepted == 2 and [t.status for t in rnd.tokens][:2] == ["accepted", "accepted"]
    for tau in (100.0, 0.5):
        assert inspector.reevaluate(rnd, tau) <= 2, "the what-if counted tokens the block's cut dropped"


def test_chart_names_come_from_the_short_names_not_the_labels(monkeypatch):
    """Display strings are data: the speed chart names a method by `METHOD_SHORT`, never by cutting its
    label at a space (a label reworded to start otherwise must not rename the bar)."""
    from pyramid_demo.app import charts
    from pyramid_demo.core.methods import METHOD_LABELS, METHOD_SHORT

    monkeypatch.setattr(charts, "METHOD_LABELS", {m: f"the {v}" for m, v in METHOD_LABELS.items()}, raising=False)
    fig = charts.throughput_figure([{"method": m, "measured": 1.0, "predicted": None} for m in ("ar", "psd_f")])
    assert list(fig.data[0].x) == [METHOD_SHORT["ar"], METHOD_SHORT["psd_f"]]

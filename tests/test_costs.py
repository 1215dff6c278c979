"""The cost profile (predict/costs.py), measured once and recorded (models/warm.py), and the load path that times
nothing."""

from __future__ import annotations

import pytest
import torch
from helpers import clear_loaded
from mock_lm import BigramLM, as_run, bigram_table

from pyramid_demo.core.engine import decode
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.trace import StageRound, Step, TokenRec
from pyramid_demo.predict import costs, expected, measure, walk_stats
from pyramid_demo.predict.expected import ar_speed, cost_ms

PROFILE = {
    "ms": {
        "draft": {str(k): 2.0 + 0.1 * k for k in range(1, 10)},
        "qualifier": {str(k): 6.0 + 0.5 * k for k in range(1, 10)},
        "target": {str(k): 20.0 + 2.0 * (k - 1) for k in range(1, 10)},
    }
}


def _round(stage: str, n: int, k: int) -> StageRound:
    toks = [TokenRec(1, "draft", "accepted" if i < k else "rejected" if i == k else "discarded") for i in range(n)]
    toks.append(TokenRec(2, "target", "bonus" if k == n else "resampled"))
    return StageRound(stage, "draft", stage, "sd", toks, k)


def _step(i: int, n: int, k: int, draft_fwd: int) -> Step:
    return Step(
        i,
        [],
        _round("target", n, k),
        [1] * (k + 1),
        ["draft"] * k + ["target"],
        0.0,
        0.0,
        {"draft": draft_fwd * 0.002, "target": 0.02},
        {"draft": draft_fwd, "target": 1},
        {"draft": [1] * draft_fwd, "target": [n + 1]},
    )


def test_summing_the_profile_over_a_known_trace():
    steps = [_step(0, 4, 4, 4), _step(1, 4, 1, 4), _step(2, 2, 0, 2)]
    p = costs.predict_run(steps, PROFILE)
    draft = 10 * cost_ms(PROFILE, "draft", 1)
    target = 2 * cost_ms(PROFILE, "target", 5) + cost_ms(PROFILE, "target", 3)
    assert p["per_role_s"]["draft"] == pytest.approx(draft / 1000)
    assert p["time_s"] == pytest.approx((draft + target) / 1000)
    assert p["tokens_per_s"] == pytest.approx(8 / ((draft + target) / 1000), rel=1e-3)
    ar = [Step(i, [], None, [1], ["target"], 0, 0, {"target": 0.02}, {"target": 1}, {"target": [1]}) for i in range(5)]
    assert costs.predict_run(ar, PROFILE)["tokens_per_s"] == pytest.approx(50.0)


def test_extrapolation_beyond_the_profile():
    prof = {"ms": {"target": {"1": 10.0, "2": 12.0}}}
    assert cost_ms(prof, "target", 4) == pytest.approx(16.0)
    assert cost_ms(prof, "target", 2) == 12.0


def _sd(profile: dict, gamma: int, alpha: float) -> float:
    return expected.round_speed(profile, gamma, (alpha,))["tokens_per_s"]


def test_break_even_is_where_the_predicted_speeds_cross():
    ar = ar_speed(PROFILE)
    be = costs.solve_alpha(lambda a: _sd(PROFILE, 4, a), ar)
    assert 0 < be < 1
    assert _sd(PROFILE, 4, be) == pytest.approx(ar, rel=1e-3)
    assert _sd(PROFILE, 4, be - 0.05) < ar < _sd(PROFILE, 4, be + 0.05)
    # by hand: E(α) = (4·2.1 + 28) / 20 = 1.82 tokens a round
    assert expected.round_speed(PROFILE, 4, (be,))["tokens_per_pass"] == pytest.approx((4 * 2.1 + 28) / 20, rel=1e-3)
    psd = costs.solve_alpha(lambda a: expected.pyramid_speed(PROFILE, 2, 8, 0.8, a), ar)
    assert expected.pyramid_speed(PROFILE, 2, 8, 0.8, psd) == pytest.approx(ar, rel=1e-3)
    slow = {"ms": {"draft": {"1": 30.0}, "target": {"1": 20.0, "5": 60.0}}}  # cannot pay
    assert costs.solve_alpha(lambda a: _sd(slow, 4, a), ar_speed(slow)) is None
    free = {"ms": {"draft": {"1": 0.0}, "target": {"1": 20.0, "5": 19.0}}}  # pays at any α
    assert costs.solve_alpha(lambda a: _sd(free, 4, a), ar_speed(free)) == 0.0


def test_method_model_and_verdict_from_a_trace():
    steps = [_step(0, 4, 4, 4), _step(1, 4, 1, 4), _step(2, 4, 0, 4)]
    m = costs.model_from_counts("sd", walk_stats.stage_counts(steps), {"gamma": 4}, PROFILE)
    assert m["alpha"] == pytest.approx(5 / 7, abs=1e-4)  # 5 accepted, 2 rejections
    assert m["lengths"] == {"gamma": 4} and 0 < m["break_even_alpha"] < 1
    assert costs.verdict("sd", m).startswith("wins" if m["alpha"] >= m["break_even_alpha"] else "loses")
    wins = m["alpha"] >= m["break_even_alpha"]
    agree, disagree = ((12.0, 10.0), (8.0, 10.0)) if wins else ((8.0, 10.0), (12.0, 10.0))
    assert "measured" in costs.verdict("sd", m, agree) and "not what the profile" not in costs.verdict("sd", m, agree)
    assert "not what the profile expects" in costs.verdict("sd", m, disagree)  # the run says otherwise
    assert "break_even_alpha" not in costs.model_from_counts("ar", walk_stats.stage_counts(steps), {}, PROFILE)
    assert walk_stats.alpha(walk_stats.counts([])) is None


def _counting(lm: BigramLM, log: list[int]) -> BigramLM:
    real = lm.forward

    def forward(tokens, pos, keep=None, parents=None):
        log.append(len(tokens))
        return real(tokens, pos, keep, parents)

    lm.forward = forward
    return lm


@pytest.mark.parametrize("method", ["ar", "sd", "psd_a"])
def test_recorded_forwards_match_what_the_engine_fed(method):
    """The target's and qualifier's forwards read from the records are the ones the engine made."""
    fed = {r: [] for r in ("draft", "qualifier", "target")}
    lms = {r: _counting(BigramLM(bigram_table(12, s, 3.0), r), fed[r]) for s, r in enumerate(fed)}
    prompt = [1, 2, 3]
    for lm in lms.values():
        lm.feed(prompt[:-1], 1)
        fed[lm.role].clear()
    cfg = DecodeConfig(method=method, max_new_tokens=24, gamma=3, l_d=2, l_q=4)
    steps = list(decode(lms, prompt, as_run(cfg), (), None))
    got = {r: [k for s in steps for k in s.fed.get(r, [])] for r in fed}
    assert got["target"] == fed["target"]
    assert got["qualifier"] == fed["qualifier"]
    assert len(got["draft"]) == len(fed["draft"])


def test_measured_by_k_reads_per_forward_times():
    out = costs.measured_by_k([_step(0, 4, 4, 4), _step(1, 2, 0, 2)])
    assert out["target"] == {5: [20.0], 3: [20.0]} and out["draft"][1] == [2.0] * 2


# ---------------------------------------------------------------- the load path and the recorded profile
def test_a_load_keeps_the_reference_precision_and_times_nothing(monkeypatch):
    """Rule: a CPU family loads at its checkpoint's reference precision (fp32) unless a dtype is asked for by name,
    each role on the forward `runtime.plan_role` names (eager core without a package); nothing is timed on the load
    path, and no exactness is claimed where nothing was measured."""
    from pyramid_demo.models import loading

    monkeypatch.setattr(measure.ForwardTimer, "__init__", lambda *a, **k: pytest.fail("timed on the load path"))
    monkeypatch.setattr(measure, "measure_profile", lambda *a, **k: pytest.fail("profiled on the load path"))
    clear_loaded()
    try:
        t = loading.load_triplet("tiny-random", device="cpu")
        assert t.dtype == torch.float32 and next(t.target.parameters()).dtype == torch.float32
        assert t.forwards == {"draft": "eager", "qualifier": "eager", "target": "eager"}, t.forwards
        assert "eager" in t.runs and t.exact is None and t.tree_exact is None
        asked = loading.load_triplet("tiny-random", device="cpu", dtype="bfloat16")
        assert asked.dtype == torch.bfloat16 and next(asked.target.parameters()).dtype == torch.bfloat16
    finally:
        clear_loaded()


def test_cost_profile_is_measured_once_then_read_from_the_manifest(tmp_path, monkeypatch, one_thread):
    """Rule: without a record a race reads no profile (nothing is measured on a visitor's request); measured when
    asked (`measure_now`: the command line, bench) it is written to the manifest and later read from it, with no
    forward timed again; the entry is keyed by what changes the numbers, the thread count included (a profile
    measured at one thread is not found at two)."""
    from pyramid_demo.models import loading, warm
    from pyramid_demo.models.tiny import tiny_random_triplet

    monkeypatch.setenv("PYRAMID_DEMO_CACHE", str(tmp_path))
    n = []

    class Timer:
        def __init__(self, *a, **kw):
            pass

        def time(self, k):
            n.append(k)
            return 0.001 * k

    monkeypatch.setattr(measure, "ForwardTimer", Timer)
    t = loading.planned(tiny_random_triplet())
    models = len({id(m) for m in (t.draft, t.qualifier, t.target)})
    assert warm.cost_profile(t) is None and not n, "a profile was measured without being asked"
    p = warm.cost_profile(t, measure_now=True)
    assert p["how"] == "measured" and p["ms"]["target"]["1"] == 1.0 and p["ms"]["target"]["3"] == 3.0
    ks = measure.MAX_K + 1  # k = 1 … MAX_K and a tree's pass
    assert len(n) == ks * models * 4  # every model, a warm-up round and 3 timed rounds
    again = warm.cost_profile(t, measure_now=True)
    assert again["how"] == "cached" and again["ms"] == p["ms"] and len(n) == ks * models * 4
    torch.set_num_threads(2)  # `one_thread` restores the count after
    assert warm.cost_profile(t) is None, "a profile measured at 1 thread was found at 2"


def test_forward_timer_times_a_real_cached_forward(one_thread):
    """The one timing harness runs the forward a run opens and leaves its cache at the context after each call."""
    from pyramid_demo.models.tiny import tiny_random_triplet

    t = tiny_random_triplet()
    timer = measure.ForwardTimer(t.target, t.vocab_size, context=20)
    assert timer.time(1) > 0 and timer.time(5) > 0 and timer.lm.cache_len == 20
    assert timer.time_tree(4) > 0 and timer.lm.cache_len == 20


@pytest.mark.parametrize("method", ["sd", "psd_f"])
def test_the_engine_records_what_each_forward_fed(method, one_thread):
    """With real cached models every Step records the new tokens of each forward; they add up to the
    forward counts and the target's passes are proposal + 1 tokens."""
    from pyramid_demo.core.run import generate
    from pyramid_demo.models.tiny import tiny_random_triplet

    t = tiny_random_triplet()
    r = generate(t, [1, 2, 3, 4], DecodeConfig(method=method, max_new_tokens=16, gamma=3, l_d=2, l_q=4), chat=False)
    for s in r.steps:
        assert {k: len(v) for k, v in s.fed.items() if v} == {k: v for k, v in s.n_forward.items() if v}
        if s.target_round is not None:
            assert s.fed["target"] == [len(s.target_round.tokens)]
    assert costs.forward_counts(r.steps)["draft"]

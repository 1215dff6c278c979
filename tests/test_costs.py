"""The cost profile (predict/costs.py) and the dtype/backend probe (models/probe)."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from helpers import clear_loaded
from mock_lm import BigramLM, as_run, bigram_table

from pyramid_demo.core.config import DecodeConfig
from pyramid_demo.core.engine import decode
from pyramid_demo.core.trace import StageRound, Step, TokenRec
from pyramid_demo.predict import costs, expected, measure, walk_stats
from pyramid_demo.predict.profile import ar_speed, cost_ms

PROFILE = {"ms": {"draft": {str(k): 2.0 + 0.1 * k for k in range(1, 10)},
                  "qualifier": {str(k): 6.0 + 0.5 * k for k in range(1, 10)},
                  "target": {str(k): 20.0 + 2.0 * (k - 1) for k in range(1, 10)}}}


def _round(stage: str, n: int, k: int) -> StageRound:
    toks = [TokenRec(1, "draft", "accepted" if i < k else "rejected" if i == k else "discarded") for i in range(n)]
    toks.append(TokenRec(2, "target", "bonus" if k == n else "resampled"))
    return StageRound(stage, "draft", stage, "sd", toks, k)


def _step(i: int, n: int, k: int, draft_fwd: int) -> Step:
    return Step(i, [], _round("target", n, k), [1] * (k + 1), ["draft"] * k + ["target"], 0.0, 0.0,
                {"draft": draft_fwd * 0.002, "target": 0.02}, {"draft": draft_fwd, "target": 1},
                {"draft": [1] * draft_fwd, "target": [n + 1]})


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

    def forward(tokens, pos, keep):
        log.append(len(tokens))
        return real(tokens, pos, keep)

    lm.forward = forward
    return lm


@pytest.mark.parametrize("method", ["ar", "sd", "psd_a"])
def test_step_forwards_match_what_the_engine_fed(method):
    """The target's and qualifier's forwards read from the records are the ones the engine made."""
    fed = {r: [] for r in ("draft", "qualifier", "target")}
    lms = {r: _counting(BigramLM(bigram_table(12, s, 3.0), r), fed[r]) for s, r in enumerate(fed)}
    prompt = [1, 2, 3]
    for lm in lms.values():
        lm.feed(prompt[:-1], 1)
        fed[lm.role].clear()
    cfg = DecodeConfig(method=method, max_new_tokens=24, gamma=3, l_d=2, l_q=4)
    steps = list(decode(lms, prompt, as_run(cfg), (), None))
    got = {r: [k for s in steps for k in costs.step_forwards(s).get(r, [])] for r in fed}
    assert got["target"] == fed["target"]
    assert got["qualifier"] == fed["qualifier"]
    assert len(got["draft"]) == len(fed["draft"])


def test_measured_by_k_reads_per_forward_times():
    out = costs.measured_by_k([_step(0, 4, 4, 4), _step(1, 2, 0, 2)])
    assert out["target"] == {5: [20.0], 3: [20.0]} and out["draft"][1] == [2.0] * 2


# ---------------------------------------------------------------- the probe
@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYRAMID_DEMO_PROBE_CACHE", str(tmp_path))
    monkeypatch.setenv("PYRAMID_DEMO_PROBE", "1")
    return tmp_path


def _all_exact(open_lm, vocab, plan, pad_rows=1, **kw):
    return {"exact": True, "top1": True, "passes": 1, "bitwise_passes": 1, "max_abs_diff": 0.0, "max_k": 2,
            "pad_rows": pad_rows}


def _fake_timer(fastest: str):
    calls = []

    class Timer:
        def __init__(self, model, vocab, backend, context=100, path="hf"):
            self.dt, self.backend = str(next(model.parameters()).dtype).removeprefix("torch."), backend

        def time(self, k):
            calls.append((self.dt, self.backend, k))
            return 0.001 * k if f"{self.dt}/{self.backend}" == fastest else 0.01 * k

    return Timer, calls


@pytest.mark.parametrize("fastest,packed", [("float32/default", True), ("bfloat16/no-onednn", True),
                                            ("bfloat16/packed", True), ("bfloat16/onednn", False)])
def test_probe_never_lowers_the_targets_precision(cache, monkeypatch, fastest, packed):
    """The probe times only reference-precision (fp32) candidates, however fast a bf16 one would be (bf16 is
    offered only when asked for by name, packed oneDNN replacing plain oneDNN where this CPU runs it); the
    choice is cached; a flag overrides it."""
    from pyramid_demo.models import probe
    from pyramid_demo.models.tiny import tiny_random_triplet

    monkeypatch.setattr(probe.build, "native_bf16", lambda: True)
    monkeypatch.setattr(probe.build, "packed_available", lambda dt: packed)
    monkeypatch.setattr(probe.build, "pack_linears", lambda models, pad=1: 0)  # the timer is fake: nothing to pack
    monkeypatch.setattr(probe.build, "invariant_pad", lambda linears, rows: 1)
    monkeypatch.setattr(probe.search, "check_model", _all_exact)  # every candidate exact: speed decides
    timer, calls = _fake_timer(fastest)
    monkeypatch.setattr(probe.search, "make_timer", timer)
    t = tiny_random_triplet()
    got = probe.choose("fam", torch.device("cpu"), None, None, lambda: (t.target, t.vocab_size))
    assert (got.dtype, got.backend, got.how) == ("float32", "default", "probe")
    assert {(c[0], c[1]) for c in calls} == set(probe.candidates()) == {("float32", "default")}
    assert ("bfloat16", "packed" if packed else "onednn") in probe.candidates(lower=True)
    assert {c[2] for c in calls} == {1, probe.VERIFY_K}
    assert next(t.target.parameters()).dtype == torch.float32  # probed on copies
    data = json.loads((cache / probe.CHOICE_FILE).read_text())
    assert [v["dtype"] + "/" + v["backend"] for v in data.values()] == ["float32/default"]
    # a second choice reads the cache: no model is loaded, nothing is timed
    calls.clear()
    again = probe.choose("fam", torch.device("cpu"), None, None, lambda: pytest.fail("loaded to probe"))
    assert (again.dtype, again.backend, again.how) == ("float32", "default", "cached") and not calls
    over = probe.choose("fam", torch.device("cpu"), None, "onednn", lambda: pytest.fail("loaded"))
    assert (over.dtype, over.backend, over.how) == ("float32", "onednn", "flag")


def test_flags_override_and_no_bf16_without_native_support(cache, monkeypatch):
    from pyramid_demo.models import probe

    got = probe.choose("fam", torch.device("cpu"), torch.bfloat16, "no-onednn", lambda: pytest.fail("probed"))
    assert (got.dtype, got.backend, got.how) == ("bfloat16", "no-onednn", "flag")
    with pytest.raises(ValueError, match="backend"):
        probe.choose("fam", torch.device("cpu"), None, "fast", lambda: pytest.fail("probed"))
    monkeypatch.setattr(probe.build, "native_bf16", lambda: False)
    assert probe.candidates(lower=True) == [("float32", "default")]
    monkeypatch.setenv("PYRAMID_DEMO_PROBE", "0")
    off = probe.choose("fam2", torch.device("cpu"), None, None, lambda: pytest.fail("probed"))
    assert (off.dtype, off.how) == ("float32", "off")


def test_load_triplet_applies_the_choice_and_cachedlm_runs_under_it(cache, monkeypatch):
    from pyramid_demo.core.run import generate
    from pyramid_demo.forward.lm import CachedLM
    from pyramid_demo.models import loading, probe

    monkeypatch.setattr(probe.build, "native_bf16", lambda: True)
    monkeypatch.setattr(probe.search, "make_timer", _fake_timer("bfloat16/no-onednn")[0])
    monkeypatch.setattr(probe.search, "check_model", _all_exact)
    clear_loaded()
    t = loading.load_triplet("tiny-random", device="cpu")  # a faster bf16 never lowers the target's precision
    assert t.dtype == torch.float32 and t.backend == "default" and "probe" in t.choice_note
    assert t.path == "lean" and "lean forward" in t.choice_note  # a tie in speed: the lean path comes first
    t = loading.load_triplet("tiny-random", device="cpu", dtype="bfloat16", backend="no-onednn")  # asked by name
    assert t.dtype == torch.bfloat16 and t.backend == "no-onednn" and "command line" in t.choice_note
    t = dataclasses.replace(t, path="hf")  # HF's forward, so that a hook sees every forward's flags
    flag = loading.load_triplet("tiny-random", device="cpu", dtype="float32", backend="onednn")
    assert flag.dtype == torch.float32 and flag.backend == "onednn" and "command line" in flag.choice_note
    seen = []
    hook = t.target.register_forward_pre_hook(lambda *a: seen.append(torch.backends.mkldnn.enabled))
    try:
        generate(t, [1, 2, 3], DecodeConfig(method="ar", max_new_tokens=2), chat=False)
        CachedLM(t.target, t.vocab_size, "target", "onednn").feed([1, 2], 1)
    finally:
        hook.remove()
        clear_loaded()
    assert seen[:-1] and not any(seen[:-1]) and seen[-1] is True  # off in every run forward, on when asked
    assert torch.backends.mkldnn.enabled  # restored afterwards


def test_cost_profile_is_measured_once_then_cached(cache, monkeypatch):
    from pyramid_demo.models import probe
    from pyramid_demo.models.tiny import tiny_random_triplet

    n = []

    class Timer:
        def __init__(self, *a, **kw):
            pass

        def time(self, k):
            n.append(k)
            return 0.001 * k

    monkeypatch.setattr(probe.search, "make_timer", Timer)
    t = tiny_random_triplet()
    models = len({id(m) for m in (t.draft, t.qualifier, t.target)})
    p = probe.cost_profile(t, max_k=3)
    assert p["how"] == "probe" and p["ms"]["target"] == {"1": 1.0, "2": 2.0, "3": 3.0}
    assert len(n) == 3 * models * 4  # k = 1..3, every model, a warm-up round and 3 timed rounds
    again = probe.cost_profile(t, max_k=3)
    assert again["how"] == "cached" and again["ms"] == p["ms"] and len(n) == 3 * models * 4


def test_forward_timer_times_a_real_cached_forward(one_thread):
    from pyramid_demo.models.tiny import tiny_random_triplet

    t = tiny_random_triplet()
    timer = measure.ForwardTimer(t.target, t.vocab_size, "no-onednn", context=20)
    assert timer.time(1) > 0 and timer.time(5) > 0 and timer.lm.cache_len == 20
    assert measure.time_forward(t.target, t.vocab_size, (1, 3), reps=1, context=20) > 0


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

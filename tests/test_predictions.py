"""Predictions for every shape: a round's forwards and the engine's work priced from the profile, a pyramid's
stage-1 rounds, speed-ups over AR that a busier machine does not move, engine prices fitted on other runs.

The right answers are sums written by hand from the hand-built profiles and rounds below."""

from __future__ import annotations

import numpy as np
import pytest

from pyramid_demo.bench import costs_fit, costs_report, report
from pyramid_demo.core.trace import StageRound, Step, TokenRec
from pyramid_demo.predict import costs, expected, measure
from pyramid_demo.predict.expected import ar_speed, cost_ms
from pyramid_demo.predict.measure import TREE_ROWS

ENGINE = {
    "step": 0.07,
    "feed": 0.1,
    "round": 0.2,
    "div": 0.3,
    "div1": 0.5,
    "expand": 0.05,
    "keep": {"draft": 0.01, "qualifier": 0.02, "target": 0.04},
}
PROF = {
    "ms": {
        "draft": {"1": 1.0, "2": 1.2, "3": 1.4},
        "qualifier": {"1": 3.0, "2": 3.5, "3": 4.0, "5": 5.0},
        "target": {"1": 10.0, "2": 11.0, "3": 12.0, "4": 13.0, "5": 14.0},
    },
    "tree_ms": {"draft": {"2": 1.5}, "target": {"3": 13.0, "5": 16.0}},
    "engine_ms": ENGINE,
}
TREE = {"shape": "tree"}  # a run's config: the shape is its setting, not its method key


def _toks(statuses: list[str], own: str) -> list[TokenRec]:
    return [TokenRec(10 + i, "draft", s) for i, s in enumerate(statuses)] + [TokenRec(99, "target", own)]


def test_a_pyramid_block_pays_for_each_round_it_takes_and_the_last_drafts_what_is_left():
    """α_Q = 1, ℓ_D 2, ℓ_Q 4: a round of 2 drafts and a 3-row qualifier pass commits 3, then one token is left:
    a round of 1 draft and a 2-row pass; then a 5-row target pass (α_T 0: one token). ℓ_Q / E(α_Q, ℓ_D) rounds
    of the full length (the old formula) is 4/3 of the first round."""
    flat = {"ms": PROF["ms"]}
    block = (2 * 1.0 + 4.0) + (1.0 + 3.5)
    assert expected.pyramid_speed(flat, 2, 4, 1.0, 0.0) == pytest.approx(1000 / (block + 14.0))
    assert expected.block_ms(flat, 2, 4, 1.0, False) == pytest.approx(block)


def test_the_fuzzy_lanes_pay_for_their_divergences_and_every_round_for_its_engine_work():
    """A chain of γ 2 at α 0.5: 2 draft steps + a 3-row pass + 3 feeds + the decision (+ 2 divergence rows for
    FSD) and the step's cut; E = 1 + 0.5 + 0.25 tokens. AR: a step, its feed and its cut."""
    sd = 2 * 1.0 + 12.0 + 3 * 0.1 + 0.2 + 0.07
    assert expected.round_speed(PROF, 2, (0.5,))["tokens_per_s"] == pytest.approx(1000 * 1.75 / sd)
    assert expected.round_speed(PROF, 2, (0.5,), True)["tokens_per_s"] == pytest.approx(1000 * 1.75 / (sd + 2 * 0.3))
    assert ar_speed(PROF) == pytest.approx(1000 / 10.17)


def test_a_tree_round_is_priced_as_a_tree():
    """2 siblings at one level (ranks 0.5 and 0.3): the draft's root step, no level forward, a 3-row *tree* pass
    (13 ms, not the chain's 12), 2 feeds, the decision, the cut, 1 expanded row, both compactions; 1.8 tokens.
    Fuzzy: one divergence per context reached (1 + 0.8 on average)."""
    base = 1.0 + 13.0 + 2 * 0.1 + 0.2 + 0.07 + 1 * 0.05 + 0.01 + 0.04
    got = expected.round_speed(PROF, 1, (0.5, 0.3), tree=(2, 1, 2))
    assert got["tokens_per_pass"] == pytest.approx(1.8) and got["pass_ms"] == pytest.approx(base)
    fz = expected.round_speed(PROF, 1, (0.5, 0.3), True, tree=(2, 1, 2))
    assert fz["pass_ms"] == pytest.approx(base + 1.8 * 0.5)
    deep = expected.tree_round_ms(PROF, "draft", "target", 4, 2, 2, False, 1.0)  # a level of 2 rows: 1.5 ms
    assert deep == pytest.approx(1.0 + 1.5 + 16.0 + 2 * 0.1 + 0.2 + 0.07 + 3 * 0.05 + 0.01 + 0.04)


def test_best_tree_keeps_its_keys_and_prices_the_chain_as_a_chain():
    b = expected.best_tree(PROF, [0.5, 0.3])
    assert {
        "tree_nodes",
        "tree_depth",
        "tree_k",
        "tokens_per_pass",
        "tokens_per_s",
        "pass_ms",
        "ar_tokens_per_s",
        "chain_tokens_per_s",
        "chain_tokens_per_pass",
        "ranks",
    } <= set(b)
    g = b["chain_gamma"]
    assert b["chain_tokens_per_s"] == pytest.approx(expected.round_speed(PROF, g, (0.5,))["tokens_per_s"], rel=1e-3)
    assert b["speedup_vs_ar"] == pytest.approx(b["tokens_per_s"] / ar_speed(PROF), rel=1e-3)


def _tree_step(rule: str) -> Step:
    """SD over a tree (greedy or fuzzy): root → nodes 0, 1; node 0 → node 2. The walk takes 0, then refuses 2.
    The draft fed its root (1 row) and one level (2 rows); the target one 4-row tree pass."""
    rnd = StageRound(
        "target",
        "draft",
        "target",
        rule,
        _toks(["accepted", "rejected", "rejected"], "resampled"),
        1,
        exact=rule == "greedy",
        parents=[-1, -1, 0],
    )
    return Step(
        0, [], rnd, [10, 99], ["draft", "target"], 0, 0, {}, {"draft": 2, "target": 1}, {"draft": [1, 2], "target": [4]}
    )


def test_a_runs_engine_work_is_counted_from_its_records():
    """Greedy tree: 1 step, 3 forwards, 1 round, 3 expanded draft rows, one compaction per model. Fuzzy: plus
    one divergence per context the walk stood on (the root and node 0). A fuzzy chain of 3: 3 rows at once."""
    g = costs.census([_tree_step("greedy")], "sd", TREE)
    assert {u: g[u] for u in costs.UNITS} == {"step": 1, "feed": 3, "round": 1, "div": 0, "div1": 0, "expand": 3}
    assert g["keep"] == {"draft": 1, "target": 1}
    assert costs.census([_tree_step("fuzzy")], "fsd", TREE)["div1"] == 2
    chain = StageRound(
        "target", "draft", "target", "fuzzy", _toks(["accepted", "rejected", "discarded"], "resampled"), 1
    )
    c = costs.census(
        [
            Step(
                0,
                [],
                chain,
                [10, 99],
                ["draft", "target"],
                0,
                0,
                {},
                {"draft": 3, "target": 1},
                {"draft": [1, 1, 1], "target": [4]},
            )
        ],
        "fsd",
    )
    assert (c["div"], c["div1"], c["expand"], c["keep"]) == (3, 0, 0, {})
    assert costs.price(g, PROF) == pytest.approx(0.07 + 3 * 0.1 + 0.2 + 3 * 0.05 + 0.01 + 0.04)


def test_a_tree_runs_forwards_are_priced_as_tree_forwards():
    """The tree step above: the draft's root feed is a chain (1 ms), its level a 2-row tree forward (1.5 ms), the
    target's pass a 4-row tree forward (between the profiled 3 and 5 rows: 14.5 ms), plus the engine's work."""
    s = _tree_step("greedy")
    assert costs.tree_forward_counts([s], "sd", TREE) == {"target": {4: 1}, "draft": {2: 1}}
    assert costs.tree_forward_counts([s], "sd", {"shape": "chain"}) == {}
    got = costs.predict_run([s], PROF, "sd", TREE)
    assert got["per_role_s"] == {"draft": pytest.approx(0.0025), "target": pytest.approx(0.0145)}
    assert got["engine_s"] == pytest.approx(costs.price(costs.census([s], "sd", TREE), PROF) / 1000)


def test_nnls_recovers_prices_and_a_variant_is_priced_from_the_others_only():
    a = np.array([[1.0, 0.0, 2.0], [2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 1.0, 1.0]])  # [4, 3]
    assert costs_fit.nnls(a, a @ np.array([0.5, 0.0, 2.0])) == pytest.approx([0.5, 0.0, 2.0], abs=1e-9)
    assert (costs_fit.nnls(a, a @ np.array([1.0, -1.0, 0.5])) >= 0).all()

    def row(variant: str, steps: int, rounds: int, overhead: float) -> dict:
        units = {"step": steps, "feed": steps, "round": rounds, "div": 0, "div1": 0, "expand": 0, "keep": {}}
        return {"variant": variant, "kind": "engine", "engine_overhead_s": overhead, "cost_record": {"engine": units}}

    # the others' runs say a step costs 1 ms (AR) and a round 2 ms more (SD): FSD's 10 steps and 10 rounds 30 ms
    rows = [
        row("ar", 10, 0, 0.010),
        row("ar", 20, 0, 0.020),
        row("sd", 10, 10, 0.030),
        row("sd", 5, 5, 0.015),
        row("fsd", 10, 10, 0.5),
    ]
    got = costs_fit.loo_engine_s(rows, {})
    assert got["fsd"] == [pytest.approx(0.030)]  # its own 0.5 s is never read
    rows[-1]["engine_overhead_s"] = 5.0
    assert costs_fit.loo_engine_s(rows, {})["fsd"] == [pytest.approx(0.030)]


def _bench_row(variant: str, method: str, prompt: int, n: int, fwd: dict, busy: float, overhead: float) -> dict:
    """A bench row whose forwards took `busy` × the profile's time, plus `overhead` s outside them."""
    rec = costs_report.row_record([], method, {})
    rec["cost_record"]["forwards"] = fwd
    t = {r: busy * sum(int(c) * cost_ms(PROF, r, int(k)) for k, c in d.items()) / 1000 for r, d in fwd.items()}
    return {
        "variant": variant,
        "method": method,
        "kind": "engine",
        "repeat": 0,
        "prompt_index": prompt,
        "n_new_tokens": n,
        "decode_s": sum(t.values()) + overhead,
        "engine_overhead_s": overhead,
        **{f"fwd_time_{r}_s": v for r, v in t.items()},
        **rec,
    }


@pytest.mark.parametrize("busy", [1.0, 2.5])
def test_a_busier_machine_moves_the_absolute_figures_not_the_speed_ups(busy):
    """AR: 8 one-token steps; SD: 4 rounds of 2 drafts and a 3-row pass (8 tokens). Every forward `busy` × the
    profile, nothing outside forwards: the measured speed-up is 80 / 56 whatever `busy` is, the prediction says
    so, and the predicted tok/s are the measured ones."""
    rows = [_bench_row("ar", "ar", p, 8, {"target": {"1": 8}}, busy, 0.0) for p in range(2)]
    rows += [_bench_row("sd", "sd", p, 8, {"draft": {"1": 8}, "target": {"3": 4}}, busy, 0.0) for p in range(2)]
    sec = costs_report.finish(rows, {"ms": PROF["ms"]})
    sd = next(v for v in sec["variants"] if v["method"] == "sd")
    assert sd["measured_speedup_vs_ar"] == pytest.approx(80 / 56)
    assert sd["predicted_speedup_vs_ar"] == pytest.approx(80 / 56) and abs(sd["speedup_error"]) < 1e-9
    assert sd["predicted_tokens_per_s"] == pytest.approx(sd["measured_tokens_per_s"])
    assert sec["busy"]["all"] == pytest.approx(busy)
    assert all(r["predicted_speedup_vs_ar"] == pytest.approx(80 / 56) for r in rows if r["method"] == "sd")
    assert "× AR predicted" in costs_report.markdown(sec)


def test_the_speed_up_target_reads_the_worst_variant():
    s = [
        {"variant": "ar", "method": "ar", "kind": "engine", "speedup_vs_ar": 1.0, "predicted_speedup_vs_ar": 1.0},
        {"variant": "sd", "method": "sd", "kind": "engine", "speedup_vs_ar": 1.2, "predicted_speedup_vs_ar": 1.26},
        {"variant": "fsd", "method": "fsd", "kind": "engine", "speedup_vs_ar": 1.0, "predicted_speedup_vs_ar": 0.88},
    ]
    assert report.speedup_errors(s) == {"sd": pytest.approx(0.05), "fsd": pytest.approx(-0.12)}
    t = next(t for t in report.check_targets(s) if "speed-up over AR" in t["target"])
    assert t["value"] == pytest.approx(0.12) and t["met"] is False


def test_the_profile_times_the_engine_and_tree_forwards_on_real_caches(one_thread):
    """A profile measured on real caches prices the engine's own work (every unit, a tree's compaction per role)
    and tree forwards of every profiled row count, on the forward a run opens."""
    from pyramid_demo.models.tiny import tiny_random_triplet

    t = tiny_random_triplet()
    extras: dict = {}
    ms = measure.measure_profile({"draft": t.draft, "target": t.target}, t.vocab_size, 3, reps=1, extras_out=extras)
    assert set(ms) == {"draft", "target"}
    e = extras["engine_ms"]
    assert all(e[u] > 0 for u in ("feed", "step", "round", "div", "div1", "expand"))
    assert set(e["keep"]) == {"draft", "target"}
    assert set(extras["tree_ms"]["target"]) == {str(n) for n in TREE_ROWS}
    timer = measure.ForwardTimer(t.target, t.vocab_size, context=20)
    assert timer.time_tree(5) > 0 and timer.time_keep() > 0 and timer.lm.cache_len == 20


def test_a_variants_shape_comes_from_its_runs_not_from_its_method_key():
    """Two SD variants, one run over a chain and one over a tree (the run's config says so): the tree one is
    modelled as a tree (acceptance by rank, the best budget), the chain one as a chain (a break-even α)."""
    rows = [_bench_row("ar", "ar", 0, 8, {"target": {"1": 8}}, 1.0, 0.0)]
    for label, shape in (("sd chain", "chain"), ("sd tree", "tree")):
        r = _bench_row(label, "sd", 0, 8, {"draft": {"1": 8}, "target": {"3": 4}}, 1.0, 0.0)
        r["cost_record"] = costs_report.row_record([], "sd", {"shape": shape})["cost_record"] | {
            "forwards": r["cost_record"]["forwards"],
            "stages": {
                "target": {
                    "accepted": 4,
                    "rejected": 4,
                    "proposed": 8,
                    "rounds": 4,
                    "rank_hits": [3, 1],
                    "rank_reach": [4, 3],
                }
            },
        }
        rows.append(r)
    by = {v["variant"]: v for v in costs_report.finish(rows, {"ms": PROF["ms"]})["variants"]}
    assert "best_tree" in by["sd tree"] and by["sd tree"]["ranks"] == [0.75, pytest.approx(1 / 3, abs=1e-4)]
    assert "best_tree" not in by["sd chain"] and "break_even_alpha" in by["sd chain"]


def test_best_tree_prices_the_stage_it_is_asked_for():
    """A pyramid's stage 1 (draft → qualifier) is priced at the qualifier's forwards and compaction: its best
    chain of γ commits 1 + Σ 0.5^d tokens for γ draft steps, a (γ+1)-row qualifier pass and the engine's work."""
    q = expected.best_tree(PROF, [0.5, 0.3], proposer="draft", verifier="qualifier")
    assert q["chain_tokens_per_s"] > expected.best_tree(PROF, [0.5, 0.3])["chain_tokens_per_s"]
    g = q["chain_gamma"]
    ms = g * 1.0 + cost_ms(PROF, "qualifier", g + 1) + (g + 1) * 0.1 + 0.2 + 0.07
    assert q["chain_tokens_per_s"] == pytest.approx(1000 * (1 + sum(0.5**d for d in range(1, g + 1))) / ms, rel=1e-3)
    n, d, k = q["tree_nodes"], q["tree_depth"], q["tree_k"]
    assert q["tokens_per_s"] == pytest.approx(
        expected.round_speed(PROF, d, [0.5, 0.3], False, "draft", "qualifier", (n, d, k))["tokens_per_s"], abs=1e-3
    )

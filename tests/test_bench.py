"""The benchmark harness on tiny-random: outputs, lossless quality, Pareto frontier, CSQA."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import pytest

from pyramid_demo.bench import csqa, report
from pyramid_demo.bench import runner as bench
from pyramid_demo.bench.prompts import Prompt, load_prompts
from pyramid_demo.cli import main as cli_main
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.predict import throughput

FIXTURES = Path(__file__).parent / "fixtures"


def _args(*extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    return p.parse_args(["--models", "tiny-random", "--no-progress", *extra])


@pytest.fixture(scope="module", autouse=True)
def own_cache(tmp_path_factory):
    """Cost profiles are recorded in a fresh cache folder's manifest, not the user's."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PYRAMID_DEMO_CACHE", str(tmp_path_factory.mktemp("bench_cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: tiny models gain nothing from more, and on a CPU shared with
    other jobs spinning OpenMP threads make them ten times slower."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def triplet():
    from pyramid_demo.models.tiny import tiny_random_triplet

    return tiny_random_triplet()


def test_builtin_prompts_are_varied() -> None:
    ps = load_prompts("builtin")
    assert len(ps) >= 20 and len({p.text for p in ps}) == len(ps)
    assert {"explanation", "code", "story", "list", "qa"} <= {p.category for p in ps}
    assert len({p.category for p in load_prompts("builtin", limit=5)}) == 5  # round-robin across kinds


def test_jsonl_prompts(tmp_path: Path) -> None:
    ps = load_prompts(str(FIXTURES / "prompts_sample.jsonl"))
    assert [p.category for p in ps] == ["list", "user"] and ps[1].text == "What is two plus two?"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt key"}\n')
    with pytest.raises(ValueError, match="prompt"):
        load_prompts(str(bad))


def test_cli_writes_all_outputs_with_every_column(tmp_path: Path) -> None:
    """`bench` writes results.csv (every column, a row per variant and prompt), results.json (runs, summary, how it
    ran, the cost profile with predicted against measured speed-ups) and a self-contained report.html."""
    out = tmp_path / "b"
    rc = cli_main(
        [
            "bench",
            "--models",
            "tiny-random",
            "--methods",
            "ar,sd,fsd,psd_a,psd_f",
            "--shape",
            "chain",
            "--peers",
            "hf_generate,hf_assisted",
            "--prompts",
            "builtin",
            "--limit",
            "2",
            "--max-new-tokens",
            "8",
            "--repeats",
            "1",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    with (out / "results.csv").open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == bench.ROW_COLUMNS
    assert len(rows) == 7 * 2  # 5 methods + 2 peers, 2 prompts, 1 repeat
    for r in rows:
        assert float(r["tokens_per_s_wall"]) > 0 and r["target_logprob"] and r["agreement"]
        if r["kind"] == "engine":
            for col in (
                "tokens_per_s",
                "tokens_per_s_incl_prefill",
                "speedup_vs_ar",
                "speedup_vs_sd",
                "engine_overhead_share",
                "fwd_target",
                "predicted_tokens_per_s",
                "decode_s",
            ):
                assert r[col] != "", (r["variant"], col)
    psd = next(r for r in rows if r["method"] == "psd_f")
    assert psd["acceptance_qualifier"] and psd["acceptance_target"] and psd["fwd_draft"] and psd["fwd_qualifier"]
    data = json.loads((out / "results.json").read_text())
    assert {"runs", "summary", "meta", "speeds", "frontier", "recommended"} <= set(data)
    assert len(data["runs"]) == 14 and [s["variant"] for s in data["summary"]][:2] == ["ar", "sd"]
    assert set(bench.ROW_COLUMNS) <= set(data["runs"][0])
    page = (out / "report.html").read_text()
    assert "Plotly.newPlot" in page and 'src="https://cdn' not in page and page.count("plotly-graph-div") >= 3
    # the cost profile: per-model time per forward by k, predicted vs measured, break-even α
    cp = data["cost_profile"]
    assert set(cp["profile"]["ms"]) == {"draft", "qualifier", "target"}
    assert len(cp["profile"]["ms"]["target"]) == 10  # k = 1 … 9, and a 16-node tree's pass (17)
    by = {v["variant"]: v for v in cp["variants"]}
    assert set(by) == {"ar", "sd", "fsd", "psd_a", "psd_f"}
    assert by["ar"]["ms_per_forward_by_k"]["target"]["1"] > 0 and by["sd"]["ms_per_forward_by_k"]["draft"]["1"] > 0
    assert all(v["predicted_tokens_per_s"] > 0 and v["why"] for v in by.values())
    assert "break_even_alpha" in by["sd"] and "alpha_qualifier" in by["psd_f"]
    assert all(r["predicted_profile_tokens_per_s"] for r in rows if r["kind"] == "engine")
    meta = data["meta"]  # how it ran: what each role runs, on which CPU, and exactness as recorded (None: unmeasured)
    assert "target: the core pass" in meta["runs"] and meta["cpu_class"] and meta["exact"] in (None, True, False)
    assert "Why each method wins or loses here" in page and "break-even" in page
    # every prediction as a speed-up over AR beside the measured one, with the engine's prices in the profile
    assert {"feed", "round", "div", "div1", "expand"} <= set(cp["profile"]["engine_ms"]) and cp["profile"]["tree_ms"]
    for v in by.values():
        assert v["measured_speedup_vs_ar"] > 0 and v["predicted_speedup_vs_ar"] > 0, v["variant"]
        assert v["speedup_error"] == pytest.approx(v["predicted_speedup_vs_ar"] / v["measured_speedup_vs_ar"] - 1)
    assert by["ar"]["measured_speedup_vs_ar"] == pytest.approx(1.0) and "× AR predicted" in page
    assert all(s["predicted_speedup_vs_ar"] > 0 for s in data["summary"] if s["kind"] == "engine")
    assert any("speed-up over AR" in t["target"] for t in data["targets"])


def test_lossless_methods_match_target_greedy(triplet) -> None:
    args = _args("--methods", "ar,sd,psd_a", "--peers", "none", "--stage2", "sd", "--max-new-tokens", "12")
    res = bench.run_bench(triplet, bench.build_variants(args), load_prompts("builtin", limit=2), progress=False)
    rows = res["runs"]
    for pi in (0, 1):
        ar = next(r for r in rows if r["method"] == "ar" and r["prompt_index"] == pi)
        for r in (r for r in rows if r["prompt_index"] == pi):
            assert r["lossless"] and r["agreement"] == 1.0 and r["prefix_agreement"] == 1.0
            assert r["target_logprob"] == pytest.approx(ar["target_logprob"], abs=1e-6)
    assert any(r["accepted_target"] for r in rows if r["method"] in ("sd", "psd_a"))  # drafts were accepted


def test_time_budget_keeps_whole_prompts(triplet) -> None:
    args = _args("--methods", "ar,sd", "--peers", "none", "--max-new-tokens", "4")
    res = bench.run_bench(
        triplet,
        bench.build_variants(args),
        load_prompts("builtin", limit=3),
        progress=False,
        max_minutes=0.0,
    )
    assert res["interrupted"] and len(res["runs"]) == 2 and {r["prompt_index"] for r in res["runs"]} == {0}
    assert res["runs"][1]["speedup_vs_ar"] is not None  # the kept prompt is complete and paired


def test_grid_variants_follow_the_paper_constraints() -> None:
    vs = bench.build_variants(
        _args(
            "--grid", "--methods", "ar,sd,fsd,psd_a,psd_f", "--peers", "none", "--grid-l-d", "2,4", "--grid-l-q", "4,8"
        )
    )
    psd_f = [v for v in vs if v.method == "psd_f"]
    assert psd_f and all(v.cfg.tau_q <= v.cfg.tau_t and v.cfg.l_d <= v.cfg.l_q for v in psd_f)
    assert len(psd_f) == 10 * 4 and len([v for v in vs if v.method == "psd_a"]) == 4 * 4
    assert [v.method for v in vs][:2] == ["ar", "sd"] and len({v.label for v in vs}) == len(vs)


def test_pareto_frontier_on_hand_made_points() -> None:
    pts = [(1.0, 1.0), (0.9, 2.0), (0.8, 1.5), (0.5, 3.0), (0.9, 2.0), (0.4, 2.5), (float("nan"), 9.0), (None, 1)]
    assert report.pareto_frontier(pts) == [3, 1, 4, 0]
    assert report.pareto_frontier([]) == []
    summary = [
        dict(variant="ar", kind="engine", speedup_vs_ar=1.0, agreement=1.0),
        dict(variant="fast", kind="engine", speedup_vs_ar=2.2, agreement=0.93),
        dict(variant="faster", kind="engine", speedup_vs_ar=3.0, agreement=0.6),
        dict(variant="slow-bad", kind="engine", speedup_vs_ar=0.9, agreement=0.5),
        dict(variant="peer", kind="peer", speedup_vs_ar=None, agreement=1.0),
    ]
    assert [p["variant"] for p in report.frontier(summary)] == ["faster", "fast", "ar"]
    assert report.recommend(summary)["variant"] == "fast"


def test_speed_targets_from_a_summary() -> None:
    summary = [
        dict(variant="ar", method="ar", kind="engine", engine_overhead_share=0.04),
        dict(variant="sd", method="sd", kind="engine", engine_overhead_share=0.12),
        dict(variant="p1", method="psd_f", kind="engine", agreement=0.95, speedup_vs_sd=1.6, speedup_vs_ar=1.8),
        dict(variant="p2", method="psd_f", kind="engine", agreement=0.5, speedup_vs_sd=3.0, speedup_vs_ar=3.0),
        dict(variant="hf_generate", method="hf_generate", kind="peer", speedup_vs_ar_wall=0.8),
        dict(variant="hf_assisted", method="hf_assisted", kind="peer", speedup_vs_sd_wall=1.25),
    ]
    got = {
        t["target"].split(" (")[0].split(" at ")[0]: (round(t["value"], 3), t["met"])
        for t in report.check_targets(summary)
    }
    assert got == {
        "our AR ÷ HF generate()": (1.25, True),
        "our SD ÷ HF assisted": (0.8, False),
        "best PSD_F × SD": (1.6, True),
        "best PSD_F × AR": (1.8, False),
        "engine time outside forwards ÷ decode time": (0.12, False),
    }


def test_summary_medians_and_spread() -> None:
    rows = [
        dict(
            variant="x",
            method="sd",
            kind="engine",
            lossless=True,
            tokens_per_s=v,
            accepted_target=a,
            proposed_target=4,
            target_passes=1,
            n_new_tokens=a + 1,
        )
        for v, a in ((10.0, 1), (20.0, 2), (30.0, 3))
    ]
    s = report.summarize(rows)[0]
    assert s["tokens_per_s"] == 20.0 and (s["tokens_per_s_q25"], s["tokens_per_s_q75"]) == (15.0, 25.0)
    assert s["acceptance_target"] == pytest.approx(6 / 12) and s["mean_accepted_per_target_pass"] == 2.0
    assert bench.token_agreement([1, 2, 9, 4], [1, 2, 3, 4, 5]) == 0.6
    assert bench.prefix_agreement([1, 2, 9, 4], [1, 2, 3, 4, 5]) == 0.4


PER_RUN = (
    "tokens_per_s_incl_prefill",
    "tokens_per_s_wall",
    "speedup_vs_ar",
    "speedup_vs_sd",
    "speedup_vs_ar_wall",
    "speedup_vs_sd_wall",
    "engine_overhead_share",
    "agreement",
    "prefix_agreement",
    "target_logprob",
    "predicted_tokens_per_s",
    "predicted_plus_one_tokens_per_s",
    "predicted_speedup_vs_ar",
    "predicted_profile_speedup_vs_ar",
    "n_new_tokens",
    "fwd_draft",
    "fwd_qualifier",
    "fwd_target",
)


def test_every_statistic_of_the_summary_from_hand_built_runs() -> None:
    """Rule: per variant, the speed is the median of its runs' tok/s with quartiles, min and max (a peer's from its
    wall time); every other per-run figure is its median over runs (runs of 1, 2 and 6 times a figure's own base:
    the median is 2×, the mean would be 3×); acceptance per stage, accepted per target pass and tokens per target
    pass are pooled (Σ ÷ Σ, not a mean of ratios); CSQA accuracy is the share of correct answers; runs counts."""
    runs = []
    for i, (tps, acc_q, acc_t, prop_t, passes, correct) in enumerate(
        ((10.0, 0, 1, 4, 1, 1), (20.0, 3, 2, 4, 1, 0), (60.0, 1, 5, 8, 2, 1))
    ):
        run = {k: (j + 1) * (1, 2, 6)[i] for j, k in enumerate(PER_RUN)}
        run.update(
            variant="x",
            method="psd_a",
            kind="engine",
            lossless=True,
            tokens_per_s=tps,
            accepted_qualifier=acc_q,
            proposed_qualifier=4,
            accepted_target=acc_t,
            proposed_target=prop_t,
            target_passes=passes,
            csqa_correct=correct,
        )
        runs.append(run)
    peer = [
        dict(variant="p", method="hf_generate", kind="peer", lossless=True, tokens_per_s=None, tokens_per_s_wall=w)
        for w in (5.0, 7.0)
    ]
    s, p = report.summarize(runs + peer)
    assert (s["variant"], s["method"], s["runs"], p["runs"]) == ("x", "psd_a", 3, 2)
    assert [
        s.get(k)
        for k in ("tokens_per_s", "tokens_per_s_q25", "tokens_per_s_q75", "tokens_per_s_min", "tokens_per_s_max")
    ] == [20.0, 15.0, 40.0, 10.0, 60.0]
    assert [p.get(k) for k in ("tokens_per_s", "tokens_per_s_min", "tokens_per_s_max")] == [6.0, 5.0, 7.0]
    assert {k: s.get(k) for k in PER_RUN} == {k: 2 * (j + 1) for j, k in enumerate(PER_RUN)}
    assert s["acceptance_qualifier"] == pytest.approx(4 / 12) and s["acceptance_target"] == pytest.approx(8 / 16)
    assert s["mean_accepted_per_target_pass"] == pytest.approx(8 / 4)
    n = PER_RUN.index("n_new_tokens") + 1  # this figure's base: its runs made n, 2n and 6n tokens
    assert s["tokens_per_target_pass"] == pytest.approx(9 * n / 4)
    assert s["csqa_accuracy"] == pytest.approx(2 / 3)


def test_csqa_extraction_and_accuracy_on_fixture(triplet) -> None:
    qs = csqa.load_questions(str(FIXTURES / "csqa_sample.jsonl"))
    assert [q.answer for q in qs] == ["B", "C", "D"] and qs[1].choices[2] == "scissors"
    prompt = csqa.format_prompt(qs[0])
    assert prompt.count("Example ") == 5 and prompt.count("Therefore, the answer is") == 6  # 5 shots + instruction
    assert prompt.rstrip().endswith("Answer:")
    assert "B) tree" in prompt
    outs = [
        "A bird nests in a tree. Therefore, the answer is B.",
        "the answer is (A) spoon",
        "Sweaters keep you warm. So the answer is D",
    ]
    preds = [csqa.extract_answer(t) for t in outs]
    assert preds == ["B", "A", "D"] and csqa.extract_answer("no idea") is None
    # the harness carries answers through to per-row correctness and per-method accuracy
    args = _args("--methods", "ar,psd_f", "--peers", "none", "--max-new-tokens", "6")
    res = bench.run_bench(
        triplet,
        bench.build_variants(args),
        [Prompt(q.stem, "csqa") for q in qs],
        answers=[q.answer for q in qs],
        progress=False,
    )
    assert all(r["csqa_answer"] in "BCD" and r["csqa_correct"] in (0, 1) for r in res["runs"])
    assert all(0.0 <= s["csqa_accuracy"] <= 1.0 for s in report.summarize(res["runs"]))


def test_csqa_without_file_fails_clearly_offline(monkeypatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_datasets(name, *a, **kw):
        if name == "datasets":
            raise ImportError("no datasets")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(ValueError, match="--dataset-file"):
        csqa.load_questions(None)


def test_bad_options_are_clear_errors(capsys) -> None:
    assert cli_main(["bench", "--models", "tiny-random", "--methods", "ar,warp", "--no-progress"]) == 2
    assert "unknown method" in capsys.readouterr().err
    assert cli_main(["bench", "--models", "tiny-random", "--methods", "ar,sd_tree", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: method 'sd_tree' is now method 'sd' with shape 'tree' (--method sd --shape tree)"]
    assert cli_main(["bench", "--models", "tiny-random", "--shapes", "chain,bush", "--no-progress"]) == 2
    assert "unknown shape(s) bush" in capsys.readouterr().err


def test_shapes_run_side_by_side_and_each_row_says_what_ran(triplet) -> None:
    """Rule: --shapes runs every proposing method once per shape (AR once), each row naming the shape that ran and
    why (auto resolved from the cost profile: chain or tree, with the reason), a tree row its budget."""
    args = _args(
        "--methods",
        "ar,sd",
        "--peers",
        "none",
        "--shapes",
        "chain,tree,auto",
        "--max-new-tokens",
        "6",
        "--tree-nodes",
        "4",
        "--tree-depth",
        "2",
        "--tree-k",
        "2",
    )
    vs = bench.build_variants(args)
    assert [(v.label, v.cfg.shape) for v in vs] == [
        ("ar", "auto"),
        ("sd chain", "chain"),
        ("sd tree", "tree"),
        ("sd auto", "auto"),
    ]
    rows = bench.run_bench(triplet, vs, load_prompts("builtin", limit=1), progress=False)["runs"]
    by = {r["variant"]: r for r in rows}
    assert by["ar"]["shape"] is None and by["sd chain"]["shape"] == "chain" and by["sd tree"]["shape"] == "tree"
    assert by["sd tree"]["tree_nodes"] == 4 and by["sd chain"]["tree_nodes"] is None
    assert by["sd auto"]["shape"] in ("chain", "tree")
    assert by["sd auto"]["shape_why"].startswith(("auto: the chain", "auto: a tree"))
    assert by["sd chain"]["shape_why"] == "shape chain, as asked"
    assert by["sd tree"]["speedup_vs_sd"] is not None and by["sd chain"]["speedup_vs_sd"] == 1.0


def test_throughput_prediction_counts_the_verifiers_token() -> None:
    speeds = {"draft": 50.0, "qualifier": 25.0, "target": 10.0}
    cfg = {"gamma": 4, "l_d": 2, "l_q": 6}
    assert throughput.predict_parts("ar", cfg, {}, speeds, plus_one=True) == 10.0
    # nothing accepted: one token per round of 4 drafts + 1 target pass (0.08 s + 0.1 s)
    assert throughput.predict_parts("sd", cfg, {"target": 0.0}, speeds, plus_one=True) == pytest.approx(1 / 0.18)
    assert throughput.predict_parts("sd", cfg, {"target": 1.0}, speeds, plus_one=True) == pytest.approx(5 / 0.18)
    inner = (0.5 * 2 + 1) / (2 / 50 + 1 / 25)
    got = throughput.predict_parts("psd_f", cfg, {"qualifier": 0.5, "target": 0.5}, speeds, plus_one=True)
    assert got == pytest.approx((0.5 * 6 + 1) / (6 / inner + 1 / 10))
    assert throughput.predict_parts("psd_f", cfg, {"target": 0.5}, speeds, plus_one=True) is None


def test_hf_assisted_on_a_draft_that_reads_the_target_is_one_clear_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """A documented peer never dies with a stack trace: on a family whose draft reads the target (the default
    offline family's feature draft), HF's assisted generation cannot drive it, so `bench --peers hf_assisted`
    skips that peer with one line naming why, runs the rest, and says so in its report."""
    import dataclasses

    import torch

    from pyramid_demo import hardware_cli
    from pyramid_demo.bench import peers
    from pyramid_demo.models.feature_draft import FeatureDraft
    from pyramid_demo.models.tiny import tiny_random_triplet

    t = tiny_random_triplet(seed=0)
    t = dataclasses.replace(
        t, draft=FeatureDraft(t.target, torch.arange(t.vocab_size)), names=("tiny/feature-draft", *t.names[1:])
    )
    monkeypatch.setattr(hardware_cli, "load", lambda args: t)
    out = tmp_path / "b"
    try:
        rc = cli_main(
            [
                "bench",
                "--models",
                "tiny-random",
                "--methods",
                "ar,sd",
                "--peers",
                "hf_generate,hf_assisted",
                "--prompts",
                "builtin",
                "--limit",
                "1",
                "--max-new-tokens",
                "6",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
    except Exception as e:  # noqa: BLE001 - the rule: no stack trace
        pytest.fail(f"bench --peers hf_assisted died with a stack trace: {e!r}")
    assert rc == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "hf_assisted skipped" in ln]
    assert len(lines) == 1 and "reads the target" in lines[0] and "tiny/feature-draft" in lines[0]
    data = json.loads((out / "results.json").read_text())
    assert {r["method"] for r in data["runs"]} == {"ar", "sd", "hf_generate"}
    assert data["meta"]["skipped"] == [peers.unsupported(t, "hf_assisted")]
    with pytest.raises(ValueError, match="hf_assisted skipped"):
        peers.hf_generate(t, [1, 2, 3], DecodeConfig(max_new_tokens=2), "hf_assisted")


def test_every_footnote_of_a_table_reaches_the_html_report():
    """A table's footnotes all show below it in report.html (peers' and reference rows' notes alike), never a
    table row as a note."""
    from pyramid_demo.bench.costs_report import html_table

    md = "| a | b |\n|---|---|\n| 1 | 2 |\n*peers*: wall time\n\n*reference rows*: alone"
    out = html_table(md)
    assert "<small>*peers*: wall time</small>" in out and "<small>*reference rows*: alone</small>" in out
    assert html_table("| a |\n|---|\n| 1 |").endswith("</table>")


def test_the_method_and_peer_lists_ignore_empty_items():
    """A trailing or doubled comma in --methods or --peers names nothing (both lists read alike); an unknown name is
    still refused by name."""
    from pyramid_demo.bench.variants import parse_methods

    def parsed(methods: str, peer_list: str) -> list[str] | str:
        try:
            return parse_methods(methods, peer_list)
        except ValueError as e:
            return str(e)

    assert parsed("ar,sd,", "hf_generate,") == ["ar", "sd", "hf_generate"]
    assert parsed("ar", ",,hf_generate") == ["ar", "hf_generate"]
    assert "unknown method(s) hf_nope;" in parsed("ar", "hf_nope,")

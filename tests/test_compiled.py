"""The compiled pass (`forward.compiled`) and the one decision over it (`models.runtime.plan_role`): what it
computes, how a stale, broken or disagreeing package is handled, and that a load never compiles or times anything.
Compiling takes a while even for a tiny model: that test is in the slow tier."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pyramid_demo.forward import compiled
from pyramid_demo.forward.cache import VerifierStates, tap_layers
from pyramid_demo.forward.core import CoreLM
from pyramid_demo.forward.weights import weights
from pyramid_demo.models import runtime
from pyramid_demo.models.tiny import tiny_random_triplet

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYRAMID_DEMO_CACHE", str(tmp_path))
    return tmp_path


def test_a_package_is_named_by_what_it_was_built_from(cache) -> None:
    """The package's name changes with any weight the pass reads, the pass's format and the threads a run uses: a
    stale package (another model, a changed weight, an older pass, kernels for another thread count) is never found."""
    t = tiny_random_triplet()
    a = compiled.package_path(t.target, compiled.fingerprint(t.target))
    assert a == compiled.package_path(t.target, compiled.fingerprint(t.target)) and a.parent == cache / "compiled"
    assert compiled.package_path(t.draft, compiled.fingerprint(t.draft)) != a
    with torch.no_grad():
        t.target.model.layers[1].mlp.up_proj.weight[3, 5] += 1e-3
    b = compiled.package_path(t.target, compiled.fingerprint(t.target))
    assert b != a
    old = compiled.FORMAT
    try:
        compiled.FORMAT = old + 1
        assert compiled.package_path(t.target, compiled.fingerprint(t.target)) != b
    finally:
        compiled.FORMAT = old
    threads = torch.get_num_threads()  # inductor writes the count into every kernel: one thread's GEMMs use one core
    try:
        torch.set_num_threads(threads + 1)
        assert compiled.package_path(t.target, compiled.fingerprint(t.target)) != b
    finally:
        torch.set_num_threads(threads)
    assert compiled.package_path(t.target, compiled.fingerprint(t.target)) == b


def test_setup_removes_the_packages_of_another_pass_format_and_keeps_this_one(cache) -> None:
    """`prune` (run by `ensure`, setup's step) deletes packages this code can never load: an older format's, a name
    without one; every package of this format stays, whatever model it was built for."""
    t = tiny_random_triplet()
    mine = compiled.package_path(t.target, compiled.fingerprint(t.target))
    other = mine.with_name(mine.name.replace(f"-v{compiled.FORMAT}-", "-v1-"))
    bare = mine.with_name("LlamaForCausalLM-0123456789abcdef0123.pt2")
    another_model = compiled.package_path(t.draft, compiled.fingerprint(t.draft), "few")
    mine.parent.mkdir(parents=True)
    for p in (mine, other, bare, another_model):
        p.write_bytes(b"x")
    assert sorted(compiled.prune()) == sorted([other.name, bare.name])
    assert mine.exists() and another_model.exists() and not other.exists() and not bare.exists()


def test_scratch_is_this_process_folder_and_a_dead_process_folder_is_removed(cache) -> None:
    """Build files and extracted libraries (hundreds of MB) live in a folder per process: the first call makes this
    process's and removes the one a process no longer running left; a running process's folder stays."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    root = cache / "compiled" / "scratch"
    dead, live = root / str(gone.pid), root / str(os.getppid())
    for d in (dead, live):
        (d / "inductor").mkdir(parents=True)
    assert compiled.scratch() == root / str(os.getpid()) and compiled.scratch().is_dir()
    assert not dead.exists() and live.exists()


def test_a_corrupt_package_is_removed_and_the_model_stays_eager(cache) -> None:
    """A package that does not load (truncated, another torch's) is removed, to be rebuilt, and the model keeps its
    eager forward: nothing half-built serves a run."""
    t = tiny_random_triplet()
    paths = [compiled.package_path(t.target, compiled.fingerprint(t.target), plan) for plan in compiled.plans(t.target)]
    paths[0].parent.mkdir(parents=True)
    for path in paths:
        path.write_bytes(b"not a package")
    assert compiled.load(t.target, compiled.fingerprint(t.target)) is None
    assert not paths[0].exists()


def test_a_model_of_plain_weights_gets_a_few_row_package_and_an_int4_copy_does_not(cache) -> None:
    """Plain (GEMM) weights get both plans, each under its own name; the int4 copy's linears are no GEMM: one package.
    A model missing one of its plans loads none (setup builds what is missing)."""
    from pyramid_demo.models.quant import int4_copy

    t = tiny_random_triplet()
    assert compiled.plans(t.target) == ("many", "few")
    assert compiled.plans(int4_copy(t.target, 32)) == ("many",)
    many, few = (compiled.package_path(t.target, compiled.fingerprint(t.target), p) for p in ("many", "few"))
    assert many != few and few.name.endswith("-few.pt2")
    many.parent.mkdir(parents=True)
    many.write_bytes(b"half of what it runs")
    assert (
        compiled.missing(t.target, compiled.fingerprint(t.target)) == ["few"]
        and compiled.load(t.target, compiled.fingerprint(t.target)) is None
        and many.exists()
    )


def test_a_pass_of_at_most_few_rows_runs_the_few_row_package_and_every_other_the_many_row_one() -> None:
    """The runner sends a step and a chain of FEW_ROWS rows to "few", a longer chain, a prefill and a tree to "many";
    without a "few" package every pass runs "many". Each row count is checked on the stand-ins' own call lists."""
    t = tiny_random_triplet()
    many, few = _Runner(t.target), _Runner(t.target)
    ids = [(7 * i + 3) % (t.vocab_size - 1) + 1 for i in range(60)]
    lm = CoreLM(weights(t.target), t.vocab_size, "target", compiled.Runner(many, few))
    lm.feed(ids[:30], 1)  # a prefill: many
    lm.feed(ids[:31], 1)  # a step: few
    lm.feed(ids[: 31 + compiled.FEW_ROWS], compiled.FEW_ROWS)  # the longest few-row chain
    lm.feed(ids[: 32 + 2 * compiled.FEW_ROWS], compiled.FEW_ROWS + 1)  # one row longer: many
    lm.forward(ids[40:43], 32 + 2 * compiled.FEW_ROWS, parents=[-1, 0, 0])  # a three-row tree: few
    assert many.rows == [30, compiled.FEW_ROWS + 1] and few.rows == [1, compiled.FEW_ROWS, 3]
    # each pass's mask is as wide as the slots it reads (its last row's slot + 1), never the cache's capacity
    assert many.widths == [30, 32 + 2 * compiled.FEW_ROWS] and few.widths == [
        31,
        31 + compiled.FEW_ROWS,
        35 + 2 * compiled.FEW_ROWS,
    ]
    alone = _Runner(t.target)
    lm = CoreLM(weights(t.target), t.vocab_size, "target", compiled.Runner(alone))
    lm.feed(ids[:30], 1), lm.feed(ids[:31], 1)
    assert alone.rows == [30, 1]


def test_a_prefill_is_one_pass_and_the_head_runs_on_the_rows_kept_alone() -> None:
    """A prompt longer than any verifier's pass goes through the package in one pass (the weights read once, not once
    per chunk), and the package is asked for the logits of its last row only; a verifying chain asks for every row.
    The logits are the eager pass's."""
    t = tiny_random_triplet()
    many = _Runner(t.target)
    ids = [(7 * i + 3) % (t.vocab_size - 1) + 1 for i in range(110)]
    lm = CoreLM(weights(t.target), t.vocab_size, "target", compiled.Runner(many))
    eager = CoreLM(weights(t.target), t.vocab_size, "target")
    assert torch.allclose(lm.feed(ids[:100], 1), eager.feed(ids[:100], 1), atol=1e-5)
    assert torch.allclose(lm.feed(ids[:106], 6), eager.feed(ids[:106], 6), atol=1e-5)
    assert many.rows == [100, 6] and many.kept == [[99], [0, 1, 2, 3, 4, 5]]


def test_a_prompt_longer_than_one_pass_goes_in_parts_each_asked_for_the_logits_kept(monkeypatch) -> None:
    """A prompt longer than LONGEST_PREFILL rows runs in parts (each pass's mask stays small); each part asks the
    package for the logits of its rows among the last `keep` (one where it has none), equal to one eager pass's."""
    from pyramid_demo.forward import core

    t = tiny_random_triplet()
    ids = [(7 * i + 3) % (t.vocab_size - 1) + 1 for i in range(100)]
    ref = CoreLM(weights(t.target), t.vocab_size, "target").feed(ids, 25)
    monkeypatch.setattr(core, "LONGEST_PREFILL", 40)
    many = _Runner(t.target)
    lm = CoreLM(weights(t.target), t.vocab_size, "target", compiled.Runner(many))
    assert torch.allclose(lm.feed(ids, 25), ref, atol=1e-5)
    assert many.rows == [40, 40, 20] and many.kept == [[39], list(range(35, 40)), list(range(20))]


def test_a_head_packed_for_its_own_kernel_runs_after_the_package_on_the_rows_kept() -> None:
    """An int4 copy's fp16 head (fbgemm) stays out of its package: the package returns the states, and the core applies
    the head to the last `keep` rows alone; the logits are the eager pass's. A plain-weights head is inside."""
    from pyramid_demo.forward.core import body
    from pyramid_demo.forward.weights import weights
    from pyramid_demo.models.quant import Fp16Linear, int4_copy

    t = tiny_random_triplet()
    q = int4_copy(t.target, 32)
    assert compiled.head_after(t.target) is None
    if not isinstance(q.get_output_embeddings(), Fp16Linear):
        pytest.skip("no fbgemm fp16 head on this CPU")
    assert compiled.head_after(q) is not None
    w, rows = weights(q), []

    def states_only(tokens, cos, sin, slots, mask, kv):
        rows.append(tokens.shape[0])
        return (body(w, tokens, cos, sin, slots, mask, kv),)

    ids = [(7 * i + 3) % (t.vocab_size - 1) + 1 for i in range(40)]
    c = CoreLM(weights(q), t.vocab_size, "qualifier", compiled.Runner(states_only, head=compiled.head_after(q)))
    e = CoreLM(weights(q), t.vocab_size, "qualifier")
    assert torch.allclose(c.forward(ids[:30], 0, 3), e.forward(ids[:30], 0, 3), atol=1e-5)  # the last 3 of 30 rows
    tc, te = c.forward(ids[30:33], 30, parents=[-1, 0, 0]), e.forward(ids[30:33], 30, parents=[-1, 0, 0])
    assert tc.shape == te.shape == (3, t.vocab_size) and torch.allclose(tc, te, atol=1e-5)
    assert rows == [30, 3]


def test_a_load_never_compiles_and_says_how_to_build(cache, monkeypatch) -> None:
    """Without a package, the decision runs the eager core pass and says setup builds one; it never compiles (or
    times anything) on the load path."""
    t = tiny_random_triplet()
    monkeypatch.setattr(compiled, "build", lambda *a, **k: pytest.fail("compiled during a load"))
    fwd = runtime.plan_role(t.target, t.vocab_size)
    assert fwd.kind == "eager" and "setup builds it" in fwd.why and fwd.runner is None


class _Runner:
    """A package stand-in: the eager pass, its logits shifted on one token (`bias`) so agreement can be planted."""

    def __init__(self, model, bias: float = 0.0) -> None:
        from pyramid_demo.forward.core import core_pass
        from pyramid_demo.forward.weights import weights

        self.w, self.bias, self.calls, self.core_pass, self.rows = weights(model), bias, 0, core_pass, []
        self.widths: list[int] = []
        self.kept: list[list[int]] = []

    def __call__(self, tokens, cos, sin, slots, mask, kv, kept):
        self.calls += 1
        self.rows.append(tokens.shape[0])
        self.widths.append(mask.shape[1])
        self.kept.append(kept.tolist())
        z, h = self.core_pass(self.w, tokens, cos, sin, slots, mask, kv, kept)
        z = z.clone()
        z[:, 7] += self.bias
        return z, h


def _with_package(t, runner, monkeypatch) -> None:
    """Packages on disk for every plan of `t.target`, each opening as `runner`."""
    fp = compiled.fingerprint(t.target)
    for plan in compiled.plans(t.target):
        path = compiled.package_path(t.target, fp, plan)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"stand-in")
    monkeypatch.setattr(compiled, "_open", lambda path: runner)


def test_a_package_runs_only_where_it_agrees_with_the_eager_pass(cache, monkeypatch) -> None:
    """A package whose pass agrees with the eager one (top-1 on a prefill, a step, a chain and a tree) runs, and the
    check is recorded once in the manifest; one whose top-1 differs is detached and the eager pass runs, saying
    why. The run then really calls the package (its masks over every slot)."""
    t = tiny_random_triplet()
    good = _Runner(t.target)
    _with_package(t, good, monkeypatch)
    fwd = runtime.plan_role(t.target, t.vocab_size)
    assert fwd.kind == "compiled" and "agrees" in fwd.why and good.calls == 4  # a prefill, a step, a chain, a tree
    assert good.rows == [60, 1, 4, 6]  # a 4-row chain: the few-row package is checked on a chain too
    rec = runtime.entry(runtime.package_key(fwd.stem))
    assert rec is not None and rec["agrees"] and rec["max_abs_diff"] < 1e-4 and rec["flips"] == 0
    assert runtime.plan_role(t.target, t.vocab_size).kind == "compiled" and good.calls == 4  # read, not re-checked
    lm = CoreLM(weights(t.target), t.vocab_size, "target", fwd.runner)
    ref = CoreLM(weights(t.target), t.vocab_size, "target")
    ids = [(7 * i + 3) % (t.vocab_size - 1) + 1 for i in range(40)]
    assert torch.allclose(lm.feed(ids[:30], 4), ref.feed(ids[:30], 4), atol=1e-5)
    assert torch.allclose(
        lm.forward(ids[30:33], 30, parents=[-1, 0, 0]), ref.forward(ids[30:33], 30, parents=[-1, 0, 0]), atol=1e-5
    )

    bad = tiny_random_triplet(seed=3)
    _with_package(bad, _Runner(bad.target, bias=1e3), monkeypatch)  # token 7 always wins: top-1 disagrees
    fwd = runtime.plan_role(bad.target, bad.vocab_size)
    assert fwd.kind == "eager" and "disagreed" in fwd.why and fwd.runner is None


def test_a_corrupt_manifest_reads_as_empty_and_is_rewritten(cache, monkeypatch) -> None:
    """An unreadable manifest is no record (not an error): the next decision measures and writes it anew."""
    t = tiny_random_triplet()
    runtime.manifest_path().parent.mkdir(parents=True, exist_ok=True)
    runtime.manifest_path().write_text("{not json")
    assert runtime.read() == {}
    _with_package(t, _Runner(t.target), monkeypatch)
    fwd = runtime.plan_role(t.target, t.vocab_size)
    assert fwd.kind == "compiled" and runtime.entry(runtime.package_key(fwd.stem))["agrees"]


@pytest.mark.slow
def test_the_compiled_pass_computes_what_the_eager_one_does(cache) -> None:
    """Built once for a tiny Llama: a chain pass, one-token steps after a rollback, tree rows and the published states
    all match the eager core pass (within float rounding; top-1 equal), and a second load reads the package."""
    t = tiny_random_triplet()
    m, v = t.target, t.vocab_size
    ok, note = compiled.ensure(m, compiled.fingerprint(m))
    assert ok, note
    ids = [(7 * i + 3) % (v - 1) + 1 for i in range(120)]
    runner = compiled.load(m, compiled.fingerprint(m))
    c, e = CoreLM(weights(m), v, "target", runner), CoreLM(weights(m), v, "target")
    c.publish, e.publish = VerifierStates(), VerifierStates()
    zc, ze = c.forward(ids[:100], 0, 100), e.forward(ids[:100], 0, 100)  # a 100-row pass asked for every row
    assert torch.allclose(zc, ze, atol=1e-4) and torch.equal(zc.argmax(-1), ze.argmax(-1))
    assert torch.allclose(c.publish.f[:100], e.publish.f[:100], atol=1e-4)
    assert c.truncate(90) == 90 and e.truncate(90) == 90  # rollback moves a length: slots 90… are fed again
    zc = torch.cat([c.forward(ids[90 + i : 91 + i], 90 + i, 1) for i in range(5)])
    ze = e.forward(ids[90:95], 90, 5)
    assert torch.allclose(zc, ze, atol=1e-4)
    tc = c.forward(ids[95:99], 95, parents=[-1, 0, 0, 1])  # rows: root, two children, a grandchild
    te = e.forward(ids[95:99], 95, parents=[-1, 0, 0, 1])
    assert torch.allclose(tc, te, atol=1e-4)
    assert c.keep_path([0, 2]) == 97 and e.keep_path([0, 2]) == 97
    assert torch.allclose(c.forward(ids[99:100], 97, 1), e.forward(ids[99:100], 97, 1), atol=1e-4)
    taps = tap_layers(m.config.num_hidden_layers)  # a reader of several layers gets them from the package too
    c, e = CoreLM(weights(m), v, "target", runner), CoreLM(weights(m), v, "target")
    c.publish, e.publish = VerifierStates(taps), VerifierStates(taps)
    c.forward(ids[:20], 0, 1), e.forward(ids[:20], 0, 1)
    assert c.publish.f.shape[1] == 3 * m.config.hidden_size
    assert torch.allclose(c.publish.f[:20], e.publish.f[:20], atol=1e-4)
    assert compiled.load(m, compiled.fingerprint(m)) is not None  # from the package on disk, no compile
    assert not (compiled.scratch() / "inductor").exists()  # the build files went with the build
    assert not any(compiled.scratch().iterdir())  # the extracted libraries went once mapped: the passes above ran
    code = (
        "import os, sys; from pyramid_demo.forward import compiled as c; from pyramid_demo.models.tiny import "
        "tiny_random_triplet as t; m = t().target; assert c.load(m, c.fingerprint(m)); print(os.getpid())"
    )
    (cache / "tmp").mkdir()
    run = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "TMPDIR": str(cache / "tmp")},
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]  # another process loads the same package…
    assert not (compiled.scratch().parent / run.stdout.strip()).exists()  # …and leaves no folder behind
    assert not any((cache / "tmp").iterdir())  # nor anything in the system's temporary folder (torch's default)
    from pyramid_demo.models.quant import int4_copy

    q = int4_copy(m, 32)  # its package holds no fp16 head (where fbgemm runs): the head runs after it
    ok, note = compiled.ensure(q, compiled.fingerprint(q))
    assert ok, note
    c, e = (
        CoreLM(weights(q), v, "qualifier", compiled.load(q, compiled.fingerprint(q))),
        CoreLM(weights(q), v, "qualifier"),
    )
    zc, ze = c.forward(ids[:40], 0, 2), e.forward(ids[:40], 0, 2)
    assert torch.allclose(zc, ze, atol=1e-3) and torch.equal(zc.argmax(-1), ze.argmax(-1))
    assert torch.allclose(c.forward(ids[40:41], 40, 1), e.forward(ids[40:41], 40, 1), atol=1e-3)


def test_a_run_opens_each_role_on_its_plans_forward_and_a_model_outside_it_runs_eager() -> None:
    """The family's plan is the only word on what runs: a role planned "compiled" runs its plan's packages (the
    stand-in is called), its copy or the same model opened outside the plan runs the eager pass, and a family not yet
    decided opens each role on the forward its kind names."""
    import copy
    from dataclasses import replace

    from pyramid_demo.forward.lm import Forward, open_lm

    t = tiny_random_triplet()
    assert t.forward("target").kind == "eager" and t.forward("target").runner is None  # not decided: uncompiled
    runner = _Runner(t.target)
    planned = replace(
        t,
        plan={
            **t.plan,
            "target": Forward("compiled", "a stand-in", compiled.Runner(runner), weights(t.target), model=t.target),
        },
    )
    lm = planned.open("target")
    lm.feed([1, 2, 3], 1)
    assert runner.calls == 1 and planned.forwards["target"] == "compiled"
    assert "target: a stand-in" in planned.runs
    for model in (t.target, copy.deepcopy(t.target)):
        open_lm(model, t.vocab_size, "target").feed([1, 2, 3], 1)
    assert runner.calls == 1, "a model opened outside its family's plan ran the plan's package"


def test_the_package_name_does_not_change_when_the_core_weights_are_built(cache) -> None:
    """A model's package is found whether or not its core weights (fused layers) were built yet: the name is taken
    on the model as it runs."""
    from pyramid_demo.forward.weights import weights
    from pyramid_demo.models.quant import int4_copy

    t = tiny_random_triplet()
    q = int4_copy(t.target, 32)
    before = compiled.package_path(q, compiled.fingerprint(q))
    weights(q)
    assert compiled.package_path(q, compiled.fingerprint(q)) == before


def test_the_name_reads_every_weight_in_place_and_every_cpu(cache, monkeypatch) -> None:
    """The name changes with an fbgemm fp16 weight (not a parameter), is computed without a float64 copy of any
    weight, and tells ARM machines apart by their "Features" line as x86 ones by their "flags"."""
    from pyramid_demo.models.quant import Fp16Linear, int4_copy

    t = tiny_random_triplet()
    q = int4_copy(t.target, 32)
    head = q.get_output_embeddings()
    if not isinstance(head, Fp16Linear):
        pytest.skip("no fbgemm fp16 head on this CPU")
    monkeypatch.setattr(torch.Tensor, "double", lambda self: pytest.fail("a float64 copy of a weight"))
    before = compiled.fingerprint(q)
    w, b = head.unpacked()
    w[0, 0] += 0.5
    head.packed = torch.ops.quantized.linear_prepack_fp16(w, b)
    assert compiled.fingerprint(q) != before
    arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes\n"
    assert compiled.cpu_line(arm, "aarch64") != compiled.cpu_line(arm.replace(" aes", " aes sve"), "aarch64")
    assert compiled.cpu_line("flags\t: avx2\n", "x86_64") == "x86_64|avx2"


def test_the_family_record_is_what_the_family_box_reads_and_is_keyed_by_its_weights(cache, one_thread) -> None:
    """`measure_family` records each role's checks and the cost profile; a load of the same family then carries
    the target's exactness from it (never assumed: None before), and a changed weight finds no record."""
    from pyramid_demo.models.loading import planned

    t = planned(tiny_random_triplet())
    assert t.exact is None and runtime.family_record(t) is None
    rec = runtime.measure_family(t)
    assert set(rec["checks"]) == {"draft", "qualifier", "target"} and rec["checks"]["target"]["trees"]
    assert rec["profile"]["ms"]["target"]["1"] > 0
    again = planned(t)
    target = rec["checks"]["target"]
    assert (
        again.exact == target["exact"]
        and again.exact_note
        and runtime.family_record(again) == runtime.entry(runtime.family_key(again))
    )
    with torch.no_grad():
        t.target.model.layers[0].mlp.up_proj.weight[0, 0] += 1.0
    assert runtime.family_record(planned(t)) is None


def test_setup_builds_each_package_at_the_threads_a_run_uses(monkeypatch) -> None:
    """Setup's parallel build workers keep the threads a run has (inductor writes the count into every kernel: a
    package built on one thread streams its weights on one core), so the names they write are the names runs look up."""
    from pyramid_demo import prepare_cli

    seen = []

    def worker(cmd, **kw):
        seen.append(kw.get("env", os.environ).get("OMP_NUM_THREADS"))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(prepare_cli.subprocess, "run", worker)
    prepare_cli._build_missing("tiny-random", [("target", "few"), ("target", "many"), ("qualifier", "many")])
    assert seen == [os.environ.get("OMP_NUM_THREADS")] * 3

"""Guards on the one decision over a compiled package (`models.runtime`): the machine's description every record is
keyed by, the manifest's entries, and the load's agreement check against the eager pass. Each test states one rule
and fails by an assertion where that rule is broken, on the smallest inputs: a CPU described by a monkeypatched
/proc/cpuinfo, and hand-built logits just inside and just outside the check's tolerance. Nothing here compiles."""

from __future__ import annotations

import json

import pytest
import torch

from pyramid_demo.forward import compiled
from pyramid_demo.forward.lm import Forward
from pyramid_demo.forward.weights import weights
from pyramid_demo.models import runtime


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYRAMID_DEMO_CACHE", str(tmp_path))
    return tmp_path


def _x86(flags: str, model: str = "Test CPU") -> str:
    return f"processor\t: 0\nmodel name\t: {model}\ncpu MHz\t\t: 2000.000\nflags\t\t: {flags}\n\n"


def _arm(features: str) -> str:
    return f"processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: {features}\nCPU implementer\t: 0x41\n\n"


def _key_on(monkeypatch, cpuinfo: str) -> str:
    monkeypatch.setattr(compiled, "cpuinfo", lambda: cpuinfo)
    return runtime.machine_key()


# ---------------------------------------------------------------- the machine every record names
def test_the_record_key_changes_with_each_vector_flag(monkeypatch) -> None:
    """Rule: the machine's key (every record's: agreement, checks, cost profiles) changes with each instruction-set
    flag kernels choose by, on x86 ("flags") and ARM ("Features"), even one that leaves the CPU's label as it was."""
    base = "fpu sse2 avx fma " + " ".join(f"x86feature{i}" for i in range(150))  # as long as a real line
    for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16"):
        assert _key_on(monkeypatch, _x86(f"{base} {f}")) != _key_on(monkeypatch, _x86(base)), f
    top = "sse2 avx2 avx512f avx512_bf16 amx_tile"  # labelled AMX with or without the flags below
    for f in ("avx512_vnni", "amx_bf16"):
        assert _key_on(monkeypatch, _x86(f"{top} {f}")) != _key_on(monkeypatch, _x86(top)), f
    for f in ("neon", "asimd", "bf16", "sve"):
        assert _key_on(monkeypatch, _arm(f"fp evtstrm {f}")) != _key_on(monkeypatch, _arm("fp evtstrm")), f


def test_cpu_flags_reads_x86_flags_and_arm_features(monkeypatch) -> None:
    """Rule: `cpu_flags` lists the vector flags present, from x86's "flags" line and ARM's "Features" line alike."""
    monkeypatch.setattr(compiled, "cpuinfo", lambda: _x86("fpu avx2 avx512f amx_tile"))
    assert runtime.cpu_flags() == ["avx2", "avx512f", "amx_tile"]
    monkeypatch.setattr(compiled, "cpuinfo", lambda: _arm("fp asimd bf16 sve"))
    assert runtime.cpu_flags() == ["asimd", "bf16", "sve"]


def test_the_cpu_label_names_its_widest_vector_unit(monkeypatch) -> None:
    """Rule: the CPU's label (every reported figure's) is its model name and its widest vector unit: AMX over
    AVX-512 BF16 over AVX-512 over AVX2; NEON on ARM."""
    cases = {
        _x86("sse2 avx2"): "AVX2",
        _x86("sse2 avx2 avx512f"): "AVX-512",
        _x86("sse2 avx2 avx512f avx512_bf16"): "AVX-512 BF16",
        _x86("sse2 avx2 avx512f avx512_bf16 amx_tile amx_bf16"): "AMX",
        _arm("fp asimd"): "NEON",
    }
    for info, isa in cases.items():
        monkeypatch.setattr(compiled, "cpuinfo", lambda info=info: info)
        label = runtime.cpu_class()
        assert label.endswith(f", {isa}"), (label, isa)
    monkeypatch.setattr(compiled, "cpuinfo", lambda: _x86("avx2", model="Acme 9000"))
    assert runtime.cpu_class().startswith("Acme 9000, ")


def test_the_record_key_changes_with_threads_and_torch(monkeypatch) -> None:
    """Rule: the machine's key changes with the threads a run uses and with torch's build."""
    key = runtime.machine_key()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert runtime.machine_key() != key, "the key ignores the thread count"
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setattr(torch, "__version__", torch.__version__ + "+other")
    assert runtime.machine_key() != key, "the key ignores torch's build"


def test_a_record_of_another_format_is_not_read(cache) -> None:
    """Rule: an entry written in another format of the manifest is no record (re-measured, never misread)."""
    runtime.write("k", {"agrees": True})
    assert runtime.entry("k")["agrees"] is True
    data = json.loads(runtime.manifest_path().read_text())
    data["k"]["format"] = runtime.FORMAT - 1
    runtime.manifest_path().write_text(json.dumps(data))
    assert runtime.entry("k") is None


def test_a_recorded_disagreement_keeps_the_model_eager(cache, monkeypatch) -> None:
    """Rule: a package whose recorded check disagreed is not run: the eager pass runs (read from the record, not
    re-checked); one recorded as agreeing runs, its plan holding the loaded package."""
    from transformers import LlamaForCausalLM

    from pyramid_demo.models.tiny import tiny_config

    torch.manual_seed(0)
    m = LlamaForCausalLM(tiny_config(64)).eval()
    fp = compiled.fingerprint(m)
    for plan in compiled.plans(m):
        path = compiled.package_path(m, fp, plan)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"stand-in")
    package = lambda *a: pytest.fail("the check ran again")  # noqa: E731
    monkeypatch.setattr(compiled, "_open", lambda path: package)
    stem = compiled.package_path(m, fp).stem
    runtime.write(runtime.package_key(stem), {"agrees": False, "flips": 1, "noise": 0.125, "max_abs_diff": 2.0})
    fwd = runtime.plan_role(m, 64)
    assert fwd.kind == "eager" and "disagreed" in fwd.why and fwd.runner is None and fwd.stem == stem
    runtime.write(runtime.package_key(stem), {"agrees": True, "flips": 0, "noise": 0.125, "max_abs_diff": 0.0})
    fwd = runtime.plan_role(m, 64)
    assert fwd.kind == "compiled" and fwd.runner is not None and fwd.runner.many is package


def _llama(seed: int = 0):
    from transformers import LlamaForCausalLM

    from pyramid_demo.models.tiny import tiny_config

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(64)).eval()


def test_the_family_record_key_changes_with_each_roles_forward_weights_dtype_and_names(cache, monkeypatch) -> None:
    """Rule: a family's record (its exactness checks, its cost profile) is found only for the same forwards, weights,
    dtype and names on the same machine (CPU, threads): a record measured on the eager pass is not the compiled
    pass's."""
    from types import SimpleNamespace

    core, other, hf = _llama(0), _llama(1), torch.nn.Linear(2, 2)

    def family(target=core, forward="eager", dtype=torch.float32, names=("d", "q", "t")):
        models = {"draft": hf, "qualifier": core, "target": target}
        plan = {
            "draft": Forward("hf"),
            "qualifier": Forward("eager", weights=weights(core)),
            "target": Forward(forward, weights=weights(target)),
        }
        return SimpleNamespace(model=models.__getitem__, plan=plan, names=names, dtype=dtype)

    key = runtime.family_key(family())
    assert runtime.family_key(family()) == key
    assert runtime.family_key(family(forward="compiled")) != key, "the record ignores the forward a role runs"
    assert runtime.family_key(family(target=other)) != key, "the record ignores the target's weights"
    assert runtime.family_key(family(dtype=torch.bfloat16)) != key, "the record ignores the dtype"
    assert runtime.family_key(family(names=("d", "q", "t2"))) != key, "the record ignores the family's names"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert runtime.family_key(family()) != key, "the record ignores the machine's threads"
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setattr(compiled, "cpuinfo", lambda: _x86("fpu sse2 avx2 avx512f avx512_bf16 amx_tile"))
    amx = runtime.family_key(family())
    monkeypatch.setattr(compiled, "cpuinfo", lambda: _x86("fpu sse2 avx2"))
    assert runtime.family_key(family()) != amx, "the record ignores the machine's CPU"


# ---------------------------------------------------------------- the agreement check on hand-built logits
V = 4
BASE = torch.tensor([3.0, 0.0, 1.0, 2.0])  # top-1 token 0, a gap of 1 to token 3


class _Rows:
    """A stand-in for `CoreLM` returning the next rows of its table for each pass (a feed keeps `keep` rows, a tree
    one per token)."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows

    def _next(self, n: int) -> torch.Tensor:
        out, self.rows = self.rows[:n], self.rows[n:]
        return out

    def feed(self, ids, keep):
        return self._next(keep)

    def forward(self, tokens, pos, keep=None, parents=None):
        return self._next(len(tokens))


def _eager() -> torch.Tensor:
    """The eager pass's 12 rows (a prefill's last, a step, a 4-row chain, a 6-row tree), each row shifted by its index
    (rows are told apart), every top-1 token 0 by a gap of 1."""
    return BASE + torch.arange(12.0)[:, None]  # [12, V]


def _check(monkeypatch, eager: torch.Tensor, package: torch.Tensor) -> dict:
    """`agreement` where the eager pass gives `eager`, the package `package`, and eager one-row steps give the chain's
    rows (eager[2:6]) off by 3/32 on every logit and by 1/8 on one: eager's rounding is 1/8 at most, 3/32 on average,
    3/8 as a norm over all logits."""
    off = torch.full((4, V), 3 / 32)
    off[2, 1] = 1 / 8
    steps = torch.cat([eager[1:2], eager[2:6] + off])  # the step before the chain, then its rows one at a time
    tables = [eager, package, steps]
    monkeypatch.setattr(runtime, "CoreLM", lambda *a, **k: _Rows(tables.pop(0)))
    monkeypatch.setattr(runtime, "weights", lambda model: model)  # the stand-in reads no weights
    return runtime.agreement(torch.nn.Linear(1, 1), V, "package")


def _flip(a: torch.Tensor, b: torch.Tensor, row: int, gap: float) -> None:
    """Row `row`: eager's token 3 `gap` under its top-1 (token 0); the package's token 3 just over it (by 1/64)."""
    a[row, 3] = a[row, 0] - gap
    b[row] = a[row]
    b[row, 3] = a[row, 0] + 1 / 64


def test_a_flip_just_outside_the_largest_rounding_difference_disagrees(monkeypatch) -> None:
    """Rule: the tolerance is eager's largest difference from its own one-row steps (1/8 here), not a norm, sum or
    mean over all logits: a package whose top-1 differs where eager's gap is 5/32 (just over 1/8) disagrees."""
    a = _eager()
    b = a.clone()
    _flip(a, b, 0, 5 / 32)
    got = _check(monkeypatch, a, b)
    assert got["noise"] == 1 / 8, got
    assert got["flips"] == 1 and got["agrees"] is False, got


def test_a_flip_just_inside_the_largest_rounding_difference_agrees(monkeypatch) -> None:
    """Rule: a package whose top-1 differs only where eager's gap is 7/64 (just under the largest difference 1/8,
    over the mean 3/32) agrees: a near-tie within eager's own rounding."""
    a = _eager()
    b = a.clone()
    _flip(a, b, 9, 7 / 64)
    got = _check(monkeypatch, a, b)
    assert got["flips"] == 1 and got["agrees"] is True, got


def test_the_gap_is_eagers_not_the_packages(monkeypatch) -> None:
    """Rule: a flip is a near-tie by eager's gap between the two tokens: the package's own gap (1/64) being small
    does not excuse a flip where eager's gap is 1/2."""
    a = _eager()
    b = a.clone()
    _flip(a, b, 4, 1 / 2)
    assert _check(monkeypatch, a, b)["agrees"] is False


def test_every_flip_must_be_a_near_tie(monkeypatch) -> None:
    """Rule: the package agrees only where every flipped row is within the tolerance: one near-tie does not excuse
    another flip outside it."""
    a = _eager()
    b = a.clone()
    _flip(a, b, 1, 7 / 64)
    _flip(a, b, 10, 5 / 32)
    got = _check(monkeypatch, a, b)
    assert got["flips"] == 2 and got["agrees"] is False, got


def test_equal_top1_agrees_whatever_the_difference_and_reports_the_largest_one(monkeypatch) -> None:
    """Rule: with every top-1 equal the package agrees, and `max_abs_diff` is the largest single |Δlogit| (not a norm,
    sum or mean), equal −inf logits counting as no difference."""
    a = _eager()
    a[0, 1] = a[11, 2] = float("-inf")
    b = a.clone()
    b[3, 1] += 1 / 4
    b[5:8, 2] -= 1 / 8
    got = _check(monkeypatch, a, b)
    assert got["agrees"] is True and got["flips"] == 0
    assert got["max_abs_diff"] == 1 / 4, got

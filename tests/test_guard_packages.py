"""Guards on the compiled packages (`forward.compiled`) and the one decision over them (`models.runtime`): a package's
name, the record's key, the per-process scratch folders and the load's agreement check. Each test states one rule and
fails by an assertion where that rule is broken, on the smallest inputs that show it: a tiny Llama, a CPU described by
a monkeypatched /proc/cpuinfo, fake pids, hand-built logits. Nothing here compiles: the naming and the decisions are
called directly, the compiler and torch's loader replaced by stand-ins."""

from __future__ import annotations

import atexit
import os
import pathlib
import subprocess

import pytest
import torch
import torch._inductor

from pyramid_demo.forward import compiled
from pyramid_demo.models import runtime


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The one cache folder in tmp_path; its compiled packages' folder returned."""
    monkeypatch.setenv("PYRAMID_DEMO_CACHE", str(tmp_path))
    return tmp_path / "compiled"


def _llama(seed: int = 0, **cfg):
    """A two-layer Llama of 64 tokens (the core forward's architecture), seeded: equal seeds, equal weights."""
    from transformers import LlamaForCausalLM

    from pyramid_demo.models.tiny import tiny_config

    c = tiny_config(64)
    for k, v in cfg.items():
        setattr(c, k, v)
    torch.manual_seed(seed)
    return LlamaForCausalLM(c).eval()


def _x86(flags: str, model: str = "Test CPU", mhz: str = "2000.000") -> str:
    return f"processor\t: 0\nmodel name\t: {model}\ncpu MHz\t\t: {mhz}\nflags\t\t: {flags}\n\n"


def _arm(features: str) -> str:
    return f"processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: {features}\nCPU implementer\t: 0x41\n\n"


def _on_cpu(monkeypatch, cpuinfo: str, arch: str = "x86_64") -> None:
    """This process reads `cpuinfo` as /proc/cpuinfo and `arch` as its architecture (the package's name and the
    record's key both)."""
    monkeypatch.setattr(compiled, "machine", lambda: arch)
    monkeypatch.setattr(compiled, "cpuinfo", lambda: cpuinfo)  # the one reader of /proc/cpuinfo


def _name_on(monkeypatch, model, cpuinfo: str, arch: str = "x86_64") -> str:
    """`model`'s package name as a process on that CPU finds it."""
    _on_cpu(monkeypatch, cpuinfo, arch)
    return compiled.package_path(model, compiled.fingerprint(model)).name


# ---------------------------------------------------------------- the name across CPUs
LONG = " ".join(f"x86feature{i}" for i in range(150))  # a flags line as long as a real one (about 1500 characters)
LONG_ARM = " ".join(f"armfeature{i}" for i in range(40))
X86_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
ARM_FEATURES = ("neon", "asimd", "bf16", "sve")


def test_a_package_name_changes_with_each_vector_flag_of_the_cpu(cache, monkeypatch) -> None:
    """Rule: a package's name changes with any instruction-set flag of the CPU (x86 "flags", ARM "Features"), first or
    last on a line as long as a real one: a cache carried to a machine lacking one finds no package built for it,
    never kernels it cannot run."""
    m = _llama()
    plain = _name_on(monkeypatch, m, _x86(LONG))
    for f in X86_FLAGS:
        for line in (f"{LONG} {f}", f"{f} {LONG}"):
            assert _name_on(monkeypatch, m, _x86(line)) != plain, f"the name ignores the CPU flag {f}"
    arm = _name_on(monkeypatch, m, _arm(LONG_ARM), "aarch64")
    for f in ARM_FEATURES:
        for line in (f"{LONG_ARM} {f}", f"{f} {LONG_ARM}"):
            assert _name_on(monkeypatch, m, _arm(line), "aarch64") != arm, f"the name ignores ARM's {f}"


def test_a_package_name_changes_with_the_architecture_alone(cache, monkeypatch) -> None:
    """Rule: two CPUs listing the same flags on different architectures get different names."""
    m = _llama()
    assert _name_on(monkeypatch, m, _x86("fp asimd"), "x86_64") != _name_on(monkeypatch, m, _x86("fp asimd"), "aarch64")


def test_a_package_name_reads_the_instruction_set_not_the_clock(cache, monkeypatch) -> None:
    """Rule: the name is the same on one CPU whatever its clock reads (cpu MHz changes between reads): the package
    setup built is found by every later process on the machine."""
    m = _llama()
    a = _name_on(monkeypatch, m, _x86("sse2 avx2", mhz="2000.000"))
    assert _name_on(monkeypatch, m, _x86("sse2 avx2", mhz="3187.532")) == a
    assert compiled.package_path(m, compiled.fingerprint(m)).name == a  # and again in the same process


def test_cpu_line_is_the_flags_line_and_the_architecture() -> None:
    """Rule: `cpu_line` is the architecture and the whole instruction-set line (x86 "flags", ARM "Features"), not
    another line of /proc/cpuinfo."""
    assert compiled.cpu_line(_x86("sse2 avx2"), "x86_64") == "x86_64|sse2 avx2"
    assert compiled.cpu_line(_arm("fp asimd sve"), "aarch64") == "aarch64|fp asimd sve"
    assert compiled.cpu_line(_arm("fp asimd"), "aarch64") != compiled.cpu_line(_arm("fp asimd sve"), "aarch64")


# ---------------------------------------------------------------- the name across weights and builds
def test_an_int4_copy_at_another_group_size_has_another_name_and_record(cache) -> None:
    """Rule: an int4 copy's weights are buffers (codes, scales, zeros), read into the name like parameters: a copy at
    another group size finds neither the other's package nor its recorded agreement."""
    from pyramid_demo.models.quant import int4_copy

    m = _llama()
    g32, g64 = int4_copy(m, 32), int4_copy(m, 64)
    assert compiled.package_path(g32, compiled.fingerprint(g32)) != compiled.package_path(
        g64, compiled.fingerprint(g64)
    )
    s32, s64 = (compiled.package_path(g, compiled.fingerprint(g)).stem for g in (g32, g64))
    runtime.write(runtime.package_key(s32), {"agrees": True, "flips": 0, "noise": 0.0, "max_abs_diff": 0.0})
    assert runtime.entry(runtime.package_key(s32)) is not None
    assert runtime.entry(runtime.package_key(s64)) is None, "the group-64 copy read the group-32 copy's agreement"


def test_an_edit_of_a_buffer_in_place_changes_the_name(cache) -> None:
    """Rule: editing a buffer in place (an int4 layer's scales, the rotary frequencies) changes the name on the same
    model object: the name cached for its old bytes is not reused."""
    from pyramid_demo.models.quant import int4_copy

    q = int4_copy(_llama(), 32)
    before = compiled.package_path(q, compiled.fingerprint(q))
    with torch.no_grad():
        q.model.layers[1].self_attn.o_proj.scales_zeros[0, 0, 0] += 1.0
    assert compiled.package_path(q, compiled.fingerprint(q)) != before, "an int4 copy's edited scales kept the old name"
    m = _llama()
    before = compiled.package_path(m, compiled.fingerprint(m))
    with torch.no_grad():
        m.model.rotary_emb.inv_freq[1] *= 1.5
    assert compiled.package_path(m, compiled.fingerprint(m)) != before, "an edited buffer kept the old name"


def test_a_buffer_replaced_by_another_tensor_changes_the_name(cache) -> None:
    """Rule: an int4 layer's scales swapped for another tensor (no in-place edit, so no version bump, and the layer's
    packed weight unchanged) change the name on the same model object: the name cached for the old scales is not
    reused."""
    from pyramid_demo.models.quant import int4_copy

    q = int4_copy(_llama(), 32)
    before = compiled.package_path(q, compiled.fingerprint(q))
    layer = q.model.layers[1].self_attn.o_proj
    layer.scales_zeros = layer.scales_zeros * 2
    assert compiled.package_path(q, compiled.fingerprint(q)) != before, (
        "an int4 copy's replaced scales kept the old name"
    )


def test_a_weight_replaced_by_another_tensor_changes_the_name(cache) -> None:
    """Rule: a weight swapped for another tensor (no in-place edit: its old tensor's version is unchanged) changes the
    name on the same model object, as does a cast of the whole model to another dtype."""
    m = _llama()
    before = compiled.package_path(m, compiled.fingerprint(m))
    old, new = m.lm_head.weight, m.lm_head.weight.detach() + 1.0
    with torch.no_grad():
        while new._version < old._version:  # the same version count: only the tensor's identity tells them apart
            new.mul_(1.0)
    m.lm_head.weight = torch.nn.Parameter(new, requires_grad=False)
    after = compiled.package_path(m, compiled.fingerprint(m))
    assert after != before, "a swapped weight kept the old name"
    m.to(torch.bfloat16)
    assert compiled.package_path(m, compiled.fingerprint(m)) != after, "a cast model kept its float32 name"


def test_the_name_changes_with_each_weights_dtype_and_shape_even_on_equal_bytes(cache) -> None:
    """Rule: a weight's dtype and shape are part of the name, not only its bytes: zeros of float16 and of bfloat16,
    of [2, 3] and of [3, 2], give three names."""
    names = set()
    for shape, dtype in (((2, 3), torch.float16), ((2, 3), torch.bfloat16), ((3, 2), torch.float16)):
        m = _llama()
        m.register_buffer("extra", torch.zeros(shape, dtype=dtype))
        names.add(compiled.package_path(m, compiled.fingerprint(m)).name)
    assert len(names) == 3, names


def test_the_name_changes_with_torch_the_config_and_the_layers_kinds(cache, monkeypatch) -> None:
    """Rule: equal weights still get another name under another torch build, another config (a norm's epsilon) or
    another kind of layer (a module of another class holding the same tensor)."""
    base = compiled.package_path(_llama(), compiled.fingerprint(_llama())).name
    assert (
        compiled.package_path(_llama(rms_norm_eps=1e-5), compiled.fingerprint(_llama(rms_norm_eps=1e-5))).name != base
    ), "the config is not in the name"
    other = _llama()
    other.model.norm.__class__ = type("OtherNorm", (type(other.model.norm),), {})
    assert compiled.package_path(other, compiled.fingerprint(other)).name != base, (
        "the layers' kinds are not in the name"
    )
    monkeypatch.setattr(torch, "__version__", torch.__version__ + "+other")
    assert compiled.package_path(_llama(), compiled.fingerprint(_llama())).name != base, (
        "torch's build is not in the name"
    )


# ---------------------------------------------------------------- prune, build, load
def test_prune_removes_exactly_the_packages_of_another_format(cache) -> None:
    """Rule: setup's prune removes every package whose format is not this one (including formats whose number starts
    or ends with this one's digits) and keeps every package of this format: any model, plan, thread count, and a
    build in progress."""
    f = compiled.FORMAT
    keep = [
        f"LlamaForCausalLM-v{f}-t1-0123456789abcdef0123.pt2",
        f"LlamaForCausalLM-v{f}-t7-0123456789abcdef0123-few.pt2",
        f"Qwen2ForCausalLM-v{f}-t2-aaaaaaaaaaaaaaaaaaaa.pt2",
        f"LlamaForCausalLM-v{f}-t2-bbbbbbbbbbbbbbbbbbbb.tmp4242.pt2",
    ]
    gone = [
        f"LlamaForCausalLM-v{f}0-t1-0123456789abcdef0123.pt2",
        f"LlamaForCausalLM-v1{f}-t1-0123456789abcdef0123.pt2",
        f"LlamaForCausalLM-v{f + 1}-t1-0123456789abcdef0123.pt2",
        f"LlamaForCausalLM-v{f - 1}-t1-0123456789abcdef0123-few.pt2",
    ]
    cache.mkdir(parents=True)
    for n in keep + gone:
        (cache / n).write_bytes(b"x")
    assert sorted(compiled.prune()) == sorted(gone)
    assert sorted(p.name for p in cache.glob("*.pt2")) == sorted(keep)


def test_a_build_writes_its_plans_package_under_its_name_from_its_own_scratch(cache, monkeypatch) -> None:
    """Rule: `build(model, plan)` compiles with the plan's settings and row count, keeps its build files in this
    process's scratch folder, writes aside under a name of this process's (two processes building one package do not
    share a file), and leaves exactly the package `package_path(model, plan)`; a failed build leaves no file."""
    m = _llama()
    seen: dict = {}
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "before")

    def export(mod, ex, dynamic_shapes=None, strict=True):
        seen["rows"] = dynamic_shapes[0][0].max
        return "exported"

    def package(ep, package_path, inductor_configs):
        seen.update(configs=inductor_configs, build_dir=os.environ["TORCHINDUCTOR_CACHE_DIR"], aside=package_path)
        pathlib.Path(package_path).write_bytes(b"package")
        if seen.get("fail"):
            raise RuntimeError("the compiler failed")
        return package_path

    monkeypatch.setattr(torch.export, "export", export)
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", package)
    for plan in ("many", "few"):
        path = compiled.build(m, compiled.fingerprint(m), plan)
        assert path == compiled.package_path(m, compiled.fingerprint(m), plan) and path.read_bytes() == b"package", plan
        assert seen["configs"] == compiled.PLANS[plan][1] and seen["rows"] == compiled.PLANS[plan][0], plan
        assert pathlib.Path(seen["build_dir"]) == compiled.scratch() / "inductor", plan
        aside = pathlib.Path(seen["aside"])
        assert aside.parent == path.parent and aside != path and str(os.getpid()) in aside.name, aside
    built = sorted(
        [
            compiled.package_path(m, compiled.fingerprint(m), "many").name,
            compiled.package_path(m, compiled.fingerprint(m), "few").name,
            "scratch",
        ]
    )
    assert sorted(p.name for p in cache.glob("*")) == built
    seen["fail"] = True
    with torch.no_grad():
        m.lm_head.weight[0, 0] += 1.0  # another package's name
    with pytest.raises(RuntimeError):
        compiled.build(m, compiled.fingerprint(m), "many")
    assert sorted(p.name for p in cache.glob("*")) == built, "a failed build left a file"


def test_a_load_opens_exactly_this_models_packages_each_for_its_plan(cache, monkeypatch) -> None:
    """Rule: a load opens only the packages named for this model here (another model's, or this model's for another
    thread count, are not it), and runs each plan on its own package."""
    m, other = _llama(0), _llama(1)
    opened: list[str] = []
    monkeypatch.setattr(compiled, "_open", lambda p: opened.append(p.name) or p.name)
    cache.mkdir(parents=True)
    for plan in compiled.plans(other):
        compiled.package_path(other, compiled.fingerprint(other), plan).write_bytes(b"x")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        for plan in compiled.plans(m):
            compiled.package_path(m, compiled.fingerprint(m), plan).write_bytes(b"x")
    finally:
        torch.set_num_threads(threads)
    assert compiled.load(m, compiled.fingerprint(m)) is None and opened == [], f"opened {opened} for another model"
    paths = {plan: compiled.package_path(m, compiled.fingerprint(m), plan) for plan in compiled.plans(m)}
    for p in paths.values():
        p.write_bytes(b"x")
    r = compiled.load(m, compiled.fingerprint(m))
    assert r is not None and r.many == paths["many"].name and r.few == paths["few"].name and r.head is None
    assert sorted(opened) == sorted(p.name for p in paths.values())


def test_a_load_extracts_into_this_process_scratch_and_restores_tmpdir(cache, tmp_path, monkeypatch) -> None:
    """Rule: torch's loader extracts a package into a folder of this process's scratch, removed once loaded, and the
    process's TMPDIR is as it was after (set or unset)."""
    seen: list[str] = []
    monkeypatch.setattr(torch._inductor, "aoti_load_package", lambda p: seen.append(os.environ["TMPDIR"]) or "run")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "system"))
    assert compiled._open(cache / "x.pt2") == "run"
    assert pathlib.Path(seen[0]).parent == compiled.scratch() and not pathlib.Path(seen[0]).exists()
    assert os.environ["TMPDIR"] == str(tmp_path / "system")
    monkeypatch.delenv("TMPDIR")
    compiled._open(cache / "x.pt2")
    assert "TMPDIR" not in os.environ and pathlib.Path(seen[1]).parent == compiled.scratch()


def test_setup_clears_its_own_build_files_and_no_other_process(cache, monkeypatch) -> None:
    """Rule: setup's `ensure` prunes stale packages, builds what is missing, then removes its own build files (this
    process's scratch/inductor) and nothing of a process still running."""
    m = _llama()
    live = cache / "scratch" / str(os.getppid()) / "inductor"
    live.mkdir(parents=True)
    stale = cache / f"LlamaForCausalLM-v{compiled.FORMAT + 1}-t1-0123456789abcdef0123.pt2"
    stale.write_bytes(b"x")

    def build(model, fp, plan="many"):
        (compiled.scratch() / "inductor" / "kernels").mkdir(parents=True, exist_ok=True)
        path = compiled.package_path(model, fp, plan)
        path.write_bytes(b"package")
        return path

    monkeypatch.setattr(compiled, "build", build)
    monkeypatch.setattr(compiled, "_open", lambda p: p.name)
    fp = compiled.fingerprint(m)
    ok, note = compiled.ensure(m, fp)
    assert ok, note
    assert not (compiled.scratch() / "inductor").exists(), "the build files stayed"
    assert live.is_dir(), "setup removed a running process's build files"
    assert not stale.exists() and all(compiled.package_path(m, fp, p).exists() for p in compiled.plans(m))


# ---------------------------------------------------------------- the per-process scratch folders
def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _as_another_users(monkeypatch, pid: int) -> None:
    """`os.kill(pid, 0)` answers as for another user's running process (PermissionError), whoever runs the tests."""
    real = os.kill

    def kill(p, sig):
        if p == pid:
            raise PermissionError(1, "Operation not permitted")
        return real(p, sig)

    monkeypatch.setattr(os, "kill", kill)


def test_alive_is_true_for_running_processes_and_another_users(monkeypatch) -> None:
    """Rule: a process is alive where it runs, ours or another user's (signal 0 refused); dead where no process has
    its pid."""
    assert compiled._alive(os.getpid()) and compiled._alive(os.getppid())
    assert compiled._alive(_dead_pid()) is False
    _as_another_users(monkeypatch, 1)
    assert compiled._alive(1) is True, "another user's process read as dead"


def test_the_sweep_removes_dead_processes_folders_only(cache, monkeypatch) -> None:
    """Rule: a process's first scratch call removes the folders of processes no longer running, and keeps those of
    every running one: its parent, a child started after it, init, another user's (signal 0 refused), and any
    folder not named by a pid."""
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        root = cache / "scratch"
        dead = [_dead_pid(), _dead_pid()]
        other_user = 1
        _as_another_users(monkeypatch, other_user)
        live = [os.getppid(), sleeper.pid, other_user]
        for pid in dead + live:
            (root / str(pid) / "inductor").mkdir(parents=True)
        (root / "notes").mkdir()
        err = None
        try:
            mine = compiled.scratch()
        except Exception as e:  # a folder the sweep cannot read as a pid is no reason to fail
            err = e
        assert err is None, f"the sweep failed on a folder not named by a pid: {err!r}"
        assert mine == root / str(os.getpid()) and mine.is_dir()
        for pid in live:
            assert (root / str(pid) / "inductor").is_dir(), f"the folder of running process {pid} was removed"
        assert (root / "notes").is_dir(), "a folder not named by a pid was removed"
        for pid in dead:
            assert not (root / str(pid)).exists(), f"the folder of dead process {pid} stayed"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_at_exit_a_process_removes_its_own_scratch_folder_only(cache, monkeypatch) -> None:
    """Rule: what a process registers to run at its exit removes its own scratch folder (with what it holds) and no
    other process's: a second process of the same setup keeps its folder."""
    registered: list = []
    monkeypatch.setattr(atexit, "register", lambda fn, *a, **k: registered.append((fn, a, k)) or fn)
    root = cache / "scratch"
    other = root / str(os.getppid()) / "inductor"
    other.mkdir(parents=True)
    mine = compiled.scratch()
    (mine / "lib.so").write_bytes(b"x")
    for fn, a, k in registered:
        fn(*a, **k)
    assert not mine.exists(), "this process's scratch folder outlives its exit"
    assert other.is_dir(), "this process's exit removed another process's scratch folder"

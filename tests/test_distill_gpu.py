"""`training/distill_gpu.sh --dry-run`: the GPU training's every step (held-out and on-policy answers, the
draft that reads the target trained, evaluation, export where agreement rose) runs on the CPU with a tiny
budget, and never writes over the shipped files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "pyramid_demo" / "models" / "weights"


def _digest() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(SHIPPED.glob("*.safetensors"))}


@pytest.mark.slow
def test_gpu_distillation_dry_run_runs_every_step_on_the_cpu(tmp_path):
    """The dry run exits 0, leaves held-out and training shards, a feature-draft checkpoint and its evaluation,
    and the shipped files are untouched."""
    before = _digest()
    env = {**os.environ, "PYTHON": sys.executable, "WORK": str(tmp_path / "w"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        ["bash", str(ROOT / "training" / "distill_gpu.sh"), "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    w = tmp_path / "w"
    f = w / "feature"
    assert list((f / "features" / "heldout").glob("shard_*.pt")) and list((f / "features" / "train").glob("shard_*.pt"))
    assert (f / "ckpt" / "feature_draft.pt").is_file()
    ev = json.loads((f / "eval.json").read_text())
    assert len(ev["checkpoint"]["top1_by_position"]) == 3 and ev["positions"] > 0
    assert 0.0 <= ev["shipped"]["top1_by_position"][0] <= 1.0
    for p in (w / "weights").glob("*.safetensors"):  # exported only where agreement rose, into the work folder
        assert p.stem == "feature_draft"
    assert _digest() == before

"""`training/distill_gpu.sh --dry-run`: the GPU distillation's every step (held-out and on-policy answers, the
draft that reads the target and the qualifier student trained, evaluation, export where agreement rose) runs
on the CPU with a tiny budget, and never writes over the shipped files."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "pyramid_demo" / "models" / "weights"


def _digest() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(SHIPPED.glob("*.safetensors"))}


def test_gpu_distillation_dry_run_runs_every_step_on_the_cpu(tmp_path):
    """The dry run exits 0, leaves held-out and training shards for both proposers, a feature-draft checkpoint
    and its evaluation, the qualifier's checkpoint and both its evaluations, says whether agreement rose, and
    the shipped files are untouched."""
    before = _digest()
    env = {**os.environ, "PYTHON": sys.executable, "WORK": str(tmp_path / "w"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(["bash", str(ROOT / "training" / "distill_gpu.sh"), "--dry-run"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    w = tmp_path / "w"
    assert list((w / "data" / "heldout").glob("shard_*.pt")) and list((w / "data" / "train").glob("shard_*.pt"))
    f = w / "feature"
    assert list((f / "features" / "heldout").glob("shard_*.pt")) and list((f / "features" / "train").glob("shard_*.pt"))
    assert (f / "ckpt" / "feature_draft.pt").is_file()
    ev = json.loads((f / "eval.json").read_text())
    assert len(ev["checkpoint"]["top1_by_position"]) == 3 and ev["positions"] > 0
    assert {p.name for p in (w / "ckpt").glob("*_last.pt")} == {"qualifier_last.pt"}
    for kind in ("ckpt", "shipped"):
        res = json.loads((w / f"eval_{kind}.json").read_text())
        assert 0.0 <= res["qualifier_vs_target"]["top1_match"] <= 1.0 and res["qualifier_vs_target"]["positions"] > 0
    assert out.stderr.count("held-out top-1 agreement") == 1
    for p in (w / "weights").glob("*.safetensors"):  # exported only where agreement rose, into the work folder
        assert p.stem in ("feature_draft", "qualifier")
    assert _digest() == before

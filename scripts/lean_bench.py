"""Per-step cost of HF eager (CachedLM) vs the lean forward on the bundled offline target, against
the memory floor (the LM head's GEMV time scaled to the model's weight bytes).

    PYTHONPATH=. .venv/bin/python scripts/lean_bench.py [--reps 15] [--context 100] [--threads N]

Timings are the min over interleaved reps: on a shared machine, pause other jobs first.
"""
from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn.functional as F

from pyramid_demo.core import packed
from pyramid_demo.core.backend import backend_flags
from pyramid_demo.core.lean import LeanLM
from pyramid_demo.core.lm import CachedLM
from pyramid_demo.models.bundled import bundled_target


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a step must read: every distinct parameter/buffer tensor once (a tied head counted once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.is_mkldnn:  # a packed weight: counted below
            continue
        if t.data_ptr() not in seen and t.dim() == 2:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    for m in model.modules():  # packed linears keep their weight in a oneDNN buffer
        if isinstance(m, packed.PackedLinear):
            total += m.in_features * m.out_features * 2
    return total


def floor_ms(model: torch.nn.Module, backend: str, reps: int) -> tuple[float, float]:
    """(head GEMV ms, that time scaled to the model's weight bytes): the memory floor of a step."""
    head = model.lm_head
    x = torch.randn(1, head.in_features).to(model.get_input_embeddings().weight.dtype)
    best = float("inf")
    with torch.inference_mode(), backend_flags(backend):
        for _ in range(reps + 2):
            t0 = time.perf_counter()
            head(x)
            best = min(best, time.perf_counter() - t0)
    head_bytes = head.in_features * head.out_features * x.element_size()
    return 1000 * best, 1000 * best * weight_bytes(model) / head_bytes


class Timer:
    def __init__(self, lm, context: int, vocab: int):
        self.lm, self.context = lm, context
        self.ids = [(7919 * i + 11) % (vocab - 1) + 1 for i in range(context + 16)]
        lm.logits(self.ids[:context], 1)

    def time(self, k: int) -> float:
        t0 = self.lm.time_s
        self.lm.logits(self.ids[: self.context + k], k)
        t = self.lm.time_s - t0
        self.lm.rollback(self.ids[: self.context + 1])
        return 1000 * t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--context", type=int, default=100)
    ap.add_argument("--ks", default="1,5")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ks = [int(k) for k in args.ks.split(",")]
    _, fp32 = bundled_target(torch.device("cpu"), torch.float32)
    vocab = fp32.config.vocab_size
    configs = [("fp32", "default", fp32)]
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    configs.append(("bf16", "no-onednn", bf16))
    if packed.available(torch.bfloat16):
        pk = copy.deepcopy(bf16)
        packed.pack_linears([pk])
        configs.append(("bf16", "packed", pk))
    timers = {}
    for name, backend, model in configs:
        timers[(name, backend, "hf")] = Timer(CachedLM(model, vocab, "t", backend), args.context, vocab)
        timers[(name, backend, "lean")] = Timer(LeanLM(model, vocab, "t", backend), args.context, vocab)
    best = {(key, k): float("inf") for key in timers for k in ks}
    for _ in range(args.reps + 1):
        for key, timer in timers.items():
            for k in ks:
                best[key, k] = min(best[key, k], timer.time(k))
    print(f"context {args.context}, min of {args.reps} interleaved reps, {torch.get_num_threads()} threads; ms")
    print("| dtype / backend | floor (head GEMV) | path | " + " | ".join(f"k={k}" for k in ks)
          + " | k=1 / floor | " + " | ".join(f"k={k} / k=1" for k in ks if k > 1) + " |")
    print("|---" * (4 + 2 * len(ks)) + "|")
    for name, backend, model in configs:
        head, floor = floor_ms(model, backend, args.reps)
        for path in ("hf", "lean"):
            t = [best[(name, backend, path), k] for k in ks]
            print(f"| {name} / {backend} | {floor:.1f} ({head:.2f}) | {path} | " + " | ".join(f"{v:.1f}" for v in t)
                  + f" | {t[0] / floor:.2f} | " + " | ".join(f"{v / t[0]:.2f}" for v in t[1:]) + " |")


if __name__ == "__main__":
    main()

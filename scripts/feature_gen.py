"""Generate the feature-conditioned proposer's data (distill/features.py) for the offline target.

  python scripts/feature_gen.py WORK [--split train|heldout] [--seed S] [--batch B] [--minutes M]
      [--dtype bfloat16|float32] [--threads N] [--rounds R] [--max-batches K] [--max-new N]

Resumable (one shard per batch under WORK/features/<split>/). The held-out set uses the fp32 target, as
every proposer's evaluation does; training data may use bf16 (about 3x faster on a CPU).
"""
import argparse
import time

import torch

from pyramid_demo.distill import features
from pyramid_demo.models.bundled import bundled_target

ap = argparse.ArgumentParser()
ap.add_argument("work")
ap.add_argument("--split", default="train")
ap.add_argument("--seed", type=int, default=10)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--minutes", type=float, default=None)
ap.add_argument("--dtype", default="bfloat16")
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--max-batches", type=int, default=None)
ap.add_argument("--max-new", type=int, default=128)
ap.add_argument("--device", default="cpu")
a = ap.parse_args()
torch.set_num_threads(a.threads)
tok, model = bundled_target(torch.device(a.device), getattr(torch, a.dtype))
model.eval()
stop = time.time() + 60 * a.minutes if a.minutes else None
n = features.generate(model, tok, f"{a.work}/features", a.split, rounds=a.rounds, batch=a.batch,
                      max_new=a.max_new, seed=a.seed, max_batches=a.max_batches, stop_at=stop)
print(f"wrote {n} answer tokens")

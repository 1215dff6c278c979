"""Train the feature-conditioned draft on feature shards (distill/feature_train.py); resumable.

  python scripts/feature_train.py CKPT HELD_WORK DATA_WORK [DATA_WORK ...] [--minutes M] [--passes P]
      [--batch B] [--lr LR] [--threads N] [--autocast] [--eval-every K]
"""
import argparse
from pathlib import Path

import torch

from pyramid_demo.distill import feature_train as ft
from pyramid_demo.models import students
from pyramid_demo.models.bundled import bundled_target

ap = argparse.ArgumentParser()
ap.add_argument("ckpt")
ap.add_argument("held")
ap.add_argument("data", nargs="+")
ap.add_argument("--minutes", type=float, default=60)
ap.add_argument("--passes", type=int, default=3)
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--lr", type=float, default=1e-3)
ap.add_argument("--lr-min", type=float, default=3e-5)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--eval-every", type=int, default=150)
ap.add_argument("--autocast", action="store_true")
ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()
torch.set_num_threads(a.threads)
_, target = bundled_target(torch.device("cpu"), torch.float32)
held = ft.heldout(Path(a.held))
print(f"held-out: {len(held)} answers, {sum(len(r['ids']) - r['n_prompt'] for r in held):,} positions", flush=True)
ft.train(target, students.subset_ids(), [Path(d) for d in a.data], held, Path(a.ckpt), a.minutes, lr=a.lr,
         lr_min=a.lr_min, batch=a.batch, passes=a.passes, seed=a.seed, eval_every=a.eval_every,
         autocast=a.autocast, log=lambda s: print(s, flush=True))

"""Train and measure the early-exit qualifier design (distill/exit_qualifier.py) on feature shards.

  python scripts/exit_train.py OUT.json HELD_WORK DATA_WORK [DATA_WORK ...] --k K [--minutes M] [--threads N]
"""
import argparse
import json
from pathlib import Path

import torch

from pyramid_demo.distill import exit_qualifier as eq
from pyramid_demo.distill import feature_train as ft
from pyramid_demo.models import students
from pyramid_demo.models.bundled import bundled_target

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("held")
ap.add_argument("data", nargs="+")
ap.add_argument("--k", type=int, default=8)
ap.add_argument("--minutes", type=float, default=20)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--eval-every", type=int, default=100)
ap.add_argument("--held-limit", type=int, default=None)
a = ap.parse_args()
torch.set_num_threads(a.threads)
_, target = bundled_target(torch.device("cpu"), torch.float32)
held = ft.heldout(Path(a.held))[: a.held_limit]
st = eq.train(target, students.subset_ids(), [Path(d) for d in a.data], held, a.k, a.minutes,
              eval_every=a.eval_every, log=lambda s: print(s, flush=True))
torch.save(st.pop("model"), Path(a.out).with_suffix(".pt"))
Path(a.out).write_text(json.dumps({"k": a.k, **st}, indent=1))
print(json.dumps(st["curve"][-1]))

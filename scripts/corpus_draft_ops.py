"""Count what the feature draft's one-token step calls (torch.profiler op counts; times only on an idle machine).

    PYTHONPATH=. python scripts/corpus_draft_ops.py [--dtype float32|bfloat16] [--context 80] [--reps 50]

Prints the aten calls of one chain step (a row past the target's states, as drafting token 2 of a chain reads its
own prediction) and, with --reps, the median wall time of that step and of the target's lean one-token step
(one thread), side by side in one process.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from pyramid_demo.core.cache import TargetStates
from pyramid_demo.core.feature_lm import FeatureLM
from pyramid_demo.core.lean import LeanLM
from pyramid_demo.models import feature_draft
from pyramid_demo.models.bundled import bundled_target


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--context", type=int, default=80)
    ap.add_argument("--reps", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    _, tgt = bundled_target(torch.device("cpu"), getattr(torch, a.dtype))
    lm = FeatureLM(feature_draft.build(tgt), tgt.config.vocab_size, "draft")
    lm.states = st = TargetStates()
    g = torch.Generator().manual_seed(0)
    n = a.context
    st.write(0, torch.randn(n, tgt.config.hidden_size, generator=g).to(lm.dtype))
    ids = torch.randint(0, tgt.config.vocab_size, (n + 2,), generator=g).tolist()
    lm.forward(ids[:n + 1], 0, 1)  # rows 0..n: the last one past the target's states

    def step() -> None:
        lm.truncate(n + 1)
        lm.forward([ids[n + 1]], n + 1, 1)
    step()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as p:
        step()
    ev = sorted(p.key_averages(), key=lambda e: -e.count)
    print(f"one draft step: {sum(e.count for e in ev)} aten calls, {len(ev)} distinct; "
          f"matmuls {sum(e.count for e in ev if e.key in ('aten::mm', 'aten::addmm'))}")
    for e in ev[:20]:
        print(f"{e.count:4d} {e.key}")
    if a.reps:
        tl = LeanLM(tgt, tgt.config.vocab_size, "target")
        tl.forward(ids[:n], 0, 1)

        def tstep() -> None:
            tl.truncate(n)
            tl.forward([ids[n]], n, 1)
        ds, ts = [], []
        for _ in range(a.reps):  # interleaved
            t0 = time.perf_counter()
            step()
            ds.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            tstep()
            ts.append(time.perf_counter() - t0)
        d, t = statistics.median(ds) * 1e3, statistics.median(ts) * 1e3
        print(f"median: draft {d:.2f} ms, target {t:.2f} ms, ratio {d / t:.3f}")


if __name__ == "__main__":
    main()

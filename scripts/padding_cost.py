"""What padding packed bf16 linears to two rows costs (`core.packed`): the offline target's cached forward at
k = 1, 5, 9 new tokens with every packed linear padded to 1 row (inexact on some CPUs) and to 2 (exact),
on the lean and the HF forward; min of 15 interleaved reps. Usage: PYTHONPATH=. python scripts/padding_cost.py
(pause anything else running first: timings on 2 shared cores are meaningless)."""
import copy

import torch

from pyramid_demo.core import costs
from pyramid_demo.core.attention import use_rowwise
from pyramid_demo.core.packed import pack_linears
from pyramid_demo.models.bundled import bundled_target

tok, t32 = bundled_target(torch.device("cpu"), torch.float32)
timers = {}
for pad in (1, 2):
    m = copy.deepcopy(t32).to(torch.bfloat16)
    use_rowwise(m)
    pack_linears([m], pad)
    for path in ("lean", "hf"):
        timers[(pad, path)] = costs.ForwardTimer(m, 49152, "packed", path=path)
best = {c: {k: 9e9 for k in (1, 5, 9)} for c in timers}
for _ in range(15):
    for c, t in timers.items():
        for k in (1, 5, 9):
            best[c][k] = min(best[c][k], 1000 * t.time(k))
print("| forward | k | pad 1 (inexact) ms | pad 2 (exact) ms | cost of padding |")
print("|---|---|---|---|---|")
for path in ("lean", "hf"):
    for k in (1, 5, 9):
        a, b = best[(1, path)][k], best[(2, path)][k]
        print(f"| {path} | {k} | {a:.2f} | {b:.2f} | {100 * (b / a - 1):+.1f}% |")

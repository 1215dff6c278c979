"""What a tree pass costs against a one-token step and chain passes, on the lean forward as the runs use it:
the offline target (bf16, packed linears with the padding `invariant_pad` finds), padded attention, after
100 tokens, interleaved reps; the tree in both key layouts (gathered: each row's ancestors copied where a
step has them; masked: the shared cache and a mask), and each layout's exactness over the probe's tree shapes.
Usage: PYTHONPATH=. python scripts/tree_cost.py [reps] [threads] [--no-check]
(pause anything else running first: timings on 2 shared cores are meaningless)."""
import statistics
import sys
import time

import torch

from pyramid_demo.core import exactness
from pyramid_demo.core.costs import CONTEXT
from pyramid_demo.core.lean import LeanLM
from pyramid_demo.models.bundled import bundled_target
from pyramid_demo.models.probe import TREE_PLAN, candidate_model

nums = [int(a) for a in sys.argv[1:] if a.isdigit()]
reps = nums[0] if nums else 30
if len(nums) > 1:
    torch.set_num_threads(nums[1])
_, fp32 = bundled_target(torch.device("cpu"), torch.float32)
vocab = fp32.config.vocab_size
model, pad = candidate_model(fp32, "bfloat16", "packed")
ids = [(7919 * i + 11) % (vocab - 1) + 1 for i in range(CONTEXT + 80)]
TREES = {8: exactness.TREE_SHAPES[1], 16: exactness.TREE_SHAPES[2]}
lms = {lay: LeanLM(model, vocab, "t", "packed", padded=True, tree_layout=lay) for lay in ("gathered", "masked")}
for lm in lms.values():
    lm.logits(ids[:CONTEXT], 1)
    lm.truncate(CONTEXT - 1)  # every case below feeds from CONTEXT - 1: the root (or first) row is ids[CONTEXT - 1]
cases = [("step", 1), ("chain", 5), ("chain", 9), ("chain", 17)] + [(f"tree-{lay}", n) for lay in lms for n in TREES]
got: dict[tuple[str, int], list[float]] = {c: [] for c in cases}
t0 = time.perf_counter()
for r in range(reps + 3):  # interleaved; 3 warm-up rounds
    for kind, n in cases:
        lm = lms["masked" if kind.endswith("masked") else "gathered"]
        s = lm.time_s
        if kind.startswith("tree"):
            par = TREES[n]
            lm.forward_tree(ids[CONTEXT - 1: CONTEXT - 1 + len(par)], list(par), CONTEXT - 1)
        else:
            lm.logits(ids[: CONTEXT + n - 1], n)
        if r >= 3:
            got[(kind, n)].append(1000 * (lm.time_s - s))
        lm.truncate(CONTEXT - 1)
print(f"bf16 packed (pad {pad}) lean padded, {torch.get_num_threads()} threads, context {CONTEXT}, {reps} interleaved "
      f"reps ({time.perf_counter() - t0:.1f} s)")
step = statistics.median(got[("step", 1)])
print("| pass | rows | ms min / median | ÷ step (median) |")
print("|---|---|---|---|")
for (kind, n), v in got.items():
    rows = n + 1 if kind.startswith("tree") else n
    print(f"| {kind} {n if kind.startswith('tree') else ''} | {rows} | {min(v):.2f} / {statistics.median(v):.2f} | "
          f"{statistics.median(v) / step:.3f} |")
if "--no-check" not in sys.argv:
    for lay in lms:
        rec = exactness.check_model(lambda lay=lay: LeanLM(model, vocab, "t", "packed", padded=True,
                                                           tree_layout=lay), vocab, TREE_PLAN, pad,
                                    kinds=("tree",))["trees"]
        print(f"{lay}: exact {rec['exact']} ({rec['bitwise_passes']}/{rec['passes']} tree passes bitwise, "
              f"max diff {rec['max_abs_diff']:.2g}, top-1 {rec['top1']})")

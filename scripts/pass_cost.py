"""What a verification pass costs against a one-token step on the lean forward (`core.lean`), row-wise
attention (one SDPA call per row per layer) against padded (one per layer): the offline target as the probe
runs it (bf16, packed linears with the padding `invariant_pad` finds), cached forwards of k = 1, 5, 9 new
tokens after 100 tokens, interleaved reps; min and median per k, and each mode's exactness record over the
probe's plan. Usage: PYTHONPATH=. python scripts/pass_cost.py [reps] [threads] [--no-check]
(pause anything else running first: timings on 2 shared cores are meaningless)."""
import statistics
import sys
import time

import torch

from pyramid_demo.core import exactness
from pyramid_demo.core.costs import CONTEXT
from pyramid_demo.core.lean import LeanLM
from pyramid_demo.models.bundled import bundled_target
from pyramid_demo.models.probe import EXACT_PLAN, candidate_model

nums = [int(a) for a in sys.argv[1:] if a.isdigit()]
reps = nums[0] if nums else 40
if len(nums) > 1:
    torch.set_num_threads(nums[1])
KS = (1, 5, 9)
_, fp32 = bundled_target(torch.device("cpu"), torch.float32)
vocab = fp32.config.vocab_size
model, pad = candidate_model(fp32, "bfloat16", "packed")
ids = [(7919 * i + 11) % (vocab - 1) + 1 for i in range(CONTEXT + max(KS))]
lms = {mode: LeanLM(model, vocab, "t", "packed", padded=mode == "padded") for mode in ("rowwise", "padded")}
for lm in lms.values():
    lm.logits(ids[:CONTEXT], 1)
got: dict[str, dict[int, list[float]]] = {m: {k: [] for k in KS} for m in lms}
print(f"timing {len(lms)} modes × k = {KS}", flush=True)
t0 = time.perf_counter()
for r in range(reps + 3):  # interleaved: a busier moment costs every mode and k alike; 3 warm-up rounds
    for mode, lm in lms.items():
        for k in KS:
            s = lm.time_s
            lm.logits(ids[: CONTEXT + k], k)
            if r >= 3:
                got[mode][k].append(1000 * (lm.time_s - s))
            lm.rollback(ids[: CONTEXT + 1])  # keeps CONTEXT tokens
print(f"bf16 packed (pad {pad}) lean, {torch.get_num_threads()} threads, context {CONTEXT}, {reps} interleaved reps "
      f"({time.perf_counter() - t0:.1f} s)")
print("| attention | k=1 ms min / median | k=5 | k=9 | k=5 ÷ k=1 (min, median) | k=9 ÷ k=1 |")
print("|---|---|---|---|---|---|")
for mode, row in got.items():
    mn = {k: min(v) for k, v in row.items()}
    md = {k: statistics.median(v) for k, v in row.items()}
    cells = " | ".join(f"{mn[k]:.2f} / {md[k]:.2f}" for k in KS)
    print(f"| {mode} | {cells} | {mn[5] / mn[1]:.3f}, {md[5] / md[1]:.3f} | {mn[9] / mn[1]:.3f}, {md[9] / md[1]:.3f} |")
base = {k: statistics.median(got["rowwise"][k]) for k in KS}
print("padded pass ÷ row-wise step (median): " + ", ".join(
    f"k={k} {statistics.median(got['padded'][k]) / base[1]:.3f}" for k in KS))
if "--no-check" not in sys.argv:
    for mode in lms:
        rec = exactness.check_model(lambda mode=mode: LeanLM(model, vocab, "t", "packed", padded=mode == "padded"),
                                    vocab, EXACT_PLAN, pad)
        print(f"{mode}: exact {rec['exact']} ({rec['bitwise_passes']}/{rec['passes']} passes bitwise, "
              f"max diff {rec['max_abs_diff']:.2g})")

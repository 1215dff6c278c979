"""What batch-invariant attention costs on the lean forward, side by side in one process: the offline target as the
probe would run it here (bf16 with packed linears where this CPU's oneDNN runs bf16, else fp32), cached forwards of
k = 1, 5, 9, 17 new tokens after 100 tokens (and after 460: past the attention kernel's key split, where rows get a
step's own call), interleaved reps, min and median per k, under three attentions:
  aligned    today's: a pass's rows in one call over scratch-aligned key lengths (`lean.scratch_pad`), row by row
             past `lean.KV_SPLIT` keys at more than one thread;
  unaligned  before issue 33: one call per pass over key lengths a multiple of 64 (batch-variant at 2 threads);
  rows       every row a one-token step's own call (`lean.set_attention(model, "rows")`).
Then each attention's exactness at this thread count: its attention check over the probe's plan (bitwise), and
unless --no-chain the model's k-token passes against one-token steps.
Usage: PYTHONPATH=. python scripts/attention_cost.py [reps] [threads] [--no-chain]
(pause anything else running first: timings on 2 shared cores are meaningless)."""
import statistics
import sys
import time

import torch

from pyramid_demo.core import exactness
from pyramid_demo.core.lean import LeanLM
from pyramid_demo.core.packed import available as packed_available
from pyramid_demo.models.bundled import bundled_target
from pyramid_demo.models.probe import EXACT_PLAN, candidate_model

nums = [int(a) for a in sys.argv[1:] if a.isdigit()]
reps = nums[0] if nums else 30
if len(nums) > 1:
    torch.set_num_threads(nums[1])
KS, CONTEXTS = (1, 5, 9, 17), (100, 460)
_, fp32 = bundled_target(torch.device("cpu"), torch.float32)
vocab = fp32.config.vocab_size
dt, backend = ("bfloat16", "packed") if packed_available(torch.bfloat16) else ("float32", "default")
model, pad = candidate_model(fp32, dt, backend)
ids = [(7919 * i + 11) % (vocab - 1) + 1 for i in range(max(CONTEXTS) + max(KS))]


def open_lm(mode: str) -> LeanLM:
    lm = LeanLM(model, vocab, "t", backend, padded=True)
    if mode == "unaligned":
        lm.key_pad = 0
        lm.batched = lambda t: True  # type: ignore[method-assign]
    lm.attention = "rows" if mode == "rows" else "auto"
    return lm


MODES = ("aligned", "unaligned", "rows")
lms = {(m, c): open_lm(m) for m in MODES for c in CONTEXTS}
for (_, c), lm in lms.items():
    lm.logits(ids[:c], 1)
got = {key: {k: [] for k in KS} for key in lms}
t0 = time.perf_counter()
for r in range(reps + 3):  # interleaved: a busier moment costs every mode and k alike; 3 warm-up rounds
    for (m, c), lm in lms.items():
        for k in KS:
            s = lm.time_s
            lm.logits(ids[: c + k], k)
            if r >= 3:
                got[(m, c)][k].append(1000 * (lm.time_s - s))
            lm.rollback(ids[: c + 1])  # keeps c tokens
print(f"{dt}/{backend} (pad {pad}) lean, {torch.get_num_threads()} threads, {reps} interleaved reps "
      f"({time.perf_counter() - t0:.1f} s)")
print("| attention | context | " + " | ".join(f"k={k} ms min / median" for k in KS) + " | median ÷ aligned |")
print("|---|---|" + "---|" * len(KS) + "---|")
for (m, c), row in got.items():
    md = {k: statistics.median(v) for k, v in row.items()}
    ref = {k: statistics.median(v) for k, v in got[("aligned", c)].items()}
    cells = " | ".join(f"{min(row[k]):.2f} / {md[k]:.2f}" for k in KS)
    print(f"| {m} | {c} | {cells} | " + ", ".join(f"k={k} {md[k] / ref[k]:.3f}" for k in KS) + " |")
for m in MODES:
    att = exactness.check_model(lambda m=m: open_lm(m), vocab, EXACT_PLAN, pad, kinds=("attention",))["attention"]
    line = f"{m}: attention check {att['bitwise_passes']}/{att['passes']} bitwise"
    if "--no-chain" not in sys.argv:
        rec = exactness.check_model(lambda m=m: open_lm(m), vocab, EXACT_PLAN, pad, kinds=("chain",))
        line += f"; passes {rec['bitwise_passes']}/{rec['passes']} bitwise (max diff {rec['max_abs_diff']:.2g})"
    print(line, flush=True)

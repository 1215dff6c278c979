"""Cost of a proposer's cached one-token forward with a full or a reduced-vocabulary head.

    PYTHONPATH=. .venv/bin/python scripts/reduced_head_costs.py --data /work/dw/data --reps 40

bf16 on CPU, as the loader runs it (row-wise attention), under two backends: "packed" (every
bf16 linear packed once for oneDNN, core.packed) and "no-onednn" (plain linears, oneDNN off).
An 80-token chat context; one forward of 1 new token, cropped back after each rep; every
configuration timed once per rep, in turn (interleaved), and the minimum over reps reported.
Pause any background job while it runs: timings on a shared machine are only comparable as minima.
"""
from __future__ import annotations

import argparse
import copy
import json
import time

import torch

from pyramid_demo.core.attention import use_rowwise
from pyramid_demo.core.config import LONGEST_PASS
from pyramid_demo.core.lm import CachedLM
from pyramid_demo.core.packed import bf16_linears, invariant_pad, pack_linears
from pyramid_demo.distill import data as dd
from pyramid_demo.distill import vocab
from pyramid_demo.models import students
from pyramid_demo.models.bundled import bundled_target
from pyramid_demo.models.reduced_head import load_subset, reduce_head


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="distill_work/data", help="work folder's data/ (for the ranking)")
    ap.add_argument("--ids", default=None, help="a ranked-id file (distill.vocab.save) instead of counting --data")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ns", default=",".join(map(str, vocab.NS)))
    ap.add_argument("--roles", default="draft,qualifier,target")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok, target = bundled_target(torch.device("cpu"), torch.bfloat16)
    V = len(tok)
    ns = [int(n) for n in a.ns.split(",")]
    if a.ids:
        ids = load_subset(a.ids)[0]
    else:
        always = tuple([tok.eos_token_id] + [i for i in tok.all_special_ids if i != tok.eos_token_id])
        ids = vocab.build(a.data, V, always, max(ns))[0]
    if len(ids) < max(ns):
        raise SystemExit(f"only {len(ids)} ranked ids, fewer than N = {max(ns)}")
    ctx = dd.chat_ids(tok, "Explain in two sentences why the sky is blue. Then list three facts about "
                           "the ocean, each with a short reason, and end with a question for the reader.")
    ctx = (ctx * 3)[:80]
    models = {}
    for backend in ("packed", "no-onednn"):  # each backend its own target: packing mutates shared layers
        base = copy.deepcopy(target) if backend == "packed" else target
        group = {}
        for role in a.roles.split(","):
            for n in [0] + (ns if role != "target" else []):
                m = base if role == "target" else students.build(base, role).to(torch.bfloat16)
                if n:
                    reduce_head(m, ids[:n])  # the student's own head; the target's is left alone
                use_rowwise(m)
                group[(backend, role, n)] = m
        if backend == "packed":
            ms = list(group.values())
            pack_linears(ms, invariant_pad(bf16_linears(ms), LONGEST_PASS) or 1)
        models.update(group)
    lms = {k: CachedLM(m, V, k[1], k[0]) for k, m in models.items()}
    for lm in lms.values():
        lm.logits(ctx[:-1], 1)
    best = {k: float("inf") for k in lms}
    for _ in range(a.reps):
        for k, lm in lms.items():
            t0 = time.perf_counter()
            lm.logits(ctx, 1)
            best[k] = min(best[k], time.perf_counter() - t0)
            lm.rollback(ctx)
    out = {f"{b}/{r}/{n or 'full'}": round(1000 * t, 2) for (b, r, n), t in best.items()}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

"""SD over a chain against SD over trees of several budgets, beside AR, in one process on the offline family:
the 8 unseen prompts (assets/unseen_prompts.jsonl), T=0, 64 new tokens, the family's tuned settings, methods
interleaved per prompt. Prints the median tok/s, the median ratio to AR per prompt, tokens per target pass
and the token agreement with AR. Usage: PYTHONPATH=. python scripts/tree_budget.py [threads]
(pause anything else running first: timings on 2 shared cores are meaningless)."""
import statistics
import sys

import torch

from pyramid_demo.bench.prompts import load_prompts
from pyramid_demo.core.run import generate
from pyramid_demo.models.loading import load_triplet
from pyramid_demo.models.presets import family_config

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)

t = load_triplet("smollm2-offline")
print(f"{torch.get_num_threads()} threads; exact: {t.exact}, tree passes exact: {t.tree_exact}", flush=True)
prompts = load_prompts("assets/unseen_prompts.jsonl")
variants = [("ar", {}), ("sd", dict(shape="chain"))] + [
    ("sd", dict(shape="tree", tree_nodes=n, tree_depth=d, tree_k=k))
    for n, d, k in [(4, 3, 2), (8, 4, 3), (8, 5, 2), (12, 5, 3), (16, 5, 4), (16, 6, 3)]]
res = {i: [] for i in range(len(variants))}
for p in prompts:
    ref: list[int] = []
    for i, (m, kw) in enumerate(variants):
        cfg = family_config("smollm2-offline", method=m, max_new_tokens=64, **kw)
        r = generate(t, p.text, cfg, full_records=False)
        if m == "ar":
            ref = r.token_ids
        agree = sum(a == b for a, b in zip(r.token_ids, ref)) / len(ref)
        res[i].append((r.stats.tokens_per_s, r.stats.tokens_per_target_pass, agree, r.stats.decode_s))
for i, (m, kw) in enumerate(variants):
    tps, ar = [x[0] for x in res[i]], [x[0] for x in res[0]]
    ratio = statistics.median([a / b for a, b in zip(tps, ar)])
    print(f"{m} {kw} median tok/s {statistics.median(tps):.1f}, median x AR {ratio:.3f}, tokens/pass "
          f"{statistics.mean(x[1] for x in res[i]):.3f}, agreement {statistics.mean(x[2] for x in res[i]):.3f}",
          flush=True)

"""The token subset of a reduced-vocabulary proposer head (FR-Spec, arXiv 2502.14856).

Tokens are ranked by how often the target itself writes them: their count in the on-policy
answers of the training shards (`data/train/*.pt`, answer ids only, EOS included), ties by id.
The chat template's special ids (`always`) come first, so every N keeps them. Coverage is the
share of the held-out answers' tokens that fall inside the top N: it caps a reduced-head
proposer's acceptance, since an uncovered position is a certain rejection.

    python -m training distill --work W vocab --vocab-n 8192
"""
from __future__ import annotations

from pathlib import Path

import torch

from pyramid_demo.models.reduced_head import load_subset, save_subset  # noqa: F401 - the file format lives with the head

NS = (1024, 2048, 4096, 8192, 16384, 32768)


def answer_counts(data_dir: str | Path, split: str, vocab: int) -> tuple[torch.Tensor, int]:
    """Per-token counts [vocab] over the answers (ids after the prompt) of every shard of `split`,
    and the number of answers. Shards are read one at a time (a running `gen` may add more)."""
    counts = torch.zeros(vocab, dtype=torch.long)
    n = 0
    for p in sorted((Path(data_dir) / split).glob("shard_*.pt")):
        for r in torch.load(p, weights_only=False):
            ans = r["ids"][int(r["n_prompt"]):].long()
            counts += torch.bincount(ans, minlength=vocab)[:vocab]
            n += 1
    return counts, n


def rank(counts: torch.Tensor, always: tuple[int, ...] = ()) -> torch.Tensor:
    """Every token id [V], `always` first (in the order given), then by count (descending, ties by id)."""
    order = torch.argsort(counts, descending=True, stable=True)  # stable: ties keep id order
    first = torch.tensor(always, dtype=torch.long)
    return torch.cat([first, order[~torch.isin(order, first)]])


def coverage(ranked: torch.Tensor, counts: torch.Tensor, n: int) -> float:
    """Share of the tokens counted in `counts` whose id is among the first n of `ranked`."""
    total = int(counts.sum())
    return float(counts[ranked[:n]].sum()) / total if total else 0.0


def build(data_dir: str | Path, vocab: int, always: tuple[int, ...], n: int,
          ns: tuple[int, ...] = NS) -> tuple[torch.Tensor, dict]:
    """Count, rank and measure: the first n ranked ids and the metadata (coverage for every N in ns)."""
    train, n_train = answer_counts(data_dir, "train", vocab)
    held, n_held = answer_counts(data_dir, "heldout", vocab)
    order = rank(train, always)
    cov = {str(k): round(coverage(order, held, k), 4) for k in sorted(set(ns) | {n})}
    meta = {"n": n, "vocab": vocab, "always": list(always),
            "counted": f"answer tokens of the target's on-policy answers (EOS included): {n_train} "
                       f"training answers, {int(train.sum())} tokens, {int((train > 0).sum())} distinct",
            "heldout": f"{n_held} held-out answers (topics never trained on), {int(held.sum())} tokens",
            "coverage_heldout": cov,
            "coverage_train": round(coverage(order, train, n), 4)}
    return order[:n], meta


@torch.inference_mode()
def agreement_by_n(student, head, recs: list[dict], ranked: torch.Tensor, ns: tuple[int, ...],
                   pad: int = 2, batch: int = 8) -> dict:
    """Teacher-forced top-1 agreement of `student` with the target on the held-out answers, with the
    full head ("full") and with a head over the first n ranked ids (each n in ns), plus the share of
    positions whose target argmax lies in the subset (the cap on that agreement)."""
    from .loss import _hidden, collate

    V = head.weight.shape[0]
    rank_of = torch.full((V,), V, dtype=torch.long)
    rank_of[ranked] = torch.arange(ranked.numel())
    hits = {str(n): 0 for n in ns} | {"full": 0}
    cap = {str(n): 0 for n in ns}
    total = 0
    for i in range(0, len(recs), batch):
        ids, att, ans, h = collate(recs, list(range(i, min(i + batch, len(recs)))), pad)
        hs = _hidden(student, ids, att)[ans]
        for j in range(0, hs.shape[0], 512):
            zs, zt = head(hs[j:j + 512]).float(), head(h[j:j + 512].to(hs.dtype)).float()
            t = zt.argmax(-1)
            hits["full"] += int((zs.argmax(-1) == t).sum())
            for n in ns:
                inside = rank_of < n  # [V]
                hits[str(n)] += int((zs.masked_fill(~inside, float("-inf")).argmax(-1) == t).sum())
                cap[str(n)] += int(inside[t].sum())
        total += hs.shape[0]
    return {"positions": total, "top1": {k: round(v / total, 4) for k, v in hits.items()},
            "target_top1_covered": {k: round(v / total, 4) for k, v in cap.items()}}

"""The token subset of the feature draft's reduced head (FR-Spec, arXiv 2502.14856).

Tokens are ranked by how often the target itself writes them: their count in the on-policy
answers of the training shards (`WORK/features/train/*.pt`, answer ids only, EOS included), ties by id.
The chat template's special ids (`always`) come first, so every N keeps them. Coverage is the
share of the held-out answers' tokens that fall inside the top N: it caps a reduced-head
proposer's acceptance, since an uncovered position is a certain rejection.

    python -m training draft-feature vocab --work W --vocab-n 8192
"""

from __future__ import annotations

from pathlib import Path

import torch

from pyramid_demo.models.feature_draft import load_subset, save_subset  # noqa: F401 - the file format lives with the draft

NS = (1024, 2048, 4096, 8192, 16384, 32768)


def answer_counts(data_dir: str | Path, split: str, vocab: int) -> tuple[torch.Tensor, int]:
    """Per-token counts [vocab] over the answers (ids after the prompt) of every shard of `split`,
    and the number of answers. Shards are read one at a time (a running `gen` may add more)."""
    counts = torch.zeros(vocab, dtype=torch.long)
    n = 0
    for p in sorted((Path(data_dir) / split).glob("shard_*.pt")):
        for r in torch.load(p, weights_only=False):
            ans = r["ids"][int(r["n_prompt"]) :].long()
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


def build(
    data_dir: str | Path, vocab: int, always: tuple[int, ...], n: int, ns: tuple[int, ...] = NS
) -> tuple[torch.Tensor, dict]:
    """Count, rank and measure: the first n ranked ids and the metadata (coverage for every N in ns)."""
    train, n_train = answer_counts(data_dir, "train", vocab)
    held, n_held = answer_counts(data_dir, "heldout", vocab)
    order = rank(train, always)
    cov = {str(k): round(coverage(order, held, k), 4) for k in sorted(set(ns) | {n})}
    meta = {
        "n": n,
        "vocab": vocab,
        "always": list(always),
        "counted": f"answer tokens of the target's on-policy answers (EOS included): {n_train} "
        f"training answers, {int(train.sum())} tokens, {int((train > 0).sum())} distinct",
        "heldout": f"{n_held} held-out answers (topics never trained on), {int(held.sum())} tokens",
        "coverage_heldout": cov,
        "coverage_train": round(coverage(order, train, n), 4),
    }
    return order[:n], meta

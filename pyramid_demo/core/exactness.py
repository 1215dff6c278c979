"""Does a k-token pass give the logits of k one-token steps? Measured, never assumed.

SD at temperature 0 promises AR's text token for token. It keeps that promise only if the target's
logits at a position do not depend on how many positions share the forward. Whether they do depends
on the CPU's kernels (see `core.packed`, `core.attention`), so the probe measures it on the machine
at hand with `pass_vs_steps`, and every "exact" claim the app, the CLI and bench make comes from the
record `summarise` builds.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .lm import LM


def pass_vs_steps(lm: LM, ids: list[int], context: int, ks: Sequence[int]) -> list[dict[str, Any]]:
    """Prefill `context` tokens of `ids`, take max(ks) one-token steps, then for each k one k-token pass
    from the same context; compare each pass's logits with the steps' at the same positions."""
    kmax = max(ks)
    seq = ids[: context + kmax]
    if len(seq) < context + kmax:
        raise ValueError(f"need {context + kmax} ids, got {len(ids)}")
    lm.logits(seq[:context], 1)
    steps = torch.cat([lm.logits(seq[: context + i + 1], 1) for i in range(kmax)])  # [kmax, V]
    out = []
    for k in ks:
        lm.rollback(seq[: context + 1])  # keeps the `context` prefilled tokens
        z = lm.logits(seq[: context + k], k)  # [k, V]
        ref = steps[:k]
        diff = torch.where(z == ref, 0.0, (z - ref).abs())  # equal −inf (a reduced head's zeros) differ by 0
        out.append({"k": k, "context": context, "bitwise": bool(torch.equal(z, ref)),
                    "top1": bool(torch.equal(z.argmax(-1), ref.argmax(-1))),
                    "max_abs_diff": float(diff.max())})
    return out


PassCheck = Callable[[LM, list[int], int, Sequence[int]], list[dict[str, Any]]]
# Every kind of multi-token pass a run makes, checked alike against one-token steps: a new kind (a tree of
# candidates verified in one pass) is one entry here, and the probe then checks it for every role.
PASS_CHECKS: dict[str, PassCheck] = {"chain": pass_vs_steps}


def summarise(checks: list[dict[str, Any]], pad_rows: int = 1) -> dict[str, Any]:
    """One record: exact only when every pass matched bitwise; top1 when every argmax matched."""
    return {"exact": all(c["bitwise"] for c in checks), "top1": all(c["top1"] for c in checks),
            "passes": len(checks), "bitwise_passes": sum(c["bitwise"] for c in checks),
            "max_abs_diff": max((c["max_abs_diff"] for c in checks), default=0.0),
            "max_k": max((c["k"] for c in checks), default=0), "pad_rows": pad_rows,
            "kinds": sorted({c.get("kind", "chain") for c in checks})}


def check_model(open_lm: Callable[..., LM], vocab_size: int, plan: Sequence[tuple[int, Sequence[int]]],
                pad_rows: int = 1, with_ids: bool = False) -> dict[str, Any]:
    """`summarise` over several contexts and every kind of pass (`PASS_CHECKS`): `plan` is [(context length,
    ks)], each on a fresh LM over fixed pseudo-random token ids (a different stretch of them per context).
    `with_ids`: `open_lm(ids)` is handed the ids it will be checked on (a proposer that reads the target
    needs the target's states over them); else `open_lm()`."""
    checks: list[dict[str, Any]] = []
    for n, (context, ks) in enumerate(plan):
        ids = [(7919 * (i + 131 * n) + 17 * n + 11) % max(2, vocab_size - 1) + 1
               for i in range(context + max(ks))]
        for kind, check in PASS_CHECKS.items():
            lm = open_lm(ids) if with_ids else open_lm()
            checks += [{**c, "kind": kind} for c in check(lm, ids, context, ks)]
    return summarise(checks, pad_rows)


def describe(record: dict[str, Any] | None) -> str:
    """What the record means for the lossless methods, in one sentence for users."""
    if not record:
        return ("exactness not checked for this choice: lossless methods (SD, lossless PSD_A) may differ from AR "
                "at near-ties")
    if record["exact"]:
        return (f"exact: a verification pass of up to {record['max_k']} tokens gives bitwise the logits of "
                f"one-token steps ({record['bitwise_passes']}/{record['passes']} passes checked), so SD and "
                "lossless PSD_A write AR's text at T=0")
    if record["top1"]:
        return (f"not bitwise exact on this machine ({record['bitwise_passes']}/{record['passes']} passes equal, "
                f"max logit difference {record['max_abs_diff']:.2g}, top-1 always equal): lossless methods may "
                "differ from AR at near-ties")
    return (f"not exact on this machine (max logit difference {record['max_abs_diff']:.2g}, top-1 differed): "
            "lossless methods may differ from AR at near-ties")

"""Does a k-token pass give the logits of k one-token steps? Measured here on the forward each role runs, never
assumed: every "exact" claim comes from the record `summarise` builds (shown to users, never an input to a choice)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..core.engine import connect
from ..forward.cache import VerifierStates, probe_ids
from ..forward.lm import LM, open_lm


def _compare(z: torch.Tensor, ref: torch.Tensor, context: int) -> dict[str, Any]:
    """A pass's logits [k, V] against one-token steps' [k, V]."""
    diff = torch.where(z == ref, 0.0, (z - ref).abs())  # equal −inf (a reduced head's zeros) differ by 0
    return {
        "k": len(z),
        "context": context,
        "bitwise": bool(torch.equal(z, ref)),
        "top1": bool(torch.equal(z.argmax(-1), ref.argmax(-1))),
        "max_abs_diff": float(diff.max()),
    }


def pass_vs_steps(lm: LM, ids: list[int], context: int, ks: Sequence[int]) -> list[dict[str, Any]]:
    """Prefill `context` tokens, take max(ks) one-token steps, then compare each k-token pass from there with them."""
    kmax = max(ks)
    seq = ids[: context + kmax]  # `check_model` draws exactly these many
    lm.feed(seq[:context], 1)
    steps = torch.cat([lm.feed(seq[: context + i + 1], 1) for i in range(kmax)])  # [kmax, V]
    out = []
    for k in ks:
        lm.rollback(seq[: context + 1])  # keeps the `context` prefilled tokens
        out.append(_compare(lm.feed(seq[: context + k], k), steps[:k], context))  # [k, V] each
    return out


# the tree shapes checked, as parent lists under the root row (−1): a bushy tree and the 16-node tree EAGLE-2's
# expansion builds at k = 4 (ancestors scattered among their cousins); a chain's rows run as a chain (checked above)
TREE_SHAPES = ((-1, 0, 0, 0, 1, 1, 2, 4), (-1, 0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 5, 5, 6, 8, 11, 14))


def tree_vs_steps(lm: LM, ids: list[int], context: int, parents: Sequence[int]) -> dict[str, Any]:
    """Prefill `context` tokens, feed one tree of ids[context:], compare each row with steps along its path."""
    tokens = ids[context : context + len(parents)]
    lm.rollback(ids[:context])  # an LM an earlier check used: keep what it shares with these ids
    lm.feed(ids[:context], 1)
    z = lm.forward(tokens, context, parents=list(parents))  # [n, V]
    paths: list[tuple[int, ...]] = []  # each row's tokens from the root (a parent comes before its children)
    steps: dict[tuple[int, ...], torch.Tensor] = {}
    for j, p in enumerate(parents):
        paths.append((paths[p] if p >= 0 else ()) + (tokens[j],))
        if paths[j] not in steps:
            lm.truncate(context)
            for i, token in enumerate(paths[j]):
                steps[paths[j][: i + 1]] = lm.forward([token], context + i, 1)[0]
    return _compare(z, torch.stack([steps[path] for path in paths]), context)


def tree_passes(lm: LM, ids: list[int], context: int, ks: Sequence[int]) -> list[dict[str, Any]]:
    """Every tree shape that fits the plan's ids, against steps along each path (none where the LM takes no trees)."""
    if not getattr(lm, "trees", False) or max(ks) < max(map(len, TREE_SHAPES)):  # once per plan: its longest pass
        return []
    at = (context, context + 25)
    return [tree_vs_steps(lm, ids, c, s) for c in at for s in TREE_SHAPES if c + len(s) <= len(ids)]


PassCheck = Callable[[LM, list[int], int, Sequence[int]], list[dict[str, Any]]]
# every kind of multi-token pass a run makes, each compared bitwise with one-token steps (`summarise` keeps them apart)
PASS_CHECKS: dict[str, PassCheck] = {"chain": pass_vs_steps, "tree": tree_passes}


def summarise(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """One record: exact when every chain pass matched bitwise (trees summarised apart)."""
    trees = [c for c in checks if c.get("kind") == "tree"]
    chain = [c for c in checks if c.get("kind") != "tree"]
    return {
        "trees": _tally(trees) if trees else None,
        **_tally(chain),
        "kinds": sorted({c.get("kind", "chain") for c in checks}),
        "threads": torch.get_num_threads(),
    }


def _tally(checks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "exact": all(c["bitwise"] for c in checks),
        "top1": all(c["top1"] for c in checks),
        "passes": len(checks),
        "bitwise_passes": sum(c["bitwise"] for c in checks),
        "max_abs_diff": max((c["max_abs_diff"] for c in checks), default=0.0),
        "max_k": max((c["k"] for c in checks), default=0),
    }


def check_model(
    opener: Callable[[list[int]], LM],
    vocab_size: int,
    plan: Sequence[tuple[int, Sequence[int]]],
    kinds: Sequence[str] = tuple(PASS_CHECKS),
) -> dict[str, Any]:
    """`summarise` over `plan` [(context, ks)], each on a fresh LM over fixed ids (`opener(ids)`)."""
    checks: list[dict[str, Any]] = []
    for n, (context, ks) in enumerate(plan):
        ids = probe_ids(context + max(ks), vocab_size, n)
        for kind in kinds:
            checks += [{**c, "kind": kind} for c in PASS_CHECKS[kind](opener(ids), ids, context, ks)]
    return summarise(checks)


def describe_trees(record: dict[str, Any] | None) -> str:
    """What the record says of tree passes, in one sentence for users ("" when none was checked)."""
    t = (record or {}).get("trees")
    if not t:
        return ""
    if t["exact"]:
        return (
            f"tree passes exact: every node of a tree pass gives bitwise the logits of one-token steps along its "
            f"path ({t['bitwise_passes']}/{t['passes']} trees checked), so tree SD writes AR's text at T=0"
        )
    return (
        f"tree passes not bitwise exact here ({t['bitwise_passes']}/{t['passes']} trees equal, max logit "
        f"difference {t['max_abs_diff']:.2g}, top-1 {'always' if t['top1'] else 'not always'} equal): the tree "
        "methods may differ from AR at near-ties; the chain methods are unaffected"
    )


def describe(record: dict[str, Any] | None) -> str:
    """What the record means for the lossless methods, in one sentence for users."""
    if not record:
        return (
            "exactness not measured on this machine yet (`python -m pyramid_demo prepare` measures it): lossless "
            "methods (SD, lossless PSD_A) may differ from AR at near-ties"
        )
    if record["exact"]:
        return (
            f"exact: a verification pass of up to {record['max_k']} tokens gives bitwise the logits of "
            f"one-token steps ({record['bitwise_passes']}/{record['passes']} passes checked), so SD and "
            "lossless PSD_A write AR's text at T=0"
        )
    if record["top1"]:
        return (
            f"not bitwise exact on this machine ({record['bitwise_passes']}/{record['passes']} passes equal, "
            f"max logit difference {record['max_abs_diff']:.2g}, top-1 always equal): lossless methods may "
            "differ from AR at near-ties"
        )
    return (
        f"not exact on this machine (max logit difference {record['max_abs_diff']:.2g}, top-1 differed): "
        "lossless methods may differ from AR at near-ties"
    )


# (context length, pass lengths k): verification passes near the start and deeper into the cache
PLAN = ((100, (2, 3, 5, 9, 17)), (300, (5, 9)))


def role_opener(
    models: dict[str, Any], role: str, vocab_size: int, runners: dict[str, Any] | None = None
) -> Callable[[list[int]], LM]:
    """`role`'s LM as a run opens it: on its `runners` package, the target publishing to a proposer that reads."""
    publish = any(getattr(m, "reads_verifier", False) for r, m in models.items() if r != "target")
    run = runners or {}

    def open_for(ids: list[int]) -> LM:
        lm = open_lm(models[role], vocab_size, role, run.get(role))
        if role == "target":
            lm.publish = VerifierStates() if publish else None
        elif getattr(models[role], "reads_verifier", False):
            target = open_lm(models["target"], vocab_size, "target", run.get("target"))
            connect({"target": target, role: lm})
            target.forward(ids, 0, 1)  # the target's states at every checked position
        return lm

    return open_for


def check_family(
    models: dict[str, Any], vocab_size: int, plan: Any = PLAN, runners: dict[str, Any] | None = None
) -> dict[str, dict]:
    """Every role's record on the forward it runs (the target's, trees included, decides the lossless claim)."""
    return {
        role: check_model(
            role_opener(models, role, vocab_size, runners),
            vocab_size,
            plan,
            kinds=tuple(PASS_CHECKS) if role == "target" else ("chain",),
        )
        for role in models
    }

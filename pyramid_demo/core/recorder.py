"""The explanation of a decided round: per-token records built off the engine clock.

Why apart from the decision: the race times methods by the work of deciding tokens; the records (top-5
lists, display divergences, p and q) are for the inspector and charts only, so AR and the speculative
lanes must not pay for them differently. The values are the ones `decide` tested (its divergence and
warped rows are reused), so what the inspector shows is what the rule saw.
"""
from __future__ import annotations

import torch

from . import rules
from .config import DecodeConfig
from .decide import Round, raw_divergence
from .trace import StageRound, TokenRec


def shown_rule(rnd: Round, cfg: DecodeConfig, greedy: bool) -> str:
    """The rule name the records carry: greedy | sd | fuzzy | fuzzy+sd."""
    if rnd.rule == "sd":
        return "greedy" if greedy else "sd"
    return "fuzzy" if cfg.fallback == "none" else "fuzzy+sd"


def record(rnd: Round, cfg: DecodeConfig, full: bool = True) -> StageRound:
    """The round's `StageRound`: each proposed token's status (accepted / rejected / discarded), then the
    verifier's own (resampled / bonus). `full=False` keeps statuses only (bench: no display values)."""
    if rnd.tree is not None:
        return _record_tree(rnd, cfg, full)
    x, k, n = rnd.x, rnd.k, len(rnd.x)
    greedy = rnd.p_w is None
    status = ["accepted" if i < k else "rejected" if i == k else "discarded" for i in range(n)]
    own_status = "resampled" if k < n else "bonus"
    if not full:
        recs = [TokenRec(t, rnd.proposer, s) for t, s in zip(x, status)]
        recs.append(TokenRec(rnd.nxt, rnd.verifier, own_status))
    else:
        z_q = rnd.z_q if n else rnd.z_p[:0]
        p_raw, q_raw = torch.softmax(rnd.z_p, -1), torch.softmax(z_q, -1)  # raw: divergences and top-5 only
        d = (rnd.d if rnd.d is not None else raw_divergence(rnd.z_p[:n], z_q, cfg) if n else torch.zeros(0)).tolist()
        if greedy:
            top = rnd.z_p.argmax(-1).tolist()
            p_x = [float(top[i] == t) for i, t in enumerate(x)]
            q_x = [float(a == t) for a, t in zip(z_q.argmax(-1).tolist(), x)]
            p_nxt = 1.0
        else:
            assert rnd.p_w is not None and rnd.q_w is not None
            p_x = [float(rnd.p_w[i, t]) for i, t in enumerate(x)]
            q_x = [float(rnd.q_w[i, t]) for i, t in enumerate(x)]
            p_nxt = float(rnd.p_w[k, rnd.nxt])
        top_p, top_q = rules.topk_pairs(p_raw), rules.topk_pairs(q_raw)
        tau = rnd.tau if rnd.rule != "sd" else None
        recs = [TokenRec(t, rnd.proposer, status[i], div=round(d[i], 6), tau=tau, p=round(p_x[i], 6),
                         q=round(q_x[i], 6), top5={rnd.verifier: top_p[i], rnd.proposer: top_q[i]})
                for i, t in enumerate(x)]
        recs.append(TokenRec(rnd.nxt, rnd.verifier, own_status, p=round(p_nxt, 6), top5={rnd.verifier: top_p[k]}))
    n_acc = k
    if rnd.eos_cut is not None:  # an EOS inside the accepted run: the round ends after it
        j = rnd.eos_cut
        own = recs[-1]
        own.status = "discarded"
        recs, n_acc = recs[: j + 1] + [own], j + 1
    return StageRound(rnd.stage, rnd.proposer, rnd.verifier, shown_rule(rnd, cfg, greedy), recs, n_acc)


def _record_tree(rnd: Round, cfg: DecodeConfig, full: bool) -> StageRound:
    """A tree round: node i is scored at its parent's context (row parent + 1 of z_p), the verifier's own token
    at the last accepted node's; an EOS on the path cuts the path after it (the rest is discarded)."""
    tree, path, greedy = rnd.tree, list(rnd.path or []), rnd.p_w is None
    assert tree is not None and rnd.status is not None
    status = list(rnd.status)
    own_status = "bonus" if rnd.leaf else "resampled"
    if rnd.eos_cut is not None:  # an EOS on the path: the nodes after it and the own token were never used
        for i in path[rnd.eos_cut + 1:]:
            status[i] = "discarded"
        path, own_status = path[: rnd.eos_cut + 1], "discarded"
    own_ctx = path[-1] + 1 if rnd.path else 0
    if not full:
        recs = [TokenRec(t, rnd.proposer, st) for t, st in zip(tree.tokens, status)]
        recs.append(TokenRec(rnd.nxt, rnd.verifier, own_status))
        return StageRound(rnd.stage, rnd.proposer, rnd.verifier, shown_rule(rnd, cfg, greedy), recs, len(path),
                          list(tree.parents))
    ctx = [p + 1 for p in tree.parents]  # each node's parent context
    p_raw = torch.softmax(rnd.z_p, -1)  # [N + 1, V] raw: divergences and top-5 only
    q_raw = torch.softmax(tree.z_q, -1)  # [M, V]
    q_of = [q_raw[tree.q_row[c]] for c in ctx]
    d = rnd.d if rnd.d is not None else torch.full((tree.n + 1,), float("nan"))
    divs = []
    for c in ctx:
        v = float(d[c])
        if v != v:  # not computed by the rule (an exact rule, or a context it never reached)
            qr = tree.z_q[tree.q_row[c]][None]
            v = float(raw_divergence(rnd.z_p[c:c + 1], qr, cfg)[0])
        divs.append(round(v, 6))
    top_p = rules.topk_pairs(p_raw)
    tau = rnd.tau if rnd.rule != "sd" else None
    recs = []
    for i, (t, c) in enumerate(zip(tree.tokens, ctx)):
        p_x = float(rnd.z_p[c].argmax() == t) if greedy else float(rnd.p_w[c, t])  # type: ignore[index]
        recs.append(TokenRec(t, rnd.proposer, status[i], div=divs[i], tau=tau, p=round(p_x, 6),
                             q=round(float(q_of[i][t]), 6),
                             top5={rnd.verifier: top_p[c], rnd.proposer: rules.topk_pairs(q_of[i][None])[0]}))
    p_nxt = 1.0 if greedy else float(rnd.p_w[own_ctx, rnd.nxt])  # type: ignore[index]
    recs.append(TokenRec(rnd.nxt, rnd.verifier, own_status, p=round(p_nxt, 6), top5={rnd.verifier: top_p[own_ctx]}))
    return StageRound(rnd.stage, rnd.proposer, rnd.verifier, shown_rule(rnd, cfg, greedy), recs, len(path),
                      list(tree.parents))

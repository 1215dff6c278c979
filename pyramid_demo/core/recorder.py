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


def warped(rnd: Round, z_q: torch.Tensor, cfg: DecodeConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The warped rows p [n+1, V] and q [n, V] the inspector shows: the rule's own where it read them (the SD
    tests), else warped here, off the clock (a fuzzy rule alone warps only p's row at its stop)."""
    def w(z: torch.Tensor) -> torch.Tensor:
        return rules.warp(z, cfg.temperature, cfg.top_k, cfg.top_p)

    return (rnd.p_w if rnd.p_w is not None else w(rnd.z_p)), (rnd.q_w if rnd.q_w is not None else w(z_q))


def record(rnd: Round, cfg: DecodeConfig, full: bool = True) -> StageRound:
    """The round's `StageRound`: each proposed token's status (accepted / rejected / discarded), then the
    verifier's own (resampled / bonus). `full=False` keeps statuses only (bench: no display values)."""
    if rnd.tree is not None:
        return _record_tree(rnd, cfg, full)
    x, k, n = rnd.x, rnd.k, len(rnd.x)
    greedy = not rnd.sampled
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
            p_w, q_w = warped(rnd, z_q, cfg)
            p_x = [float(p_w[i, t]) for i, t in enumerate(x)]
            q_x = [float(q_w[i, t]) for i, t in enumerate(x)]
            p_nxt = float(p_w[k, rnd.nxt])
        top_p, top_q = rules.topk_pairs(p_raw), rules.topk_pairs(q_raw)
        tau = rnd.tau if rnd.rule != "sd" else None
        recs = [TokenRec(t, rnd.proposer, status[i], div=round(d[i], 6), tau=tau, p=round(p_x[i], 6),
                         q=round(q_x[i], 6), top5={rnd.verifier: top_p[i], rnd.proposer: top_q[i]})
                for i, t in enumerate(x)]
        recs.append(TokenRec(rnd.nxt, rnd.verifier, own_status, p=round(p_nxt, 6), top5={rnd.verifier: top_p[k]}))
    n_acc = k
    if rnd.kept is not None:  # only the first `kept` new tokens were used (a block cut or an EOS)
        c = rnd.kept
        for r in recs[c:k]:
            r.status = "discarded"
        recs[-1].status = "discarded"  # the verifier's own token never entered the block or the output
        n_acc = c
        if rnd.eos_trim:  # the proposals after the EOS could never be used: no statistic counts them
            recs = recs[:c] + recs[-1:]
    return StageRound(rnd.stage, rnd.proposer, rnd.verifier, shown_rule(rnd, cfg, greedy), recs, n_acc,
                      exact=rnd.rule == "sd", sd_fallback=rnd.rule != "sd" and cfg.fallback == "sd")


def _record_tree(rnd: Round, cfg: DecodeConfig, full: bool) -> StageRound:
    """A tree round: node i is scored at its parent's context (row parent + 1 of z_p), the verifier's own token
    at the last accepted node's. A cut (`Round.keep`: a block's size, an EOS) ends the path where it says: the
    path's nodes from there on and the own token are discarded; the tree's other nodes stay, as they were."""
    tree, path, greedy = rnd.tree, list(rnd.path or []), not rnd.sampled
    assert tree is not None and rnd.status is not None
    status = list(rnd.status)
    own_status = "bonus" if rnd.leaf else "resampled"
    if rnd.kept is not None:
        for i in path[rnd.kept:]:
            status[i] = "discarded"
        path, own_status = path[: rnd.kept], "discarded"
    own_ctx = rnd.path[-1] + 1 if rnd.path else 0
    shown = shown_rule(rnd, cfg, greedy)
    exact, fallback = rnd.rule == "sd", rnd.rule != "sd" and cfg.fallback == "sd"
    if not full:
        recs = [TokenRec(t, rnd.proposer, st) for t, st in zip(tree.tokens, status)]
        recs.append(TokenRec(rnd.nxt, rnd.verifier, own_status))
        return StageRound(rnd.stage, rnd.proposer, rnd.verifier, shown, recs, len(path), exact, fallback,
                          list(tree.parents))
    ctx = [p + 1 for p in tree.parents]  # each node's parent context
    p_raw = torch.softmax(rnd.z_p, -1)  # [N + 1, V] raw: divergences and top-5 only
    q_raw = torch.softmax(tree.z_q, -1)  # [M, V]
    p_w = p_raw if greedy else rules.warp(rnd.z_p, cfg.temperature, cfg.top_k, cfg.top_p)  # off the clock
    q_of = [q_raw[tree.q_row[c]] for c in ctx]
    d = rnd.d if rnd.d is not None else torch.full((tree.n + 1,), float("nan"))
    divs = []
    for c in ctx:
        v = float(d[c])
        if v != v:  # not computed by the rule (an exact rule, or a context it never reached)
            v = float(raw_divergence(rnd.z_p[c:c + 1], tree.z_q[tree.q_row[c]][None], cfg)[0])
        divs.append(round(v, 6))
    top_p = rules.topk_pairs(p_raw)
    tau = rnd.tau if rnd.rule != "sd" else None
    recs = []
    for i, (t, c) in enumerate(zip(tree.tokens, ctx)):
        p_x = float(rnd.z_p[c].argmax() == t) if greedy else float(p_w[c, t])
        recs.append(TokenRec(t, rnd.proposer, status[i], div=divs[i], tau=tau, p=round(p_x, 6),
                             q=round(float(q_of[i][t]), 6),
                             top5={rnd.verifier: top_p[c], rnd.proposer: rules.topk_pairs(q_of[i][None])[0]}))
    p_nxt = 1.0 if greedy else float(p_w[own_ctx, rnd.nxt])
    recs.append(TokenRec(rnd.nxt, rnd.verifier, own_status, p=round(p_nxt, 6), top5={rnd.verifier: top_p[own_ctx]}))
    return StageRound(rnd.stage, rnd.proposer, rnd.verifier, shown, recs, len(path), exact, fallback,
                      list(tree.parents))

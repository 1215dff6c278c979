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

"""A decided round's explanation (`record`), built off the engine clock (the race must not time display work):
per-token records reusing the walk's own divergences and uniforms, so the inspector shows what the rule saw."""

from __future__ import annotations

import torch

from . import rules
from .config import DecodeConfig
from .round import Round
from .trace import StageRound, TokenRec


def raw_divergence(z_p: torch.Tensor, z_q: torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """Div(P_verifier, P_proposer) per proposed position [n] on the raw distributions (CHOICE: the FSD code's
    form, temperature 1, no top-k/top-p), over the proposer's support when it has zeros (cfg.div_support)."""
    return rules.support_divergence_logits(z_p, z_q, cfg.divergence, cfg.div_support)


def topk_pairs(probs: torch.Tensor, k: int = 5) -> list[list[list[float]]]:
    """[[id, prob] × k] per row of probs [n, V], for the step inspector."""
    v, i = torch.topk(probs, min(k, probs.shape[-1]), dim=-1)
    return [[[int(a), round(float(b), 5)] for a, b in zip(ii, vv)] for ii, vv in zip(i, v)]


def shown_rule(rnd: Round, cfg: DecodeConfig, greedy: bool) -> str:
    """The rule name the records carry: greedy | sd | fuzzy | fuzzy+sd."""
    return ("greedy" if greedy else "sd") if rnd.rule == "sd" else "fuzzy" if cfg.fallback == "none" else "fuzzy+sd"


def statuses(rnd: Round) -> tuple[list[str], str, int]:
    """Each proposed node's status, the verifier's own token's, and the accepted count, after the round's cut."""
    status, own, n_acc = list(rnd.dec.status), rnd.own_status, rnd.k
    if rnd.kept is not None:  # only the first `kept` new tokens were used (a block cut or an EOS)
        for i in rnd.dec.path[rnd.kept :]:
            status[i] = "discarded"
        own, n_acc = "discarded", rnd.kept  # the verifier's own token never entered the block or the output
    return status, own, n_acc


def kept_nodes(rnd: Round) -> list[int]:
    """The nodes the record keeps: all but those below an EOS the round was cut at (never usable)."""
    n = rnd.tree.n
    if not rnd.eos_trim or rnd.kept is None or rnd.kept < 1:
        return list(range(n))
    eos = rnd.dec.path[rnd.kept - 1]
    return [i for i in range(n) if eos not in rules.path(rnd.tree.parents, i)[:-1]]


def sd_verdicts(rnd: Round, p_w: torch.Tensor | None, q_w: torch.Tensor | None) -> list[bool | None]:
    """The SD rule's verdict on every child at every context it could decide (what the walk computed where it
    ran, the rest computed here, off the clock, from the same uniforms): what a what-if τ reads."""
    tree, dec = rnd.tree, rnd.dec
    out = list(dec.sd)
    top = None if rnd.sampled else rnd.z_p.argmax(-1).tolist()
    for c, kids in enumerate(rules.children(tree.parents)):
        if not kids or any(out[ch] is not None for ch in kids) or tree.q_row[c] < 0:
            continue
        p = q = None
        if rnd.sampled:
            assert p_w is not None and q_w is not None
            p, q = p_w[c], q_w[tree.q_row[c]]
        _, verdicts, _ = rules.sd_at(tree, kids, top[c] if top is not None else None, p, q, dec.r)
        for ch, v in zip(kids, verdicts):
            out[ch] = v
    return out


def divergences(rnd: Round, cfg: DecodeConfig) -> list[float]:
    """Div at each context the proposer expanded [N + 1] (nan elsewhere): the rule's own values, the rest here."""
    tree = rnd.tree
    d = rnd.dec.d.clone() if rnd.dec.d is not None else torch.full((tree.n + 1,), float("nan"))
    todo = [c for c in range(tree.n + 1) if tree.q_row[c] >= 0 and d[c] != d[c]]
    if todo:
        d[todo] = raw_divergence(rnd.z_p[todo], tree.z_q[[tree.q_row[c] for c in todo]], cfg)
    return d.tolist()


def record(rnd: Round, cfg: DecodeConfig, full: bool = True) -> StageRound:
    """The round's `StageRound`: each proposed node's status, the verifier's own token and the parent list; node i
    is scored at row parent + 1 of z_p. `full=False` keeps statuses only (bench)."""
    tree, greedy = rnd.tree, not rnd.sampled
    status, own_status, n_acc = statuses(rnd)
    keep = kept_nodes(rnd)
    ctx = [p + 1 for p in tree.parents]  # each node's parent context
    own_ctx = rnd.dec.path[-1] + 1 if rnd.dec.path else 0
    recs: list[TokenRec]
    if not full:
        recs = [TokenRec(tree.tokens[i], rnd.proposer, status[i]) for i in keep]
        recs.append(TokenRec(rnd.dec.nxt, rnd.verifier, own_status))
    else:
        warp = (cfg.temperature, cfg.top_k, cfg.top_p)
        p_w = None if greedy else rules.warp(rnd.z_p, *warp)  # [N + 1, V], off the clock
        q_w = None if greedy or not tree.n else rules.warp(tree.z_q, *warp)  # [M, V]
        top_v = rnd.z_p.argmax(-1).tolist()
        top_q = tree.z_q.argmax(-1).tolist() if tree.n else []
        pairs_p = topk_pairs(torch.softmax(rnd.z_p, -1))  # raw: top-5 only
        pairs_q = topk_pairs(torch.softmax(tree.z_q, -1)) if tree.n else []
        d = divergences(rnd, cfg) if tree.n else []
        sd = sd_verdicts(rnd, p_w, q_w) if rnd.rule == "sd" or cfg.fallback == "sd" else [None] * tree.n
        tau = rnd.tau if rnd.rule != "sd" else None
        recs = []
        for i in keep:
            t, c, row = tree.tokens[i], ctx[i], tree.q_row[ctx[i]]
            p_x = float(top_v[c] == t) if p_w is None else float(p_w[c, t])
            q_x = float(top_q[row] == t) if q_w is None else float(q_w[row, t])
            recs.append(
                TokenRec(
                    t,
                    rnd.proposer,
                    status[i],
                    div=round(d[c], 6),
                    tau=tau,
                    p=round(p_x, 6),
                    q=round(q_x, 6),
                    top5={rnd.verifier: pairs_p[c], rnd.proposer: pairs_q[row]},
                    sd_passed=sd[i],
                )
            )
        p_nxt = 1.0 if p_w is None else float(p_w[own_ctx, rnd.dec.nxt])
        recs.append(
            TokenRec(rnd.dec.nxt, rnd.verifier, own_status, p=round(p_nxt, 6), top5={rnd.verifier: pairs_p[own_ctx]})
        )
    index = {old: j for j, old in enumerate(keep)}
    parents = [index[tree.parents[i]] if tree.parents[i] >= 0 else -1 for i in keep]
    return StageRound(
        rnd.stage,
        rnd.proposer,
        rnd.verifier,
        shown_rule(rnd, cfg, greedy),
        recs,
        n_acc,
        exact=rnd.rule == "sd",
        sd_fallback=rnd.rule != "sd" and cfg.fallback == "sd",
        parents=parents,
    )

"""Pure math of speculative decoding (warps, divergences, acceptance rules, the walk `decide_tree`). p: the verifier,
q: the proposer. A proposal is a tree in breadth-first order (node i: `tokens[i]`, `parents[i]`, −1 the root);
context c = 0 is the root, c = i + 1 node i, one row of the verifier's logits each."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

LN2 = math.log(2.0)


def warp(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Sampling distribution [n, V] from logits [n, V]; temperature 0 gives a one-hot argmax."""
    if temperature == 0.0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    z = logits / temperature
    if top_k and top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]  # [n, 1]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, idx = torch.sort(z, dim=-1, descending=True)
        cum = torch.softmax(sorted_z, -1).cumsum(-1)
        drop_sorted = cum - torch.softmax(sorted_z, -1) >= top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return torch.softmax(z, -1)


def divergence(
    p: torch.Tensor,
    q: torch.Tensor,
    kind: str = "js",
    log_p: torch.Tensor | None = None,
    log_q: torch.Tensor | None = None,
) -> torch.Tensor:
    """Div(p, q) per row [n] of [n, V]: js = ½KL(m‖p) + ½KL(m‖q), m = (p+q)/2 (CHOICE: the FSD code's form, not the
    textbook JSD); kl = KL(q‖p); tv = ½Σ|p−q|. 0·log 0 counts 0, +inf where p = 0 < q; never negative."""
    if kind == "tv":
        return (0.5 * (p - q).abs().sum(-1)).clamp_min(0)
    if kind not in ("kl", "js"):
        raise ValueError(f"unknown divergence {kind!r}; choose js, kl or tv")
    log_p, log_q = p.log() if log_p is None else log_p, q.log() if log_q is None else log_q
    if kind == "kl":
        terms = q * (log_q - log_p)
        zero = torch.isneginf(log_q)  # q = 0: the term is 0 whatever p is
    else:
        log_m = torch.logaddexp(log_p, log_q) - LN2  # log((p+q)/2), exact in the log domain
        terms = log_m.exp() * (log_m - 0.5 * (log_p + log_q))
        zero = torch.isneginf(log_m)  # p = q = 0
    return torch.where(zero, torch.zeros_like(terms), terms).sum(-1).clamp_min(0)


def support_divergence(
    p: torch.Tensor,
    q: torch.Tensor,
    kind: str = "js",
    support: str = "subset",
    log_p: torch.Tensor | None = None,
    log_q: torch.Tensor | None = None,
) -> torch.Tensor:
    """Div(p, q) per row [n] when q may be 0 (a reduced head). CHOICE `support`: "full" is `divergence`; "subset" is
    over S = {q > 0}, p renormalised: Div(p_S, q) − log p(S) (js, kl), tv(p_S, q) + 1 − p(S) (tv)."""
    if support not in ("subset", "full"):
        raise ValueError(f"unknown support {support!r}; choose subset or full")
    log_p, log_q = p.log() if log_p is None else log_p, q.log() if log_q is None else log_q
    out = torch.isneginf(log_q)  # [n, V]: outside the proposer's support
    has_zeros = out.any(-1)  # [n]
    if support == "full" or not bool(has_zeros.any()):
        return divergence(p, q, kind, log_p, log_q)
    lp_in = log_p.masked_fill(out, float("-inf"))  # (`support_divergence_logits` cuts a shared support to S)
    log_mass = torch.logsumexp(lp_in, -1, keepdim=True)  # [n, 1]: log p(S)
    lp_s = torch.where(torch.isneginf(log_mass), lp_in, lp_in - log_mass)  # log p_S
    sub = _on_support(lp_s, log_mass, q, log_q, kind)
    return torch.where(has_zeros, sub, divergence(p, q, kind, log_p, log_q))


def _on_support(
    lp_s: torch.Tensor, log_mass: torch.Tensor, q_s: torch.Tensor, log_q_s: torch.Tensor, kind: str
) -> torch.Tensor:
    """The "subset" divergence [n] from log p_S [n, |S|], log p(S) [n, 1] and the proposer on S; worst at p(S) = 0."""
    none = torch.isneginf(log_mass).squeeze(-1)  # the verifier rules out every token the proposer can write
    inside = divergence(lp_s.exp(), q_s, kind, lp_s, log_q_s)
    mass = log_mass.squeeze(-1)
    cost = -torch.expm1(mass) if kind == "tv" else -mass  # 1 − p(S), or −log p(S)
    worst = torch.ones_like(inside) if kind == "tv" else torch.full_like(inside, float("inf"))  # p(S) = 0
    return torch.where(none, worst, inside + cost.clamp_min(0))  # (tv of disjoint supports is 1)


def shared_support(z_q: torch.Tensor) -> torch.Tensor | None:
    """The columns [|S|] where every row of z_q [n, V] is finite, when the rows share one support with zeros (a
    reduced head); None otherwise."""
    if not bool(torch.isneginf(z_q[0]).any()):
        return None
    out = torch.isneginf(z_q)  # [n, V]
    return (~out[0]).nonzero().squeeze(-1) if bool((out == out[:1]).all()) else None


def support_divergence_logits(
    z_p: torch.Tensor, z_q: torch.Tensor, kind: str = "js", support: str = "subset"
) -> torch.Tensor:
    """`support_divergence` of softmax(z_p), softmax(z_q) [n, V]; a reduced head under "subset" reads z_p on S."""
    cols = shared_support(z_q) if support == "subset" else None
    if cols is None:
        lp, lq = torch.log_softmax(z_p, -1), torch.log_softmax(z_q, -1)  # [n, V]
        return support_divergence(lp.exp(), lq.exp(), kind, support, lp, lq)
    zp_s, zq_s = z_p[:, cols], z_q[:, cols]  # [n, |S|]
    lse_s = torch.logsumexp(zp_s, -1, keepdim=True)  # [n, 1]
    log_mass = lse_s - torch.logsumexp(z_p, -1, keepdim=True)  # [n, 1]: log p(S)
    lp_s = torch.where(torch.isneginf(lse_s), zp_s, zp_s - lse_s)  # log p_S [n, |S|]
    log_q_s = torch.log_softmax(zq_s, -1)  # [n, |S|]: the proposer's whole distribution lives on S
    return _on_support(lp_s, log_mass, log_q_s.exp(), log_q_s, kind)


def fuzzy_passes(d: torch.Tensor | Sequence[float], tau: float) -> list[bool]:
    """FSD test: Div(P_T,i, P_D,i) ≤ τ, whatever the token. CHOICE: τ = 0 accepts nothing (target-only decoding)."""
    return [tau > 0 and float(v) <= tau for v in d]


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)) [V]: where SD resamples after a rejection (falls back to p if empty)."""
    res = (p - q).clamp_min(0)
    s = res.sum()
    return res / s if s > 0 else p


def sample(probs: torch.Tensor, gen: torch.Generator | None) -> int:
    """One token from probs [V]; argmax when no generator is given (greedy decoding)."""
    return int(probs.argmax()) if gen is None else int(torch.multinomial(probs, 1, generator=gen))


# ---------------------------------------------------------------- proposals: parent lists and the tree
def chain_parents(n: int) -> list[int]:
    """A chain of n proposed tokens as a parent list: [−1, 0, 1, …, n − 2]."""
    return list(range(-1, n - 1))


def is_chain(parents: list[int]) -> bool:
    """Whether every node's parent is the node before it."""
    return parents == chain_parents(len(parents))


def depths(parents: list[int]) -> list[int]:
    """Each node's depth (the root's children are at depth 1): its position along a path."""
    d: list[int] = []
    for p in parents:
        d.append(1 if p < 0 else d[p] + 1)
    return d


def children(parents: list[int]) -> list[list[int]]:
    """Per context c (0 the root, i + 1 node i): its children's node indices, in ranked (drawn, record) order."""
    out: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        out[p + 1].append(i)
    return out


def path(parents: list[int], i: int) -> list[int]:
    """Node indices from the root's child down to node i (empty for i = −1, the root)."""
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]


def context_of(parents: list[int], i: int) -> int:
    """The context node i was proposed at, where its distributions are read: its parent's (0 the root)."""
    return parents[i] + 1


@dataclass
class Tree:
    """A proposal: `z_q` [M, V] holds the proposer's logits at the contexts it expanded, `q_row[c]` context c's row
    (−1: never expanded, a leaf)."""

    tokens: list[int]
    parents: list[int]
    z_q: torch.Tensor  # [M, V]
    q_row: list[int]  # [N + 1]
    score: list[float] = field(default_factory=list)  # [N] log of the product of proposer probabilities

    @property
    def n(self) -> int:
        return len(self.tokens)


def chain(tokens: list[int], z_q: torch.Tensor) -> Tree:
    """A chain as a tree: node i's parent is i − 1; z_q [n, V] gives the proposer's row per context."""
    n = len(tokens)
    return Tree(list(tokens), chain_parents(n), z_q, list(range(n)) + [-1])


def best_nodes(parents: list[int], score: list[float], n: int) -> list[int]:
    """EAGLE-2's reranking: the n best nodes by path score, breadth-first; a child never outscores its parent."""
    order = sorted(range(len(score)), key=lambda i: (-score[i], i))
    keep: set[int] = set()
    for i in order:
        if len(keep) == n:
            break
        if parents[i] < 0 or parents[i] in keep:
            keep.add(i)
    return sorted(keep)


# ---------------------------------------------------------------- the walk: one acceptance for chains and trees
@dataclass(frozen=True)
class TreeDecision:
    """What a rule decided over a tree: the accepted path, the verifier's own token, each node's status, and what
    the rule computed."""

    path: list[int]
    nxt: int
    status: list[str]
    d: torch.Tensor | None = None  # [N + 1] divergence per context (fuzzy rules; nan where not computed)
    r: torch.Tensor | None = None  # [N] the uniform each node's ratio test reads (sampled runs)
    sd: list[bool | None] = field(default_factory=list)  # [N] the SD rule's verdict on each child it tried
    leaf: bool = False  # the walk ended at a context with no children: the own token is a bonus


def spine(tree: Tree) -> list[int]:
    """The contexts along first children from the root, where a walk that accepts goes (read in one batch)."""
    kids, out, c = children(tree.parents), [0], 0
    while kids[c]:
        c = kids[c][0] + 1
        out.append(c)
    return out


def take(z: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """z's rows [len(rows), V]: a view when they are consecutive, else a gathered copy."""
    return z[rows[0] : rows[0] + len(rows)] if rows and rows == list(range(rows[0], rows[0] + len(rows))) else z[rows]


def sd_at(
    tree: Tree, kids: list[int], top: int | None, p: torch.Tensor | None, q: torch.Tensor | None, r: torch.Tensor | None
) -> tuple[int | None, list[bool | None], torch.Tensor | None]:
    """The SD rule at one context over its ranked `kids`: greedy, the child equal to `top`; sampled, multi-step
    speculative sampling on warped p, q [V]. Returns the accepted child, each child's verdict and p's residual."""
    verdicts: list[bool | None] = [None] * len(kids)
    if p is None:
        for j, ch in enumerate(kids):
            verdicts[j] = tree.tokens[ch] == top
            if verdicts[j]:
                return ch, verdicts, None
        return None, verdicts, None
    assert q is not None and r is not None
    for j, ch in enumerate(kids):
        t = tree.tokens[ch]
        verdicts[j] = float(r[ch]) * float(q[t]) < float(p[t])  # r < p(t)/q(t), q(t) > 0: t was drawn from q
        if verdicts[j]:
            return ch, verdicts, None
        p = residual(p, q)  # norm(max(0, p − q)): the verifier's law given the refusal
        if j + 1 < len(kids):
            q = q.clone()
            q[t] = 0.0  # the next child was drawn from q without t
            q = q / q.sum() if float(q.sum()) > 0 else q
    return None, verdicts, p


def decide_tree(
    z_p: torch.Tensor,
    tree: Tree,
    rule: str,
    tau: float | None,
    fallback: str,
    warp_args: tuple[float, int, float],
    gen: torch.Generator | None,
    div: tuple[str, str] = ("js", "subset"),
) -> TreeDecision:
    """Walk the tree against the verifier's logits z_p [N + 1, V] (docs/how-it-works.md): "sd" (greedy or sampled),
    "fuzzy" (Div ≤ τ accepts the first child; fallback "sd" decides the others); one uniform per node always."""
    n, kids = tree.n, children(tree.parents)
    r = torch.rand(n, generator=gen) if gen is not None else None
    fuzzy, with_sd = rule != "sd", rule == "sd" or fallback == "sd"
    walked: list[int] = []
    status: list[str] = ["discarded"] * n
    sd: list[bool | None] = [None] * n
    p_w: dict[int, torch.Tensor] = {}  # context → the verifier's warped row the SD rule read [V]
    q_w: dict[int, torch.Tensor] = {}  # context → the proposer's warped row [V]
    line = spine(tree)
    d = [float("nan")] * (n + 1)  # the divergence per context, as plain floats while the walk reads them
    if fuzzy and tau and n:  # the divergences a walk that accepts reads, in one batch (a chain: all of them)
        ctx = [c for c in line if tree.q_row[c] >= 0]
        got = support_divergence_logits(take(z_p, ctx), take(tree.z_q, [tree.q_row[c] for c in ctx]), *div)
        for c, v in zip(ctx, got.tolist()):
            d[c] = v
    top = z_p.argmax(-1).tolist() if gen is None and with_sd else None  # greedy SD reads only argmaxes [N + 1]

    def rows(cs: list[int], proposer: bool) -> None:  # the warped rows the SD rule reads, batched
        cache = q_w if proposer else p_w
        want = [c for c in cs if c not in cache and (not proposer or tree.q_row[c] >= 0)]
        if want:
            z = take(tree.z_q, [tree.q_row[c] for c in want]) if proposer else take(z_p, want)
            for c, w in zip(want, warp(z, *warp_args)):
                cache[c] = w

    if gen is not None and with_sd:
        rows(line, False)
        rows(line[:-1], True)
    c, rest = 0, None
    while kids[c]:  # a context with no children ends the walk: its own token is a bonus
        here, chosen, rest = kids[c], None, None
        if fuzzy and tau and tree.q_row[c] >= 0:
            if d[c] != d[c]:  # off the spine: computed where the walk stands (as `decide` would)
                d[c] = float(support_divergence_logits(z_p[c : c + 1], tree.z_q[tree.q_row[c]][None], *div)[0])
            if fuzzy_passes([d[c]], tau)[0]:
                chosen = here[0]
        if chosen is None and with_sd:
            if gen is not None:
                rows([c], False)
                rows([c], True)
            chosen, verdicts, rest = sd_at(tree, here, top[c] if top is not None else None, p_w.get(c), q_w.get(c), r)
            for ch, v in zip(here, verdicts):
                sd[ch] = v
        for ch in here:
            if ch == chosen:
                break
            status[ch] = "rejected"
        if chosen is None:  # refused: the verifier's own token (from the residual, sampled after an SD refusal)
            break
        status[chosen] = "accepted"  # the other children stay rejected (tried) or discarded (never tried)
        walked.append(chosen)
        c = chosen + 1
    if gen is not None and rest is None:  # at a leaf, or after a fuzzy refusal alone: from p itself (no residual)
        rows([c], False)
        rest = p_w[c]
    nxt = int(z_p[c].argmax()) if rest is None else sample(rest, gen)  # the verifier's own token
    return TreeDecision(walked, nxt, status, torch.tensor(d) if fuzzy else None, r, sd, not kids[c])


# the shipped feature draft's on-policy acceptance by rank (greedy, assets/unseen_prompts.jsonl, 352 positions),
# assumed before a tree has run: it fixes a sampled tree's shape and what the predictor prices first
RANK_PRIOR = (0.406, 0.103, 0.045, 0.045, 0.046)


# ---------------------------------------------------------------- the sampled tree's shape
def expected_tree(nodes: int, depth: int, k: int, a: list[float] | tuple[float, ...]) -> tuple[list[int], list[int]]:
    """EAGLE-2's expansion on expected scores (Σ log a_rank along a path): (parents, ranks), a sampled tree's shape."""

    def lp(r: int) -> float:
        return math.log(max(a[r] if r < len(a) else a[-1] * 0.5, 1e-9))

    par: list[int] = []
    rank: list[int] = []
    score: list[float] = []
    frontier, base = [-1], {-1: 0.0}
    for _ in range(depth):
        new = []
        for f in frontier:
            for r in range(k):
                par.append(f)
                rank.append(r)
                score.append(base[f] + lp(r))
                base[len(par) - 1] = score[-1]
                new.append(len(par) - 1)
        frontier = sorted(new, key=lambda i: -score[i])[:k]
    keep = best_nodes(par, score, nodes)
    idx = {old: i for i, old in enumerate(keep)}
    return [idx[par[i]] if par[i] >= 0 else -1 for i in keep], [rank[i] for i in keep]

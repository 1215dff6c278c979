"""One tree round against models: the proposer grows a tree (EAGLE-2), the verifier scores it in one pass.

Growing: one proposer forward per level over the frontier; each frontier node's top-k children are
candidates, ranked by the product of the proposer's probabilities along their path; the best k
candidates are the next frontier; after `depth` levels the best `nodes` candidates overall are the tree
(`tree.best_nodes`). Verifying: the verifier feeds its unfed committed tokens as a chain, then the tree on
its last one, in one pass (`forward_tree`); the rule walks the tree (`tree.decide_tree`); only the
accepted path stays in the verifier's cache (`keep_path`), and in the proposer's, where it fed it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import DecodeConfig
from .tree import Tree, TreeDecision, best_nodes, decide_tree


@dataclass
class Grown:
    """A grown tree and, per node, the proposer's pending row that holds it (−1: never fed)."""

    tree: Tree
    rows: list[int]


def grow(lane, seq: list[int], nodes: int, depth: int, k: int) -> Grown:
    """The proposer's tree after `seq` (its cache catches up on seq first, as a chain proposal does).

    `lane` is an engine Lane (model + position). Candidates are ranked on raw log-probabilities, so the
    tree is a deterministic function of the context: what the lossless rule for trees requires."""
    z_root = lane.feed(seq, 1)  # [1, V]: the root's context
    ctx_rows = [z_root[0]]
    toks: list[int] = []
    par: list[int] = []
    score: list[float] = []
    ctx: list[int] = []  # per node: its row in ctx_rows (−1: not expanded)
    fed: list[int] = []  # per node: its pending row in the proposer (−1: not fed)

    def add_children(z_row: torch.Tensor, parent: int, base: float) -> list[int]:
        z = z_row.float()
        v, i = torch.topk(z, k)  # the top-k logits; their log-probabilities need one logsumexp, not a log-softmax
        v = v - torch.logsumexp(z, -1)
        out = []
        for s, t in zip(v.tolist(), i.tolist()):
            if s == float("-inf"):  # a reduced head with fewer than k tokens: no such candidate
                break
            toks.append(int(t))
            par.append(parent)
            score.append(base + s)
            ctx.append(-1)
            fed.append(-1)
            out.append(len(toks) - 1)
        return out

    level = add_children(z_root[0], -1, 0.0)
    frontier = level
    n_rows = 0
    for _ in range(depth - 1):
        if not frontier:
            break
        z = lane.lm.forward_tree([toks[f] for f in frontier], [fed[par[f]] if par[f] >= 0 else -1 for f in frontier],
                                 lane.pos)  # [len(frontier), V]
        nxt = []
        for j, f in enumerate(frontier):
            fed[f], ctx[f] = n_rows + j, len(ctx_rows)
            ctx_rows.append(z[j])
            nxt += add_children(z[j], f, score[f])
        n_rows += len(frontier)
        frontier = sorted(nxt, key=lambda i: -score[i])[:k]
    keep = best_nodes(par, score, nodes)
    new = {old: i for i, old in enumerate(keep)}
    tree = Tree([toks[i] for i in keep], [new[par[i]] if par[i] >= 0 else -1 for i in keep],
                torch.stack(ctx_rows), [0] + [ctx[i] for i in keep], [score[i] for i in keep])
    return Grown(tree, [fed[i] for i in keep])


def verify(lane, seq: list[int], tree: Tree, rule: str, tau: float | None, cfg: DecodeConfig,
           gen: torch.Generator | None) -> tuple[TreeDecision, torch.Tensor]:
    """The verifier scores `tree` after `seq` in one pass and the rule walks it; only the accepted path
    stays in its cache. Returns the decision and the verifier's logits per context [N + 1, V]."""
    chain = seq[lane.pos:]  # the committed tokens it has not fed, the root last
    m = len(chain)
    rows = chain + tree.tokens
    parents = list(range(-1, m - 1)) + [p + m if p >= 0 else m - 1 for p in tree.parents]
    z = lane.lm.forward_tree(rows, parents, lane.pos)  # [m + N, V]
    z_p = z[m - 1:]  # [N + 1, V]: the root's context, then each node's
    dec = decide_tree(z_p, tree, rule, tau, cfg.fallback, (cfg.temperature, cfg.top_k, cfg.top_p), gen,
                      (cfg.divergence, cfg.div_support))
    lane.kept(chain + [tree.tokens[i] for i in dec.path], lane.lm.keep_path(list(range(m)) + [m + i for i in dec.path]))
    return dec, z_p


def keep_fed(lane, grown: Grown, path: list[int]) -> None:
    """The proposer keeps the accepted path's nodes it fed (a prefix of the path) and drops its other rows."""
    rows: list[int] = []
    for i in path:
        if grown.rows[i] < 0:
            break
        rows.append(grown.rows[i])
    lane.kept([grown.tree.tokens[i] for i in path[: len(rows)]], lane.lm.keep_path(rows), after_last=True)

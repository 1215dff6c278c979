"""Trees of candidates (EAGLE-2, SpecInfer, Sequoia): a proposal is a parent list, verified in one pass.

Node i has token `tokens[i]` and parent `parents[i]` (−1: the root, the last committed token). Nodes are
in breadth-first order (a parent before its children, depth non-decreasing), so a node at depth d sits at
position root + d and attends to the prefix, its ancestors and itself. A chain is the tree with
parents = [−1, 0, 1, …]. Context c is where a distribution is read: c = 0 the root, c = i + 1 node i; the
verifier's pass gives one row of logits per context (the root's row first).

The rules (ALGORITHMS.md, "Trees of candidates"), pure functions over hand-buildable logits:
- greedy: from the root, move to the child equal to the verifier's argmax while one exists;
- sampled, lossless, deterministic children: try a context's children in ranked order, accept child c with
  probability p(c), else set p(c) = 0 and renormalise; with no child accepted, sample from what is left;
- fuzzy: Div(P_verifier, P_proposer) is one number per context; a passing context accepts its top-ranked
  child (CHOICE); with the SD fallback the other children are then tried by the rule above.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import parents as parent_list
from . import rules


@dataclass
class Tree:
    """A proposal of candidate tokens. `z_q` [M, V] holds the proposer's logits at the contexts it
    expanded; `q_row[c]` is context c's row in it (−1: never expanded, so a leaf)."""

    tokens: list[int]
    parents: list[int]
    z_q: torch.Tensor  # [M, V]
    q_row: list[int]  # [N + 1]
    score: list[float] = field(default_factory=list)  # [N] log of the product of proposer probabilities

    @property
    def n(self) -> int:
        return len(self.tokens)

    def depths(self) -> list[int]:
        return parent_list.depths(self.parents)

    def children(self) -> list[list[int]]:
        """Per context c (0 root, i + 1 node i): its children's node indices, in ranked order."""
        return parent_list.children(self.parents)

    def path(self, i: int) -> list[int]:
        """Node indices from the root's child down to node i."""
        return parent_list.path(self.parents, i)


def chain(tokens: list[int], z_q: torch.Tensor) -> Tree:
    """A chain as a tree: node i's parent is i − 1; z_q [n, V] gives the proposer's row per context."""
    n = len(tokens)
    return Tree(list(tokens), parent_list.chain(n), z_q, list(range(n)) + [-1])


def check(tree: Tree) -> None:
    """A ValueError when the parent list is not breadth-first (each parent earlier, depth non-decreasing)."""
    depth = tree.depths()
    for i, p in enumerate(tree.parents):
        if not -1 <= p < i:
            raise ValueError(f"node {i}'s parent {p} is not an earlier node")
        if i and depth[i] < depth[i - 1]:
            raise ValueError(f"node {i} is shallower than node {i - 1}: nodes must be in breadth-first order")


def best_nodes(parents: list[int], score: list[float], n: int) -> list[int]:
    """EAGLE-2's reranking: the n best nodes by path score, closed under ancestors, in breadth-first order.

    A child's score (a log product of probabilities) is never above its parent's, so taking nodes best
    first keeps every parent before its child; ties go to the shallower (earlier) node."""
    order = sorted(range(len(score)), key=lambda i: (-score[i], i))
    keep: set[int] = set()
    for i in order:
        if len(keep) == n:
            break
        if parents[i] < 0 or parents[i] in keep:
            keep.add(i)
    return sorted(keep)


@dataclass
class TreeDecision:
    """What a rule decided over a tree: the accepted path (node indices), the verifier's own token and
    each node's fate (accepted, rejected = tried and refused, discarded = never reached)."""

    path: list[int]
    nxt: int
    status: list[str]
    d: torch.Tensor | None = None  # [N + 1] divergence per context (fuzzy rules only; nan where not computed)


def decide_tree(z_p: torch.Tensor, tree: Tree, rule: str, tau: float | None, fallback: str,
                warp: tuple[float, int, float], gen: torch.Generator | None,
                div: tuple[str, str] = ("js", "subset")) -> TreeDecision:
    """Walk the tree against the verifier's logits z_p [N + 1, V] (row c = context c).

    rule "sd": greedy at gen None, else the deterministic-children rule (lossless); "fuzzy": a context whose
    divergence ≤ τ accepts its top-ranked child, with fallback "sd" the other children are tried by the SD
    rule. `warp` is (temperature, top_k, top_p) for the verifier's sampling distribution."""
    kids = tree.children()
    n = tree.n
    r = torch.rand(n, generator=gen) if gen is not None else None  # one uniform per node, whatever the rule
    fuzzy, with_sd = rule != "sd", rule == "sd" or fallback == "sd"
    d = torch.full((n + 1,), float("nan")) if fuzzy else None
    def warped(c: int) -> torch.Tensor:  # the verifier's sampling distribution at a context it reached [V]
        return rules.warp(z_p[c:c + 1], *warp)[0]

    status = ["discarded"] * n
    path: list[int] = []
    c = 0
    while True:
        children = kids[c]
        if not children:
            nxt = int(z_p[c].argmax()) if gen is None else rules.sample(warped(c), gen)
            break
        chosen = None
        if fuzzy and tree.q_row[c] >= 0 and tau:
            assert d is not None
            zq = tree.z_q[tree.q_row[c]][None]
            d[c] = float(rules.support_divergence_logits(z_p[c:c + 1], zq, div[0], div[1])[0])  # as `decide`
            if rules.fuzzy_passes(d[c:c + 1], tau)[0]:
                chosen = children[0]
        p = warped(c) if gen is not None and chosen is None else None
        if chosen is None and with_sd:
            top = int(z_p[c].argmax())
            for ch in children:
                t = tree.tokens[ch]
                if p is None:
                    ok = t == top
                else:
                    assert r is not None
                    mass = float(p.sum())
                    ok = mass > 0 and float(r[ch]) * mass < float(p[t])
                if ok:
                    chosen = ch
                    break
                status[ch] = "rejected"
                if p is not None:
                    p[t] = 0.0
        elif chosen is None:
            for ch in children:
                status[ch] = "rejected"
        if chosen is not None:  # the other children stay rejected (tried) or discarded (never tried)
            status[chosen] = "accepted"
            path.append(chosen)
            c = chosen + 1
            continue
        if p is None:
            nxt = int(z_p[c].argmax())
        else:  # what is left of p after the refused children (nothing refused: p itself)
            rest = p if float(p.sum()) > 0 else warped(c)
            nxt = rules.sample(rest / rest.sum(), gen)
        break
    return TreeDecision(path, nxt, status, d)

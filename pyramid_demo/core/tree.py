"""A proposal is a tree of candidates (EAGLE-2, SpecInfer, Sequoia), verified in one pass; a chain is the tree
with parent i − 1. This module holds the proposal type and the one acceptance walk, for chains and trees alike.

Node i has token `tokens[i]` and parent `parents[i]` (−1: the root, the last committed token). Nodes are
in breadth-first order (a parent before its children, depth non-decreasing), so a node at depth d sits at
position root + d and attends to the prefix, its ancestors and itself. Context c is where a distribution is
read: c = 0 the root, c = i + 1 node i; the verifier's pass gives one row of logits per context.

The rules (ALGORITHMS.md, "Trees of candidates"), pure functions over hand-buildable logits:
- greedy: from the root, move to the child equal to the verifier's argmax while one exists;
- sampled, lossless: SpecInfer's multi-step speculative sampling over a context's children, which the
  proposer drew from its warped q without replacement: child c_i is accepted with min(1, p_i(c_i)/q_i(c_i));
  on a refusal p_{i+1} = norm(max(0, p_i − q_i)) and q_{i+1} = q_i with c_i removed, renormalised; with no child
  accepted the verifier's token is drawn from what is left. With one child this is SD's ratio test and residual;
- fuzzy: Div(P_verifier, P_proposer) is one number per context (its children share it); a passing context
  accepts its first child (CHOICE: the proposer's own first choice, as a chain's); with the SD fallback a
  failing context is decided by the rule above.
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
        """Per context c (0 root, i + 1 node i): its children's node indices, in ranked (drawn) order."""
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
    """What a rule decided over a tree: the accepted path (node indices), the verifier's own token, each node's
    fate (accepted, rejected = tried and refused, discarded = never reached), and what the rule computed."""

    path: list[int]
    nxt: int
    status: list[str]
    d: torch.Tensor | None = None  # [N + 1] divergence per context (fuzzy rules; nan where not computed)
    r: torch.Tensor | None = None  # [N] the uniform each node's ratio test reads (sampled runs)
    sd: list[bool | None] = field(default_factory=list)  # [N] the SD rule's verdict on each child it tried
    leaf: bool = False  # the walk ended at a context with no children: the own token is a bonus
    p_w: dict[int, torch.Tensor] = field(default_factory=dict)  # context → the verifier's warped row it read [V]
    q_w: dict[int, torch.Tensor] = field(default_factory=dict)  # context → the proposer's warped row it read [V]


def spine(tree: Tree) -> list[int]:
    """The contexts along first children from the root (a chain: every context), where a walk that accepts
    goes: the rule reads their rows in one batch."""
    kids, out, c = tree.children(), [0], 0
    while kids[c]:
        c = kids[c][0] + 1
        out.append(c)
    return out


def take(z: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """z's rows [len(rows), V]: a view when they are consecutive (a chain's always are), else a gathered copy."""
    if rows and rows == list(range(rows[0], rows[0] + len(rows))):
        return z[rows[0]: rows[0] + len(rows)]
    return z[rows]


def sd_at(tree: Tree, kids: list[int], top: int | None, p: torch.Tensor | None, q: torch.Tensor | None,
          r: torch.Tensor | None) -> tuple[int | None, list[bool | None], torch.Tensor | None]:
    """The SD rule at one context over its children `kids` (ranked): greedy (`top`, the verifier's argmax) the
    child equal to it; sampled, multi-step speculative sampling on the warped rows p, q [V] with the children's
    uniforms r. Returns the accepted child (None), each child's verdict (None: not tried, an earlier one won) and
    what is left of p to draw the verifier's own token from (sampled; None when greedy)."""
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
        p = rules.residual(p, q)  # norm(max(0, p − q)): the verifier's law given the refusal
        if j + 1 < len(kids):
            q = q.clone()
            q[t] = 0.0  # the next child was drawn from q without t
            q = q / q.sum() if float(q.sum()) > 0 else q
    return None, verdicts, p


def decide_tree(z_p: torch.Tensor, tree: Tree, rule: str, tau: float | None, fallback: str,
                warp: tuple[float, int, float], gen: torch.Generator | None,
                div: tuple[str, str] = ("js", "subset")) -> TreeDecision:
    """Walk the tree against the verifier's logits z_p [N + 1, V] (row c = context c); see the module doc.

    rule "sd": greedy at gen None, else multi-step speculative sampling (lossless when each context's children
    were drawn from the warped proposer without replacement); "fuzzy": a context whose divergence ≤ τ accepts
    its first child, with fallback "sd" the SD rule decides the others. `warp` is (temperature, top_k, top_p).
    One uniform per node is drawn under every rule, so the random stream is the same whatever the rule."""
    n, kids = tree.n, tree.children()
    r = torch.rand(n, generator=gen) if gen is not None else None
    fuzzy, with_sd = rule != "sd", rule == "sd" or fallback == "sd"
    dec = TreeDecision([], -1, ["discarded"] * n, None, r, [None] * n)
    line = spine(tree)
    d = [float("nan")] * (n + 1)  # the divergence per context, as plain floats while the walk reads them
    if fuzzy and tau and n:  # the divergences a walk that accepts reads, in one batch (a chain: all of them)
        ctx = [c for c in line if tree.q_row[c] >= 0]
        got = rules.support_divergence_logits(take(z_p, ctx), take(tree.z_q, [tree.q_row[c] for c in ctx]), *div)
        for c, v in zip(ctx, got.tolist()):
            d[c] = v
    top = z_p.argmax(-1).tolist() if gen is None and with_sd else None  # greedy SD reads only argmaxes [N + 1]

    def rows(cs: list[int], proposer: bool) -> None:  # the warped rows the SD rule reads, batched
        cache = dec.q_w if proposer else dec.p_w
        want = [c for c in cs if c not in cache and (not proposer or tree.q_row[c] >= 0)]
        if want:
            z = take(tree.z_q, [tree.q_row[c] for c in want]) if proposer else take(z_p, want)
            for c, w in zip(want, rules.warp(z, *warp)):
                cache[c] = w

    def own(c: int, rest: torch.Tensor | None) -> int:  # the verifier's token at context c
        if gen is None:
            return int(top[c]) if top is not None else int(z_p[c].argmax())
        if rest is None:  # at a leaf, or after a fuzzy refusal alone: from p itself (no residual)
            rows([c], False)
            rest = dec.p_w[c]
        return rules.sample(rest, gen)

    if gen is not None and with_sd:
        rows(line, False)
        rows(line[:-1], True)
    c = 0
    while True:
        children = kids[c]
        if not children:
            dec.leaf, dec.nxt = True, own(c, None)
            break
        chosen, rest = None, None
        if fuzzy and tau and tree.q_row[c] >= 0:
            if d[c] != d[c]:  # off the spine: computed where the walk stands (as `decide` would)
                d[c] = float(rules.support_divergence_logits(z_p[c:c + 1], tree.z_q[tree.q_row[c]][None], *div)[0])
            if rules.fuzzy_passes([d[c]], tau)[0]:
                chosen = children[0]
        if chosen is None and with_sd:
            if gen is not None:
                rows([c], False)
                rows([c], True)
            chosen, verdicts, rest = sd_at(tree, children, top[c] if top is not None else None,
                                           dec.p_w.get(c), dec.q_w.get(c), r)
            for ch, v in zip(children, verdicts):
                dec.sd[ch] = v
        for ch in children:
            if ch == chosen:
                break
            dec.status[ch] = "rejected"
        if chosen is not None:  # the other children stay rejected (tried) or discarded (never tried)
            dec.status[chosen] = "accepted"
            dec.path.append(chosen)
            c = chosen + 1
            continue
        dec.nxt = own(c, rest)
        break
    if fuzzy:
        dec.d = torch.tensor(d)  # [N + 1]
    return dec

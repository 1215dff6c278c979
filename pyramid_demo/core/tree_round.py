"""The model layer of a round: a model's lane, the proposal it makes (a chain or a tree) and the pass that scores it.

Why here and not in the engine: the engine runs one round for every shape; only the models differ in how a
shape is fed. A chain is drafted one token at a time through the plain cached forward and scored by one
plain pass (no tree layout to pay for); a tree is grown with one batched tree forward per level (EAGLE-2) and
scored by one tree pass, after which only the accepted path stays in each cache (`settle`).

Growing a tree: at temperature 0 each expanded node's top-k tokens are its children, ranked by the product of
the proposer's probabilities along their path; the best k are expanded next and the best `nodes` kept
(`tree.best_nodes`). Above 0 the lossless rule needs children drawn from the proposer's warped q without
replacement, and a tree whose shape does not depend on the drawn tokens: the shape is the expected tree on
the rank prior (`tree_costs.expected_tree`, what the predictor prices), filled by draws in order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import parents as parent_list
from . import rules
from .cache import CacheError
from .config import DecodeConfig
from .lm import LM
from .tree import Tree, best_nodes, chain


class NonFiniteLogits(ValueError):
    """A model returned NaN or +inf logits (or a row with no finite logit): it is broken."""


def _finite(z: torch.Tensor, role: str) -> torch.Tensor:
    """z itself, checked once: the row maxima catch NaN, +inf and all-−inf rows (−inf alone is a token ruled
    out, probability 0, and is allowed)."""
    if not bool(torch.isfinite(z.amax(-1)).all()):
        raise NonFiniteLogits(f"the {role} model returned NaN or infinite logits")
    return z


@dataclass
class Lane:
    """One model in a run and the position its cache ends at: every forward is fed from there.

    The position is the lane's own, advanced by what it feeds and set back by what it cuts (never read off
    the sequence it is handed), and each feed first checks that the sequence still holds, where the lane's
    last feed put them, the tokens that feed cached: a missed cut (a rejection the cache never heard of)
    then raises CacheError instead of feeding from the wrong offset."""

    lm: LM

    pos: int = 0
    last: list[int] = field(default_factory=list)  # the tokens of its last feed, at pos-len(last) … pos-1

    def feed(self, seq: list[int], keep: int) -> torch.Tensor:
        """Feed seq[pos:] at `pos`; logits of the last `keep` positions [keep, V], checked for NaN and +inf."""
        start = self.pos - len(self.last)
        if seq[start: self.pos] != self.last:
            raise CacheError(f"{self.lm.role}: its cache holds tokens at {start}…{self.pos - 1} that the sequence "
                             "no longer has there (a cut was missed)")
        new = seq[self.pos:]
        z = self.lm.forward(new, self.pos, keep)
        self.pos, self.last = self.pos + len(new), new
        return _finite(z, self.lm.role)

    def kept(self, fed: list[int], pos: int, after_last: bool = False) -> None:
        """After a tree forward: the tokens it kept, `fed`, now end the cache at `pos` (`after_last`: they follow
        the lane's last feed, as a proposer's kept path follows its catch-up)."""
        self.pos, self.last = pos, (self.last + fed) if after_last else list(fed)

    def cut(self, committed: int) -> None:
        """After a round: keep at most the committed tokens less the last (fed next); the cache may keep less."""
        end = self.pos
        self.pos = self.lm.truncate(min(self.pos, committed - 1))
        self.last = self.last[: max(0, len(self.last) - (end - self.pos))]


@dataclass
class Proposal:
    """A proposal and, for a grown tree, the proposer's pending row holding each node (−1: never fed)."""

    tree: Tree
    rows: list[int] | None = None  # None: a chain drafted through the plain cached forward


def pick(z: torch.Tensor, cfg: DecodeConfig, gen: torch.Generator | None) -> int:
    """Greedy argmax, or a sample from the warped distribution of logits z [1, V]."""
    if gen is None:
        return int(z[0].argmax())
    return rules.sample(rules.warp(z, cfg.temperature, cfg.top_k, cfg.top_p)[0], gen)


def propose_chain(lane: Lane | LM, seq: list[int], n: int, cfg: DecodeConfig,
                  gen: torch.Generator | None) -> tuple[list[int], torch.Tensor]:
    """The proposer drafts up to n tokens one at a time: ids and their logits [n, V]. n may be 0 (the last
    token of the budget): a pass that proposes nothing. With cfg.conf_stop > 0 it stops after a token drafted
    at a confidence (its largest raw probability) below that floor (HF assisted generation's threshold)."""
    if not isinstance(lane, Lane):  # a bare model (tests): its cache must end where seq's prefix does
        lane = Lane(lane, lane.cache_len)
    x: list[int] = []
    rows = []
    for _ in range(n):
        z = lane.feed(seq + x, 1)  # [1, V]
        rows.append(z[0])
        x.append(pick(z, cfg, gen))
        if cfg.conf_stop and float(rules.confidence(z)[0]) < cfg.conf_stop:
            break
    return x, torch.stack(rows) if rows else torch.zeros(0, 0)


def propose(lane: Lane, seq: list[int], room: int, length: int, cfg: DecodeConfig,
            gen: torch.Generator | None) -> Proposal:
    """The proposal after `seq`, as cfg.shape says: a chain of min(length, room) tokens, or a tree grown
    min(tree_depth, room) levels deep (`room`: the most tokens a path may still hold)."""
    if cfg.shape == "tree" and room > 0:
        return grow(lane, seq, cfg.tree_nodes, min(cfg.tree_depth, room), cfg.tree_k, cfg, gen)
    x, z = propose_chain(lane, seq, min(length, room), cfg, gen)
    return Proposal(chain(x, z))


def score(lane: Lane, seq: list[int], tree: Tree) -> torch.Tensor:
    """The verifier's logits per context [N + 1, V] after `seq` in one pass: a chain through the plain pass, a
    tree through a tree pass (its unfed committed tokens as a chain, then the tree on the last of them)."""
    if parent_list.is_chain(tree.parents):
        return lane.feed(seq + tree.tokens, tree.n + 1)
    new = seq[lane.pos:]  # the committed tokens it has not fed, the root last
    m = len(new)
    parents = parent_list.chain(m) + [p + m if p >= 0 else m - 1 for p in tree.parents]
    z = lane.lm.forward_tree(new + tree.tokens, parents, lane.pos)  # [m + N, V]
    return _finite(z[m - 1:], lane.lm.role)  # the root's context, then each node's


def settle(proposer: Lane, verifier: Lane, seq: list[int], prop: Proposal, path: list[int]) -> None:
    """After the decision only the accepted path stays: in the verifier's cache where it scored a tree (a chain's
    plain pass is cut by the engine), and in the proposer's where it fed the path's nodes (a prefix of it)."""
    tree = prop.tree
    if not parent_list.is_chain(tree.parents):
        new = seq[verifier.pos:]
        m = len(new)
        end = verifier.lm.keep_path(list(range(m)) + [m + i for i in path])
        verifier.kept(new + [tree.tokens[i] for i in path], end)
    if prop.rows is not None:
        rows: list[int] = []
        for i in path:
            if prop.rows[i] < 0:
                break
            rows.append(prop.rows[i])
        proposer.kept([tree.tokens[i] for i in path[: len(rows)]], proposer.lm.keep_path(rows), after_last=True)


def grow(lane: Lane, seq: list[int], nodes: int, depth: int, k: int, cfg: DecodeConfig,
         gen: torch.Generator | None) -> Proposal:
    """The proposer's tree after `seq` (its cache catches up on seq first, as a chain proposal does), one
    batched tree forward per level below the root."""
    z_root = lane.feed(seq, 1)  # [1, V]: the root's context
    warp = (cfg.temperature, cfg.top_k, cfg.top_p)
    shape = None
    if gen is not None:  # sampled: a shape fixed before any draw (lossless), filled in draw order
        from .tree_costs import RANK_PRIOR, expected_tree

        shape = parent_list.children(expected_tree(nodes, depth, k, RANK_PRIOR)[0])
    ctx_rows, toks, par, score_, ctx, fed, slot = [z_root[0]], [], [], [], [], [], []
    # per node: token, parent, path score, its row in ctx_rows (−1: not expanded), pending proposer row, shape slot

    def add_children(z_row: torch.Tensor, parent: int, base: float, at: int) -> list[int]:
        if shape is None:  # the top-k: their log-probabilities need one logsumexp, not a log-softmax
            z = z_row.float()
            v, i = torch.topk(z, k)
            logp, picks, slots = (v - torch.logsumexp(z, -1)).tolist(), i.tolist(), [-1] * k
        else:
            q = rules.warp(z_row[None], *warp)[0]  # [V]: the law the lossless rule holds the children to
            want = shape[at + 1]
            m = min(len(want), int((q > 0).sum()))
            picks = torch.multinomial(q, m, replacement=False, generator=gen).tolist() if m else []
            logp, slots = [float(q[t].log()) for t in picks], want[:m]
        out = []
        for s, t, sl in zip(logp, picks, slots):
            if s == float("-inf"):  # a reduced head with fewer than k tokens: no such candidate
                break
            toks.append(int(t))
            par.append(parent)
            score_.append(base + s)
            ctx.append(-1)
            fed.append(-1)
            slot.append(sl)
            out.append(len(toks) - 1)
        return out

    frontier = add_children(z_root[0], -1, 0.0, -1)
    n_rows = 0
    for _ in range(depth - 1):
        if shape is not None:  # the nodes the shape expands
            frontier = [f for f in frontier if shape[slot[f] + 1]]
        if not frontier:
            break
        z = lane.lm.forward_tree([toks[f] for f in frontier], [fed[par[f]] if par[f] >= 0 else -1 for f in frontier],
                                 lane.pos)  # [len(frontier), V]
        nxt = []
        for j, f in enumerate(frontier):
            fed[f], ctx[f] = n_rows + j, len(ctx_rows)
            ctx_rows.append(z[j])
            nxt += add_children(z[j], f, score_[f], slot[f])
        n_rows += len(frontier)
        frontier = nxt if shape is not None else sorted(nxt, key=lambda i: -score_[i])[:k]
    keep = best_nodes(par, score_, nodes) if shape is None else list(range(len(toks)))
    new = {old: i for i, old in enumerate(keep)}
    tree = Tree([toks[i] for i in keep], [new[par[i]] if par[i] >= 0 else -1 for i in keep],
                torch.stack(ctx_rows), [0] + [ctx[i] for i in keep], [score_[i] for i in keep])
    return Proposal(tree, [fed[i] for i in keep])

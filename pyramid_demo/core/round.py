"""One verification round (`engine.stage_round`): the proposal (chain or tree), its scoring pass and the decision;
its explanation is `explain.record`."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from . import rules
from .config import DecodeConfig
from .rules import Tree, TreeDecision, chain

if TYPE_CHECKING:
    from ..forward.lm import LM

# the shipped feature draft's on-policy acceptance by rank (greedy, assets/unseen_prompts.jsonl, 352 positions),
# assumed before a tree has run: it fixes a sampled tree's shape and what the predictor prices first
RANK_PRIOR = (0.406, 0.103, 0.045, 0.045, 0.046)


class NonFiniteLogits(ValueError):
    """A model returned NaN or +inf logits (or a row with no finite logit): it is broken."""


def _finite(z: torch.Tensor, role: str) -> torch.Tensor:
    """z itself, checked: row maxima catch NaN, +inf and all-−inf rows (a lone −inf is a token ruled out)."""
    if not bool(torch.isfinite(z.amax(-1)).all()):
        raise NonFiniteLogits(f"the {role} model returned NaN or infinite logits")
    return z


def feed(lm: LM, seq: list[int], keep: int) -> torch.Tensor:
    """`lm.feed` with its logits [keep, V] checked for NaN and +inf: every plain feed of the loop."""
    return _finite(lm.feed(seq, keep), lm.role)


# ---------------------------------------------------------------- propose
def confidence(z: torch.Tensor) -> torch.Tensor:
    """A proposer's confidence at each position: its largest raw probability, from logits z [n, V] -> [n]."""
    z = z.float()
    return torch.exp(z.max(-1).values - torch.logsumexp(z, -1))


def confident_prefix(conf: list[float], floor: float) -> int:
    """Tokens kept when a proposer stops after its first token below `floor` (kept; floor 0 keeps all)."""
    low = next((i for i, c in enumerate(conf) if c < floor), None)
    return len(conf) if low is None else low + 1


def pick(z: torch.Tensor, cfg: DecodeConfig, gen: torch.Generator | None) -> int:
    """Greedy argmax, or a sample from the warped distribution of logits z [1, V]."""
    if gen is None:
        return int(z[0].argmax())
    return rules.sample(rules.warp(z, cfg.temperature, cfg.top_k, cfg.top_p)[0], gen)


def propose(lm: LM, seq: list[int], room: int, length: int, cfg: DecodeConfig, gen: torch.Generator | None) -> Tree:
    """The proposal after `seq`, as cfg.shape says: a chain of min(length, room) tokens, or a tree grown
    min(tree_depth, room) levels deep (`room`: the most tokens a path may still hold); prompt lookup (an LM with
    `chain_after`) reads its chain from the text."""
    if hasattr(lm, "chain_after"):
        return chain(*lm.chain_after(seq, min(length, room)))
    if cfg.shape == "tree" and room > 0:
        return grow(lm, seq, cfg.tree_nodes, min(cfg.tree_depth, room), cfg.tree_k, cfg, gen)
    return chain(*propose_chain(lm, seq, min(length, room), cfg, gen))


def propose_chain(
    lm: LM, seq: list[int], n: int, cfg: DecodeConfig, gen: torch.Generator | None
) -> tuple[list[int], torch.Tensor]:
    """Up to n (maybe 0) tokens drafted one at a time: ids and logits [n, V]; with cfg.conf_stop > 0 it stops after
    a token whose largest raw probability is below that floor (HF assisted generation's threshold)."""
    x: list[int] = []
    rows = []
    for _ in range(n):
        z = feed(lm, seq + x, 1)  # [1, V]
        rows.append(z[0])
        x.append(pick(z, cfg, gen))
        if cfg.conf_stop and float(confidence(z)[0]) < cfg.conf_stop:
            break
    return x, torch.stack(rows) if rows else torch.zeros(0, 0)


def grow(
    lm: LM, seq: list[int], nodes: int, depth: int, k: int, cfg: DecodeConfig, gen: torch.Generator | None
) -> Tree:
    """The proposer's tree after `seq`, one tree forward per level (EAGLE-2). Greedy: top-k children, the k best
    paths expanded, the best `nodes` kept. Sampled: children drawn from warped q without replacement into a shape
    fixed before any draw (`expected_tree` on the rank prior), as the lossless rule needs."""
    z_root = feed(lm, seq, 1)  # [1, V]: the root's context
    warp = (cfg.temperature, cfg.top_k, cfg.top_p)
    shape = rules.children(expected_tree(nodes, depth, k, RANK_PRIOR)[0]) if gen is not None else None  # lossless
    ctx_rows, toks, par, score_, ctx, fed, slot = [z_root[0]], [], [], [], [], [], []
    # per node: token, parent, path score, its row in ctx_rows (−1: not expanded), its pending row, shape slot

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
        z = lm.forward_tree(
            [toks[f] for f in frontier], [fed[par[f]] if par[f] >= 0 else -1 for f in frontier], lm.cache_len
        )  # [len(frontier), V]
        nxt = []
        for j, f in enumerate(frontier):
            fed[f], ctx[f] = n_rows + j, len(ctx_rows)
            ctx_rows.append(z[j])
            nxt += add_children(z[j], f, score_[f], slot[f])
        n_rows += len(frontier)
        frontier = nxt if shape is not None else sorted(nxt, key=lambda i: -score_[i])[:k]
    keep = rules.best_nodes(par, score_, nodes) if shape is None else list(range(len(toks)))
    new = {old: i for i, old in enumerate(keep)}
    return Tree(
        [toks[i] for i in keep],
        [new[par[i]] if par[i] >= 0 else -1 for i in keep],
        torch.stack(ctx_rows),
        [0] + [ctx[i] for i in keep],
        [score_[i] for i in keep],
    )


# ---------------------------------------------------------------- score
def score(lm: LM, seq: list[int], tree: Tree) -> torch.Tensor:
    """The verifier's logits per context [N + 1, V] after `seq` in one pass: a chain through the plain pass, a
    tree through a tree pass (its unfed committed tokens as a chain, then the tree on the last of them)."""
    if rules.is_chain(tree.parents):
        return feed(lm, seq + tree.tokens, tree.n + 1)
    new = lm.unfed(seq)  # the committed tokens it has not fed, the root last
    m = len(new)
    parents = rules.chain_parents(m) + [p + m if p >= 0 else m - 1 for p in tree.parents]
    z = lm.forward_tree(new + tree.tokens, parents, lm.cache_len)  # [m + N, V]
    return _finite(z[m - 1 :], lm.role)  # the root's context, then each node's


# ---------------------------------------------------------------- decide
@dataclass(frozen=True)
class Round:
    """What a rule decided for a proposal (`dec`: the walk's path, own token, statuses) and the logits explaining it."""

    stage: str  # "qualifier" or "target": the verifier's role
    proposer: str
    verifier: str
    rule: str  # "sd" or "fuzzy"
    tau: float | None
    tree: Tree  # the proposal (a chain: parents i − 1)
    z_p: torch.Tensor  # [N + 1, V] the verifier's logits, one row per context
    dec: TreeDecision
    sampled: bool = False  # decided with a generator (temperature > 0); else greedy
    kept: int | None = None  # only this many of the round's new tokens were used (None: all); see `cut`
    eos_trim: bool = False  # the last token kept is an EOS: the proposals below it are left out of the record

    @property
    def k(self) -> int:
        """Proposed tokens accepted (the accepted path's length)."""
        return len(self.dec.path)

    @property
    def accepted(self) -> list[int]:
        """The accepted proposed tokens, along the accepted path."""
        return [self.tree.tokens[i] for i in self.dec.path]

    @property
    def own_status(self) -> str:
        """The one place "bonus" is decided: the walk ended where nothing was proposed (a leaf, or an empty
        proposal's root), so the verifier's token came for free; else it was drawn after a refusal."""
        return "bonus" if self.dec.leaf else "resampled"

    @property
    def own_origin(self) -> str:
        """The verifier's token's origin in the output, agreeing with `own_status`: a target's bonus is "bonus"."""
        return "bonus" if self.verifier == "target" and self.own_status == "bonus" else self.verifier

    def new_tokens(self) -> list[int]:
        """The round's new tokens: its accepted path, then the verifier's own token (`dec.nxt`: drawn from what
        is left at a refusal, else the bonus)."""
        return self.accepted + [self.dec.nxt]

    def cut(self, n: int, eos: bool = False) -> Round:
        """This round with only its first n new tokens used (a block cut, an EOS): the rest of the path and the
        verifier's token are marked discarded; `eos`: the proposals below the n-th token are left out."""
        return replace(self, kept=n, eos_trim=eos) if n < self.k + 1 else self


def decide_round(
    z_p: torch.Tensor,
    tree: Tree,
    rule: str,
    tau: float | None,
    cfg: DecodeConfig,
    gen: torch.Generator | None,
    stage: str,
    proposer: str,
    verifier: str,
) -> Round:
    """Decide a proposal against the verifier's logits z_p [N + 1, V] (`rules.decide_tree`). SD: greedy argmax, or
    multi-step speculative sampling; fuzzy: Div ≤ τ accepts the first child, else the verifier's token from p.
    CHOICE, cfg.fallback "sd": where Div > τ the SD rule decides, so those positions follow the verifier."""
    dec = rules.decide_tree(
        z_p,
        tree,
        rule,
        tau,
        cfg.fallback,
        (cfg.temperature, cfg.top_k, cfg.top_p),
        gen,
        (cfg.divergence, cfg.div_support),
    )
    return Round(stage, proposer, verifier, rule, tau, tree, z_p, dec, sampled=gen is not None)


def decide(
    z_p: torch.Tensor,
    z_q: torch.Tensor,
    x: list[int],
    rule: str,
    tau: float | None,
    cfg: DecodeConfig,
    gen: torch.Generator | None,
    stage: str,
    proposer: str,
    verifier: str,
) -> Round:
    """A chain's round: proposed tokens x [n] with the proposer's logits z_q [n, V] (see `decide_round`)."""
    return decide_round(z_p, chain(x, z_q if x else z_p[:0]), rule, tau, cfg, gen, stage, proposer, verifier)


# ---------------------------------------------------------------- the sampled tree's shape
def expected_tree(nodes: int, depth: int, k: int, a: list[float] | tuple[float, ...]) -> tuple[list[int], list[int]]:
    """EAGLE-2's expansion on expected scores (log of a product of a_rank along a path): (parents, ranks). A
    sampled tree takes this shape on `RANK_PRIOR`; the predictor prices trees by it."""

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
    keep = rules.best_nodes(par, score, nodes)
    idx = {old: i for i, old in enumerate(keep)}
    return [idx[par[i]] if par[i] >= 0 else -1 for i in keep], [rank[i] for i in keep]

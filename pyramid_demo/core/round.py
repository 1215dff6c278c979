"""One verification round below the loop (`engine.stage_round`): each model's cursor into its cache, the proposal
(a chain or a tree), the one pass that scores it, the decision, and the caches settled to the accepted path.

Why apart from the loop: the loop runs one round for every shape and every stage; only the models differ in how a
shape is fed. A chain is drafted one token at a time through the plain cached forward and scored by one plain
pass (no tree layout to pay for); a tree is grown with one batched tree forward per level (EAGLE-2) and scored
by one tree pass, after which only the accepted path stays in each cache (`settle`). Between the two the round
only decides, by the one walk (`rules.decide_tree`): greedy SD reads argmaxes, sampled SD the warped rows of the
contexts it reaches, a fuzzy rule the divergences it tests. Nothing here is for display: `recorder.record`
explains the round later from the same logits, reusing what was computed here (divergences, warped rows, uniforms).

Growing a tree: at temperature 0 each expanded node's top-k tokens are its children, ranked by the product of
the proposer's probabilities along their path; the best k are expanded next and the best `nodes` kept
(`rules.best_nodes`). Above 0 the lossless rule needs children drawn from the proposer's warped q without
replacement, and a tree whose shape does not depend on the drawn tokens: the shape is the expected tree on
the rank prior (`tree_costs.expected_tree`, what the predictor prices), filled by draws in order.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..forward.cache import CacheError
from ..forward.lm import LM
from . import rules
from .config import DecodeConfig
from .rules import Tree, TreeDecision, chain


class NonFiniteLogits(ValueError):
    """A model returned NaN or +inf logits (or a row with no finite logit): it is broken."""


def _finite(z: torch.Tensor, role: str) -> torch.Tensor:
    """z itself, checked once: the row maxima catch NaN, +inf and all-−inf rows (−inf alone is a token ruled
    out, probability 0, and is allowed)."""
    if not bool(torch.isfinite(z.amax(-1)).all()):
        raise NonFiniteLogits(f"the {role} model returned NaN or infinite logits")
    return z


@dataclass
class Cursor:
    """One model in a run and the position its cache ends at: every forward is fed from there.

    The position is the cursor's own, advanced by what it feeds and set back by what it cuts (never read off
    the sequence it is handed), and each feed first checks that the sequence still holds, where the cursor's
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
        the cursor's last feed, as a proposer's kept path follows its catch-up)."""
        self.pos, self.last = pos, (self.last + fed) if after_last else list(fed)

    def cut(self, committed: int) -> None:
        """After a round: keep at most the committed tokens less the last (fed next); the cache may keep less."""
        end = self.pos
        self.pos = self.lm.truncate(min(self.pos, committed - 1))
        self.last = self.last[: max(0, len(self.last) - (end - self.pos))]


# ---------------------------------------------------------------- propose
@dataclass
class Proposal:
    """A proposal and, for a grown tree, the proposer's pending row holding each node (−1: never fed)."""

    tree: Tree
    rows: list[int] | None = None  # None: a chain drafted through the plain cached forward


def confidence(z: torch.Tensor) -> torch.Tensor:
    """A proposer's confidence at each position: its largest raw probability, from logits z [n, V] -> [n]."""
    z = z.float()
    return torch.exp(z.max(-1).values - torch.logsumexp(z, -1))


def confident_prefix(conf: list[float], floor: float) -> int:
    """How many proposed tokens to keep when a proposer stops after its first token whose
    confidence is below `floor` (that token is kept; floor 0 keeps them all)."""
    low = next((i for i, c in enumerate(conf) if c < floor), None)
    return len(conf) if low is None else low + 1


def pick(z: torch.Tensor, cfg: DecodeConfig, gen: torch.Generator | None) -> int:
    """Greedy argmax, or a sample from the warped distribution of logits z [1, V]."""
    if gen is None:
        return int(z[0].argmax())
    return rules.sample(rules.warp(z, cfg.temperature, cfg.top_k, cfg.top_p)[0], gen)


def propose(cur: Cursor, seq: list[int], room: int, length: int, cfg: DecodeConfig,
            gen: torch.Generator | None) -> Proposal:
    """The proposal after `seq`, as cfg.shape says: a chain of min(length, room) tokens, or a tree grown
    min(tree_depth, room) levels deep (`room`: the most tokens a path may still hold)."""
    if cfg.shape == "tree" and room > 0:
        return grow(cur, seq, cfg.tree_nodes, min(cfg.tree_depth, room), cfg.tree_k, cfg, gen)
    x, z = propose_chain(cur, seq, min(length, room), cfg, gen)
    return Proposal(chain(x, z))


def propose_chain(cur: Cursor, seq: list[int], n: int, cfg: DecodeConfig,
                  gen: torch.Generator | None) -> tuple[list[int], torch.Tensor]:
    """The proposer drafts up to n tokens one at a time: ids and their logits [n, V]. n may be 0 (the last
    token of the budget): a pass that proposes nothing. With cfg.conf_stop > 0 it stops after a token drafted
    at a confidence (its largest raw probability) below that floor (HF assisted generation's threshold)."""
    x: list[int] = []
    rows = []
    for _ in range(n):
        z = cur.feed(seq + x, 1)  # [1, V]
        rows.append(z[0])
        x.append(pick(z, cfg, gen))
        if cfg.conf_stop and float(confidence(z)[0]) < cfg.conf_stop:
            break
    return x, torch.stack(rows) if rows else torch.zeros(0, 0)


def grow(cur: Cursor, seq: list[int], nodes: int, depth: int, k: int, cfg: DecodeConfig,
         gen: torch.Generator | None) -> Proposal:
    """The proposer's tree after `seq` (its cache catches up on seq first, as a chain proposal does), one
    batched tree forward per level below the root."""
    z_root = cur.feed(seq, 1)  # [1, V]: the root's context
    warp = (cfg.temperature, cfg.top_k, cfg.top_p)
    shape = None
    if gen is not None:  # sampled: a shape fixed before any draw (lossless), filled in draw order
        from ..predict.tree_costs import RANK_PRIOR, expected_tree

        shape = rules.children(expected_tree(nodes, depth, k, RANK_PRIOR)[0])
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
        z = cur.lm.forward_tree([toks[f] for f in frontier], [fed[par[f]] if par[f] >= 0 else -1 for f in frontier],
                                cur.pos)  # [len(frontier), V]
        nxt = []
        for j, f in enumerate(frontier):
            fed[f], ctx[f] = n_rows + j, len(ctx_rows)
            ctx_rows.append(z[j])
            nxt += add_children(z[j], f, score_[f], slot[f])
        n_rows += len(frontier)
        frontier = nxt if shape is not None else sorted(nxt, key=lambda i: -score_[i])[:k]
    keep = rules.best_nodes(par, score_, nodes) if shape is None else list(range(len(toks)))
    new = {old: i for i, old in enumerate(keep)}
    tree = Tree([toks[i] for i in keep], [new[par[i]] if par[i] >= 0 else -1 for i in keep],
                torch.stack(ctx_rows), [0] + [ctx[i] for i in keep], [score_[i] for i in keep])
    return Proposal(tree, [fed[i] for i in keep])


# ---------------------------------------------------------------- score
def score(cur: Cursor, seq: list[int], tree: Tree) -> torch.Tensor:
    """The verifier's logits per context [N + 1, V] after `seq` in one pass: a chain through the plain pass, a
    tree through a tree pass (its unfed committed tokens as a chain, then the tree on the last of them)."""
    if rules.is_chain(tree.parents):
        return cur.feed(seq + tree.tokens, tree.n + 1)
    new = seq[cur.pos:]  # the committed tokens it has not fed, the root last
    m = len(new)
    parents = rules.chain_parents(m) + [p + m if p >= 0 else m - 1 for p in tree.parents]
    z = cur.lm.forward_tree(new + tree.tokens, parents, cur.pos)  # [m + N, V]
    return _finite(z[m - 1:], cur.lm.role)  # the root's context, then each node's


# ---------------------------------------------------------------- decide
@dataclass(frozen=True)
class Round:
    """What a rule decided for a proposal (`dec`: the walk's path, own token and statuses), and the logits that
    explain it."""

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
        """This round with only its first n new tokens used (a PSD block's size or confidence cut, an EOS): the
        record then says exactly that. A cut inside the accepted path leaves the path from n on and the
        verifier's own token unused (`recorder.record` marks them discarded and counts n accepted). `eos`: the
        n-th token is an EOS, so the proposals below it (never usable) are left out of the record."""
        return replace(self, kept=n, eos_trim=eos) if n < self.k + 1 else self


def decide_round(z_p: torch.Tensor, tree: Tree, rule: str, tau: float | None, cfg: DecodeConfig,
                 gen: torch.Generator | None, stage: str, proposer: str, verifier: str) -> Round:
    """Decide a proposal (chain or tree) against the verifier's logits z_p [N + 1, V]: the one rule walk.

    SD: greedy, accept the child equal to argmax p; sampled, multi-step speculative sampling (one child: SD's
    ratio test r < p(x)/q(x) and the residual norm(max(0, p − q))). Fuzzy: a context with Div ≤ τ accepts its
    first child, a refusal draws the verifier's own token from p. CHOICE, cfg.fallback "sd": where Div > τ the SD
    rule alone decides (ratio test and residual), so those positions follow the verifier's distribution."""
    dec = rules.decide_tree(z_p, tree, rule, tau, cfg.fallback, (cfg.temperature, cfg.top_k, cfg.top_p), gen,
                            (cfg.divergence, cfg.div_support))
    return Round(stage, proposer, verifier, rule, tau, tree, z_p, dec, sampled=gen is not None)


def decide(z_p: torch.Tensor, z_q: torch.Tensor, x: list[int], rule: str, tau: float | None,
           cfg: DecodeConfig, gen: torch.Generator | None, stage: str, proposer: str, verifier: str) -> Round:
    """A chain's round: proposed tokens x [n] with the proposer's logits z_q [n, V] (see `decide_round`)."""
    return decide_round(z_p, chain(x, z_q if x else z_p[:0]), rule, tau, cfg, gen, stage, proposer, verifier)


# ---------------------------------------------------------------- settle
def settle(proposer: Cursor, verifier: Cursor, seq: list[int], prop: Proposal, path: list[int]) -> None:
    """After the decision only the accepted path stays: in the verifier's cache where it scored a tree (a chain's
    plain pass is cut by the loop), and in the proposer's where it fed the path's nodes (a prefix of it)."""
    tree = prop.tree
    if not rules.is_chain(tree.parents):
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

"""One verification round (`engine.stage_round`): propose, score, decide; then its record (`record`), built off the
engine clock from the walk's own divergences and uniforms, so the inspector shows what the rule saw."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from ..forward.lookup import NGRAM, lookup, one_hot
from . import rules
from .methods import DecodeConfig
from .rules import Tree, TreeDecision, chain
from .trace import StageRound, TokenRec

if TYPE_CHECKING:
    from ..forward.lm import LM


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
    """The proposal after `seq` as cfg.shape says, no path longer than `room`: a chain of `length`, or a tree;
    prompt lookup (an LM with `chain_after`, or the draft under `cfg.lookup_first`) reads its chain from the text."""
    if hasattr(lm, "chain_after"):
        return chain(*lm.chain_after(seq, min(length, room)))
    if cfg.lookup_first and (looked := looked_up(lm, seq, min(length, room), cfg.lookup_first)):
        return looked
    if cfg.shape == "tree" and room > 0:
        return grow(lm, seq, cfg.tree_nodes, min(cfg.tree_depth, room), cfg.tree_k, cfg, gen)
    return chain(*propose_chain(lm, seq, min(length, room), cfg, gen))


def looked_up(lm: LM, seq: list[int], n: int, shortest: int) -> Tree | None:
    """CHOICE `lookup_first`: prompt lookup's chain of up to n tokens after `seq`, where the text's last `shortest`
    or more tokens occurred before (None: no such match, the model proposes). Its time is the draft's; no pass is
    counted, and the model's cache catches up at its next pass."""
    t0 = time.perf_counter()
    x = lookup(seq, max(NGRAM, shortest), n, shortest)
    lm.time_s += time.perf_counter() - t0
    return chain(x, one_hot(x, lm.vocab_size)) if x else None


def propose_chain(
    lm: LM, seq: list[int], n: int, cfg: DecodeConfig, gen: torch.Generator | None
) -> tuple[list[int], torch.Tensor]:
    """Up to n tokens drafted one at a time: ids and logits [n, V]; stops after one less sure than cfg.conf_stop."""
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
    """The proposer's tree after `seq`, one forward per level (EAGLE-2): greedy, top-k children and the best `nodes`;
    sampled, children drawn without replacement into a shape fixed before any draw (the lossless rule needs it)."""
    z_root = feed(lm, seq, 1)  # [1, V]: the root's context
    warp = (cfg.temperature, cfg.top_k, cfg.top_p)
    shape = (
        rules.children(rules.expected_tree(nodes, depth, k, rules.RANK_PRIOR)[0]) if gen is not None else None
    )  # lossless
    ctx_rows, toks, par, score_, ctx, slot = [z_root[0]], [], [], [], [], []
    # per node: token, parent, path score, its row in ctx_rows (−1: not expanded; its pending row is one less), slot

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
            slot.append(sl)
            out.append(len(toks) - 1)
        return out

    frontier = add_children(z_root[0], -1, 0.0, -1)
    for _ in range(depth - 1):
        if shape is not None:  # the nodes the shape expands
            frontier = [f for f in frontier if shape[slot[f] + 1]]
        if not frontier:
            break
        up = [ctx[par[f]] - 1 if par[f] >= 0 else -1 for f in frontier]  # each parent's pending row (−1: the root)
        z = lm.forward([toks[f] for f in frontier], lm.cache_len, parents=up)  # [len(frontier), V]
        nxt = []
        for j, f in enumerate(frontier):
            ctx[f] = len(ctx_rows)
            ctx_rows.append(z[j])
            nxt += add_children(z[j], f, score_[f], slot[f])
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
    """The verifier's logits per context [N + 1, V] in one pass: its unfed committed tokens (the root last), then the
    proposal's nodes under their parents, pending until the round keeps its accepted path."""
    new = lm.unfed(seq)
    m = len(new)
    parents = rules.chain_parents(m) + [p + m if p >= 0 else m - 1 for p in tree.parents]
    z = lm.forward(new + tree.tokens, lm.cache_len, tree.n + 1, parents)  # [N + 1, V]
    return _finite(z, lm.role)


# ---------------------------------------------------------------- decide
@dataclass(frozen=True)
class Round:
    """What a rule decided for a proposal (`dec`) and the logits explaining it."""

    proposer: str
    verifier: str  # its role names the stage: "qualifier" or "target"
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
        """The one place "bonus" is decided: the walk ended where nothing was proposed; else it was a refusal."""
        return "bonus" if self.dec.leaf else "resampled"

    @property
    def own_origin(self) -> str:
        """The verifier's token's origin in the output, agreeing with `own_status`: a target's bonus is "bonus"."""
        return "bonus" if self.verifier == "target" and self.own_status == "bonus" else self.verifier

    def new_tokens(self) -> list[int]:
        """The round's new tokens: its accepted path, then the verifier's own token."""
        return self.accepted + [self.dec.nxt]

    def cut(self, n: int, eos: bool = False) -> Round:
        """This round with only its first n new tokens used (the rest discarded); `eos`: those below are left out."""
        return replace(self, kept=n, eos_trim=eos) if n < self.k + 1 else self


def decide_round(
    z_p: torch.Tensor,
    tree: Tree,
    rule: str,
    tau: float | None,
    cfg: DecodeConfig,
    gen: torch.Generator | None,
    proposer: str,
    verifier: str,
) -> Round:
    """Decide a proposal against the verifier's logits z_p [N + 1, V] (`rules.decide_tree`); CHOICE, cfg.fallback
    "sd": where Div > τ the SD rule decides, so those positions follow the verifier."""
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
    return Round(proposer, verifier, rule, tau, tree, z_p, dec, sampled=gen is not None)


# ---------------------------------------------------------------- the record of a decided round
def topk_pairs(probs: torch.Tensor, k: int = 5) -> list[list[list[float]]]:
    """[[id, prob] × k] per row of probs [n, V], for the step inspector."""
    v, i = torch.topk(probs, min(k, probs.shape[-1]), dim=-1)
    return [[[int(a), round(float(b), 5)] for a, b in zip(ii, vv)] for ii, vv in zip(i, v)]


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
    """The SD rule's verdict on every child at every context (the walk's, the rest here from the same uniforms)."""
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
        z_q = tree.z_q[[tree.q_row[c] for c in todo]]
        d[todo] = rules.support_divergence_logits(rnd.z_p[todo], z_q, cfg.divergence, cfg.div_support)
    return d.tolist()


def record(rnd: Round, cfg: DecodeConfig, full: bool = True) -> StageRound:
    """The round's `StageRound`; node i is scored at row parent + 1 of z_p. `full=False` keeps statuses only."""
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
    # the rule name the records show: greedy | sd | fuzzy | fuzzy+sd
    rule = ("greedy" if greedy else "sd") if rnd.rule == "sd" else "fuzzy" if cfg.fallback == "none" else "fuzzy+sd"
    parents = [index[tree.parents[i]] if tree.parents[i] >= 0 else -1 for i in keep]
    return StageRound(
        rnd.verifier,
        rnd.proposer,
        rnd.verifier,
        rule,
        recs,
        n_acc,
        exact=rnd.rule == "sd",
        sd_fallback=rnd.rule != "sd" and cfg.fallback == "sd",
        parents=parents,
    )

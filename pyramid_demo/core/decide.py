"""One verification's decision: only what its acceptance rule needs (the engine's timed path).

Greedy SD reads two argmaxes; sampled SD warps both distributions for the ratio test; a fuzzy rule
computes the divergence it tests. Nothing here is for display: `recorder.record` explains the round
later from the same logits, reusing what was computed here (the divergence, the warped rows).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import rules
from .config import DecodeConfig
from .tree import Tree, TreeDecision


@dataclass
class Round:
    """What a rule decided for proposed tokens x [n], and the logits that explain it."""

    stage: str  # "qualifier" or "target"
    proposer: str
    verifier: str
    rule: str  # "sd" or "fuzzy"
    tau: float | None
    x: list[int]
    k: int  # drafted tokens accepted
    nxt: int  # the verifier's own token (resampled at a rejection, else the bonus)
    z_p: torch.Tensor  # [n+1, V] the verifier's logits
    z_q: torch.Tensor  # [n, V] the proposer's logits
    d: torch.Tensor | None = None  # [n] divergences, when the rule computed them
    p_w: torch.Tensor | None = None  # [n+1, V] warped verifier rows, when the rule read them (sampled SD tests)
    q_w: torch.Tensor | None = None  # [n, V] warped proposer rows, likewise (the recorder warps what is missing)
    kept: int | None = None  # only this many of the round's new tokens were used (None: all); see `keep`
    eos_trim: bool = False  # the last token kept is an EOS: the proposals after it are left out of the record
    sampled: bool = False  # decided with a generator (temperature > 0); else greedy
    tree: Tree | None = None  # a tree round: x are its nodes, z_p and z_q have one row per context
    path: list[int] | None = None  # a tree round: the accepted nodes, root first
    status: list[str] | None = None  # a tree round: each node's fate (accepted / rejected / discarded)

    @property
    def accepted(self) -> list[int]:
        """The accepted drafted tokens, in order (a tree's: along its accepted path)."""
        return [self.x[i] for i in self.path] if self.path is not None else self.x[: self.k]

    @property
    def leaf(self) -> bool:
        """Whether the walk ended where nothing more was proposed (the verifier's token is then a bonus)."""
        if self.tree is None:
            return self.k == len(self.x)
        return (self.path[-1] if self.path else -1) not in self.tree.parents  # the last context has no children

    def new_tokens(self) -> list[int]:
        """The round's new tokens: its accepted run, then the verifier's own token."""
        return self.accepted + [self.nxt]

    def keep(self, n: int, eos: bool = False) -> None:
        """Only the first n new tokens were used (a PSD block's size or confidence cut, an EOS): the record then
        says exactly that. A cut inside the accepted run leaves the accepted tokens from n on and the verifier's
        own token unused: `recorder.record` marks them discarded and counts n accepted. `eos`: the n-th token
        is an EOS, so the proposals after it (never usable) are left out of the record and of every count."""
        if n < self.k + 1:
            self.kept, self.eos_trim = n, eos


def raw_divergence(z_p: torch.Tensor, z_q: torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """Div(P_verifier, P_proposer) per proposed position [n] on the raw distributions (CHOICE: the FSD code's
    form, temperature 1, no top-k/top-p), over the proposer's support when it has zeros (cfg.div_support)."""
    return rules.support_divergence_logits(z_p, z_q, cfg.divergence, cfg.div_support)


def decide(z_p: torch.Tensor, z_q: torch.Tensor, x: list[int], rule: str, tau: float | None,
           cfg: DecodeConfig, gen: torch.Generator | None, stage: str, proposer: str, verifier: str) -> Round:
    """Test proposed tokens x [n] against the verifier's logits z_p [n+1, V]; z_q [n, V] are the proposer's.

    SD: greedy, accept while x̃_i == argmax p_i; sampled, while r_i < p_i(x̃_i)/q_i(x̃_i), and resample from
    norm(max(0, p − q)) at the first rejection. Fuzzy: accept while Div ≤ τ, then the verifier's own token
    from p. CHOICE, cfg.fallback "sd": a token passing either test is accepted, and a rejection (both failed)
    resamples from SD's residual. Div does not depend on the token, so where it exceeds τ the SD rule alone
    decides, ratio test and residual: those positions follow the verifier's distribution exactly."""
    n = len(x)
    z_q = z_q if n else z_p[:0]  # nothing proposed (the budget's last token): the verifier's own only
    fuzzy = rule != "sd"
    with_sd = not fuzzy or cfg.fallback == "sd"
    d = raw_divergence(z_p[:n], z_q, cfg) if fuzzy and n else None
    p_w = q_w = None
    sd: list[bool] = []
    if gen is None:
        if with_sd:
            sd = [a == t for a, t in zip(z_p[:n].argmax(-1).tolist(), x)]
    else:
        r = torch.rand(n, generator=gen)  # drawn under every rule: one random stream whatever the rule
        if with_sd:  # the ratio test reads every warped row; a fuzzy rule alone reads only p's at its stop
            p_w = rules.warp(z_p, cfg.temperature, cfg.top_k, cfg.top_p)  # [n+1, V]
            q_w = rules.warp(z_q, cfg.temperature, cfg.top_k, cfg.top_p)  # [n, V]
            sd = rules.sd_passes(p_w[:n], q_w, x, r)
    if not fuzzy:
        passes = sd
    else:
        passes = rules.fuzzy_passes(d, tau if tau is not None else 0.0) if d is not None else []
        if with_sd:
            passes = [a or b for a, b in zip(passes, sd)]
    k = rules.leading_run(passes)
    if gen is None:
        nxt = int(z_p[k].argmax())
    else:
        p_next = p_w[k] if p_w is not None else rules.warp(z_p[k: k + 1], cfg.temperature, cfg.top_k, cfg.top_p)[0]
        q_next = q_w[k] if q_w is not None and k < n else None  # a rejection by the SD test: its residual
        nxt = rules.next_token(p_next, q_next, gen)
    return Round(stage, proposer, verifier, rule, tau, list(x), k, nxt, z_p, z_q, d, p_w, q_w, sampled=gen is not None)


def tree_round_record(dec: TreeDecision, tree: Tree, z_p: torch.Tensor, rule: str, tau: float | None, stage: str,
                      proposer: str, verifier: str, sampled: bool) -> Round:
    """A tree decision as a `Round` (x: the nodes; z_p [N + 1, V] and z_q: one row per context)."""
    return Round(stage, proposer, verifier, rule, tau, list(tree.tokens), len(dec.path), dec.nxt, z_p, tree.z_q,
                 dec.d, None, None, sampled=sampled, tree=tree, path=list(dec.path), status=list(dec.status))

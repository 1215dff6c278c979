"""One verification's decision: only what its acceptance rule needs (the engine's timed path).

Every proposal is a tree (a chain is the tree with parent i − 1), decided by the one walk
`tree.decide_tree`: greedy SD reads argmaxes, sampled SD the warped rows of the contexts it reaches, a fuzzy
rule the divergences it tests. Nothing here is for display: `recorder.record` explains the round later from
the same logits, reusing what was computed here (the divergences, the warped rows, the uniforms).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from . import rules
from .config import DecodeConfig
from .tree import Tree, TreeDecision, chain, decide_tree


@dataclass(frozen=True)
class Round:
    """What a rule decided for a proposal, and the logits that explain it."""

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
    def x(self) -> list[int]:
        return self.tree.tokens

    @property
    def z_q(self) -> torch.Tensor:
        return self.tree.z_q

    @property
    def path(self) -> list[int]:
        return self.dec.path

    @property
    def k(self) -> int:
        """Proposed tokens accepted (the accepted path's length)."""
        return len(self.dec.path)

    @property
    def nxt(self) -> int:
        """The verifier's own token (drawn from what is left at a refusal, else the bonus)."""
        return self.dec.nxt

    @property
    def d(self) -> torch.Tensor | None:
        return self.dec.d

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
        """The round's new tokens: its accepted path, then the verifier's own token."""
        return self.accepted + [self.nxt]

    def cut(self, n: int, eos: bool = False) -> Round:
        """This round with only its first n new tokens used (a PSD block's size or confidence cut, an EOS): the
        record then says exactly that. A cut inside the accepted path leaves the path from n on and the
        verifier's own token unused (`recorder.record` marks them discarded and counts n accepted). `eos`: the
        n-th token is an EOS, so the proposals below it (never usable) are left out of the record."""
        return replace(self, kept=n, eos_trim=eos) if n < self.k + 1 else self


def raw_divergence(z_p: torch.Tensor, z_q: torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """Div(P_verifier, P_proposer) per proposed position [n] on the raw distributions (CHOICE: the FSD code's
    form, temperature 1, no top-k/top-p), over the proposer's support when it has zeros (cfg.div_support)."""
    return rules.support_divergence_logits(z_p, z_q, cfg.divergence, cfg.div_support)


def decide_round(z_p: torch.Tensor, tree: Tree, rule: str, tau: float | None, cfg: DecodeConfig,
                 gen: torch.Generator | None, stage: str, proposer: str, verifier: str) -> Round:
    """Decide a proposal (chain or tree) against the verifier's logits z_p [N + 1, V]: the one rule walk.

    SD: greedy, accept the child equal to argmax p; sampled, multi-step speculative sampling (one child: SD's
    ratio test r < p(x)/q(x) and the residual norm(max(0, p − q))). Fuzzy: a context with Div ≤ τ accepts its
    first child, a refusal draws the verifier's own token from p. CHOICE, cfg.fallback "sd": where Div > τ the SD
    rule alone decides (ratio test and residual), so those positions follow the verifier's distribution."""
    dec = decide_tree(z_p, tree, rule, tau, cfg.fallback, (cfg.temperature, cfg.top_k, cfg.top_p), gen,
                      (cfg.divergence, cfg.div_support))
    return Round(stage, proposer, verifier, rule, tau, tree, z_p, dec, sampled=gen is not None)


def decide(z_p: torch.Tensor, z_q: torch.Tensor, x: list[int], rule: str, tau: float | None,
           cfg: DecodeConfig, gen: torch.Generator | None, stage: str, proposer: str, verifier: str) -> Round:
    """A chain's round: proposed tokens x [n] with the proposer's logits z_q [n, V] (see `decide_round`)."""
    return decide_round(z_p, chain(x, z_q if x else z_p[:0]), rule, tau, cfg, gen, stage, proposer, verifier)

"""Pure math of speculative decoding: warps, divergences and acceptance rules.

No model calls here; every function is tested with hand-built logits. Names follow the
papers: p is the verifier's distribution, q the proposer's, x̃ the proposed tokens.
"""
from __future__ import annotations

import torch

EPS = 1e-12
LOG_EPS = -27.6  # log(EPS)


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


def divergence(p: torch.Tensor, q: torch.Tensor, kind: str = "js",
               log_p: torch.Tensor | None = None, log_q: torch.Tensor | None = None) -> torch.Tensor:
    """Div(p, q) per row [n] for p = verifier, q = proposer (raw distributions [n, V]).

    js is the FSD reference code's form ½KL(m‖p) + ½KL(m‖q) with m = (p+q)/2 (CHOICE: it is
    not the textbook JSD); kl is KL(q‖p); tv is ½Σ|p−q|. Pass log_p/log_q (log_softmax of the
    logits) when you have them: it saves two logs. Never NaN, never negative.
    """
    if kind == "tv":
        d = 0.5 * (p - q).abs().sum(-1)
    elif kind in ("kl", "js"):
        log_p = p.clamp_min(EPS).log() if log_p is None else log_p.clamp_min(LOG_EPS)
        log_q = q.clamp_min(EPS).log() if log_q is None else log_q.clamp_min(LOG_EPS)
        if kind == "kl":
            d = (q * (log_q - log_p)).sum(-1)
        else:
            m = 0.5 * (p + q)
            d = (m * (m.clamp_min(EPS).log() - 0.5 * (log_p + log_q))).sum(-1)
    else:
        raise ValueError(f"unknown divergence {kind!r}; choose js, kl or tv")
    return d.clamp_min(0)


def confidence(z: torch.Tensor) -> torch.Tensor:
    """A proposer's confidence at each position: its largest raw probability, from logits z [n, V] -> [n]."""
    z = z.float()
    return torch.exp(z.max(-1).values - torch.logsumexp(z, -1))


def confident_prefix(conf: list[float], floor: float) -> int:
    """How many proposed tokens to keep when a proposer stops after its first token whose
    confidence is below `floor` (that token is kept; floor 0 keeps them all)."""
    low = next((i for i, c in enumerate(conf) if c < floor), None)
    return len(conf) if low is None else low + 1


def leading_run(passes: list[bool]) -> int:
    """Length of the leading run of True: tokens are accepted until the first failure."""
    for i, ok in enumerate(passes):
        if not ok:
            return i
    return len(passes)


def sd_passes(p: torch.Tensor, q: torch.Tensor, x: list[int], r: torch.Tensor | None) -> list[bool]:
    """Per-token SD test. Greedy (r None): x̃_i == argmax p_i. Sampled: r_i < p_i(x̃_i)/q_i(x̃_i).

    p, q: [n, V] warped (greedy: p may be raw logits, only its argmax is read); x: n proposed
    ids; r: [n] uniforms.
    """
    if r is None:
        return [a == t for a, t in zip(p.argmax(-1).tolist(), x)]
    return [float(r[i]) * float(q[i, t]) < float(p[i, t]) for i, t in enumerate(x)]


def fuzzy_passes(d: torch.Tensor, tau: float) -> list[bool]:
    """FSD test: Div(P_T,i, P_D,i) ≤ τ, whatever the token."""
    return [float(v) <= tau for v in d]


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)) [V]: where SD resamples after a rejection (falls back to p if empty)."""
    res = (p - q).clamp_min(0)
    s = res.sum()
    return res / s if s > 0 else p


def sample(probs: torch.Tensor, gen: torch.Generator | None) -> int:
    """One token from probs [V]; argmax when no generator is given (greedy decoding)."""
    if gen is None:
        return int(probs.argmax())
    return int(torch.multinomial(probs, 1, generator=gen))


def next_token(p_next: torch.Tensor, q_next: torch.Tensor | None, gen: torch.Generator | None) -> int:
    """The verifier's own token: from the residual under SD (q given), from p otherwise."""
    dist = residual(p_next, q_next) if q_next is not None else p_next
    return sample(dist, gen)


def topk_pairs(probs: torch.Tensor, k: int = 5) -> list[list[list[float]]]:
    """[[id, prob] × k] per row of probs [n, V], for the step inspector."""
    v, i = torch.topk(probs, min(k, probs.shape[-1]), dim=-1)
    return [[[int(a), round(float(b), 5)] for a, b in zip(ii, vv)] for ii, vv in zip(i, v)]

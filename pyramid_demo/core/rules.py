"""Pure math of speculative decoding: warps, divergences and acceptance rules.

No model calls here; every function is tested with hand-built logits. Names follow the
papers: p is the verifier's distribution, q the proposer's, x̃ the proposed tokens.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

LN2 = math.log(2.0)


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
    logits) when you have them: they are used as they are (no floor: a verifier probability of
    1e-20 counts as 1e-20), which is exact even where p or q underflows to 0. Only −inf is
    guarded: a 0·log 0 term counts 0, so the result is never NaN; it is +inf where the verifier
    rules out (probability exactly 0) a token the proposer can produce. Never negative.
    Differentiable (the distillation loss uses it).
    """
    if kind == "tv":
        return (0.5 * (p - q).abs().sum(-1)).clamp_min(0)
    if kind not in ("kl", "js"):
        raise ValueError(f"unknown divergence {kind!r}; choose js, kl or tv")
    log_p = p.log() if log_p is None else log_p
    log_q = q.log() if log_q is None else log_q
    if kind == "kl":
        terms = q * (log_q - log_p)
        zero = torch.isneginf(log_q)  # q = 0: the term is 0 whatever p is
    else:
        log_m = torch.logaddexp(log_p, log_q) - LN2  # log((p+q)/2), exact in the log domain
        terms = log_m.exp() * (log_m - 0.5 * (log_p + log_q))
        zero = torch.isneginf(log_m)  # p = q = 0
    return torch.where(zero, torch.zeros_like(terms), terms).sum(-1).clamp_min(0)


def support_divergence(p: torch.Tensor, q: torch.Tensor, kind: str = "js", support: str = "subset",
                       log_p: torch.Tensor | None = None, log_q: torch.Tensor | None = None) -> torch.Tensor:
    """Div(p, q) per row [n] when the proposer q may be 0 on part of the vocabulary (a reduced head).

    CHOICE `support`:
    - "full": `divergence` over the whole vocabulary. js is then +inf wherever q = 0 < p, so a
      reduced-head proposer never passes a fuzzy test (only the SD fallback accepts); kl and tv stay finite.
    - "subset": over the proposer's support S = {q > 0}, the verifier renormalised on it
      (p_S = p·1_S / p(S)), plus what that restriction costs: Div(p_S, q) − log p(S) for js and kl, and
      tv(p_S, q) + (1 − p(S)) for tv. The verifier's mass outside S is thus charged, never ignored: a
      verifier sure of a token the proposer cannot write gives a large divergence (p(S) = 0: +inf; tv 1).
      For kl this is exactly KL(q‖p); for tv it bounds the full tv from above (triangle inequality).
    A row where q has no zeros gets `divergence` itself under either choice (S is the vocabulary).
    """
    if support not in ("subset", "full"):
        raise ValueError(f"unknown support {support!r}; choose subset or full")
    log_p = p.log() if log_p is None else log_p
    log_q = q.log() if log_q is None else log_q
    out = torch.isneginf(log_q)  # [n, V]: outside the proposer's support
    has_zeros = out.any(-1)  # [n]
    if support == "full" or not bool(has_zeros.any()):
        return divergence(p, q, kind, log_p, log_q)
    cols = None
    if bool(has_zeros.all()) and bool((out == out[:1]).all()):  # one support for every row (a reduced head):
        cols = (~out[0]).nonzero().squeeze(-1)  # [|S|]           work on its columns only
        lp_in, q_s, log_q_s = log_p[:, cols], q[:, cols], log_q[:, cols]  # [n, |S|]
    else:
        lp_in, q_s, log_q_s = log_p.masked_fill(out, float("-inf")), q, log_q
    log_mass = torch.logsumexp(lp_in, -1, keepdim=True)  # [n, 1]: log p(S)
    lp_s = torch.where(torch.isneginf(log_mass), lp_in, lp_in - log_mass)  # log p_S
    sub = _on_support(lp_s, log_mass, q_s, log_q_s, kind)
    if cols is not None:
        return sub
    return torch.where(has_zeros, sub, divergence(p, q, kind, log_p, log_q))


def _on_support(lp_s: torch.Tensor, log_mass: torch.Tensor, q_s: torch.Tensor, log_q_s: torch.Tensor,
                kind: str) -> torch.Tensor:
    """The "subset" divergence [n] from the verifier renormalised on S (log p_S [n, |S|]), its log mass there
    (log p(S) [n, 1]) and the proposer on S: Div(p_S, q) − log p(S), tv: + 1 − p(S); worst where p(S) = 0."""
    none = torch.isneginf(log_mass).squeeze(-1)  # the verifier rules out every token the proposer can write
    inside = divergence(lp_s.exp(), q_s, kind, lp_s, log_q_s)
    mass = log_mass.squeeze(-1)
    cost = -torch.expm1(mass) if kind == "tv" else -mass  # 1 − p(S), or −log p(S)
    worst = torch.ones_like(inside) if kind == "tv" else torch.full_like(inside, float("inf"))  # p(S) = 0
    return torch.where(none, worst, inside + cost.clamp_min(0))  # (tv of disjoint supports is 1)


def shared_support(z_q: torch.Tensor) -> torch.Tensor | None:
    """The columns [|S|] where every row of the proposer's logits z_q [n, V] is finite, when the rows share one
    support with zeros (a reduced head: −inf outside S); None otherwise (a full head, or differing supports)."""
    if not bool(torch.isneginf(z_q[0]).any()):
        return None
    out = torch.isneginf(z_q)  # [n, V]
    if not bool((out == out[:1]).all()):
        return None
    return (~out[0]).nonzero().squeeze(-1)


def support_divergence_logits(z_p: torch.Tensor, z_q: torch.Tensor, kind: str = "js",
                              support: str = "subset") -> torch.Tensor:
    """`support_divergence` of the raw distributions softmax(z_p), softmax(z_q) [n, V], from their logits.

    Why: for a reduced-head proposer (one support S) under "subset" the verifier is needed only on S and
    through its normaliser: log p_S = z_p,S − logsumexp(z_p,S) and log p(S) = logsumexp(z_p,S) −
    logsumexp(z_p). One full-vocabulary reduction per row replaces a full log-softmax and its exp (the
    fuzzy lanes' largest cost outside the forwards). Other proposers take `support_divergence` itself."""
    cols = shared_support(z_q) if support == "subset" else None
    if cols is None:
        lp, lq = torch.log_softmax(z_p, -1), torch.log_softmax(z_q, -1)  # [n, V]
        return support_divergence(lp.exp(), lq.exp(), kind, support, lp, lq)
    if kind not in ("kl", "js", "tv"):
        raise ValueError(f"unknown divergence {kind!r}; choose js, kl or tv")
    zp_s, zq_s = z_p[:, cols], z_q[:, cols]  # [n, |S|]
    lse_s = torch.logsumexp(zp_s, -1, keepdim=True)  # [n, 1]
    log_mass = lse_s - torch.logsumexp(z_p, -1, keepdim=True)  # [n, 1]: log p(S)
    lp_s = torch.where(torch.isneginf(lse_s), zp_s, zp_s - lse_s)  # log p_S [n, |S|]
    log_q_s = torch.log_softmax(zq_s, -1)  # [n, |S|]: the proposer's whole distribution lives on S
    return _on_support(lp_s, log_mass, log_q_s.exp(), log_q_s, kind)


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


def fuzzy_passes(d: torch.Tensor | Sequence[float], tau: float) -> list[bool]:
    """FSD test: Div(P_T,i, P_D,i) ≤ τ, whatever the token.

    CHOICE: τ = 0 accepts nothing, so the verifier produces every token itself (target-only
    decoding). "Div ≤ 0" would otherwise accept a near-tie whose divergence rounds to 0 although
    the token is not the verifier's own choice.
    """
    return [tau > 0 and float(v) <= tau for v in d]


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

"""The decoding loops: AR, SD, FSD and the two-stage pyramid (PSD_A, PSD_F).

`decode` is one generator with explicit state (the committed sequence `seq` and three
cached models); each target pass yields one `Step` record. Randomness comes from a single
`torch.Generator` seeded per run (None at temperature 0, i.e. greedy everywhere).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Iterator

import torch

from . import rules
from .config import DecodeConfig
from .lm import LM
from .methods import method_spec, target_rule
from .trace import StageRound, Step, TokenRec


class _Clock:
    """Engine time: wall time while the generator runs, not while its consumer renders."""

    def __init__(self) -> None:
        self.t0, self.paused, self.pause_at = time.perf_counter(), 0.0, 0.0

    def now(self) -> float:
        return time.perf_counter() - self.t0 - self.paused

    def pause(self) -> None:
        self.pause_at = time.perf_counter()

    def resume(self) -> None:
        self.paused += time.perf_counter() - self.pause_at


class NonFiniteLogits(ValueError):
    """A model returned NaN or +inf logits (or a row with no finite logit): it is broken."""


def _logits(lm: LM, seq: list[int], keep: int) -> torch.Tensor:
    """lm.logits, checked once per forward: the row maxima catch NaN, +inf and all-−inf rows
    (−inf alone is a token ruled out, i.e. probability 0, and is allowed)."""
    z = lm.logits(seq, keep)
    if not bool(torch.isfinite(z.amax(-1)).all()):
        raise NonFiniteLogits(f"the {lm.role} model returned NaN or infinite logits")
    return z


def roles_for(method: str) -> tuple[str, ...]:
    """The models a method runs (its row in `methods.TABLE`)."""
    return method_spec(method).roles


def propose(lm: LM, seq: list[int], n: int, cfg: DecodeConfig,
            gen: torch.Generator | None) -> tuple[list[int], torch.Tensor]:
    """The proposer drafts up to n tokens one at a time: ids and their logits [n, V].
    n may be 0 (the last token of the budget): a target pass that proposes nothing.

    With cfg.conf_stop > 0 it stops after a token drafted at a confidence (its largest raw
    probability) below that floor, like HF assisted generation's confidence threshold."""
    x: list[int] = []
    rows = []
    for _ in range(n):
        z = _logits(lm, seq + x, 1)  # [1, V]
        rows.append(z[0])
        x.append(_pick(z, cfg, gen))
        if cfg.conf_stop and float(rules.confidence(z)[0]) < cfg.conf_stop:
            break
    return x, torch.stack(rows) if rows else torch.zeros(0, 0)


def _pick(z: torch.Tensor, cfg: DecodeConfig, gen: torch.Generator | None) -> int:
    """Greedy argmax, or a sample from the warped distribution of logits z [1, V]."""
    if gen is None:
        return int(z[0].argmax())
    return rules.sample(rules.warp(z, cfg.temperature, cfg.top_k, cfg.top_p)[0], gen)


def verify(z_p: torch.Tensor, z_q: torch.Tensor, x: list[int], rule: str, tau: float | None,
           cfg: DecodeConfig, gen: torch.Generator | None, stage: str, proposer: str,
           verifier: str) -> tuple[StageRound, int]:
    """Test proposed tokens x [n] against the verifier's logits z_p [n+1, V].

    z_q [n, V] are the proposer's logits at the same positions. Returns the round record
    and the verifier's own next token (the last record in `round.tokens`).
    """
    n = len(x)
    z_q = z_q if n else z_p[:0]  # nothing proposed (the budget's last token): the verifier's own only
    lp, lq = torch.log_softmax(z_p, -1), torch.log_softmax(z_q, -1)
    p_raw, q_raw = lp.exp(), lq.exp()  # raw distributions: divergences and top-5 only
    d = rules.support_divergence(p_raw[:n], q_raw, cfg.divergence, cfg.div_support, lp[:n], lq)  # [n]
    if gen is None:  # greedy: the warped distributions are one-hot argmaxes
        top = z_p.argmax(-1).tolist()
        p_x = [float(top[i] == t) for i, t in enumerate(x)]
        q_x = [float(a == t) for a, t in zip(z_q.argmax(-1).tolist(), x)]
        sd = rules.sd_passes(z_p[:n], z_q, x, None) if rule == "sd" or cfg.fallback == "sd" else []
    else:
        p_w = rules.warp(z_p, cfg.temperature, cfg.top_k, cfg.top_p)  # [n+1, V]
        q_w = rules.warp(z_q, cfg.temperature, cfg.top_k, cfg.top_p)  # [n, V]
        p_x = [float(p_w[i, t]) for i, t in enumerate(x)]
        q_x = [float(q_w[i, t]) for i, t in enumerate(x)]
        r = torch.rand(n, generator=gen)
        sd = rules.sd_passes(p_w[:n], q_w, x, r)
    if rule == "sd":
        passes = sd
    else:
        passes = rules.fuzzy_passes(d, tau)
        if cfg.fallback == "sd":
            passes = [a or b for a, b in zip(passes, sd)]
    k = rules.leading_run(passes)
    if gen is None:
        nxt, p_nxt = top[k], 1.0
    else:
        q_next = q_w[k] if rule == "sd" and k < n else None  # residual only under the SD rule
        nxt = rules.next_token(p_w[k], q_next, gen)
        p_nxt = float(p_w[k, nxt])
    top_p, top_q, d = rules.topk_pairs(p_raw), rules.topk_pairs(q_raw), d.tolist()
    recs = [TokenRec(t, proposer, "accepted" if i < k else "rejected" if i == k else "discarded",
                     div=round(d[i], 6), tau=tau if rule != "sd" else None,
                     p=round(p_x[i], 6), q=round(q_x[i], 6),
                     top5={verifier: top_p[i], proposer: top_q[i]}) for i, t in enumerate(x)]
    recs.append(TokenRec(nxt, verifier, "resampled" if k < n else "bonus",
                         p=round(p_nxt, 6), top5={verifier: top_p[k]}))
    shown = rule if rule == "sd" or cfg.fallback == "none" else "fuzzy+sd"
    if gen is None and rule == "sd":
        shown = "greedy"
    return StageRound(stage, proposer, verifier, shown, recs, k), nxt


def _own_origin(status: str) -> str:
    return "bonus" if status == "bonus" else "target"


def _cut_at_eos(rnd: StageRound, new: list[int], eos_ids: tuple[int, ...]) -> int | None:
    """Index of the first EOS in a round's new tokens `new` (its accepted run, then its own token).

    When the EOS is a drafted token inside the accepted run, the round is cut after it: the drafted
    tokens behind it and the verifier's own token were never used, so no statistic counts them
    (the own token's record stays last, marked discarded)."""
    j = next((i for i, t in enumerate(new) if t in eos_ids), None)
    if j is not None and j < rnd.n_accepted:
        own = dataclasses.replace(rnd.tokens[-1], status="discarded")
        rnd.tokens, rnd.n_accepted = rnd.tokens[: j + 1] + [own], j + 1
    return j


def pyramid_block(lms: dict[str, LM], seq: list[int], size: int, cfg: DecodeConfig,
                  gen: torch.Generator | None, eos_ids: tuple[int, ...] = ()
                  ) -> tuple[list[int], list[str], torch.Tensor, list[StageRound]]:
    """Stage 1: draft → qualifier rounds until `size` tokens are qualified (CHOICE: cut to size).
    The block also ends at an EOS: nothing after it could be used.

    Returns the block, each token's origin, the qualifier's logits at every block position
    [size, V] (they replace the draft's in stage 2), and the qualifier rounds. With
    cfg.conf_stop > 0 the block also ends after a token the qualifier is less sure of.
    """
    block: list[int] = []
    origins: list[str] = []
    z_q_rows: list[torch.Tensor] = []
    rounds: list[StageRound] = []
    rule = method_spec(cfg.method).stage1
    while len(block) < size:
        n = min(cfg.l_d, size - len(block))
        x, z_d = propose(lms["draft"], seq + block, n, cfg, gen)
        z_q = _logits(lms["qualifier"], seq + block + x, len(x) + 1)  # [len(x)+1, V]
        rnd, nxt = verify(z_q, z_d, x, rule, cfg.tau_q if rule == "fuzzy" else None, cfg, gen,
                          "qualifier", "draft", "qualifier")
        eos_at = _cut_at_eos(rnd, x[: rnd.n_accepted] + [nxt], eos_ids)
        k = rnd.n_accepted
        keep, low = (k + 1 if eos_at is None else eos_at + 1), False
        if cfg.conf_stop:  # the qualifier's confidence at the new block tokens [keep]
            conf = rules.confidence(z_q[:keep]).tolist()
            keep = rules.confident_prefix(conf, cfg.conf_stop)
            low = conf[keep - 1] < cfg.conf_stop
        block += (x[:k] + [nxt])[:keep]
        origins += (["draft"] * k + ["qualifier"])[:keep]
        z_q_rows.extend(z_q[:keep])
        rounds.append(rnd)
        lms["draft"].rollback(seq + block)
        lms["qualifier"].rollback(seq + block)
        if low or eos_at is not None:
            break
    z_q_block = torch.stack(z_q_rows[:size]) if z_q_rows else torch.zeros(0, 0)
    return block[:size], origins[:size], z_q_block, rounds


def target_only(lm: LM, seq: list[int], cfg: DecodeConfig, gen: torch.Generator | None) -> int:
    return _pick(_logits(lm, seq, 1), cfg, gen)


def prefill(lms: dict[str, LM], prompt_ids: list[int]) -> float:
    """Feed all but the last prompt token to every model; returns the seconds it took."""
    t0 = time.perf_counter()
    if len(prompt_ids) > 1:
        for lm in lms.values():
            lm.logits(prompt_ids[:-1], 1)
    return time.perf_counter() - t0


def decode(lms: dict[str, LM], prompt_ids: list[int], cfg: DecodeConfig, eos_ids: tuple[int, ...],
           gen: torch.Generator | None) -> Iterator[Step]:
    """Generate after a prefilled prompt, one `Step` per target pass, until EOS or the budget.

    A model that returns NaN or +inf logits stops the run with NonFiniteLogits naming the model's
    role and the target pass."""
    n_pass = n_new = 0
    try:
        for step in _decode(lms, prompt_ids, cfg, eos_ids, gen):
            n_pass, n_new = n_pass + 1, n_new + len(step.new_tokens)
            yield step
    except NonFiniteLogits as e:
        raise NonFiniteLogits(f"{e} at target pass {n_pass + 1} (after {n_new} new tokens): the model is "
                              f"broken, or overflows in its dtype (try float32)") from None


def _decode(lms: dict[str, LM], prompt_ids: list[int], cfg: DecodeConfig, eos_ids: tuple[int, ...],
            gen: torch.Generator | None) -> Iterator[Step]:
    seq, n0, clock = list(prompt_ids), len(prompt_ids), _Clock()
    spec = method_spec(cfg.method)
    for i in range(cfg.max_new_tokens):
        room = cfg.max_new_tokens - (len(seq) - n0)
        if room <= 0:
            return
        t0 = clock.now()
        times0 = {r: lm.time_s for r, lm in lms.items()}
        calls0 = {r: lm.n_forward for r, lm in lms.items()}
        fed0 = {r: len(lm.fed) for r, lm in lms.items()}
        qrounds: list[StageRound] = []
        tround = None
        if spec.proposer is None:
            new, origins = [target_only(lms["target"], seq, cfg, gen)], ["target"]
        else:
            prop, size = spec.proposer, min(getattr(cfg, spec.lengths[-1]), room - 1)
            rule = target_rule(cfg.method, cfg.stage2)
            tau = cfg.tau_t if rule == "fuzzy" else None
            if spec.pyramid:
                x, from_q, z_q, qrounds = pyramid_block(lms, seq, size, cfg, gen, eos_ids)
            else:
                x, z_q = propose(lms[prop], seq, size, cfg, gen)
                from_q = [prop] * len(x)
            z_p = _logits(lms["target"], seq + x, len(x) + 1)  # [n+1, V]: one target pass
            tround, nxt = verify(z_p, z_q, x, rule, tau, cfg, gen, "target", prop, "target")
            k = tround.n_accepted
            new = x[:k] + [nxt]
            origins = from_q[:k] + [_own_origin(tround.tokens[-1].status) if x else "target"]
            _cut_at_eos(tround, new, eos_ids)
        eos_at = next((j for j, t in enumerate(new) if t in eos_ids), None)
        if eos_at is not None:
            new, origins = new[: eos_at + 1], origins[: eos_at + 1]
        seq.extend(new)
        for lm in lms.values():
            lm.rollback(seq)
        step = Step(i, qrounds, tround, new, origins, t0, clock.now(),
                    {r: round(lm.time_s - times0[r], 6) for r, lm in lms.items()},
                    {r: lm.n_forward - calls0[r] for r, lm in lms.items()},
                    {r: lm.fed[fed0[r]:] for r, lm in lms.items()})
        clock.pause()
        yield step
        clock.resume()
        if eos_at is not None:
            return

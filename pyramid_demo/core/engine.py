"""The decoding loop: AR, and every speculative method as the stages of its row in `methods.TABLE`, each round one
code path whatever the proposal's shape. Each target pass yields one `Step`, recorded off the engine clock."""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from ..forward.lm import LM
from . import rules
from .methods import DecodeConfig, Stage, method_spec, stage_rule
from .round import (
    NonFiniteLogits,
    Round,
    confidence,
    confident_prefix,
    decide_round,
    feed,
    pick,
    propose,
    record,
    score,
)
from .trace import Step


def decode(
    lms: dict[str, LM],
    prompt_ids: list[int],
    cfg: DecodeConfig,
    eos_ids: tuple[int, ...],
    gen: torch.Generator | None,
    full_records: bool = True,
    defer: bool = False,
) -> Iterator[Step]:
    """One `Step` per target pass after a prefilled prompt, until EOS or the budget. `full_records=False` keeps
    statuses only; `defer` builds the full records once the decode ends (between passes they would slow it)."""
    stages = method_spec(cfg.method).stages  # the one look-up: the loop below runs them
    if any(st.shaped for st in stages) and cfg.shape not in ("chain", "tree"):
        raise ValueError(f"shape {cfg.shape!r} must be settled to 'chain' or 'tree' before decoding (run.shape_to_run)")
    seq, n0, clock = list(prompt_ids), len(prompt_ids), _Clock()
    later: list[tuple[Step, list[Round], Round | None]] = []  # steps whose full records are built at the end
    try:
        yield from _steps(
            lms,
            seq,
            n0,
            stages,
            cfg,
            eos_ids,
            gen,
            clock,
            full_records and not defer,
            later if full_records and defer else None,
        )
    finally:
        for step, qrounds, tround in later:
            step.qualifier_rounds = [record(r, cfg) for r in qrounds]
            step.target_round = record(tround, cfg) if tround is not None else None


def _steps(
    lms: dict[str, LM],
    seq: list[int],
    n0: int,
    stages: tuple[Stage, ...],
    cfg: DecodeConfig,
    eos_ids: tuple[int, ...],
    gen: torch.Generator | None,
    clock: _Clock,
    full: bool,
    later: list[tuple[Step, list[Round], Round | None]] | None,
) -> Iterator[Step]:
    """`decode`'s loop: one target pass a step (records `full` now, or its rounds kept in `later` for them)."""
    for i in range(cfg.max_new_tokens):
        room = cfg.max_new_tokens - (len(seq) - n0)
        if room <= 0:
            return
        t0 = clock.now()
        times0 = {r: lm.time_s for r, lm in lms.items()}
        calls0 = {r: lm.n_forward for r, lm in lms.items()}
        fed0 = {r: len(lm.fed) for r, lm in lms.items()}
        qrounds: list[Round] = []
        tround = None
        try:
            if not stages:  # AR: the target alone
                new, origins = [pick(feed(lms["target"], seq, 1), cfg, gen)], ["target"]
            else:
                qrounds, tround, from_q = _target_round(lms, seq, stages, room - 1, cfg, gen, eos_ids)
                new, origins = tround.new_tokens(), from_q + [tround.own_origin]
        except NonFiniteLogits as e:
            raise NonFiniteLogits(
                f"{e} at target pass {i + 1} (after {len(seq) - n0} new tokens): the model is "
                f"broken, or overflows in its dtype (try float32)"
            ) from None
        eos_at = first_eos(new, eos_ids)
        if eos_at is not None:
            new, origins = new[: eos_at + 1], origins[: eos_at + 1]
            if tround is not None:
                tround = tround.cut(eos_at + 1, eos=True)  # an EOS inside the accepted path: the round ends there
        seq.extend(new)
        for lm in lms.values():
            lm.truncate(len(seq) - 1)  # the committed tokens less the last, which is fed next
        t_end = clock.now()
        clock.pause()  # the records explain the step; the race does not time them
        step = Step(
            i,
            [record(r, cfg, full) for r in qrounds],
            record(tround, cfg, full) if tround is not None else None,
            new,
            origins,
            t0,
            t_end,
            {r: round(lm.time_s - times0[r], 6) for r, lm in lms.items()},
            {r: lm.n_forward - calls0[r] for r, lm in lms.items()},
            {r: lm.fed[fed0[r] :] for r, lm in lms.items()},
        )
        if later is not None:
            later.append((step, qrounds, tround))
        yield step
        clock.resume()
        if eos_at is not None:
            return


def _target_round(
    lms: dict[str, LM],
    seq: list[int],
    stages: tuple[Stage, ...],
    room: int,
    cfg: DecodeConfig,
    gen: torch.Generator | None,
    eos_ids: tuple[int, ...],
) -> tuple[list[Round], Round, list[str]]:
    """A pyramid's stage-1 block (if any), then the target's round: qualifier rounds, target round, token origins."""
    st = stages[-1]
    if len(stages) > 1:
        x, from_q, z_q, qrounds = pyramid_block(
            lms, seq, stages[0], min(getattr(cfg, st.length), room), cfg, gen, eos_ids
        )
        assert z_q.shape[0] == len(x), f"stage 2 misaligned: {z_q.shape[0]} qualifier rows for a block of {len(x)}"
        tree = rules.chain(x, z_q)  # the qualified block goes on as a chain
    else:
        qrounds = []
        tree = propose(lms[st.proposer], seq, room, getattr(cfg, st.length), cfg, gen)
        from_q = [st.proposer] * tree.n
    rnd = stage_round(lms, seq, st, tree, cfg, gen)
    return qrounds, rnd, [from_q[i] for i in rnd.dec.path]


def pyramid_block(
    lms: dict[str, LM],
    seq: list[int],
    st: Stage,
    size: int,
    cfg: DecodeConfig,
    gen: torch.Generator | None,
    eos_ids: tuple[int, ...] = (),
) -> tuple[list[int], list[str], torch.Tensor, list[Round]]:
    """Stage 1: draft → qualifier rounds until `size` tokens (CHOICE: cut to size), an EOS or an unsure qualifier
    token. Returns the block, its origins, the qualifier's logits there [len(block), V] and the rounds."""
    block: list[int] = []
    origins: list[str] = []
    z_q_rows: list[torch.Tensor] = []
    rounds: list[Round] = []
    while len(block) < size:
        here = seq + block
        tree = propose(lms[st.proposer], here, size - len(block), getattr(cfg, st.length), cfg, gen)
        rnd = stage_round(lms, here, st, tree, cfg, gen)
        z_q = rnd.z_p[[0] + [i + 1 for i in rnd.dec.path]]  # [k+1, V]: the qualifier at the new tokens' contexts
        new = rnd.new_tokens()  # [k+1]: the accepted path, then the qualifier's own token
        eos_at = first_eos(new, eos_ids)
        keep = min(len(new), size - len(block), len(new) if eos_at is None else eos_at + 1)  # CHOICE: cut to size
        low = False
        if cfg.conf_stop:  # the qualifier's confidence at the new block tokens [keep]
            conf = confidence(z_q[:keep]).tolist()
            keep = confident_prefix(conf, cfg.conf_stop)
            low = conf[keep - 1] < cfg.conf_stop
        ends_at_eos = eos_at is not None and keep == eos_at + 1
        rnd = rnd.cut(keep, eos=ends_at_eos)  # the record says what entered the block, nothing more
        block += new[:keep]
        origins += ([st.proposer] * rnd.k + [rnd.own_origin])[:keep]
        z_q_rows.extend(z_q[:keep])
        rounds.append(rnd)
        for role in (st.proposer, st.verifier):
            lms[role].truncate(len(seq) + len(block) - 1)  # the block less its last token, fed next
        if low or ends_at_eos:
            break
    z_q_block = torch.stack(z_q_rows) if z_q_rows else torch.zeros(0, 0)  # [len(block), V]
    return block, origins, z_q_block, rounds


def stage_round(
    lms: dict[str, LM], seq: list[int], st: Stage, tree: rules.Tree, cfg: DecodeConfig, gen: torch.Generator | None
) -> Round:
    """One verification of `st`, for every shape and stage: one scoring pass, the rule, the accepted path kept."""
    rule = stage_rule(st, cfg.stage2)
    tau = getattr(cfg, st.tau) if rule == "fuzzy" and st.tau else None
    z_p = score(lms[st.verifier], seq, tree)  # [N + 1, V]
    rnd = decide_round(z_p, tree, rule, tau, cfg, gen, st.proposer, st.verifier)
    for role in (st.proposer, st.verifier):
        lms[role].keep_along(seq + rnd.accepted)
    return rnd


def first_eos(tokens: list[int], eos_ids: tuple[int, ...]) -> int | None:
    """Index of the first EOS in `tokens` (None without one): the one place a step looks for it."""
    return next((i for i, t in enumerate(tokens) if t in eos_ids), None)


class _Clock:
    """Engine time: wall time while the generator decides, not while its records are built or consumed."""

    def __init__(self) -> None:
        self.t0, self.paused, self.pause_at = time.perf_counter(), 0.0, 0.0

    def now(self) -> float:
        return time.perf_counter() - self.t0 - self.paused

    def pause(self) -> None:
        self.pause_at = time.perf_counter()

    def resume(self) -> None:
        self.paused += time.perf_counter() - self.pause_at


def prefill(lms: dict[str, LM], prompt_ids: list[int], share: bool = False) -> float:
    """Feed all but the last prompt token to every model, the draft last (it may read its verifier's states); returns
    the seconds. CHOICE `share`: the qualifier takes the target's prompt keys and values (one prefill, not two)."""
    connect(lms)
    t0 = time.perf_counter()
    if len(prompt_ids) > 1:
        roles = sorted(lms, key=lambda r: r == "draft")
        if share:
            if not shares_prompt(lms):
                raise ValueError("the qualifier cannot take the target's prompt cache (`shares_prompt`)")
            q, t = lms["qualifier"], lms["target"]
            q.publish, t.publish = None, q.publish  # the draft reads the target's states for the prompt
            t.feed(prompt_ids[:-1], 1)
            q.publish, t.publish = t.publish, None
            q.adopt(t)  # type: ignore[attr-defined]
            roles.remove("qualifier")
            roles.remove("target")
        for role in roles:
            lms[role].feed(prompt_ids[:-1], 1)
    return time.perf_counter() - t0


def shares_prompt(lms: dict[str, LM]) -> bool:
    """Whether the qualifier can take the target's prompt cache: a core forward of the same shapes."""
    q, t = lms.get("qualifier"), lms.get("target")
    return q is not None and t is not None and hasattr(q, "same_cache") and q.same_cache(t)


def connect(lms: dict[str, LM]) -> None:
    """Have a proposer's verifier (the qualifier in a pyramid, else the target) publish its states where the proposer
    reads them (a feature draft's `states`); nothing extra is computed when no model reads them."""
    states = getattr(lms.get("draft"), "states", None)
    source = lms.get("qualifier", lms.get("target"))
    if states is not None and source is not None:
        source.publish = states


def roles_for(method: str) -> tuple[str, ...]:
    """The models a method runs (its row in `methods.TABLE`)."""
    return method_spec(method).roles

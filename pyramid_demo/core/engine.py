"""The decoding loops: AR, SD, FSD and the two-stage pyramid (PSD_A, PSD_F).

`decode` is one generator with explicit state: the committed sequence `seq` and one `Lane` per model
(its model and the position its cache ends at, passed into every forward). Each target pass yields one
`Step`. The timed path only decides (`rules_apply.decide`: the greedy or ratio test, a divergence only
for a fuzzy rule); the per-token records that explain a step (top-5 lists, display divergences, p and q)
are built from the logits already computed, after the engine clock has stopped (`recorder.record`).
Randomness comes from one `torch.Generator` per run (None at temperature 0: greedy everywhere).
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from . import rules, tree_round
from .cache import CacheError, TargetStates
from .config import DecodeConfig
from .decide import Round, decide, tree_round_record
from .lm import LM
from .methods import method_spec, target_rule
from .recorder import record
from .trace import StageRound, Step


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


class NonFiniteLogits(ValueError):
    """A model returned NaN or +inf logits (or a row with no finite logit): it is broken."""


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
        """Feed seq[pos:] at `pos`; logits of the last `keep` positions [keep, V], checked once: the row maxima
        catch NaN, +inf and all-−inf rows (−inf alone is a token ruled out, probability 0, and is allowed)."""
        start = self.pos - len(self.last)
        if seq[start: self.pos] != self.last:
            raise CacheError(f"{self.lm.role}: its cache holds tokens at {start}…{self.pos - 1} that the sequence "
                             "no longer has there (a cut was missed)")
        new = seq[self.pos:]
        z = self.lm.forward(new, self.pos, keep)
        self.pos, self.last = self.pos + len(new), new
        if not bool(torch.isfinite(z.amax(-1)).all()):
            raise NonFiniteLogits(f"the {self.lm.role} model returned NaN or infinite logits")
        return z

    def kept(self, fed: list[int], pos: int, after_last: bool = False) -> None:
        """After a tree forward: the tokens it kept, `fed`, now end the cache at `pos` (`after_last`: they follow
        the lane's last feed, as a proposer's kept path follows its catch-up)."""
        self.pos, self.last = pos, (self.last + fed) if after_last else list(fed)

    def cut(self, committed: int) -> None:
        """After a round: keep at most the committed tokens less the last (fed next); the cache may keep less."""
        end = self.pos
        self.pos = self.lm.truncate(min(self.pos, committed - 1))
        self.last = self.last[: max(0, len(self.last) - (end - self.pos))]


def roles_for(method: str) -> tuple[str, ...]:
    """The models a method runs (its row in `methods.TABLE`)."""
    return method_spec(method).roles


def connect(lms: dict[str, LM]) -> None:
    """Give every proposer that reads the target (a `states` attribute) the target's states, which the
    target's forward then hands out. Nothing when no model reads them (the target computes nothing extra)."""
    readers = [lm for r, lm in lms.items() if r != "target" and hasattr(lm, "states")]
    if not readers or "target" not in lms:
        return
    states = TargetStates()
    lms["target"].publish = states
    for lm in readers:
        lm.states = states


def _pick(z: torch.Tensor, cfg: DecodeConfig, gen: torch.Generator | None) -> int:
    """Greedy argmax, or a sample from the warped distribution of logits z [1, V]."""
    if gen is None:
        return int(z[0].argmax())
    return rules.sample(rules.warp(z, cfg.temperature, cfg.top_k, cfg.top_p)[0], gen)


def propose(lane: Lane | LM, seq: list[int], n: int, cfg: DecodeConfig,
            gen: torch.Generator | None) -> tuple[list[int], torch.Tensor]:
    """The proposer drafts up to n tokens one at a time: ids and their logits [n, V].
    n may be 0 (the last token of the budget): a target pass that proposes nothing.

    With cfg.conf_stop > 0 it stops after a token drafted at a confidence (its largest raw
    probability) below that floor, like HF assisted generation's confidence threshold."""
    if not isinstance(lane, Lane):  # a bare model (tests): its cache must end where seq's prefix does
        lane = Lane(lane, lane.cache_len)
    x: list[int] = []
    rows = []
    for _ in range(n):
        z = lane.feed(seq + x, 1)  # [1, V]
        rows.append(z[0])
        x.append(_pick(z, cfg, gen))
        if cfg.conf_stop and float(rules.confidence(z)[0]) < cfg.conf_stop:
            break
    return x, torch.stack(rows) if rows else torch.zeros(0, 0)


def verify(z_p: torch.Tensor, z_q: torch.Tensor, x: list[int], rule: str, tau: float | None,
           cfg: DecodeConfig, gen: torch.Generator | None, stage: str, proposer: str,
           verifier: str) -> tuple[StageRound, int]:
    """Decide and record one round at once (tests and tools): the round record and the verifier's token."""
    rnd = decide(z_p, z_q, x, rule, tau, cfg, gen, stage, proposer, verifier)
    return record(rnd, cfg), rnd.nxt


def pyramid_block(lanes: dict[str, Lane], seq: list[int], size: int, cfg: DecodeConfig,
                  gen: torch.Generator | None, eos_ids: tuple[int, ...] = ()
                  ) -> tuple[list[int], list[str], torch.Tensor, list[Round]]:
    """Stage 1: draft → qualifier rounds until `size` tokens are qualified (CHOICE: cut to size).
    The block also ends at an EOS: nothing after it could be used.

    Returns the block (at most `size` tokens), each token's origin, the qualifier's logits at every block
    position [len(block), V] (they replace the draft's in stage 2), and the qualifier rounds, each recording
    exactly the tokens it put in the block. With cfg.conf_stop > 0 the block also ends after a token the
    qualifier is less sure of.
    """
    block: list[int] = []
    origins: list[str] = []
    z_q_rows: list[torch.Tensor] = []
    rounds: list[Round] = []
    rule = method_spec(cfg.method).stage1
    assert rule is not None
    tree = cfg.shape == "tree"
    while len(block) < size:
        n = min(cfg.l_d, size - len(block))
        tau = cfg.tau_q if rule == "fuzzy" else None
        if tree:  # the draft's tree, verified by the qualifier in one pass; z_q: its rows along the path
            grown = tree_round.grow(lanes["draft"], seq + block, cfg.tree_nodes, min(cfg.tree_depth, n), cfg.tree_k)
            dec, z_ctx = tree_round.verify(lanes["qualifier"], seq + block, grown.tree, rule, tau, cfg, gen)
            tree_round.keep_fed(lanes["draft"], grown, dec.path)
            rnd = tree_round_record(dec, grown.tree, z_ctx, rule, tau, "qualifier", "draft", "qualifier",
                                    gen is not None)
            z_q = z_ctx[[0] + [i + 1 for i in dec.path]]  # [len(path)+1, V]: the block positions' contexts
        else:
            x, z_d = propose(lanes["draft"], seq + block, n, cfg, gen)
            z_q = lanes["qualifier"].feed(seq + block + x, len(x) + 1)  # [len(x)+1, V]
            rnd = decide(z_q, z_d, x, rule, tau, cfg, gen, "qualifier", "draft", "qualifier")
        new = rnd.new_tokens()  # [k+1]: the accepted run, then the qualifier's own token
        eos_at = first_eos(new, eos_ids)
        keep = min(len(new), size - len(block), len(new) if eos_at is None else eos_at + 1)  # CHOICE: cut to size
        low = False
        if cfg.conf_stop:  # the qualifier's confidence at the new block tokens [keep]
            conf = rules.confidence(z_q[:keep]).tolist()
            keep = rules.confident_prefix(conf, cfg.conf_stop)
            low = conf[keep - 1] < cfg.conf_stop
        ends_at_eos = eos_at is not None and keep == eos_at + 1
        rnd.keep(keep, eos=ends_at_eos)  # the record says what entered the block, nothing more
        block += new[:keep]
        origins += (["draft"] * rnd.k + ["qualifier"])[:keep]
        z_q_rows.extend(z_q[:keep])
        rounds.append(rnd)
        for role in ("draft", "qualifier"):
            lanes[role].cut(len(seq) + len(block))
        if low or ends_at_eos:
            break
    z_q_block = torch.stack(z_q_rows) if z_q_rows else torch.zeros(0, 0)  # [len(block), V]
    return block, origins, z_q_block, rounds


def first_eos(tokens: list[int], eos_ids: tuple[int, ...]) -> int | None:
    """Index of the first EOS in `tokens` (None without one): the one place a step looks for it."""
    return next((i for i, t in enumerate(tokens) if t in eos_ids), None)


def _tree_step(lanes: dict[str, Lane], seq: list[int], depth: int, cfg: DecodeConfig, gen: torch.Generator | None,
               rule: str, prop: str) -> Round:
    """SD/FSD over a tree: the proposer grows it, the target verifies it in one pass; each keeps the path."""
    grown = tree_round.grow(lanes[prop], seq, cfg.tree_nodes, depth, cfg.tree_k)
    tau = cfg.tau_t if rule == "fuzzy" else None
    dec, z_p = tree_round.verify(lanes["target"], seq, grown.tree, rule, tau, cfg, gen)
    tree_round.keep_fed(lanes[prop], grown, dec.path)
    return tree_round_record(dec, grown.tree, z_p, rule, tau, "target", prop, "target", gen is not None)


def prefill(lms: dict[str, LM], prompt_ids: list[int]) -> float:
    """Feed all but the last prompt token to every model (the target first: a proposer that reads it needs
    its states, linked here by `connect`); returns the seconds it took."""
    connect(lms)
    t0 = time.perf_counter()
    if len(prompt_ids) > 1:
        for role in sorted(lms, key=lambda r: r != "target"):
            lm = lms[role]
            lm.forward(prompt_ids[lm.cache_len: -1], lm.cache_len, 1)
    return time.perf_counter() - t0


def decode(lms: dict[str, LM], prompt_ids: list[int], cfg: DecodeConfig, eos_ids: tuple[int, ...],
           gen: torch.Generator | None, full_records: bool = True) -> Iterator[Step]:
    """Generate after a prefilled prompt, one `Step` per target pass, until EOS or the budget.

    `full_records=False` (bench) keeps each token's status only: no top-5 lists, divergences or p/q.
    A model that returns NaN or +inf logits stops the run with NonFiniteLogits naming the model's
    role and the target pass."""
    n_pass = n_new = 0
    try:
        for step in _decode(lms, prompt_ids, cfg, eos_ids, gen, full_records):
            n_pass, n_new = n_pass + 1, n_new + len(step.new_tokens)
            yield step
    except NonFiniteLogits as e:
        raise NonFiniteLogits(f"{e} at target pass {n_pass + 1} (after {n_new} new tokens): the model is "
                              f"broken, or overflows in its dtype (try float32)") from None


def _decode(lms: dict[str, LM], prompt_ids: list[int], cfg: DecodeConfig, eos_ids: tuple[int, ...],
            gen: torch.Generator | None, full_records: bool) -> Iterator[Step]:
    spec = method_spec(cfg.method)
    if spec.shaped and cfg.shape not in ("chain", "tree"):
        raise ValueError(f"shape {cfg.shape!r} must be resolved to 'chain' or 'tree' before decoding "
                         "(run.resolve_shape)")
    seq, n0, clock = list(prompt_ids), len(prompt_ids), _Clock()
    lanes = {r: Lane(lm, lm.cache_len) for r, lm in lms.items()}  # after the prefill
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
        if spec.proposer is None:
            new, origins = [_pick(lanes["target"].feed(seq, 1), cfg, gen)], ["target"]
        else:
            length = "tree_nodes" if cfg.shape == "tree" and not spec.pyramid else spec.lengths[-1]
            prop, size = spec.proposer, min(getattr(cfg, length), room - 1)
            rule = target_rule(cfg.method, cfg.stage2)
            assert rule is not None
            if spec.pyramid:
                x, from_q, z_q, qrounds = pyramid_block(lanes, seq, size, cfg, gen, eos_ids)
                assert z_q.shape[0] == len(x), \
                    f"stage 2 misaligned: {z_q.shape[0]} qualifier rows for a block of {len(x)} tokens"
            elif cfg.shape == "tree" and size > 0:
                tround = _tree_step(lanes, seq, min(cfg.tree_depth, size), cfg, gen, rule, prop)
            else:
                x, z_q = propose(lanes[prop], seq, size, cfg, gen)
                from_q = [prop] * len(x)
            if tround is None:
                z_p = lanes["target"].feed(seq + x, len(x) + 1)  # [n+1, V]: one target pass
                tround = decide(z_p, z_q, x, rule, cfg.tau_t if rule == "fuzzy" else None, cfg, gen,
                                "target", prop, "target")
            else:
                from_q = [prop] * tround.k
            new = tround.new_tokens()
            own = "bonus" if tround.x and tround.leaf else "target"  # an empty proposal: the target's own
            origins = from_q[: tround.k] + [own]
        eos_at = first_eos(new, eos_ids)
        if eos_at is not None:
            new, origins = new[: eos_at + 1], origins[: eos_at + 1]
            if tround is not None:
                tround.keep(eos_at + 1, eos=True)  # an EOS inside the accepted run: the round ends after it
        seq.extend(new)
        for lane in lanes.values():
            lane.cut(len(seq))
        t_end = clock.now()
        clock.pause()  # the records explain the step; the race does not time them
        step = Step(i, [record(r, cfg, full_records) for r in qrounds],
                    record(tround, cfg, full_records) if tround is not None else None, new, origins, t0, t_end,
                    {r: round(lm.time_s - times0[r], 6) for r, lm in lms.items()},
                    {r: lm.n_forward - calls0[r] for r, lm in lms.items()},
                    {r: lm.fed[fed0[r]:] for r, lm in lms.items()})
        yield step
        clock.resume()
        if eos_at is not None:
            return

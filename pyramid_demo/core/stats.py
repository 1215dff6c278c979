"""Statistics computed from step records alone (so charts and reports can recompute them)."""
from __future__ import annotations

from .trace import StageRound, Stats, Step

STAGES = ("qualifier", "target")


def stage_rounds(steps: list[Step], stage: str) -> list[StageRound]:
    if stage == "qualifier":
        return [r for s in steps for r in s.qualifier_rounds]
    return [s.target_round for s in steps if s.target_round is not None]


def n_proposed(r: StageRound) -> int:
    return len(r.tokens) - 1  # the last record is the verifier's own token


def per_position(rounds: list[StageRound]) -> list[float]:
    """P(position i accepted | the proposal reached position i)."""
    width = max((n_proposed(r) for r in rounds), default=0)
    out = []
    for i in range(width):
        reached = sum(1 for r in rounds if n_proposed(r) > i)
        out.append(round(sum(1 for r in rounds if r.n_accepted > i) / reached, 4) if reached else 0.0)
    return out


def agreement(out: list[int], ref: list[int]) -> float | None:
    """Agreement with target greedy output: the share of the reference `ref` (target-only greedy
    tokens) that `out` reproduces at the same positions. The one definition the app and the bench
    both report (None without a reference)."""
    if not ref:
        return None
    return sum(1 for a, b in zip(out, ref) if a == b) / len(ref)


def prefix_agreement(out: list[int], ref: list[int]) -> float | None:
    """Share of the reference reproduced before the first differing token."""
    if not ref:
        return None
    n = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
    return n / len(ref)


def compute_stats(method: str, steps: list[Step], prefill_s: float, stopped: str) -> Stats:
    n_new = sum(len(s.new_tokens) for s in steps)
    decode_s = steps[-1].t_end if steps else 0.0
    acceptance, proposed, accepted, positions, n_rounds = {}, {}, {}, {}, {}
    for stage in STAGES:
        rounds = stage_rounds(steps, stage)
        if not rounds:
            continue
        proposed[stage] = sum(n_proposed(r) for r in rounds)
        n_rounds[stage] = len(rounds)
        accepted[stage] = sum(r.n_accepted for r in rounds)
        acceptance[stage] = round(accepted[stage] / proposed[stage], 4) if proposed[stage] else 0.0
        positions[stage] = per_position(rounds)
    targets = stage_rounds(steps, "target")
    hist = [0] * (max((n_proposed(r) for r in targets), default=0) + 1)
    for r in targets:
        hist[r.n_accepted] += 1
    passes = len(steps)  # every step is exactly one target forward
    fwd: dict[str, int] = {}
    ftime: dict[str, float] = {}
    for s in steps:
        for role, n in s.n_forward.items():
            fwd[role] = fwd.get(role, 0) + n
            ftime[role] = ftime.get(role, 0.0) + s.time_s.get(role, 0.0)
    return Stats(
        method=method, n_new_tokens=n_new, prefill_s=round(prefill_s, 6), decode_s=round(decode_s, 6),
        tokens_per_s=round(n_new / decode_s, 3) if decode_s > 0 else 0.0,
        target_passes=passes, acceptance=acceptance, proposed=proposed, accepted=accepted,
        mean_accepted_per_target_pass=round(sum(r.n_accepted for r in targets) / passes, 4) if passes else 0.0,
        tokens_per_target_pass=round(n_new / passes, 4) if passes else 0.0,
        accepted_hist=hist if targets else [], per_position_acceptance=positions,
        forward_passes=fwd, forward_time_s={k: round(v, 6) for k, v in ftime.items()},
        engine_overhead_s=round(max(0.0, decode_s - sum(ftime.values())), 6), stopped=stopped,
        rounds=n_rounds,
    )

"""Pure functions over recorded rounds: what-if acceptance under another τ, per-position top-5,
race speeds and the race table. No model calls, so the inspector answers instantly."""
from __future__ import annotations

from ..core import noise
from ..core.rules import fuzzy_passes, leading_run
from ..core.stats import STAGES, agreement, stage_rounds
from ..core.trace import RunResult, StageRound, Step, TokenRec
from .session import Race


def reevaluate(rnd: StageRound, tau: float | None) -> int:
    """Drafted tokens the round would have accepted at threshold `tau`: the leading run of recorded Div ≤ τ,
    by the engine's own test (`rules.fuzzy_passes`), keyed by the round's data (`exact`, `sd_fallback`).

    Exact-rule rounds (SD, PSD_A's stage 1, stage-2 'sd') do not use τ: their recorded count stands.
    Under the SD fallback a token that was accepted although Div > its recorded τ passed the SD rule,
    which τ does not change, so it still passes. A round cut short (its own token discarded: a PSD block's
    size or confidence cut, an EOS) keeps at most what it kept: the cut does not depend on τ.
    """
    if rnd.exact or tau is None:
        return rnd.n_accepted
    if rnd.parents is not None:
        return _tree_whatif(rnd, tau)[0]
    recs = rnd.tokens[:-1]
    passes = fuzzy_passes([t.div if t.div is not None else float("inf") for t in recs], tau)
    if rnd.sd_fallback:
        passes = [ok or (t.status == "accepted" and t.tau is not None and (t.div or 0.0) > t.tau)
                  for ok, t in zip(passes, recs)]
    k = leading_run(passes)
    cut = bool(rnd.tokens) and rnd.tokens[-1].status == "discarded"
    return min(k, rnd.n_accepted) if cut else k


def _tree_whatif(rnd: StageRound, tau: float) -> tuple[int, list[str]]:
    """A fuzzy tree round under another τ, walked as the engine walks it (`core.tree.decide_tree`): a node's
    children share its divergence (recorded on each child); a passing node takes its top-ranked child; under the
    SD fallback a failing node still takes the child the SD rule took (the recorded accepted child whose Div was
    above its τ). Returns the accepted path's length and each node's status under τ."""
    recs = rnd.tokens[:-1]
    parents = rnd.parents or []
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    status = ["discarded"] * len(recs)
    c, k = -1, 0
    while kids.get(c):
        ch = kids[c]
        d = recs[ch[0]].div
        took = ch[0] if fuzzy_passes([d if d is not None else float("inf")], tau)[0] else None
        if took is None and rnd.sd_fallback:
            took = next((i for i in ch if recs[i].status == "accepted" and recs[i].tau is not None
                         and (recs[i].div or 0.0) > recs[i].tau), None)
        for i in ch:
            status[i] = "rejected" if took is None else status[i]
        if took is None:
            break
        status[took], k, c = "accepted", k + 1, took
    cut = bool(rnd.tokens) and rnd.tokens[-1].status == "discarded"
    return (min(k, rnd.n_accepted) if cut else k), status


def whatif_statuses(rnd: StageRound, tau: float | None) -> list[str]:
    """accepted / rejected / discarded for each proposed token under `tau`."""
    if rnd.parents is not None:
        return [t.status for t in rnd.tokens[:-1]] if rnd.exact or tau is None else _tree_whatif(rnd, tau)[1]
    k = reevaluate(rnd, tau)
    n = len(rnd.tokens) - 1
    return ["accepted" if i < k else "rejected" if i == k else "discarded" for i in range(n)]


def round_tau(rnd: StageRound, tau_q: float, tau_t: float) -> float | None:
    """The what-if threshold that applies to a round (None under an exact rule)."""
    if rnd.exact:
        return None
    return tau_q if rnd.stage == "qualifier" else tau_t


def block_sources(step: Step) -> list[TokenRec | None]:
    """For each position of the target round, the stage-1 record that saw the draft's proposal there.

    A position the qualifier filled itself maps to the draft's rejected token (it holds the draft's
    distribution), or to None after a fully accepted round (the draft made no proposal there).
    """
    out: list[TokenRec | None] = []
    for rnd in step.qualifier_rounds:
        k, n = rnd.n_accepted, len(rnd.tokens) - 1
        out += rnd.tokens[:k]
        out.append(rnd.tokens[k] if k < n else None)
    return out


def position_top5(step: Step, pos: int) -> dict[str, list[list[float]]]:
    """Each model's top-5 next tokens at position `pos` of this step's target round (role → [[id, p]])."""
    rnd = step.target_round
    if rnd is None or not rnd.tokens:
        return {}
    pos = max(0, min(pos, len(rnd.tokens) - 1))
    merged: dict[str, list[list[float]]] = {}
    srcs = block_sources(step)
    if pos < len(srcs) and srcs[pos] is not None:
        merged.update(srcs[pos].top5)
    merged.update(rnd.tokens[pos].top5)
    return {r: merged[r] for r in ("draft", "qualifier", "target") if r in merged}


def ratio(a: float, b: float | None) -> float | None:
    return a / b if b else None


def race_noise(results: dict[str, RunResult]) -> float | None:
    """The race's relative timing noise: the spread of same-size forwards over all its lanes (core.noise)."""
    groups: dict = {}
    for r in results.values():
        for key, ts in noise.same_k_forwards(r.steps).items():
            groups.setdefault(key, []).extend(ts)
    return noise.timing_noise(groups)


def within_noise(a: float, b: float | None, spread: float | None) -> bool:
    """True when speeds a and b differ by no more than the race's noise (never when it is unknown)."""
    return bool(b) and spread is not None and noise.compare(a, b, spread) == 0


def speedups(m: str, results: dict[str, RunResult]) -> list[str]:
    """["×1.80 vs AR", "×1.05 vs SD (tie within noise)"] for method m: what the lanes, legend and status show."""
    out = []
    spread = race_noise(results)
    for base in ("ar", "sd"):
        b = results.get(base)
        if b is None or m == base or (base == "sd" and m == "ar"):
            continue
        a, bs = results[m].stats.tokens_per_s, b.stats.tokens_per_s
        x = ratio(a, bs)
        if x is not None:
            out.append(f"×{x:.2f} vs {base.upper()}" + (" (tie within noise)" if within_noise(a, bs, spread) else ""))
    return out


def _times(r: RunResult, base: RunResult | None, spread: float | None) -> float | str | None:
    """A table's × cell (r's speed ÷ base's): the ratio, marked when the gap is within the race's noise."""
    b = base.stats.tokens_per_s if base else None
    x = ratio(r.stats.tokens_per_s, b)
    if x is None:
        return None
    return f"{x:.2f} (tie: noise {spread:.0%})" if r is not base and within_noise(r.stats.tokens_per_s, b, spread) \
        else round(x, 2)


def race_rows(races: list[Race]) -> list[list]:
    """One table row per (race, method): the numbers the race summary and the CSV export show."""
    rows = []
    for race in races:
        res: dict[str, RunResult] = race.results
        ar, sd = res.get("ar"), res.get("sd")
        greedy = not race.config.get("temperature")
        spread = race_noise(res)
        for m, r in res.items():
            s = r.stats
            acc = ", ".join(f"{k} {v:.0%}" for k, v in s.acceptance.items()) or "—"
            # agreement with target greedy output (the bench's figure): AR is that reference at T=0 only
            same = agreement(r.token_ids, ar.token_ids) if ar is not None and greedy else None
            rows.append([race.n, m, s.n_new_tokens, round(s.decode_s, 2), round(s.tokens_per_s, 1),
                         _times(r, ar, spread), _times(r, sd, spread),
                         acc, round(s.tokens_per_target_pass, 2), None if same is None else f"{same:.0%}",
                         s.stopped or ("running…" if race.running == m else "stopped by user")])
    return rows


def stage_names(r: RunResult) -> list[str]:
    return [s for s in STAGES if stage_rounds(r.steps, s)]

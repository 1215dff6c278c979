"""A measured cost profile: what one cached forward of k new tokens costs each model, and what
that predicts for every method on this machine.

A profile is a plain dict, JSON as is: {"ms": {role: {k: ms}}, ...}: the time of one cached forward
of k new tokens (k = 1 … longest proposal + 1) over a ~100-token context, the minimum of a few reps.
From it and a run's trace (`predict_run`) the method's time is the sum of profile[model][k] over the
forwards the run actually made; `break_even` is the per-token acceptance α at which SD or PSD
would be exactly as fast as AR. This sits beside `throughput` (the paper's formulas from one-token
speeds); everything here but the timers (`ForwardTimer`, `time_forward`, `warm_up`) is pure math over
records.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .methods import method_spec
from .profile import ar_speed, cost_ms  # noqa: F401 - re-exported: callers read the profile through costs
from .trace import Step
from .tree_costs import best_tree, rank_counts, tree_speed

MAX_K = 9  # longest forward profiled one k at a time: a proposal of 8 plus the verifier's own token
TREE_K = 17  # also profiled: the pass of a 16-node tree (its root row included)
CONTEXT = 100  # tokens already in the cache when a forward is timed


# ---------------------------------------------------------------- the profile
def step_forwards(step: Step) -> dict[str, list[int]]:
    """The new-token counts of the forwards one Step made, per role: `step.fed` where the engine
    recorded it; else (a trace without it, e.g. an older export) read from the rounds. Target: one pass of
    (proposal + 1) tokens (1 for AR). Qualifier: one pass of (proposal + 1) per stage-1 round. Draft: its
    forwards, counted as one token each (the first of a round may feed one more committed token)."""
    if step.fed:
        return {r: list(ks) for r, ks in step.fed.items() if ks}
    out: dict[str, list[int]] = {}
    t = step.target_round
    out["target"] = [len(t.tokens) if t is not None else 1] * max(1, step.n_forward.get("target", 1))
    if step.qualifier_rounds or step.n_forward.get("qualifier"):
        q = [len(r.tokens) for r in step.qualifier_rounds]
        n = step.n_forward.get("qualifier", len(q))
        out["qualifier"] = (q + [q[-1] if q else 1] * n)[:n] if n else []
    if step.n_forward.get("draft"):
        out["draft"] = [1] * step.n_forward["draft"]
    return {r: ks for r, ks in out.items() if ks}


def forward_counts(steps: list[Step]) -> dict[str, dict[int, int]]:
    """How many forwards of k new tokens each role made: {role: {k: n}} (adds up over runs)."""
    out: dict[str, dict[int, int]] = {}
    for s in steps:
        for role, ks in step_forwards(s).items():
            for k in ks:
                out.setdefault(role, {})[k] = out.get(role, {}).get(k, 0) + 1
    return out


def predict_counts(counts: dict[str, dict], profile: dict) -> dict[str, float]:
    """Predicted forward seconds per role: Σ n × profile[role][k] (roles the profile lacks are left out)."""
    return {role: sum(int(n) * cost_ms(profile, role, int(k)) for k, n in by_k.items()) / 1000
            for role, by_k in counts.items() if role in profile["ms"]}


def predict_run(steps: list[Step], profile: dict) -> dict[str, Any]:
    """Predicted forward seconds per role and tokens/s for a recorded run, from the profile."""
    per_role = predict_counts(forward_counts(steps), profile)
    n = sum(len(s.new_tokens) for s in steps)
    total = sum(per_role.values())
    return {"time_s": round(total, 6), "per_role_s": {k: round(v, 6) for k, v in per_role.items()},
            "tokens_per_s": round(n / total, 3) if total > 0 else None}


def measured_by_k(steps: list[Step]) -> dict[str, dict[int, list[float]]]:
    """Per-forward times measured inside a run, in ms, by role and k, where a step pins them down:
    the target's one pass per step, a qualifier's single round, a draft's one-token forwards."""
    out: dict[str, dict[int, list[float]]] = {}
    for s in steps:
        for role, ks in step_forwards(s).items():
            t = s.time_s.get(role)
            if t is None or not ks or len(set(ks)) != 1:
                continue
            out.setdefault(role, {}).setdefault(ks[0], []).append(1000 * t / len(ks))
    return out


# ---------------------------------------------------------------- expected speed and break-even
def expected_len(alpha: float, n: float) -> float:
    """Tokens a round of n proposals commits when each is accepted with probability α until the first
    rejection, the verifier's own token included: (1 − α^(n+1)) / (1 − α)."""
    if alpha >= 1.0:
        return n + 1.0
    return (1 - alpha ** (n + 1)) / (1 - alpha)


def sd_speed(profile: dict, gamma: int, alpha: float) -> float:
    """Expected tok/s of SD: E(α, γ) tokens per round of γ one-token drafts and one (γ+1)-token pass."""
    round_ms = gamma * cost_ms(profile, "draft", 1) + cost_ms(profile, "target", gamma + 1)
    return 1000 * expected_len(alpha, gamma) / round_ms


def psd_speed(profile: dict, l_d: int, l_q: int, alpha_q: float, alpha_t: float) -> float:
    """Expected tok/s of the pyramid: stage 1 yields E(α_Q, ℓ_D) qualified tokens per round of ℓ_D
    drafts and one (ℓ_D+1)-token qualifier pass; a block of ℓ_Q such tokens costs ℓ_Q / E1 rounds,
    then one (ℓ_Q+1)-token target pass commits E(α_T, ℓ_Q)."""
    stage1_ms = l_d * cost_ms(profile, "draft", 1) + cost_ms(profile, "qualifier", l_d + 1)
    block_ms = l_q / expected_len(alpha_q, l_d) * stage1_ms + cost_ms(profile, "target", l_q + 1)
    return 1000 * expected_len(alpha_t, l_q) / block_ms


def solve_alpha(speed: Callable[[float], float], goal: float) -> float | None:
    """The α in [0, 1] where speed(α) = goal (speed rises with α); 0.0 if it beats goal even at α = 0,
    None if it cannot reach goal even at α = 1."""
    if speed(0.0) >= goal:
        return 0.0
    if speed(1.0) < goal:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speed(mid) < goal else (lo, mid)
    return round((lo + hi) / 2, 4)


def rejected(r: Any) -> bool:
    """A round that ended at a refused token (not one a block's size, a confidence floor or an EOS cut short)."""
    return any(t.status == "rejected" for t in r.tokens[:-1])


def per_token_alpha(rounds: list) -> float | None:
    """Measured α for the leading-run model: accepted ÷ (accepted + rejections), from StageRounds."""
    acc = sum(r.n_accepted for r in rounds)
    rej = sum(1 for r in rounds if rejected(r))
    return round(acc / (acc + rej), 4) if acc + rej else None


def stage_counts(steps: list[Step]) -> dict[str, dict[str, int]]:
    """Per stage: accepted tokens, rejections, proposed tokens and rounds (what α and the lengths need;
    counts add up over runs, so pooled figures come from sums)."""
    out: dict[str, dict[str, Any]] = {}
    for stage, rounds in (("target", [s.target_round for s in steps if s.target_round is not None]),
                          ("qualifier", [r for s in steps for r in s.qualifier_rounds])):
        if rounds:
            out[stage] = {"accepted": sum(r.n_accepted for r in rounds),
                          "rejected": sum(1 for r in rounds if rejected(r)),
                          "proposed": sum(len(r.tokens) - 1 for r in rounds), "rounds": len(rounds)}
            if any(r.parents is not None for r in rounds):  # tree rounds: acceptance by rank (`tree_costs`)
                out[stage]["rank_hits"], out[stage]["rank_reach"] = rank_counts(rounds)
    return out


def _alpha(c: dict | None) -> float | None:
    n = c["accepted"] + c["rejected"] if c else 0
    return round(c["accepted"] / n, 4) if c and n else None


def _length(c: dict | None, default: int) -> int:
    return max(1, round(c["proposed"] / c["rounds"])) if c and c["rounds"] else default


def method_model(method: str, steps: list[Step], config: dict, profile: dict) -> dict[str, Any]:
    """For one recorded run: see `model_from_counts`."""
    return model_from_counts(method, stage_counts(steps), config, profile)


def model_from_counts(method: str, counts: dict, config: dict, profile: dict) -> dict[str, Any]:
    """Lengths (measured means), measured α per stage (accepted ÷ (accepted + rejections)), the expected
    tok/s at that α on this profile, and the break-even α at which it equals AR's tok/s (None for AR)."""
    spec = method_spec(method)
    out: dict[str, Any] = {"ar_tokens_per_s": round(ar_speed(profile), 3)}
    if spec.proposer is None:
        return out
    a_t = _alpha(counts.get("target"))
    out["alpha"] = a_t
    try:
        if config.get("shape") == "tree" and not spec.pyramid:
            return _tree_model(out, counts.get("target") or {}, config, profile)
        if not spec.pyramid:
            g = _length(counts.get("target"), config.get("gamma", 4))
            f = lambda a: sd_speed(profile, g, a)  # noqa: E731
            out["lengths"] = {"gamma": g}
        else:
            ld = _length(counts.get("qualifier"), config.get("l_d", 4))
            lq = _length(counts.get("target"), config.get("l_q", 8))
            a_q = _alpha(counts.get("qualifier"))
            out["alpha_qualifier"] = a_q
            f = lambda a: psd_speed(profile, ld, lq, a_q if a_q is not None else 0.0, a)  # noqa: E731
            out["lengths"] = {"l_d": ld, "l_q": lq}
        out["break_even_alpha"] = solve_alpha(f, ar_speed(profile))
        out["expected_tokens_per_s"] = round(f(a_t), 3) if a_t is not None else None
        out["ceiling_tokens_per_s"] = round(f(1.0), 3)
    except KeyError:  # a role the profile lacks
        pass
    return out


def _tree_model(out: dict[str, Any], c: dict, config: dict, profile: dict) -> dict[str, Any]:
    """A tree method's model: measured acceptance by rank, the expected tree's speed at this budget and the
    budget the profile predicts best (`tree_costs`)."""
    hits, reach = c.get("rank_hits") or [], c.get("rank_reach") or []
    ranks = [h / n for h, n in zip(hits, reach) if n] or None
    budget = {k: int(config.get(k, d)) for k, d in (("tree_nodes", 16), ("tree_depth", 5), ("tree_k", 4))}
    out["ranks"] = [round(r, 4) for r in ranks] if ranks else None
    out["lengths"] = budget
    if ranks:
        got = tree_speed(profile, budget["tree_nodes"], budget["tree_depth"], budget["tree_k"], ranks)
        out["expected_tokens_per_s"], out["expected_tokens_per_pass"] = got["tokens_per_s"], got["tokens_per_pass"]
    out["best_tree"] = best_tree(profile, ranks)
    return out


def verdict(method: str, m: dict, measured: tuple[float, float] | None = None) -> str:
    """One line: why the method wins or loses here, on the profile; `measured` (the method's and AR's
    tok/s in the same run) adds what happened, and says so when the run did not follow the profile."""
    if "best_tree" in m:
        b, exp = m["best_tree"], m.get("expected_tokens_per_s")
        ranks = ", ".join(f"{r:.2f}" for r in (m.get("ranks") or [])[:4]) or "not measured yet"
        line = (f"a tree spends the draft's top few (acceptance by rank {ranks})"
                + (f": expected {exp:.1f} vs AR {m['ar_tokens_per_s']:.1f} tok/s at this budget" if exp else "")
                + f"; predicted best here {b['tree_nodes']} nodes, depth {b['tree_depth']}, k {b['tree_k']} "
                  f"({b['tokens_per_pass']:.2f} tokens per pass, {b['tokens_per_s']:.1f} tok/s)")
        if measured and all(measured):
            line += f"; measured {measured[0]:.1f} vs AR {measured[1]:.1f} tok/s"
        return line
    if "break_even_alpha" not in m:
        return "the baseline: one target forward per token" if method == "ar" else "no profile for its models"
    be, a = m["break_even_alpha"], m.get("alpha")
    stage = "the target's acceptance α_T" if "alpha_qualifier" in m else "acceptance α"
    if be is None:
        return (f"cannot beat AR on this machine even if every token were accepted (at best "
                f"{m['ceiling_tokens_per_s']:.1f} vs {m['ar_tokens_per_s']:.1f} tok/s): its forwards cost too much")
    if a is None:
        return f"pays once {stage} exceeds {be:.2f}"
    exp = m.get("expected_tokens_per_s")
    vs = f" (expected {exp:.1f} vs AR {m['ar_tokens_per_s']:.1f} tok/s on this profile)" if exp else ""
    wins = a >= be
    line = (f"wins: {stage} {a:.2f} is above the break-even {be:.2f}{vs}" if wins
            else f"loses: {stage} {a:.2f} is below the break-even {be:.2f}{vs}")
    if measured and all(measured):
        got, ar = measured
        line += f"; measured {got:.1f} vs AR {ar:.1f} tok/s"
        if (got >= ar) != wins:
            line += (" — not what the profile expects: these forwards cost more in the run than in the "
                     "profile, or its proposals were shorter/longer than the formula's γ")
    return line


# ---------------------------------------------------------------- measuring (the only torch code here)
class ForwardTimer:
    """Times cached forwards of k new tokens after `context` tokens, over one prefilled cache, under
    `backend`. Token ids are fixed, so every call times the same work."""

    def __init__(self, model: Any, vocab_size: int, backend: str = "default", context: int = CONTEXT,
                 path: str = "hf"):
        from .lm import open_lm

        self.lm = open_lm(model, vocab_size, "probe", backend, path)
        self.context = context
        self.ids = [(7919 * i + 11) % max(2, vocab_size - 1) + 1 for i in range(context + MAX_K + 64)]
        self.lm.logits(self.ids[:context], 1)

    def time(self, k: int) -> float:
        """Seconds for one forward of k new tokens; the cache is cropped back to `context` after."""
        t0 = self.lm.time_s
        self.lm.logits(self.ids[: self.context + k], k)
        t = self.lm.time_s - t0
        self.lm.rollback(self.ids[: self.context + 1])  # keeps `context` tokens
        return t


def time_forward(model: Any, vocab_size: int, k: int, backend: str = "default", reps: int = 3,
                 context: int = CONTEXT, path: str = "hf") -> float:
    """Seconds for one cached forward of k new tokens after `context` tokens: min of `reps` after a warm-up."""
    timer = ForwardTimer(model, vocab_size, backend, context, path)
    return min(timer.time(k) for _ in range(reps + 1))


def measure_profile(models: dict[str, Any], vocab_size: int, backend: str = "default", max_k: int = MAX_K,
                    reps: int = 3, make_timer: Callable[..., Any] | None = None,
                    path: str = "hf") -> dict[str, dict[int, float]]:
    """{role: {k: ms}} for every distinct model (a role that shares another's model shares its row):
    one prefilled cache per model, k = 1 … max_k timed in interleaved rounds, min over rounds (the first
    round warms up)."""
    make_timer = make_timer or ForwardTimer
    timers: dict[int, Any] = {}
    for model in models.values():
        if id(model) not in timers:
            timers[id(model)] = make_timer(model, vocab_size, backend, path=path)  # the path the runs will use
    best: dict[int, dict[int, float]] = {i: {} for i in timers}
    for _ in range(reps + 1):
        for i, timer in timers.items():
            for k in (*range(1, max_k + 1), *((TREE_K,) if max_k >= MAX_K else ())):  # a full profile: trees too
                best[i][k] = min(best[i].get(k, float("inf")), timer.time(k))
    return {role: {k: round(1000 * v, 4) for k, v in best[id(m)].items()} for role, m in models.items()}


def linear_bytes(model: Any) -> tuple[int, Any]:
    """Bytes of every weight matrix a decode step streams (linear layers, packed or not, counted once), and
    the largest such layer. An embedding is read one row per token, so a tied head counts once, as a linear."""
    total, largest, best = 0, None, -1
    seen: set[int] = set()
    for m in model.modules():
        w = getattr(m, "packed", None) if hasattr(m, "packed") else getattr(m, "weight", None)
        if id(m) in seen or w is None or not hasattr(m, "in_features") or not hasattr(m, "out_features"):
            continue
        seen.add(id(m))
        n = m.in_features * m.out_features * w.element_size()
        total += n
        if n > best:
            largest, best = m, n
    return total, largest


def memory_floor_ms(model: Any, backend: str = "default", reps: int = 15) -> dict[str, float]:
    """The step's floor on this machine: the largest matrix's one-row product time (min of `reps`), scaled
    to every weight byte a step reads. Returns {"floor_ms", "gemv_ms", "gb_per_s", "mb"}."""
    import time

    import torch

    from .lm import backend_flags

    total, largest = linear_bytes(model)
    if largest is None:
        return {}
    w = getattr(largest, "packed", None)
    w = largest.weight if w is None else w
    x = torch.randn(1, largest.in_features).to(w.dtype if w.is_floating_point() else torch.float32)  # [1, in]
    best = float("inf")
    with torch.inference_mode(), backend_flags(backend):
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            largest(x)
            best = min(best, time.perf_counter() - t0)
    mine = largest.in_features * largest.out_features * w.element_size()
    return {"floor_ms": round(1000 * best * total / mine, 3), "gemv_ms": round(1000 * best, 3),
            "gb_per_s": round(mine / best / 1e9, 2), "mb": round(total / 1e6, 1)}


def warm_up(models: dict[str, Any], vocab_size: int, backend: str, prompt_ids: list[int], path: str = "hf") -> float:
    """One short run through every distinct model before any clock starts (first-call allocations,
    kernel selection): the prompt, then a one-token and a few-token cached forward. Returns seconds."""
    import time

    from .lm import open_lm

    t0 = time.perf_counter()
    seen: set[int] = set()
    ids = list(prompt_ids[-32:]) or [1]
    for role, model in models.items():
        if id(model) in seen:
            continue
        seen.add(id(model))
        lm = open_lm(model, vocab_size, role, backend, path)
        seq = ids + [int(lm.logits(ids, 1)[0].argmax())]
        seq.append(int(lm.logits(seq, 1)[0].argmax()))
        lm.logits(seq + seq[-3:], 3)
    return time.perf_counter() - t0

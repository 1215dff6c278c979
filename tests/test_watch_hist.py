"""The pass histogram's bins from hand-built records: which bin each target pass counts in (its accepted drafted
tokens, the bonus not counted; a tree's path length, not its nodes; a pyramid's target round, not its qualifier's),
how many bins a run has, and where the figure's bars and x axis start and stop. No model runs."""

from __future__ import annotations

from helpers import compute_stats

from pyramid_demo.app import pass_hist
from pyramid_demo.core.trace import RunResult, StageRound, Step, TokenRec


def rnd(stage: str, statuses: str, own: str, parents: list[int] | None = None) -> StageRound:
    """A round from one letter per proposed token (a accepted, r rejected, d discarded) and its own token's
    status; the proposer is the draft, or the qualifier for a pyramid's target round."""
    proposer = "qualifier" if stage == "target-block" else "draft"
    stage = "target" if stage == "target-block" else stage
    verifier = "qualifier" if stage == "qualifier" else "target"
    names = {"a": "accepted", "r": "rejected", "d": "discarded"}
    toks = [TokenRec(10 + i, proposer, names[c]) for i, c in enumerate(statuses)]
    toks.append(TokenRec(99, verifier, own))
    return StageRound(
        stage,
        proposer,
        verifier,
        "greedy",
        toks,
        statuses.count("a"),
        exact=True,
        parents=parents if parents is not None else list(range(-1, len(statuses) - 1)),
    )


def step(i: int, target: StageRound, qual: list[StageRound] = ()) -> Step:
    k = target.n_accepted + 1
    return Step(i, list(qual), target, [1] * k, ["draft"] * (k - 1) + ["target"], 0.0, 0.1 * (i + 1))


def run(method: str, shape: str, steps: list[Step]) -> RunResult:
    stats = compute_stats(method, steps, 0.0, "max_new_tokens")
    return RunResult(method, {"shape": shape}, [], "", [], [], [], [], "", stats, steps)


def sd_chain() -> RunResult:
    """γ = 4: passes accepting 0, 1, 2 (then refused), 0, 1 and one proposing nothing (the budget's last token)."""
    return run(
        "sd",
        "chain",
        [
            step(0, rnd("target", "rddd", "resampled")),
            step(1, rnd("target", "ardd", "resampled")),
            step(2, rnd("target", "aard", "resampled")),
            step(3, rnd("target", "rddd", "resampled")),
            step(4, rnd("target", "ardd", "resampled")),
            step(5, rnd("target", "", "bonus")),
        ],
    )


def sd_tree() -> RunResult:
    """Trees of 5 nodes, depth 3 (root ─ a ─ c ─ e; root ─ b ─ d): paths of 3 (to the leaf e, then the bonus), 2
    (through the second child b to its leaf d) and 0."""
    par = [-1, -1, 0, 1, 2]
    return run(
        "sd",
        "tree",
        [
            step(0, rnd("target", "adada", "bonus", par)),
            step(1, rnd("target", "radad", "bonus", par)),
            step(2, rnd("target", "rrddd", "resampled", par)),
        ],
    )


def psd_chain() -> RunResult:
    """A pyramid: stage 1 accepts 3 then 2 drafted tokens; the target accepts 4 of the 5-token block, then 1."""
    q = [rnd("qualifier", "aaa", "bonus"), rnd("qualifier", "aar", "resampled")]
    return run(
        "psd_f",
        "chain",
        [step(0, rnd("target-block", "aaaar", "resampled"), q), step(1, rnd("target-block", "ardd", "resampled"), q)],
    )


def test_each_pass_counts_in_the_bin_of_its_accepted_drafted_tokens() -> None:
    """Rule: bin k counts the target passes that accepted exactly k drafted tokens (the verifier's own token never
    counted, a pass that proposed nothing in bin 0); a run has one bin per position its deepest proposal offered
    (a chain's γ + 1, a tree's depth + 1, never its node count + 1), and a pyramid bins its target round alone."""
    assert sd_chain().stats.accepted_hist == [3, 2, 1, 0, 0]
    assert sd_tree().stats.accepted_hist == [1, 0, 1, 1]
    assert psd_chain().stats.accepted_hist == [0, 1, 0, 0, 1, 0]


def test_the_figures_bars_stop_at_the_longest_run_any_lane_had() -> None:
    """Rule: every panel's bars sit at k = 0, 1, … up to the largest k any shown lane has a pass at (empty bins
    past it dropped, empty bins before it kept), their counts are the histogram's and their heights its shares;
    the x axis spans half a bar either side of them."""
    res = {"sd": sd_chain(), "sd+tree": sd_tree(), "psd_f": psd_chain()}
    fig = pass_hist.accepted_figure(res)
    bars = {tr.name: tr for tr in fig.data}
    assert set(bars) == {"SD", "SD tree", "PSD_F"}
    want = {"SD": [3, 2, 1, 0, 0], "SD tree": [1, 0, 1, 1], "PSD_F": [0, 1, 0, 0, 1]}
    for name, counts in want.items():
        tr = bars[name]
        assert list(tr.x) == list(range(len(counts))), f"{name}'s bars at {list(tr.x)}"
        assert list(tr.customdata) == counts, f"{name}'s counts {list(tr.customdata)}"
        assert list(tr.y) == [c / sum(counts) for c in counts]
    assert tuple(fig.layout.xaxis.range) == (-0.6, 4.6)


def test_a_short_race_keeps_the_first_three_bins_on_its_axis() -> None:
    """Rule: when no lane accepted more than one token the axis still shows k = 0 … 2, while the bars stop at 1."""
    res = {
        "sd": run(
            "sd", "chain", [step(0, rnd("target", "ard", "resampled")), step(1, rnd("target", "rdd", "resampled"))]
        )
    }
    fig = pass_hist.accepted_figure(res)
    assert list(fig.data[0].x) == [0, 1] and list(fig.data[0].customdata) == [1, 1]
    assert tuple(fig.layout.xaxis.range) == (-0.6, 2.6)

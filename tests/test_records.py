"""Records that tell the truth: every round records exactly the tokens it put in the block or the output.

All tests drive the engine with the bigram mock, so each round can be worked out by hand.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from helpers import compute_stats
from mock_lm import BigramLM, as_run

from pyramid_demo.core.engine import decode, pyramid_block, roles_for
from pyramid_demo.core.methods import DecodeConfig, method_spec
from pyramid_demo.core.trace import StageRound, Step
from pyramid_demo.forward.cache import CacheError

pytestmark = pytest.mark.usefixtures("one_thread")

V = 8
USED = ("accepted", "resampled", "bonus")


def chain(sure: float = 20.0) -> torch.Tensor:
    """Bigram logits [V, V] of the chain t -> t+1 (mod V), at a confidence set by `sure`."""
    t = torch.zeros(V, V)
    for i in range(V):
        t[i, (i + 1) % V] = sure
    return t


def run(
    method: str,
    tables: dict[str, torch.Tensor],
    cfg: DecodeConfig,
    eos: tuple[int, ...] = (),
    gen: torch.Generator | None = None,
) -> list[Step]:
    lms = {r: BigramLM(tables[r], r) for r in roles_for(method)}
    return list(decode(lms, [0], as_run(cfg), eos, gen))


def used(r: StageRound) -> list[int]:
    """The tokens a round says it put in the block (or the output)."""
    return [t.token_id for t in r.tokens if t.status in USED]


def check_blocks(steps: list[Step]) -> None:
    """Every step's qualifier rounds record, in order, exactly the block the target was sent, and their
    accepted counts are the block's drafted tokens."""
    for s in steps:
        if s.target_round is None or not s.qualifier_rounds:
            continue
        block = [t.token_id for t in s.target_round.tokens[:-1]]
        assert [t for r in s.qualifier_rounds for t in used(r)] == block, "stage-1 records ≠ the block"
        n_draft = sum(r.n_accepted for r in s.qualifier_rounds)
        assert n_draft == sum(1 for r in s.qualifier_rounds for t in r.tokens if t.status == "accepted"), (
            "a round's n_accepted ≠ its accepted records"
        )


def unsure_qualifier() -> torch.Tensor:
    """The chain, but unsure after token 1 (top probability e/(e+7) ≈ 0.28, still token 2) and refusing
    the draft's 4 after 3 (it writes 6)."""
    q = chain()
    q[1] = 0.0
    q[1, 2] = 1.0
    q[3] = 0.0
    q[3, 6] = 20.0
    return q


def test_a_confidence_cut_records_only_what_entered_the_block():
    """ℓ_D 4, conf_stop 0.5: the qualifier accepts 3 drafted tokens, then the block ends after its unsure
    second token. The round records 2 accepted, the third discarded (cut), the fourth rejected and its own
    token discarded; acceptance["qualifier"] counts 2 of 4."""
    tables = {"draft": chain(), "qualifier": unsure_qualifier(), "target": unsure_qualifier()}
    cfg = DecodeConfig(method="psd_a", l_d=4, l_q=8, conf_stop=0.5, max_new_tokens=6)
    steps = run("psd_a", tables, cfg)
    first = steps[0].qualifier_rounds[0]
    assert [t.status for t in first.tokens] == ["accepted", "accepted", "discarded", "rejected", "discarded"]
    assert first.n_accepted == 2, "the confidence cut's tokens were counted as accepted"
    assert [t.token_id for t in steps[0].target_round.tokens[:-1]] == [1, 2]
    s = compute_stats("psd_a", steps[:1], 0.0, "max_new_tokens")
    assert s.accepted["qualifier"] == 2 and s.proposed["qualifier"] == 4
    check_blocks(steps)


def test_a_size_cut_discards_the_qualifiers_bonus():
    """ℓ_D 4, ℓ_Q 6, draft = qualifier: round 1 fills 5 (4 + bonus), round 2 drafts 1 and its bonus would be
    the 7th token: it is cut by the block's size, so the round records it discarded, not a bonus."""
    tables = {r: chain() for r in ("draft", "qualifier", "target")}
    cfg = DecodeConfig(method="psd_f", l_d=4, l_q=6, max_new_tokens=14)
    steps = run("psd_f", tables, cfg)
    second = steps[0].qualifier_rounds[1]
    assert [t.status for t in second.tokens] == ["accepted", "discarded"], "the cut bonus was recorded as used"
    assert len(steps[0].target_round.tokens) - 1 == 6
    check_blocks(steps)


@pytest.mark.parametrize("method", ["psd_a", "psd_f"])
@pytest.mark.parametrize("stop", [0.0, 0.4])
def test_sampled_stage1_records_are_the_block(method, stop):
    """At T=1, with and without conf_stop, every block equals what its qualifier rounds record as used."""
    g = torch.Generator().manual_seed(0)
    tables = {r: 2.0 * torch.randn(V, V, generator=g) for r in ("draft", "qualifier", "target")}
    cfg = DecodeConfig(method=method, temperature=1.0, l_d=3, l_q=5, conf_stop=stop, tau_q=0.5, max_new_tokens=60)
    check_blocks(run(method, tables, cfg, gen=torch.Generator().manual_seed(1)))


# --- EOS: looked for once per step; the verifier's own EOS is not a cut ----------------------------


def disagreeing_target(at: int, writes: int) -> torch.Tensor:
    """The chain, except that after token `at` the target writes `writes`."""
    t = chain()
    t[at] = 0.0
    t[at, writes] = 20.0
    return t


def test_an_eos_that_is_the_verifiers_own_token_is_not_a_cut():
    """SD, γ 4: the target refuses the draft's third token (3) and resamples the EOS (7) itself. The round
    accepted 2 and its own token is the resampled EOS, which ends the output: nothing was cut inside the
    accepted run, so n_accepted stays 2 and 4 proposals are counted."""
    tables = {"draft": chain(), "target": disagreeing_target(2, 7)}
    steps = run("sd", tables, DecodeConfig(method="sd", gamma=4, max_new_tokens=10), eos=(7,))
    rnd = steps[0].target_round
    assert steps[0].new_tokens == [1, 2, 7] and len(steps) == 1
    assert [t.status for t in rnd.tokens] == ["accepted", "accepted", "rejected", "discarded", "resampled"], (
        "the verifier's own EOS was treated as a cut inside the accepted run"
    )
    assert rnd.n_accepted == 2


def test_an_eos_inside_the_accepted_run_cuts_the_round():
    """SD, γ 4, the EOS is the draft's second token, accepted: the round ends after it (2 accepted, the
    target's own token discarded, the proposals after the EOS left out)."""
    tables = {"draft": chain(), "target": chain()}
    steps = run("sd", tables, DecodeConfig(method="sd", gamma=4, max_new_tokens=10), eos=(2,))
    rnd = steps[0].target_round
    assert steps[0].new_tokens == [1, 2]
    assert [t.status for t in rnd.tokens] == ["accepted", "accepted", "discarded"] and rnd.n_accepted == 2


def test_a_bonus_tokens_origin_is_bonus():
    """A fully accepted proposal is followed by the target's bonus token, whose origin is "bonus" (the app
    colours it apart from a target resample); the budget's last token, after an empty proposal, is a bonus too,
    in its status and its origin alike (one rule: the walk ended where nothing was proposed)."""
    for method, kw in (("sd", dict(gamma=3)), ("psd_f", dict(l_d=2, l_q=3))):
        tables = {r: chain() for r in ("draft", "qualifier", "target")}
        steps = run(method, tables, DecodeConfig(method=method, max_new_tokens=9, **kw))
        assert steps[0].origins[-1] == "bonus", f"{method}: a bonus token's origin was recorded as the target's"
        assert [len(s.new_tokens) for s in steps] == [4, 4, 1] and steps[-1].origins == ["bonus"]
        assert steps[-1].target_round.tokens[-1].status == "bonus"


# --- the cache's safety net fires from the engine -------------------------------------------------


def test_a_missed_qualifier_cut_raises_cache_error():
    """A cache whose cut is missed must not be fed after stale tokens. Planted: after a k < n round that ends its
    block (its own token 5 is unsure, conf_stop 0.5) the qualifier keeps every row it scored, not the accepted
    path, and its cut is skipped; the target then accepts the block, and the step's cut keeps the qualifier's
    stale 2 at position 2 (the draft's; the block has 5 there). Its next feed must raise CacheError, not feed on
    silently."""
    q = chain()
    q[1] = 0.0
    q[1, 5] = 1.0  # after 1 the qualifier refuses the draft's 2 and writes 5, unsure (top ≈ 0.28)
    cfg = DecodeConfig(method="psd_a", l_d=4, l_q=8, conf_stop=0.5)
    lms = {"draft": BigramLM(chain(), "draft"), "qualifier": BigramLM(q, "qualifier")}
    st = method_spec(cfg.method).stages[0]
    seq = [0]
    q_lm = lms["qualifier"]
    q_lm.keep_along = lambda seq: q_lm.keep_path(list(range(len(q_lm.pending))))  # planted: every row kept
    q_lm.truncate = lambda pos: q_lm.cache_len  # planted: the missed cut (this block only)
    block, *_ = pyramid_block(lms, seq, st, 8, cfg, None)
    del q_lm.truncate, q_lm.keep_along
    assert block == [1, 5]
    seq = seq + block + [6]  # the target accepts the block and adds its bonus
    for lm in lms.values():
        lm.truncate(len(seq) - 1)
    assert lms["qualifier"].ids == [0, 1, 2], "the premise: the qualifier still caches the refused 2"
    assert "cut was missed" in _refusal(lambda: pyramid_block(lms, seq, st, 8, cfg, None)), (
        "the qualifier was fed after its stale 2: a missed cut went unnoticed"
    )


def _refusal(call) -> str:
    """The CacheError message `call` raises ("" when it raises none)."""
    try:
        call()
    except CacheError as e:
        return str(e)
    return ""


def test_a_feed_checks_every_cached_token_against_the_sequence():
    """Rule: a model fed a sequence whose start no longer matches its cached tokens raises CacheError (any
    position, not only the last feed's), and a cut back to the shared prefix lets it feed again."""
    lm = BigramLM(chain(), "draft")
    lm.feed([0, 1, 2], 1)
    lm.feed([0, 1, 2, 3, 4], 2)
    for stale in ([0, 9, 2, 3, 4, 5], [7, 1, 2, 3, 4, 5], [0, 1, 2]):
        assert "cut was missed" in _refusal(partial(lm.feed, stale, 1)), f"fed {stale} over other cached tokens"
    assert lm.ids == [0, 1, 2, 3, 4], "a refused feed changed the cache"
    lm.truncate(1)
    assert torch.equal(lm.feed([0, 9, 2], 1), chain()[[2]]) and lm.ids == [0, 9, 2]

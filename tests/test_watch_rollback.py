"""What a proposer that reads its verifier's states (the feature draft) reads after a rollback: a spy on the rows it
feeds records, for every row, the input state it was handed; each one taken from the verifier must be the
verifier's own state for the tokens the proposer holds there (committed, or the block being qualified), never
for a token a rejection threw away. Tiny-random models, greedy, a few seconds."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from mock_lm import as_run
from transformers import LlamaForCausalLM

from pyramid_demo.core.engine import decode, prefill, roles_for
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.forward.feature_lm import FeatureLM
from pyramid_demo.forward.lm import open_lm
from pyramid_demo.models.feature_draft import FeatureDraft
from pyramid_demo.models.tiny import tiny_config, tiny_random_triplet

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = [12, 40, 7, 99, 23, 61]


@dataclasses.dataclass
class Read:
    """One row the proposer fed: its slot, the tokens it held at slots 0 … slot, the state it read [d], how many
    verifier states were known then (a row at slot i reads the verifier's state at i − 1 when i ≤ known) and the
    proposer's own prediction at slot i − 1 then [d] (what a row past the known states reads)."""

    slot: int
    tokens: list[int]
    state: torch.Tensor
    known: int
    own: torch.Tensor


def spy(lm: FeatureLM) -> list[Read]:
    """Record every chain row `lm` feeds (its `_rows`, wrapped on this instance only)."""
    reads: list[Read] = []
    inner = lm._rows

    def rows(toks, f_prev, first, seen, at=None):
        assert at is None, "a chain run feeds no tree rows"
        held = lm.ids[:first] + toks.tolist()  # the proposer's tokens at slots 0 … first + c − 1
        for r, s in enumerate(range(first, first + toks.shape[0])):
            reads.append(Read(s, held[: s + 1], f_prev[r].clone(), lm.states.n, lm.pred[max(s - 1, 0)].clone()))
        return inner(toks, f_prev, first, seen, at)

    lm._rows = rows
    return reads


def states_of(model, tokens: list[int]) -> torch.Tensor:
    """The verifier's final normed state at every position of `tokens`, from scratch [n, d]."""
    with torch.no_grad():
        return model.model(input_ids=torch.tensor([tokens])).last_hidden_state[0]


def run(
    models: dict, vocab: int, reads_from: str, cfg: DecodeConfig, prompt: list[int]
) -> tuple[list[Read], list[int], list]:
    """Decode with a feature draft over `models[reads_from]`; the spy's reads, the output and the steps."""
    fd = FeatureDraft(models[reads_from], torch.arange(vocab)).eval()
    lms = {r: open_lm(fd if r == "draft" else models[r], vocab, r) for r in roles_for(cfg.method)}
    reads = spy(lms["draft"])
    prefill(lms, prompt)
    steps = list(decode(lms, prompt, as_run(cfg), (), None))
    return reads, prompt + [x for s in steps for x in s.new_tokens], steps


def check_reads(reads: list[Read], model) -> int:
    """Every row that read a verifier state read the verifier's own state for the tokens the proposer held, and
    every row past the known states read the proposer's own prediction; returns how many read the verifier's (so a
    caller can see the check is not vacuous)."""
    n = 0
    memo: dict[tuple[int, ...], torch.Tensor] = {}
    for rd in reads:
        if rd.slot == 0:
            zeros = not rd.state.any()
            assert zeros, "row 0 reads zeros"
            continue
        if rd.slot > rd.known:
            own = torch.equal(rd.state, rd.own)
            assert own, f"the row at slot {rd.slot}, past the {rd.known} known states, did not read its own prediction"
            continue
        ctx = tuple(rd.tokens[: rd.slot])  # the state at slot − 1 depends on tokens 0 … slot − 1
        if ctx not in memo:
            memo[ctx] = states_of(model, list(ctx))[-1]
        diff = float((rd.state - memo[ctx]).abs().max())
        assert diff < 1e-4, (
            f"the row at slot {rd.slot} read a state {diff:.3f} away from the verifier's for the "
            "tokens it holds: a refused token's state"
        )
        n += 1
    return n


def test_after_a_target_rejection_the_draft_reads_the_targets_states_for_the_committed_tokens() -> None:
    """Rule: in SD (chain, greedy) every state the feature draft reads from the target is the target's state for
    the committed tokens at that position (the tokens it holds there are the output's), never the state of a
    proposal the target refused; the run has refusals after accepting some tokens and after accepting none."""
    torch.manual_seed(0)
    target = LlamaForCausalLM(tiny_config(4)).eval()  # four tokens: an untrained draft guesses some right
    cfg = DecodeConfig(method="sd", gamma=4, max_new_tokens=24)
    reads, out, steps = run({"target": target}, 4, "target", cfg, [1, 2, 3, 1])
    cut = [s.target_round.n_accepted for s in steps if s.target_round.n_accepted < len(s.target_round.tokens) - 1]
    assert any(k == 0 for k in cut) and any(k > 0 for k in cut), f"refusals after {cut} accepted: not both kinds"
    for rd in reads:
        if 1 <= rd.slot <= rd.known:
            assert rd.tokens[: rd.slot] == out[: rd.slot], f"row {rd.slot} holds tokens the output has not"
    assert check_reads(reads, target) > len(steps)  # at least one true read per pass


def test_in_a_pyramid_the_draft_reads_the_qualifiers_states_for_the_tokens_it_holds() -> None:
    """Rule: under a qualifier (PSD_A, stage 2 'sd') the feature draft reads the qualifier's states; after a
    qualifier refusal in stage 1 and after the target cuts a block, each state it reads is the qualifier's for the
    tokens the draft holds there, never one for a refused or cut token."""
    cfg = DecodeConfig(method="psd_a", stage2="sd", l_d=3, l_q=6, max_new_tokens=24)
    family = tiny_random_triplet(seed=0)
    models = {r: family.model(r) for r in ("qualifier", "target")}
    reads, _, steps = run(models, family.vocab_size, "qualifier", cfg, PROMPT)
    q_refused = [r for s in steps for r in s.qualifier_rounds if r.n_accepted < len(r.tokens) - 1]
    t_cut = [s for s in steps if s.target_round.n_accepted < len(s.target_round.tokens) - 1]
    assert q_refused and t_cut, "the run needs refusals at both stages"
    assert check_reads(reads, family.qualifier) > len(steps)

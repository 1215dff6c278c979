"""The proposal's shape is a setting: "auto" is priced before the run (`predict.expected`), from the cost
profile, and the run's record says why; the loop itself runs only a chain or a tree."""

import dataclasses

import pytest
import torch
from mock_lm import BigramLM, bigram_table

from pyramid_demo.core.engine import decode, roles_for
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.run import generate, takes_trees
from pyramid_demo.forward.lm import described, open_lm
from pyramid_demo.models.tiny import tiny_random_triplet
from pyramid_demo.predict.expected import best_tree, resolve_shape

pytestmark = pytest.mark.usefixtures("one_thread")


def profile(target_per_row: float) -> dict:
    """A cost profile: a draft forward costs 2 ms whatever its rows; a target pass 40 ms plus `target_per_row` per
    extra row (0: a tree pass costs a step, as on a CPU; 40: every row costs a step, so only a chain pays)."""
    ks = [1, 2, 3, 4, 5, 9, 17, 33]
    verifier = {str(k): 40.0 + target_per_row * (k - 1) for k in ks}
    return {"ms": {"draft": {str(k): 2.0 for k in ks}, "qualifier": dict(verifier), "target": verifier}}


def test_auto_takes_the_tree_the_profile_prices_best_with_its_budget():
    """Rule: "auto" asks `expected.best_tree` and runs the tree, with the budget it priced, when its predicted
    tok/s beats the best chain's; the reason names both figures."""
    prof = profile(0.0)
    b = best_tree(prof, None)
    assert b["tokens_per_s"] > b["chain_tokens_per_s"]  # the premise: a flat pass makes a tree pay
    cfg, why = resolve_shape(DecodeConfig(method="sd", shape="auto"), prof)
    assert cfg.shape == "tree" and (cfg.tree_nodes, cfg.tree_depth, cfg.tree_k) == (
        b["tree_nodes"],
        b["tree_depth"],
        b["tree_k"],
    )
    assert why.startswith("auto: a tree of") and f"{b['chain_tokens_per_s']:.1f}" in why


def test_auto_takes_the_chain_when_the_profile_says_a_tree_does_not_pay():
    prof = profile(40.0)
    b = best_tree(prof, None)
    assert b["tokens_per_s"] <= b["chain_tokens_per_s"]
    cfg, why = resolve_shape(DecodeConfig(method="psd_f", shape="auto", tree_nodes=9), prof)
    assert cfg.shape == "chain" and cfg.tree_nodes == 9 and why.startswith("auto: the chain, predicted")
    assert why.endswith("(the draft → qualifier stage)")  # a pyramid's tree is stage 1's: priced there


def test_a_pyramid_prices_its_tree_against_the_qualifiers_pass():
    """Rule: stage 1's tree is verified by the qualifier, so "auto" prices it on the qualifier's costs: a flat
    qualifier pass makes the tree pay even where the target's pass (never given a tree) is steep."""
    prof = profile(40.0)
    prof["ms"]["qualifier"] = profile(0.0)["ms"]["qualifier"]
    assert resolve_shape(DecodeConfig(method="psd_a"), prof)[0].shape == "tree"
    assert resolve_shape(DecodeConfig(method="sd"), prof)[0].shape == "chain"


@pytest.mark.parametrize("prof", [None, {}, {"ms": {"target": {"1": 40.0}}}, {"error": "boom"}])
def test_auto_without_a_profile_takes_the_chain_and_says_so(prof):
    cfg, why = resolve_shape(DecodeConfig(method="fsd"), prof)
    assert cfg.shape == "chain" and "no cost profile" in why


def test_asked_shapes_stay_and_ar_has_none():
    for shape in ("chain", "tree"):
        cfg, why = resolve_shape(DecodeConfig(method="sd", shape=shape), profile(0.0))
        assert cfg.shape == shape and why == f"shape {shape}, as asked"
    cfg, why = resolve_shape(DecodeConfig(method="ar"), profile(0.0))
    assert cfg.shape == "chain" and "proposes nothing" in why


def test_models_without_tree_forwards():
    """Rule: "auto" on models whose forwards cannot take a tree takes the chain, saying why; an asked tree is
    refused before any work, naming the chain."""
    cfg, why = resolve_shape(DecodeConfig(method="sd"), profile(0.0), trees=False)
    assert cfg.shape == "chain" and "cannot take a tree" in why
    with pytest.raises(ValueError, match="--shape chain"):
        resolve_shape(DecodeConfig(method="sd", shape="tree"), profile(0.0), trees=False)


def test_the_engine_never_sees_auto():
    """Rule: the engine runs a chain or a tree; "auto" reaching it is an error naming where it is settled."""
    lms = {r: BigramLM(bigram_table(4, 1), r) for r in roles_for("sd")}
    with pytest.raises(ValueError, match="shape_to_run"):
        next(iter(decode(lms, [0], DecodeConfig(method="sd", shape="auto"), (), None)))


def test_the_record_says_which_shape_ran_and_why():
    """Rule: a run's record carries the shape that ran (its config) and why (`shape_why`, as the caller priced
    it); an "auto" nobody priced runs the chain and says so."""
    t = tiny_random_triplet(seed=0)
    cfg, why = resolve_shape(DecodeConfig(method="sd", max_new_tokens=6), profile(0.0), takes_trees(t, "sd"))
    r = generate(t, "hello", cfg, shape_why=why)
    assert r.config["shape"] == "tree" and r.shape_why == why and why.startswith("auto: a tree of")
    assert all(s.target_round.parents is not None for s in r.steps)
    r = generate(t, "hello", DecodeConfig(method="sd", max_new_tokens=6))
    assert r.config["shape"] == "chain" and "no cost profile" in r.shape_why
    r = generate(t, "hello", DecodeConfig(method="sd", shape="tree", max_new_tokens=6))
    assert r.config["shape"] == "tree" and r.shape_why == "shape tree, as asked"


def _hybrid(vocab: int) -> torch.nn.Module:
    """A tiny LFM2 (a convolution layer, then attention): an architecture the core forward does not cover, whose HF
    cache holds a convolution state, not keys a tree's mask could select."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    torch.manual_seed(0)
    return Lfm2ForCausalLM(
        Lfm2Config(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            layer_types=["conv", "full_attention"],
        )
    ).eval()


def test_whether_models_take_trees_is_known_before_the_run():
    """Rule: `described` says, without building an LM, what the LM a run builds says (`trees`): the core
    forward and HF's over a cache of keys take a tree, HF's over a convolution state does not; and
    `run.takes_trees` asks it of a method's shaped stage."""
    from transformers import GPT2Config, GPT2LMHeadModel

    t = tiny_random_triplet(seed=0)
    gpt = GPT2LMHeadModel(GPT2Config(vocab_size=t.vocab_size, n_embd=32, n_layer=1, n_head=2)).eval()
    for m in (t.draft, t.target, gpt):
        assert described(m).trees == open_lm(m, t.vocab_size, "x").trees is True
    assert takes_trees(t, "psd_a") and takes_trees(t, "ar")
    hybrid = dataclasses.replace(t, target=_hybrid(t.vocab_size))
    assert described(hybrid.target).trees == open_lm(hybrid.target, t.vocab_size, "x").trees is False
    assert not takes_trees(hybrid, "sd") and takes_trees(hybrid, "ar")  # AR grows no tree
    with pytest.raises(ValueError, match="--shape chain"):
        generate(hybrid, "hello", DecodeConfig(method="sd", shape="tree", max_new_tokens=2))

"""The one forward core (`forward.core`): HF's numbers on every covered family, tree rows as steps along their paths,
rollback as a length move, growth that keeps every written slot, and the mask each row sees."""

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.run import generate
from pyramid_demo.forward.core import CoreLM, visible
from pyramid_demo.forward.lm import HFLM, forward_of, open_lm
from pyramid_demo.forward.weights import covered, weights
from pyramid_demo.models.tiny import tiny_random_triplet

V = 300
SIZE = dict(
    vocab_size=V,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}  # scaling bites at these lengths
IDS = [(i * 37 + 5) % (V - 10) + 3 for i in range(600)]
TOL = 1e-4


def family(name: str, seed: int = 0, init: float = 0.02) -> torch.nn.Module:
    """A tiny random model of one covered family, built from its config."""
    torch.manual_seed(seed)
    if name == "llama3":
        model = LlamaForCausalLM(LlamaConfig(**SIZE, rope_parameters=LLAMA3_ROPE, initializer_range=init))
    elif name == "qwen2":  # q/k/v carry biases; give them values a zero init would hide
        model = Qwen2ForCausalLM(Qwen2Config(**SIZE, initializer_range=init))
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    elif name == "mistral":  # a window shorter than the test sequences, so it is in use
        model = MistralForCausalLM(MistralConfig(**SIZE, sliding_window=8, initializer_range=init))
    else:
        raise ValueError(name)
    return model.eval()


def _passes(lm, n0: int = 20) -> torch.Tensor:
    """Prefill n0 tokens (all logits kept), then a 3-token and a 1-token pass: [n0 + 4, V]."""
    return torch.cat([lm.feed(IDS[:n0], n0), lm.feed(IDS[: n0 + 3], 3), lm.feed(IDS[: n0 + 4], 1)])


@pytest.mark.parametrize("name", ["llama3", "qwen2", "mistral"])
def test_logits_match_hf_on_each_family(name, one_thread):
    """fp32 logits equal HF's within 1e-4 on every covered family: llama3 rope scaling, Qwen2's q/k/v biases,
    Mistral's sliding window, GQA, past the first capacity (a prefill of 300 grows the cache)."""
    model = family(name, init=0.5)  # large weights: a wrong rope, bias or window shows in the logits
    assert covered(model)
    want = _passes(HFLM(model, V, "t"), 300)
    got = _passes(CoreLM(weights(model), V, "t"), 300)
    assert (got - want).abs().max() < TOL


@pytest.mark.parametrize("name", ["llama3", "mistral"])
def test_each_tree_row_scores_as_steps_along_its_path(name, one_thread):
    """A tree pass (rows with their own positions and ancestor masks) gives each row the logits a chain along its
    path gives: a wrong position, a missing or extra ancestor bit shows in some row."""
    model = family(name, init=0.5)
    parents = [-1, 0, 0, 1, 1, 2, 3, -1]  # two roots, a bushy level, a grandchild and a great-grandchild
    tree = IDS[40:48]
    lm = CoreLM(weights(model), V, "t")
    lm.feed(IDS[:30], 1)
    got = lm.forward(tree, 30, parents=parents)  # [8, V]
    for j in range(len(parents)):
        path, k = [], j
        while k >= 0:
            path.append(tree[k])
            k = parents[k]
        ref = HFLM(model, V, "t").feed(IDS[:30] + path[::-1], 1)[0]
        assert (got[j] - ref).abs().max() < TOL, f"row {j}"


def test_a_kept_path_continues_as_a_fresh_chain(one_thread):
    """`keep_path` moves the accepted rows' keys/values to the cache's end: the next token scores as a fresh
    chain over the same tokens (a wrong slot in the gather shows)."""
    model = family("llama3", init=0.5)
    lm = CoreLM(weights(model), V, "t")
    lm.feed(IDS[:30], 1)
    lm.forward(IDS[40:44], 30, parents=[-1, -1, 1, 2])
    assert lm.keep_path([1, 2, 3]) == 33 and lm.ids == IDS[:30] + IDS[41:44]
    got = lm.feed(IDS[:30] + IDS[41:45], 1)
    ref = HFLM(model, V, "t").feed(IDS[:30] + IDS[41:45], 1)
    assert (got - ref).abs().max() < TOL


def test_rollback_moves_a_length(one_thread):
    """After a rejected draft is rolled back and another continuation fed, the logits equal a fresh cache's over
    the same committed sequence, and the cache holds exactly the committed tokens."""
    model = family("mistral", init=0.5)
    lm = CoreLM(weights(model), V, "t")
    lm.feed(IDS[:15], 1)
    lm.feed(IDS[:21], 6)  # a draft of 6, to be partly rejected
    seq = IDS[:17] + IDS[100:108]  # 2 accepted, then another continuation
    lm.rollback(seq)
    assert lm.cache_len == 17 and lm.ids == seq[:17]
    got = lm.feed(seq, 8)
    assert (got - CoreLM(weights(model), V, "t").feed(seq, 8)).abs().max() < TOL
    assert lm.fed == [15, 6, 8] and lm.n_forward == 3


def test_a_tree_level_that_grows_the_cache_keeps_the_earlier_levels_rows(one_thread):
    """A second tree level that crosses the cache's capacity keeps the first level's pending rows: the path kept
    across both levels scores the next token as a fresh chain does (a growth that copies only the committed slots
    leaves zeros there)."""
    model = family("llama3", init=0.2)
    for n in range(250, 260):  # a context after which level 1 fits the cache and level 2 grows it
        lm = CoreLM(weights(model), V, "t")
        lm.feed(IDS[:n], 1)
        cap = lm.capacity
        lm.forward(IDS[n : n + 2], n, parents=[-1, 0])  # level 1: rows 0, 1
        if lm.capacity != cap:
            continue
        lm.forward(IDS[n + 2 : n + 4], n, parents=[1, 2])  # level 2: rows 2, 3
        if lm.capacity > cap:
            break
    else:
        raise AssertionError("no context length made the second level grow the cache")
    assert lm.keep_path([0, 1, 2, 3]) == n + 4
    got = lm.feed(IDS[: n + 5], 1)
    assert (got - CoreLM(weights(model), V, "t").feed(IDS[: n + 5], 1)).abs().max() < TOL


def test_each_row_sees_the_cache_its_ancestors_and_itself():
    """The mask: a one-row step needs none; a chain row sees every slot up to its own; a tree's rows see what
    `seen` names; a sliding window hides cache slots more than `window` positions back."""
    assert visible([9], [9], 10, None) is None
    chain = visible([8, 9], [8, 9], 10, None)
    assert chain.tolist() == [[True] * 9 + [False], [True] * 10]
    seen = torch.tensor([[True, True, True, False], [True, True, False, True]])
    assert visible([2, 3], [2, 2], 4, None, seen.clone()).tolist() == seen.tolist()  # two siblings at position 2
    win = visible([9], [9], 10, 4)
    assert win.tolist() == [[False] * 6 + [True] * 4]
    tree = visible([10, 11], [10, 10], 12, 4, torch.ones(2, 12, dtype=torch.bool), cached=10)
    assert tree.tolist() == [[False] * 7 + [True] * 5] * 2  # the window over the cache; tree slots by ancestry


def test_open_lm_follows_forward_of(one_thread):
    """`open_lm` opens the core forward for a covered architecture (eager without a package) and HF's for the
    rest; `forward_of` says which before any run."""
    t = tiny_random_triplet()
    assert forward_of(t.target) == "eager" and isinstance(open_lm(t.target, t.vocab_size, "target"), CoreLM)
    gpt = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2)).eval()
    assert not covered(gpt) and forward_of(gpt) == "hf"
    assert isinstance(open_lm(gpt, 64, "target"), HFLM)


def test_greedy_ar_matches_hf_generate_and_sd_matches_ar(one_thread):
    """fp32: greedy AR through the engine on the core forward is HF `generate()`'s text token for token, and SD at
    T=0 writes the same text (on this tiny family a many-row pass keeps every argmax)."""
    t = tiny_random_triplet(seed=2)
    prompt = [5, 17, 42, 99, 7]
    out = generate(t, prompt, DecodeConfig(method="ar", max_new_tokens=24), chat=False)
    with torch.inference_mode():
        ref = t.target.generate(
            torch.tensor([prompt]),
            max_new_tokens=24,
            do_sample=False,
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        )
    assert out.token_ids == ref[0, len(prompt) :].tolist()
    assert out.forwards == {"target": "eager"}
    sd = generate(t, prompt, DecodeConfig(method="sd", gamma=4, max_new_tokens=24), chat=False)
    assert sd.token_ids == out.token_ids


def test_growth_keeps_every_slot_and_doubles():
    """`grown`, every cache's one growth: the same tensor while it holds what is needed; else the size doubled
    until it does, every old slot (the last one too) kept in place and the new ones zero."""
    from pyramid_demo.forward.cache import grown

    t = torch.arange(1, 2 * 3 * 4 + 1, dtype=torch.float32).reshape(2, 3, 4)
    assert grown(t, 1, 3) is t
    g = grown(t, 1, 7)
    assert g.shape == (2, 12, 4) and torch.equal(g[:, :3], t) and not g[:, 3:].any()

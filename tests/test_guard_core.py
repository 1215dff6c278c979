"""Guards on the forward core's rules that no other test held (issue 60): HF's numbers on a YaRN-scaled model, a
sliding window's edge (one-row steps, chains and tree rows whose context is window-1, window, window+1 keys), and the
states a verifier publishes after a tree round (the kept path's rows, never the first rows of the pass).

Each test states one rule; each was checked to fail by its assertion with a slip of that rule planted."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from pyramid_demo.core.engine import decode, prefill
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.forward.cache import CacheError, VerifierStates, tap_layers
from pyramid_demo.forward.core import CoreLM, rope_table
from pyramid_demo.forward.feature_lm import FeatureLM
from pyramid_demo.forward.lm import HFLM
from pyramid_demo.forward.weights import covered, weights
from pyramid_demo.models.feature_draft import FeatureDraft

pytestmark = pytest.mark.usefixtures("one_thread")
V, W = 96, 4  # vocabulary; the sliding window (keys a query sees, itself included)
SIZE = dict(
    vocab_size=V,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    initializer_range=0.5,  # large weights: a wrong scale, key or state shows in the logits
)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}
IDS = [(i * 37 + 5) % (V - 3) + 2 for i in range(64)]
TOL = 1e-4


def _yarn(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "llama":
        return LlamaForCausalLM(LlamaConfig(**SIZE, rope_parameters=YARN)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**SIZE, rope_parameters=YARN)).eval()


def _mistral(window: int | None, seed: int = 1) -> MistralForCausalLM:
    torch.manual_seed(seed)
    return MistralForCausalLM(MistralConfig(**SIZE, sliding_window=window)).eval()


@torch.no_grad()
def _hf(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """HF's own uncached forward over ids: the logits after every prefix [n, V]."""
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]


@pytest.fixture(scope="module")
def windowed() -> tuple[MistralForCausalLM, torch.Tensor]:
    """A tiny Mistral with a window of W and HF's logits after every prefix of IDS[:16]; the window is in force
    there (the same weights without it give other logits once a query has more than W keys)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a module fixture runs before `one_thread`
    m = _mistral(W)
    free = _mistral(None)
    free.load_state_dict(m.state_dict())
    ref = _hf(m, IDS[:16])
    assert (ref[:W] - _hf(free, IDS[:16])[:W]).abs().max() < TOL, "within the window both models agree"
    assert (ref[W] - _hf(free, IDS[:16])[W]).abs().max() > 1e-2, "the window hides nothing (a vacuous test)"
    torch.set_num_threads(threads)
    return m, ref


# ---------------------------------------------------------------- rotary scaling


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_yarn_scaled_core_matches_hf(name):
    """Rule: the core's rotary table carries HF's attention scaling (YaRN's attention factor multiplies cos and sin),
    so on a YaRN-scaled model a prefill, a chain, a one-row step and a tree row give HF's logits (within 1e-4)."""
    model = _yarn(name)
    scaling = float(model.model.rotary_emb.attention_scaling)
    assert covered(model) and scaling > 1.05, "no attention scaling to get wrong (a vacuous test)"
    ref = _hf(model, IDS[:40])
    lm = CoreLM(weights(model), V, "t")
    got = torch.cat([lm.feed(IDS[:30], 30), lm.feed(IDS[:33], 3), lm.feed(IDS[:34], 1)])  # [34, V]
    assert (got - ref[:34]).abs().max() < TOL, "the core left HF's YaRN-scaled logits"
    tree = lm.forward([IDS[34], 7, IDS[35]], 34, parents=[-1, -1, 0])  # row 2: IDS[35] after IDS[34]
    assert (tree[2] - ref[35]).abs().max() < TOL and (tree[0] - ref[34]).abs().max() < TOL, "a tree row left HF's"


# ---------------------------------------------------------------- the sliding window's edge


@pytest.mark.parametrize("context", [W - 2, W - 1, W, W + 1, W + 2])
def test_a_one_row_step_at_the_window_edge_matches_hf(windowed, context):
    """Rule: a one-row step sees exactly its last W keys (itself included), as HF's window does: after `context`
    cached tokens (the step's keys: W-1, W, W+1 …) its logits are HF's uncached forward's at that position."""
    m, ref = windowed
    lm = CoreLM(weights(m), V, "t")
    lm.feed(IDS[:context], 1)
    got = lm.feed(IDS[: context + 1], 1)[0]
    assert (got - ref[context]).abs().max() < TOL, f"a one-row step with {context + 1} keys saw another window"


@pytest.mark.parametrize("k", [2, 3])
def test_chain_rows_across_the_window_edge_match_hf(windowed, k):
    """Rule: every row of a prefill and of a k-row chain sees its last W keys: rows whose keys number W-1, W, W+1
    and more give HF's logits, whatever the pass they come in."""
    m, ref = windowed
    for context in range(1, 2 * W):
        lm = CoreLM(weights(m), V, "t")
        pre = lm.feed(IDS[:context], context)  # every prefill row
        got = lm.feed(IDS[: context + k], k)
        assert (pre - ref[:context]).abs().max() < TOL, f"a prefill of {context} rows saw another window"
        assert (got - ref[context : context + k]).abs().max() < TOL, f"a {k}-row chain after {context} saw another"


@pytest.mark.parametrize("context", [W - 1, W, W + 1])
def test_tree_rows_at_the_window_edge_match_hf(windowed, context):
    """Rule: a tree row at position p sees the cached keys of positions > p - W, its ancestors and itself: each row
    of a two-level tree after W-1, W, W+1 cached tokens gives HF's logits over the cache and its path."""
    m, _ = windowed
    tokens, parents = [11, 12, 13, 14], [-1, -1, 0, 1]
    lm = CoreLM(weights(m), V, "t")
    lm.feed(IDS[:context], 1)
    got = lm.forward(tokens, context, parents=parents)
    for j, path in enumerate(([11], [12], [11, 13], [12, 14])):
        want = _hf(m, IDS[:context] + path)[-1]
        assert (got[j] - want).abs().max() < TOL, f"tree row {j} after {context} cached saw another window"


def test_a_kept_path_keeps_slot_order_under_a_sliding_window(windowed):
    """Rule: `keep_path` moves the kept rows' keys to the cache's end in path order (slot = position), so the window
    of later one-row steps, which hides slots by position, hides the right keys: steps whose window edge falls
    inside the kept path (rows 1, 4, 5 of a tree after 6 tokens) give HF's logits over the committed sequence."""
    m, _ = windowed
    lm = CoreLM(weights(m), V, "t")
    lm.feed(IDS[:6], 1)
    lm.forward([11, 12, 13, 14, 15, 16], 6, parents=[-1, -1, 0, 1, 1, 4])
    assert lm.keep_path([1, 4, 5]) == 9
    seq = IDS[:6] + [12, 15, 16] + IDS[20:23]
    ref = _hf(m, seq)
    for pos in range(9, 12):  # windows 6…9, 7…10, 8…11: the edge inside the kept path
        got = lm.feed(seq[: pos + 1], 1)[0]
        assert (got - ref[pos]).abs().max() < TOL, f"the step at {pos} saw the kept keys in another order"


# ---------------------------------------------------------------- the states a verifier publishes


def _llama(seed: int = 0, layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**SIZE, "num_hidden_layers": layers})).eval()


def _kept(keep, arg) -> int:
    """`keep_path` / `keep_along` on arg; a failure to keep the path (rows gathered from the wrong levels, a path
    refused) is this rule's failure, said by an assertion."""
    try:
        return keep(arg)
    except (IndexError, RuntimeError) as e:
        raise AssertionError(f"the kept path's rows could not be kept: {e!r}") from e


def _lm(forward, model):
    """A fresh LM of class `forward` over `model` (the core forward over its core weights)."""
    return forward(weights(model) if forward is CoreLM else model, V, "target")


def _published(forward, model, ids: list[int], taps: tuple[int, ...]) -> torch.Tensor:
    """The states a fresh LM publishes over ids fed as one chain [len(ids), d·(taps + 1)]."""
    lm = _lm(forward, model)
    lm.publish = VerifierStates(taps)
    lm.feed(ids, 1)
    return lm.publish.f[: len(ids)].clone()


@pytest.mark.parametrize("forward", [CoreLM, HFLM])
@pytest.mark.parametrize("wide", [False, True])
def test_a_tree_round_publishes_the_kept_paths_states(forward, wide):
    """Rule: after tree rows are scored, the verifier publishes the states of the rows it keeps, in path order, at
    the positions they take (not the pass's first rows, nor states before a path is kept); a later feed continues
    from there. The kept path here is rows 1, 4, 5 of three tree levels."""
    model = _llama()
    taps = tap_layers(SIZE["num_hidden_layers"]) if wide else ()
    ctx, toks = IDS[:10], [21, 22, 23, 24, 25, 26]
    lm = _lm(forward, model)
    lm.publish = VerifierStates(taps)
    lm.feed(ctx, 1)
    lm.forward(toks[:2], 10, parents=[-1, -1])
    lm.forward(toks[2:5], 10, parents=[0, 1, 1])
    lm.forward(toks[5:], 10, parents=[4])
    assert lm.publish.n == 10, "tree rows were published before any was kept"
    kept = [toks[1], toks[4], toks[5]]
    assert _kept(lm.keep_path, [1, 4, 5]) == 13 and lm.publish.n == 13
    want = _published(forward, model, ctx + kept + [30], taps)
    first = _published(forward, model, ctx + toks[:3], taps)
    assert (want[10:13] - first[10:13]).abs().max() > 1e-2, "the first rows' states equal the kept ones (vacuous)"
    assert torch.allclose(lm.publish.f[:13], want[:13], atol=1e-5), "published states are not the kept path's"
    lm.feed(ctx + kept + [30], 1)
    assert lm.publish.n == 14 and torch.allclose(lm.publish.f[:14], want, atol=1e-5), "a feed after the tree"


def test_one_scoring_pass_publishes_its_unfed_tokens_and_the_kept_branch():
    """Rule: a verifier's scoring pass (its unfed committed tokens as a chain, then the tree on the last of them)
    publishes, once `keep_along` keeps what was accepted, the states of those tokens and of the accepted branch's
    rows only: here the second root's branch, rows 2 + 1 and 2 + 3 of the pass."""
    model = _llama()
    lm = CoreLM(weights(model), V, "target")
    lm.publish = VerifierStates()
    lm.feed(IDS[:8], 1)
    lm.forward(IDS[8:10] + [21, 22, 23, 24], 8, parents=[-1, 0, 1, 1, 2, 3])  # two chain rows, then the tree
    seq = IDS[:10] + [22, 24]
    assert _kept(lm.keep_along, seq) == 12 and lm.ids == seq
    want = _published(CoreLM, model, seq, ())
    assert torch.allclose(lm.publish.f[:12], want, atol=1e-5), "published states are not the kept rows'"


def test_states_published_after_each_tree_round_are_the_committed_tokens():
    """Rule: through a tree SD run, after every step the target has published, at every position it caches, the
    states a chain over the committed tokens gives (what a feature draft reads next round); whole paths two deep
    are accepted on the way (so a kept path beyond the pass's first rows is published)."""
    from pyramid_demo.models.tiny import _noisy_copy

    target = _llama(seed=3)
    draft = _noisy_copy(target, 0.02, torch.Generator().manual_seed(4))
    lms = {"draft": CoreLM(weights(draft), V, "draft"), "target": CoreLM(weights(target), V, "target")}
    lms["target"].publish = VerifierStates()
    prompt = IDS[:6]
    prefill(lms, prompt)
    cfg = DecodeConfig(method="sd", shape="tree", max_new_tokens=16, tree_nodes=6, tree_depth=3, tree_k=2)
    seq, deepest = list(prompt), 0
    for step in decode(lms, prompt, cfg, (), None):
        seq += step.new_tokens
        deepest = max(deepest, step.target_round.n_accepted)
        tg = lms["target"]
        assert tg.ids == seq[:-1] and tg.publish.n == len(tg.ids)
        want = _published(CoreLM, target, tg.ids, ())
        assert torch.allclose(tg.publish.f[: tg.publish.n], want, atol=1e-5), f"step {step.index}: wrong states"
    assert deepest >= 2, "no path two deep was accepted (a vacuous test)"


def test_a_feature_draft_tree_root_reads_the_published_state_before_it():
    """Rule: a feature draft's tree root at position p reads the verifier's published state at p - 1 (as the chain
    row at p does), not its own prediction nor the state at p: with the target's states known, each root's logits
    equal a chain row's over the same token."""
    model = _llama()
    fd = FeatureDraft(model, torch.arange(V)).eval()
    ids = IDS[:12]

    def connected() -> tuple[CoreLM, FeatureLM]:
        tg, dr = CoreLM(weights(model), V, "target"), FeatureLM(fd, V, "draft")
        tg.publish = dr.states = VerifierStates()
        tg.feed(ids, 1)  # the target's states at 0 .. 11
        dr.feed(ids[:10], 1)
        return tg, dr

    _, tree_lm = connected()
    got = tree_lm.forward([ids[10], 40], 10, parents=[-1, -1])
    _, chain_lm = connected()
    want = chain_lm.feed(ids[:11], 1)[0]
    assert torch.allclose(got[0], want, atol=1e-5), "a tree root read another state than the chain row"
    _, other_lm = connected()
    other = other_lm.feed(ids[:10] + [40], 1)[0]
    assert torch.allclose(got[1], other, atol=1e-5), "the second root read another state than its chain row"
    assert not torch.allclose(other, want, atol=1e-3), "both roots give one row (a vacuous test)"


def test_tapped_layers_are_published_normalised_without_a_weight():
    """Rule: a tapped layer's output is published RMS-normalised with no weight (the final norm's weight scales the
    final state only), by the core forward as by HF's: with a final norm weight far from ones, the published wide
    states equal the layers' outputs normalised, then the final normed state, at every position. (Four layers: the
    taps are then inner layers; HF's hidden_states hold no pre-norm output of the last layer.)"""
    model = _llama(layers=4)
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.2, 3.0)
    taps, got = tap_layers(4), {}
    hooks = [
        model.model.layers[i].register_forward_hook(
            lambda m, a, o, i=i: got.__setitem__(i, o[0] if isinstance(o, tuple) else o)
        )
        for i in taps
    ]
    try:
        with torch.no_grad():
            last = model.model(input_ids=torch.tensor([IDS[:12]])).last_hidden_state[0]  # [12, d]
    finally:
        for h in hooks:
            h.remove()
    eps = model.config.rms_norm_eps
    want = torch.cat(
        [*(got[i][0] * torch.rsqrt(got[i][0].pow(2).mean(-1, keepdim=True) + eps) for i in taps), last], -1
    )
    for forward in (CoreLM, HFLM):
        pub = _published(forward, model, IDS[:12], taps)
        assert torch.allclose(pub, want, atol=1e-5), f"{forward.__name__} published other wide states"


def test_a_states_write_overwrites_its_tail_and_forgets_past_it():
    """Rule: the published states hold positions 0 … n-1; a write of k states at pos ≤ n puts them at pos … pos+k-1
    and n becomes pos + k (a shorter rewrite forgets what lay past it); a write past n is refused."""
    ts = VerifierStates()
    a, b = torch.arange(300.0)[:, None].expand(300, 3), -torch.ones(4, 3)
    ts.write(0, a[:200])
    ts.write(150, b)
    assert ts.n == 154, "a rewrite at 150 must leave 154 known states"
    assert torch.equal(ts.f[:150], a[:150]) and torch.equal(ts.f[150:154], b)
    ts.write(154, a[:150])  # grows past the first capacity: the known states kept
    assert ts.n == 304 and torch.equal(ts.f[:150], a[:150]) and torch.equal(ts.f[154:304], a[:150])
    with pytest.raises(CacheError):
        ts.write(306, b)


def test_the_feature_drafts_rotary_table_is_the_cores():
    """Rule: the feature draft rotates with the core forward's own table for its target (same frequencies, same
    positions, no extra scale): on a plain-RoPE target its cos and sin equal the core's, row for row."""
    model = _llama()
    fd = FeatureDraft(model, torch.arange(V))
    lm = CoreLM(weights(model), V, "target")
    cos, sin = rope_table(fd.inv_freq, 40, torch.float32)
    assert torch.equal(cos, lm.cos[:40]) and torch.equal(sin, lm.sin[:40]), "the draft rotates by another table"

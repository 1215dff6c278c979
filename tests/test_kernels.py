"""Kernel choice: the target keeps fp32 arithmetic, a choice is timed once per CPU and cached, trials leave no
trace, and the copy's kinds are said in words."""
from __future__ import annotations

import torch

from pyramid_demo.forward.packed import PackedLinear
from pyramid_demo.models import kernels
from pyramid_demo.models.quant import Fp16Linear, Int4Linear


def _small_llama() -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    from pyramid_demo.models.tiny import tiny_config

    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_config(320)).eval()


def test_a_choice_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch) -> None:
    """_pick times every option the first time, keeps the fastest, and later answers from the cache alone."""
    monkeypatch.setenv("PYRAMID_DEMO_PROBE_CACHE", str(tmp_path))
    calls = []

    def measure(o: str) -> float:
        calls.append(o)
        return {"a": 3.0, "b": 1.0, "c": 2.0}[o]

    assert kernels._pick("cpu|k", ["a", "b", "c"], measure) == "b" and calls == ["a", "b", "c"]
    assert kernels._pick("cpu|k", ["a", "b", "c"], measure) == "b" and calls == ["a", "b", "c"]


def test_the_target_keeps_fp32_and_trials_are_undone(tmp_path, monkeypatch) -> None:
    """The target's configurations are fp32 only (default or oneDNN); each trial restores the model, and only the
    chosen configuration stays."""
    monkeypatch.setenv("PYRAMID_DEMO_PROBE_CACHE", str(tmp_path))
    m = _small_llama()
    seen = []

    def fake_time(model, vocab, *_, **__):
        kinds = {type(x).__name__ for x in model.modules() if isinstance(x, torch.nn.Linear | PackedLinear)}
        seen.append(kinds)
        assert not any(isinstance(x, Fp16Linear | Int4Linear) for x in model.modules()), "target must stay fp32"
        return {frozenset({"Linear"}): 2.0, frozenset({"Linear", "PackedLinear"}): 3.0,
                frozenset({"PackedLinear"}): 1.0}[frozenset(kinds)]

    monkeypatch.setattr(kernels, "time_forward", fake_time)
    assert kernels.choose_target(m, 320) == "onednn"
    assert seen == [{"Linear"}, {"Linear", "PackedLinear"}, {"PackedLinear"}], "each trial starts from the model"
    assert isinstance(m.lm_head, PackedLinear) and isinstance(m.model.layers[0].mlp.down_proj, PackedLinear)


def test_the_copy_takes_the_faster_format(tmp_path, monkeypatch) -> None:
    """quantized_copy keeps whichever of its int4 and fp16 forms ran faster, and says which in words."""
    monkeypatch.setenv("PYRAMID_DEMO_PROBE_CACHE", str(tmp_path))
    m = _small_llama()
    monkeypatch.setattr(kernels, "time_forward",
                        lambda model, vocab, *_, **__: 1.0 if "Int4Linear" in model.quant_kinds else 2.0)
    c = kernels.quantized_copy(m, 32)
    assert isinstance(c.model.layers[0].self_attn.q_proj, Int4Linear)
    assert kernels.label(c, None) == kernels.LABELS["int4"]
    monkeypatch.setenv("PYRAMID_DEMO_PROBE_CACHE", str(tmp_path / "other"))
    monkeypatch.setattr(kernels, "time_forward",
                        lambda model, vocab, *_, **__: 2.0 if "Int4Linear" in model.quant_kinds else 1.0)
    c = kernels.quantized_copy(m, 32)
    assert isinstance(c.model.layers[0].self_attn.q_proj, Fp16Linear)
    assert kernels.label(c, None) == kernels.LABELS["fp16"]


def test_a_model_on_onednn_can_still_be_copied_and_cast() -> None:
    """A target whose linears were put on oneDNN deep-copies into plain linears (the probe casts such a copy to
    another dtype; oneDNN's packed tensor itself cannot be copied), computing the same outputs."""
    import copy

    m = _small_llama()
    x = torch.tensor([[5, 9, 11]])
    with torch.no_grad():
        ref = m(x).logits
    kernels._swap(m, "all")
    c = copy.deepcopy(m)
    assert type(c.lm_head) is torch.nn.Linear and isinstance(m.lm_head, PackedLinear)
    with torch.no_grad():
        assert torch.allclose(c(x).logits, ref, atol=1e-4)
    assert c.to(torch.bfloat16).lm_head.weight.dtype == torch.bfloat16


def test_a_cache_key_names_depth_vocabulary_dtype_and_version(tmp_path, monkeypatch) -> None:
    """Two models alike but for their number of layers, vocabulary or source dtype get different kernel-choice keys
    (target and copy alike), and a choice cached under an older key version is not reused: it is timed anew."""
    from pyramid_demo.models.tiny import tiny_config

    monkeypatch.setenv("PYRAMID_DEMO_PROBE_CACHE", str(tmp_path))
    base = tiny_config(320)
    deeper, wider_vocab = tiny_config(320), tiny_config(640)
    deeper.num_hidden_layers = 3
    f32 = torch.float32
    keys = {kernels.shape_key(base, f32), kernels.shape_key(deeper, f32), kernels.shape_key(wider_vocab, f32),
            kernels.shape_key(base, torch.bfloat16)}
    assert len(keys) == 4, "configs differing in layers, vocabulary or dtype share a key"
    assert kernels._copy_key(base, f32, 32) != kernels._copy_key(deeper, f32, 32)
    calls = []
    monkeypatch.setattr(kernels, "KEY_VERSION", kernels.KEY_VERSION - 1)
    kernels._pick(kernels._copy_key(base, f32, 32), ["int4", "fp16"], lambda o: calls.append(o) or 1.0)
    assert kernels.copy_format(base, f32, 32) == "int4"
    monkeypatch.undo()
    monkeypatch.setenv("PYRAMID_DEMO_PROBE_CACHE", str(tmp_path))
    assert kernels.copy_format(base, f32, 32) is None, "an entry under an old key version was read"
    got = kernels._pick(kernels._copy_key(base, f32, 32), ["int4", "fp16"],
                        lambda o: calls.append(o) or {"int4": 2.0, "fp16": 1.0}[o])
    assert got == "fp16" and calls == ["int4", "fp16", "int4", "fp16"], "an old version's choice was reused"


def test_the_label_names_the_heads_own_format(monkeypatch) -> None:
    """An int4 copy whose head could not take fp16 weights (no fbgemm) is labelled with an int4 head: the label
    reads the head it holds, not the format it would hold elsewhere."""
    from pyramid_demo.models import quant

    m = _small_llama()
    monkeypatch.setattr(quant, "fp16_available", lambda: False)
    c = quant.int4_copy(m, 32)
    assert isinstance(c.get_output_embeddings(), Int4Linear)
    assert kernels.label(c, None) == "int4 weights, int4 head"
    monkeypatch.setattr(quant, "fp16_available", lambda: True)
    assert kernels.label(quant.int4_copy(m, 32), None) == kernels.LABELS["int4"]

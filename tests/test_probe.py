"""The probe's choice as a typed record (no display text in a key, none parsed back), an old cache read
gracefully, and a lean forward that does not apply shown instead of claimed."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from helpers import clear_loaded
from transformers import GPT2Config, GPT2LMHeadModel

from pyramid_demo.models import loading, probe
from pyramid_demo.models.tiny import tiny_random_triplet

RECORD = {"exact": True, "top1": True, "passes": 3, "bitwise_passes": 3, "max_abs_diff": 0.0, "max_k": 65,
          "pad_rows": 2}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYRAMID_DEMO_PROBE_CACHE", str(tmp_path))
    monkeypatch.setenv("PYRAMID_DEMO_PROBE", "1")
    return tmp_path


def _choice(**kw) -> probe.Choice:
    base = dict(dtype="bfloat16", backend="packed", how="probe", timings_ms={"bfloat16/packed/lean": {"1": 9.5}},
                probe_s=3.0, exactness={"bfloat16/packed/lean": RECORD}, path="lean")
    return probe.Choice(**{**base, **kw})


def test_a_cached_choice_round_trips_its_fields_and_its_display_is_derived(cache):
    """Rule: the cache holds fields (dtype, backend, path, timings, exactness), never a display string; what a
    user reads is derived from them, and the summary carries no probe timings for a handler to cut off."""
    got = probe.remember("fam", _choice())
    entry = json.loads((cache / probe.CHOICE_FILE).read_text())[f"{probe.machine_key()} | fam"]
    assert entry["format"] == probe.FORMAT and not any("chosen by" in str(v) for v in entry.values())
    back = probe.cached_choice("fam")
    assert back is not None and back.how == "cached"
    assert (back.dtype, back.backend, back.path, back.timings_ms, back.exactness) == \
        (got.dtype, got.backend, got.path, got.timings_ms, got.exactness)
    assert back.exact and back.pad_rows == 2
    assert back.summary.startswith("bfloat16, oneDNN, weights packed once, lean forward (chosen by this machine's")
    assert "k=1" not in back.summary and " — " not in back.summary and "k=1 9.5 ms" in back.note


def test_an_old_cache_entry_is_probed_again(cache):
    """Rule: an entry written before typed records (no format) is not trusted: `choose` probes again and
    rewrites it in the current format."""
    key = f"{probe.machine_key()} | fam"
    old = {"dtype": "float32", "backend": "default", "path": "hf", "exactness": {"float32/default/hf": RECORD}}
    (cache / probe.CHOICE_FILE).write_text(json.dumps({key: old}))
    assert probe.cached_choice("fam") is None
    probed = []

    def fake_probe(target, vocab, check_all=False):
        probed.append(vocab)
        return _choice()

    t = tiny_random_triplet()
    mp = pytest.MonkeyPatch()
    mp.setattr(probe.policy, "probe_target", fake_probe)
    try:
        got = probe.choose("fam", torch.device("cpu"), None, None, lambda: (t.target, t.vocab_size))
    finally:
        mp.undo()
    assert probed == [t.vocab_size] and got.dtype == "bfloat16"
    assert json.loads((cache / probe.CHOICE_FILE).read_text())[key]["format"] == probe.FORMAT
    (cache / probe.CHOICE_FILE).write_text("{not json")  # an unreadable file is no cache, not an error
    assert probe.cached_choice("fam") is None


def test_a_view_key_holds_no_display_text(cache):
    """Rule: the loaded family's view is keyed by the choice's fields: two choices that differ only in
    wording (timings shown in the note) share one view; a different record gives another."""
    a, b = _choice(), _choice(timings_ms={"bfloat16/packed/lean": {"1": 99.0}})
    assert a.note != b.note and a.identity == b.identity
    assert all(not isinstance(x, str) or "chosen by" not in x for x in a.identity)
    c = _choice(exactness={"bfloat16/packed/lean": {**RECORD, "exact": False}})
    assert c.identity != a.identity


def test_the_policy_flag_device_off_and_cached_paths(cache, monkeypatch):
    """The decision, path by path: a dtype flag (path lean on a CPU, the cached record's exactness), a GPU or
    placed family (its device's default, no probe), the probe off, a cached choice; a backend flag on top."""
    no_load = lambda: pytest.fail("loaded to probe")  # noqa: E731
    probe.remember("fam", _choice())
    flag = probe.choose("fam", torch.device("cpu"), torch.bfloat16, None, no_load)
    assert (flag.how, flag.path, flag.exact) == ("flag", "lean", None)  # bfloat16/default/lean was not measured
    assert probe.choose("fam", torch.device("cpu"), torch.bfloat16, "packed", no_load).exact
    placed = probe.choose("fam", torch.device("cpu"), None, None, no_load, placed=True)
    assert (placed.dtype, placed.how, placed.path) == ("float32", "device", "hf")
    cached = probe.choose("fam", torch.device("cpu"), None, "no-onednn", no_load)
    assert (cached.dtype, cached.backend, cached.how) == ("bfloat16", "no-onednn", "flag")
    monkeypatch.setenv("PYRAMID_DEMO_PROBE", "0")
    assert probe.choose("fam", torch.device("cpu"), None, None, no_load).how == "off"


def _gpt2(vocab: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=32, n_layer=1, n_head=2, n_positions=256)).eval()


def test_a_lean_forward_that_does_not_apply_is_shown_not_claimed(cache, monkeypatch):
    """Rule: where the lean forward does not cover a model, the loaded family's path says what runs (HF's
    forward where it covers none) and its choice note, shown in the family box, the CLI and the race, names
    the role and architecture; where it covers every model, nothing is said."""
    from pyramid_demo.forward.lm import CachedLM, open_lm

    tiny = tiny_random_triplet()
    gpt = _gpt2(tiny.vocab_size)
    monkeypatch.setattr(loading, "_load", lambda *a, **k: tiny_random_triplet())
    clear_loaded()
    try:
        covered = loading.load_triplet("tiny-random", device="cpu", dtype="float32")
        assert covered.path == "lean" and "does not cover" not in covered.choice_note
        monkeypatch.setattr(loading, "_load", lambda *a, **k: dataclasses.replace(
            tiny_random_triplet(), draft=gpt, qualifier=gpt, target=gpt))
        clear_loaded()
        none = loading.load_triplet("tiny-random", device="cpu", dtype="float32")
        assert none.path == "hf", "the lean forward covers no model here, yet the family claims it"
        assert "does not cover" in none.choice_note and "GPT2LMHeadModel" in none.choice_note
        assert isinstance(open_lm(none.target, none.vocab_size, "target", path=none.path), CachedLM)
    finally:
        clear_loaded()
    mixed = probe.forward_for(_choice(), {"draft": gpt, "qualifier": tiny.qualifier, "target": tiny.target})
    assert mixed.path == "lean" and mixed.uncovered == {"draft": "GPT2LMHeadModel"}
    assert "HF's forward for the draft (GPT2LMHeadModel)" in mixed.summary


def test_a_probe_of_an_uncovered_target_names_it(cache, monkeypatch):
    """The probe times only HF's forward for a target the lean forward does not cover, and its cached choice
    (what the family box shows) says so."""

    class Timer:
        def __init__(self, model, vocab, backend, context=100, path="hf"):
            assert path == "hf"

        def time(self, k):
            return 0.001 * k

    monkeypatch.setattr(probe.search, "make_timer", Timer)
    monkeypatch.setattr(probe.search, "candidates", lambda: [("float32", "default")])
    monkeypatch.setattr(probe.search, "check_model", lambda *a, **k: RECORD)
    gpt = _gpt2(64)
    got = probe.remember("fam", probe.probe_target(gpt, 64))
    assert got.path == "hf" and got.uncovered == {"target": "GPT2LMHeadModel"}
    shown = probe.cached_choice("fam")
    assert shown is not None and "the lean forward does not cover" in shown.summary


def test_a_choice_made_at_one_thread_is_not_reused_at_two(cache):
    """Rule: the cache is keyed by everything that changes the numerics, the thread count included (torch's CPU
    attention and MKL split work by threads and round by each thread's scratch), and every entry carries what it
    was measured under: a choice probed at 1 thread is neither found nor trusted at 2, even filed under the
    2-thread key (a shared cache folder, an older writer), and the probe runs again."""
    before = torch.get_num_threads()
    probed: list[int] = []

    def fake_probe(target, vocab, check_all=False):
        probed.append(torch.get_num_threads())
        return _choice()

    t = tiny_random_triplet()
    mp = pytest.MonkeyPatch()
    mp.setattr(probe.policy, "probe_target", fake_probe)
    try:
        torch.set_num_threads(1)
        one = probe.choose("fam", torch.device("cpu"), None, None, lambda: (t.target, t.vocab_size))
        key_one = probe.machine_key()
        assert probe.cached_choice("fam") is not None
        torch.set_num_threads(2)
        key_two = probe.machine_key()
        assert key_two != key_one and "2 threads" in key_two
        assert probe.cached_choice("fam") is None, "a 1-thread choice was found at 2 threads"
        entries = json.loads((cache / probe.CHOICE_FILE).read_text())
        (cache / probe.CHOICE_FILE).write_text(json.dumps({**entries, f"{key_two} | fam": entries[f"{key_one} | fam"]}))
        assert probe.cached_choice("fam") is None, "an entry measured at 1 thread was trusted at 2"
        two = probe.choose("fam", torch.device("cpu"), None, None, lambda: (t.target, t.vocab_size))
        assert probed == [1, 2] and two.how == "probe"
        assert (one.numerics["threads"], two.numerics["threads"]) == (1, 2)
        assert two.identity != one.identity, "a loaded view of the 1-thread choice would be reused at 2 threads"
        back = probe.cached_choice("fam")
        assert back is not None and back.numerics == probe.numerics()
    finally:
        mp.undo()
        torch.set_num_threads(before)


def test_the_numerics_name_the_instruction_sets_and_an_older_format_is_probed_again(cache):
    """Rule: the key names the CPU's instruction sets (a VM of the same model name may hide AVX-512) and the
    kernels torch dispatches to; an entry of format 5 (before the numerics were kept) is not trusted."""
    n = probe.numerics()
    assert set(n) == {"cpu", "isa", "capability", "torch", "threads"}
    assert all(str(v) in probe.machine_key() for k, v in n.items() if k != "threads")
    entry = {**_choice().to_entry(), "format": 5}
    assert probe.Choice.from_entry(entry) is None
    assert probe.Choice.from_entry({**entry, "format": probe.FORMAT}) is not None
    assert probe.Choice.from_entry({**entry, "format": probe.FORMAT, "attention": "batched?"}) is None


def test_the_lean_attention_is_part_of_the_choice(cache):
    """Rule: the lean attention the records were measured on ("rows" where the batched one failed its check) is
    cached with the choice, kept by a --dtype flag that reuses the record, and part of a view's identity."""
    rows = probe.remember("fam", _choice(attention="rows"))
    back = probe.cached_choice("fam")
    assert back is not None and back.attention == "rows" and back.identity != _choice().identity
    t = tiny_random_triplet()
    flagged = probe.choose("fam", torch.device("cpu"), torch.bfloat16, None, lambda: (t.target, t.vocab_size))
    assert flagged.how == "flag" and flagged.attention == rows.attention


def test_a_compiled_forward_is_not_a_probe_candidate_yet(cache):
    """Pinned refusal (docs/how-it-works.md, "Exactness"): a compiled (inductor) forward rounds unlike the eager
    one, so it may run only as its own probed candidate, which does not exist yet; a cache entry naming any
    forward but HF's or the lean one is not trusted and the family is probed again."""
    entry = _choice().to_entry()
    assert probe.Choice.from_entry(entry) is not None
    for path in ("compiled", "aot", "inductor"):
        assert probe.Choice.from_entry({**entry, "path": path}) is None, path
    assert all(b in ("default", "packed", "onednn", "no-onednn") for _, b in probe.CANDIDATES)

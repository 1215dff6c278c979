"""Exactness is measured, never assumed: the probe rejects a batch-variant backend, padding repairs it,
and under the probe's choice SD and the lossless cascade write AR's text on the real offline target."""
from __future__ import annotations

import json

import pytest
import torch

from pyramid_demo.core.config import DecodeConfig
from pyramid_demo.forward.attention import use_rowwise
from pyramid_demo.forward.lm import CachedLM
from pyramid_demo.forward.packed import available as packed_available
from pyramid_demo.forward.packed import invariant_pad, rows_invariant
from pyramid_demo.models.probe import exactness
from pyramid_demo.models.tiny import tiny_random_triplet

PLAN = ((12, (2, 3, 5, 9)), (20, (2, 4)))


class BatchVariant(torch.nn.Module):
    """A fake kernel: a one-row call rounds its result up by one ulp, as a GEMV path might, while calls
    of two or more rows do not; `min_rows` pads calls as `forward.packed.PackedLinear` does."""

    def __init__(self, linear: torch.nn.Linear, min_rows: int = 1):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.in_features, self.out_features, self.min_rows = linear.in_features, linear.out_features, min_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        rows = flat.shape[0]
        if rows < self.min_rows:
            flat = torch.cat([flat, flat.new_zeros(self.min_rows - rows, self.in_features)])
        y = torch.nn.functional.linear(flat, self.weight, self.bias)
        if flat.shape[0] == 1:
            y = torch.nextafter(y, torch.full_like(y, float("inf")))
        return y[:rows].reshape(*x.shape[:-1], self.out_features)


def _swap(model: torch.nn.Module, min_rows: int) -> torch.nn.Module:
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, BatchVariant(child, min_rows))
    return model


def _exact_base(seed: int = 7) -> tuple[torch.nn.Module, int]:
    """A tiny target that is exact as it is: bf16, row-wise attention, run with oneDNN off."""
    t = tiny_random_triplet(seed=seed)
    model = t.target.to(torch.bfloat16)
    assert use_rowwise(model)
    return model, t.vocab_size


def _record(min_rows: int | None) -> dict:
    model, vocab = _exact_base()
    if min_rows:
        _swap(model, min_rows)
    return exactness.check_model(lambda: CachedLM(model, vocab, "target", "no-onednn"), vocab, PLAN, min_rows or 1)


def test_a_batch_variant_linear_is_not_exact(one_thread):
    """A linear whose one-row result differs in the last bit makes k-token passes differ from steps:
    the record says not exact, where the same model with plain linears is exact."""
    assert _record(None)["exact"]
    rec = _record(1)
    assert rec["exact"] is False and rec["bitwise_passes"] < rec["passes"] == 6
    assert rec["max_abs_diff"] > 0 and rec["max_k"] == 9


def test_padding_makes_the_batch_variant_linear_exact(one_thread):
    """Padding every call to two rows makes the fake kernel batch-invariant: `invariant_pad` finds 2,
    and the model passes every pass-versus-steps check bitwise."""
    lin = torch.nn.Linear(16, 8)
    assert not rows_invariant(BatchVariant(lin, 1), 9)
    assert invariant_pad([lin], 9, pack=BatchVariant) == 2
    rec = _record(2)
    assert rec["exact"] and rec["bitwise_passes"] == rec["passes"] and rec["max_abs_diff"] == 0.0


def test_the_probe_picks_the_fastest_exact_candidate():
    """Speed decides only among exact candidates; with none exact, among those whose top-1 always matched."""
    from pyramid_demo.models.probe import pick

    fast, slow = {"1": 10.0, "5": 12.0}, {"1": 14.0, "5": 40.0}
    exact, near, off = {"exact": True, "top1": True}, {"exact": False, "top1": True}, {"exact": False, "top1": False}
    assert pick({"a": fast, "b": slow}, {"a": near, "b": exact}) == "b"
    assert pick({"a": fast, "b": slow}, {"a": off, "b": near}) == "b"
    assert pick({"a": fast, "b": slow}, {"a": exact, "b": exact}) == "a"


def test_the_probe_rejects_a_batch_variant_backend(tmp_path, monkeypatch, one_thread):
    """End to end through `choose`: the faster candidate runs a batch-variant linear, so the probe picks
    the slower exact one, caches its record, and says which claim holds; a cached choice without an
    exactness record is probed again."""
    from pyramid_demo.models import probe

    monkeypatch.setenv("PYRAMID_DEMO_PROBE_CACHE", str(tmp_path))
    monkeypatch.setenv("PYRAMID_DEMO_PROBE", "1")
    monkeypatch.setattr(probe.search, "EXACT_PLAN", PLAN)
    monkeypatch.setattr(probe.search, "candidates", lambda: [("float32", "default"), ("bfloat16", "no-onednn")])

    def candidate(target, dt, backend):  # fp32 "fast" but batch-variant; the other exact
        model, _ = _exact_base()
        return (_swap(model, 1), 1) if dt == "float32" else (model, 1)

    monkeypatch.setattr(probe.search, "open_lm", lambda m, v, r, b, path: CachedLM(m, v, r, "no-onednn"))
    monkeypatch.setattr(probe.search, "supports_lean", lambda m: False)

    class Timer:
        def __init__(self, model, vocab, backend, context=100, path="hf"):
            self.fast = any(isinstance(m, BatchVariant) for m in model.modules())

        def time(self, k):
            return 0.001 if self.fast else 0.01

    monkeypatch.setattr(probe.search, "candidate_model", candidate)
    monkeypatch.setattr(probe.search, "make_timer", Timer)
    key = f"{probe.machine_key()} | fam"
    (tmp_path / probe.CHOICE_FILE).write_text(json.dumps({key: {"dtype": "float32", "backend": "default"}}))
    t = tiny_random_triplet()
    got = probe.choose("fam", torch.device("cpu"), None, None, lambda: (t.target, t.vocab_size))
    assert got.how == "probe" and (got.dtype, got.backend, got.path) == ("bfloat16", "no-onednn", "hf") and got.exact
    assert got.exactness["float32/default/hf"]["exact"] is False
    assert got.note.startswith("bfloat16") and "exact: " in got.note
    cached = probe.choose("fam", torch.device("cpu"), None, None, lambda: pytest.fail("probed again"))
    assert cached.how == "cached" and cached.exact and cached.record == got.record
    flagged = probe.choose("fam", torch.device("cpu"), torch.float32, None, lambda: pytest.fail("probed"))
    assert flagged.path == "lean" and flagged.exact is None and "not checked" in flagged.exact_note


def test_claims_follow_the_record():
    """What users read comes from the record: exact, top-1 only, or not checked."""
    assert exactness.describe({"exact": True, "top1": True, "passes": 3, "bitwise_passes": 3,
                               "max_abs_diff": 0.0, "max_k": 65}).startswith("exact: ")
    near = exactness.describe({"exact": False, "top1": True, "passes": 3, "bitwise_passes": 0,
                               "max_abs_diff": 6e-5, "max_k": 65})
    assert near.startswith("not bitwise exact") and "near-ties" in near
    assert "not checked" in exactness.describe(None)


@pytest.fixture(scope="module")
def probed_offline(tmp_path_factory):
    """The offline family loaded under this machine's probe (run afresh, in a scratch cache)."""
    from pyramid_demo.models import loading

    mp = pytest.MonkeyPatch()
    mp.setenv("PYRAMID_DEMO_PROBE_CACHE", str(tmp_path_factory.mktemp("probe")))
    mp.setenv("PYRAMID_DEMO_PROBE", "1")
    try:
        yield loading.load_triplet("smollm2-offline", device="cpu")
    finally:
        mp.undo()


@pytest.mark.slow
def test_lossless_methods_equal_ar_on_the_real_target_under_the_probe(probed_offline):
    """On this CPU, under the dtype and backend the probe chose, SD and PSD_A with an exact stage 2 write
    AR's text at T=0, token for token (2 prompts × 32 tokens), whenever the probe says the choice is exact;
    the triplet carries the probe's record."""
    from pyramid_demo.core.run import generate

    t = probed_offline
    assert t.exact is not None and t.exact_note and t.exact_note in t.choice_note
    if t.backend == "packed" and packed_available(torch.bfloat16):
        assert t.exact, "packed oneDNN with the probe's padding should be exact on a CPU that offers it"
    if not t.exact:
        pytest.skip(f"the probe found no exact candidate here: {t.exact_note}")
    for prompt in ("Explain in two sentences why the sky is blue.", "Write a haiku about a lighthouse."):
        outs = {}
        for method, kw in (("ar", {}), ("sd", {}), ("psd_a", {"stage2": "sd"})):
            cfg = DecodeConfig(method=method, max_new_tokens=32, gamma=4, l_d=3, l_q=8, **kw)
            outs[method] = generate(t, prompt, cfg).token_ids
        assert outs["sd"] == outs["ar"] and outs["psd_a"] == outs["ar"]


@pytest.mark.skipif(not packed_available(torch.bfloat16), reason="this CPU's oneDNN does not run bf16")
def test_real_packed_linears_are_invariant_with_the_padding_found():
    """On this CPU, packed bf16 linears of the offline target's shapes (the MLP down projection among
    them) padded to the row count `invariant_pad` finds give every row as a one-row call does."""
    from pyramid_demo.forward.packed import PackedLinear

    g = torch.Generator().manual_seed(0)
    lins = [torch.nn.Linear(i, o, bias=False).to(torch.bfloat16) for i, o in ((576, 576), (576, 1536), (1536, 576))]
    for lin in lins:
        lin.weight.data = (0.05 * torch.randn(lin.weight.shape, generator=g)).to(torch.bfloat16)
    pad = invariant_pad(lins, 40)
    assert pad is not None
    assert all(rows_invariant(PackedLinear(lin, pad), 40) for lin in lins)


def test_a_check_given_values_that_are_only_close_fails():
    """Rule: exactness is bitwise (`torch.equal`), never a tolerance: a pass whose last row is one ulp from the
    step's (allclose by any standard) is not exact, for chain passes, tree passes and the attention check alike."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from mock_lm import BigramLM, bigram_table

    class OneUlpOff(BigramLM):
        def _run(self, tokens, pos, keep):
            z = super()._run(tokens, pos, keep)  # [keep, V]
            if keep > 1:  # a multi-row pass: its last row one ulp up
                z[-1] = torch.nextafter(z[-1], torch.full_like(z[-1], float("inf")))
            return z

        def _run_tree(self, rows, base, pos):
            z = super()._run_tree(rows, base, pos)  # [n, V]
            z[-1] = torch.nextafter(z[-1], torch.full_like(z[-1], float("inf")))
            return z

    table = bigram_table(40, seed=3)
    ids = [(5 * i + 1) % 40 for i in range(60)]
    exact = exactness.summarise(exactness.pass_vs_steps(BigramLM(table), ids, 10, (2, 5)))
    assert exact["exact"], "the bigram is exact as it is (else this test is vacuous)"
    checks = exactness.pass_vs_steps(OneUlpOff(table), ids, 10, (2, 5))
    assert all(c["top1"] and 0 < c["max_abs_diff"] < 1e-5 for c in checks), "the rows are only close"
    assert not any(c["bitwise"] for c in checks) and not exactness.summarise(checks)["exact"]
    trees = [{**c, "kind": "tree"} for c in exactness.tree_passes(OneUlpOff(table), ids, 10, (17,))]
    assert trees and not exactness.summarise(trees)["trees"]["exact"]
    assert exactness.summarise([{**c, "kind": "tree"} for c in exactness.tree_passes(BigramLM(table), ids, 10,
                                                                                    (17,))])["trees"]["exact"]
    close = {"k": 5, "context": 10, "bitwise": False, "top1": True, "max_abs_diff": 1e-7, "kind": "attention"}
    rec = exactness.summarise([{**c, "kind": "chain"} for c in exactness.pass_vs_steps(BigramLM(table), ids, 10,
                                                                                      (2,))] + [close])
    assert not rec["exact"] and not rec["attention"]["exact"] and "attention kernel" in exactness.describe(rec)

"""The feature draft's pass against its recorded outputs: what it predicted before any rewrite of its forward, on the
same inputs (a prefill fed the target's states, steps fed its own predictions, a tree). Recorded once with
`RECORD_DRAFT=1 pytest tests/test_draft_record.py -m ''`; a rewrite that changes what the draft computes fails here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from pyramid_demo.core.engine import prefill
from pyramid_demo.forward.lm import open_lm
from pyramid_demo.models.feature_draft import FeatureDraft
from pyramid_demo.models.tiny import tiny_random_triplet

DATA = Path(__file__).resolve().parent / "data"
RECORD = os.environ.get("RECORD_DRAFT") == "1"
pytestmark = pytest.mark.usefixtures("one_thread")


def _scenario(draft, target, vocab: int, ids: list[int]) -> torch.Tensor:
    """Every logit row the draft gives in one run-shaped sequence of calls [rows, V]: after a prefill (23 rows fed
    the target's states), 4 rows re-fed after a rollback, three one-row steps past the target (fed its own
    predictions), the target's next pass (the predicted rows go stale, re-read with its states), then a 4-row tree."""
    lms = {"draft": open_lm(draft, vocab, "draft"), "target": open_lm(target, vocab, "target")}
    prefill(lms, ids[:24])  # 23 rows each
    d, t = lms["draft"], lms["target"]
    d.truncate(20)
    rows = [d.forward(ids[20:24], 20, 4)]
    rows += [d.forward([ids[i]], i, 1) for i in range(24, 27)]  # each reads the state it predicted at i - 1
    t.forward(ids[23:28], 23, 1)  # the target's states up to 27
    assert d.truncate(27) == 24, "the rows fed predicted states were kept"
    rows.append(d.feed(ids[:28], 4))
    rows.append(d.forward(ids[28:32], 28, parents=[-1, 0, 0, 1]))
    return torch.cat(rows)


def _check(name: str, got: torch.Tensor, top: int | None = None, atol: float = 1e-4) -> None:
    """Full rows for a tiny vocabulary; the `top` best (ids and logits) of each row for a real one."""
    path = DATA / name
    finite = torch.where(torch.isfinite(got), got, torch.zeros_like(got))
    if top is None:
        now = {"logits": finite, "inf": ~torch.isfinite(got)}
    else:
        val, idx = got.topk(top, -1)
        now = {"logits": val, "ids": idx}
    if RECORD:
        DATA.mkdir(exist_ok=True)
        torch.save(now, path)
    was = torch.load(path)
    for key, want in was.items():
        have = now[key]
        if want.dtype == torch.bool or not want.is_floating_point():
            assert torch.equal(have, want), f"{name}: {key} differs from the recording"
        else:
            assert torch.allclose(have, want, atol=atol, rtol=1e-4), (name, float((have - want).abs().max()))


def test_a_seeded_draft_predicts_what_it_predicted_before() -> None:
    """Rule: over a tiny target, a draft with seeded weights (its layer and fc moved off their initial copy) gives
    the recorded logits on every row of the scenario, -inf outside its token subset included."""
    t = tiny_random_triplet(seed=0)
    g = torch.Generator().manual_seed(5)
    fd = FeatureDraft(t.target, torch.arange(0, t.vocab_size, 2))
    with torch.no_grad():
        for p in fd.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    fd.eval()
    ids = torch.randint(3, t.vocab_size, (40,), generator=g).tolist()
    _check("draft_seeded.pt", _scenario(fd, t.target, t.vocab_size, ids))


@pytest.mark.slow
def test_the_shipped_draft_predicts_what_it_predicted_before(offline_cache) -> None:
    """Rule: the shipped draft over the bundled target gives the recorded best 8 tokens and logits on every row of
    the scenario (its weights load as they are)."""
    from pyramid_demo.models.loading import load_triplet

    t = load_triplet("smollm2-offline", device="cpu")
    text = (
        "The quick brown fox jumps over the lazy dog. Then it runs into the forest, past the old mill and the river, "
        "and hides under a tall oak tree until the farmer has gone home for the night."
    )
    ids = t.tokenizer(text)["input_ids"][:32]
    assert len(ids) == 32
    _check("draft_shipped.pt", _scenario(t.draft, t.target, t.vocab_size, ids), top=8, atol=2e-3)

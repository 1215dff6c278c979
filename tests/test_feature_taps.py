"""A draft that reads several of the target's layers (EAGLE-3): what every forward publishes for it, what it reads,
and that a fresh fuse starts as the one-layer draft it was initialised from."""

import dataclasses

import pytest
import torch

from pyramid_demo.core.engine import connect
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.run import generate
from pyramid_demo.forward.cache import VerifierStates, tap_layers, tap_norm
from pyramid_demo.forward.core import CoreLM
from pyramid_demo.forward.lm import HFLM, open_lm
from pyramid_demo.forward.weights import weights
from pyramid_demo.models.feature_draft import FeatureDraft, file_taps
from pyramid_demo.models.tiny import tiny_random_triplet
from training import feature_train as ft
from training.lean_batch import states

pytestmark = pytest.mark.usefixtures("one_thread")


def _expected(target, ids: list[int]) -> torch.Tensor:
    """[the tapped layers' outputs, RMS-normalised ; the final normed state] at every position [n, 3·d], read
    through hooks on the HF layers (not through any of the forwards under test)."""
    taps, got = tap_layers(target.config.num_hidden_layers), {}
    hooks = [
        target.model.layers[i].register_forward_hook(
            lambda m, a, o, i=i: got.__setitem__(i, o[0] if isinstance(o, tuple) else o)
        )
        for i in taps
    ]
    try:
        with torch.no_grad():
            last = target.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    finally:
        for h in hooks:
            h.remove()
    eps = target.config.rms_norm_eps
    return torch.cat([*(tap_norm(got[i][0], eps) for i in taps), last], -1)


@pytest.mark.parametrize("forward", [HFLM, CoreLM])
def test_every_forward_publishes_the_tapped_layers_a_reader_asks_for(forward):
    """With a reader that wants taps, the target's forward (HF's and the core one) hands out the tapped layers'
    normalised outputs before its final normed state, at every position; without, the final state alone."""
    t = tiny_random_triplet(seed=0)
    ids = [(5 * i + 2) % (t.vocab_size - 1) + 1 for i in range(14)]
    want = _expected(t.target, ids)
    d = t.target.config.hidden_size
    model = weights(t.target) if forward is CoreLM else t.target  # the core forward runs over the core's weights
    lm = forward(model, t.vocab_size, "target")
    lm.publish = VerifierStates(tap_layers(t.target.config.num_hidden_layers))
    lm.forward(ids[:10], 0, 1)
    lm.forward(ids[10:], 10, 1)
    assert lm.publish.f.shape[1] == 3 * d
    assert torch.allclose(lm.publish.f[:14], want, atol=1e-5), "a tapped layer is not the one the draft reads"
    plain = forward(model, t.vocab_size, "target")
    plain.publish = VerifierStates()
    plain.forward(ids, 0, 1)
    assert torch.allclose(plain.publish.f[:14], want[:, -d:], atol=1e-5)


def test_training_states_are_the_published_ones():
    """The states training reads (`lean_batch.states` with taps) are what the forward publishes at run time."""
    t = tiny_random_triplet(seed=0)
    seqs = [[(3 * i + 1) % (t.vocab_size - 1) + 1 for i in range(n)] for n in (9, 15)]
    got = states(t.target, seqs, taps=tap_layers(t.target.config.num_hidden_layers))
    for s, f in zip(seqs, got):
        assert torch.allclose(f, _expected(t.target, s), atol=1e-5)


def test_a_wide_batch_puts_the_taps_before_the_final_state():
    """collate(wide): row i of f_prev is [aux at i-1 ; f at i-1], row 0 zeros; f_true is the final state alone."""
    g = torch.Generator().manual_seed(0)
    r = {
        "ids": torch.arange(1, 8),
        "n_prompt": 3,
        "f": torch.randn(6, 4, generator=g),
        "aux": torch.randn(6, 8, generator=g),
    }
    b = ft.collate([r], wide=True)
    assert b["f_prev"].shape == (1, 6, 12) and b["f_true"].shape == (1, 6, 4)
    assert torch.equal(b["f_prev"][0, 0], torch.zeros(12))
    assert torch.equal(b["f_prev"][0, 3], torch.cat((r["aux"][2], r["f"][2])))
    assert torch.equal(b["f_true"][0], r["f"])


def test_a_fresh_fuse_drafts_what_its_one_layer_init_drafts_and_reads_the_taps():
    """A draft with taps, started from a one-layer draft (fuse reads the final state only), proposes the same
    tokens under SD at T=0; during the run the target hands it wide states, and its fuse reads them."""
    t = tiny_random_triplet(seed=0)
    L, d = t.target.config.num_hidden_layers, t.target.config.hidden_size
    one = FeatureDraft(t.target, torch.arange(t.vocab_size)).eval()
    wide = FeatureDraft(t.target, torch.arange(t.vocab_size), taps=tap_layers(L)).eval()
    wide.load_state_dict(one.state_dict(), strict=False)
    widths: list[int] = []
    reduce = wide.reduce
    wide.reduce = lambda f: (widths.append(f.shape[-1]), reduce(f))[1]  # type: ignore[method-assign]
    cfg = DecodeConfig(method="sd", gamma=3, max_new_tokens=24)
    a = generate(dataclasses.replace(t, draft=one), "a b c", cfg)
    b = generate(dataclasses.replace(t, draft=wide), "a b c", cfg)
    assert b.token_ids == a.token_ids
    assert a.stats.proposed == b.stats.proposed and a.stats.accepted == b.stats.accepted, "it drafted otherwise"
    assert 3 * d in widths, "the draft never read the target's tapped layers"
    lms = {"draft": open_lm(wide, t.vocab_size, "draft"), "target": open_lm(t.target, t.vocab_size, "target")}
    connect(lms)
    assert lms["target"].publish.taps == tap_layers(L)


def test_a_saved_draft_keeps_its_taps(tmp_path):
    """A saved draft with taps loads back with them (fuse included); a one-layer draft refuses its file."""
    t = tiny_random_triplet(seed=0)
    L = t.target.config.num_hidden_layers
    wide = FeatureDraft(t.target, torch.arange(t.vocab_size), taps=tap_layers(L))
    with torch.no_grad():
        wide.fuse_w.normal_()
    p = tmp_path / "d.safetensors"
    wide.save(p)
    assert file_taps(p) == tap_layers(L)
    back = FeatureDraft(t.target, torch.arange(t.vocab_size), taps=file_taps(p)).load(p)
    assert torch.allclose(back.fuse_w, wide.fuse_w.half().float())
    with pytest.raises(ValueError):
        FeatureDraft(t.target, torch.arange(t.vocab_size)).load(p)
    with pytest.raises(ValueError):
        FeatureDraft(t.target, torch.arange(t.vocab_size), taps=(0, 0, 1))


def test_the_run_time_cache_reads_the_taps_as_training_does():
    """With a trained-looking fuse (random), rows the run-time cache feeds the target's wide states predict what
    the training forward's first pass predicts on the wide batch: the fuse reads the taps, in the same order."""
    t = tiny_random_triplet(seed=0)
    L = t.target.config.num_hidden_layers
    wide = FeatureDraft(t.target, torch.arange(t.vocab_size), taps=tap_layers(L)).eval()
    with torch.no_grad():
        wide.fuse_w.normal_(std=0.05)
    ids = [(5 * i + 2) % (t.vocab_size - 1) + 1 for i in range(14)]
    f = _expected(t.target, ids)[:-1]  # [13, 3·d] the states at 0 .. 12
    d = t.target.config.hidden_size
    with torch.no_grad():  # the layer input of row 4, spelled out: fc([fuse · wide state at 3 ; E(x_4)])
        want = torch.nn.functional.linear(torch.cat((wide.fuse_w @ f[3], wide.embed[ids[4]])), wide.fc_w, wide.fc_b)
        assert torch.allclose(wide.inputs(f[3:4], torch.tensor([ids[4]]))[0], want, atol=1e-5), "fuse skipped"
    b = ft.collate([{"ids": torch.tensor(ids), "n_prompt": 2, "f": f[:, -d:], "aux": f[:, :-d]}], wide=True)
    with torch.no_grad():
        (p1,) = wide.forward_train(b["f_prev"], b["tokens"])
    lms = {"draft": open_lm(wide, t.vocab_size, "draft"), "target": open_lm(t.target, t.vocab_size, "target")}
    connect(lms)
    lms["target"].forward(ids[:13], 0, 1)
    lms["draft"].forward(ids[:13], 0, 1)
    assert torch.allclose(lms["draft"].pred[:13], p1[0, :13], atol=1e-5), "the run reads other states than training"

"""The offline family's shape on tiny models, through the production decode: a feature draft over its verifier's
states, the target's own int4 copy as qualifier, the target. The text at T=0 is AR's, the draft's tokens pass, and
what the draft reads is its verifier's states at the kept path's rows. (The same family through real compiled
packages costs a minute of compiling: `test_compiled.py`'s slow test.)"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_feature_draft import trained  # noqa: F401 - the fixture: a feature draft fitted briefly to the tiny target

from pyramid_demo.core import engine
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.run import generate
from pyramid_demo.forward.cache import VerifierStates
from pyramid_demo.forward.lm import open_lm
from pyramid_demo.forward.weights import weights
from pyramid_demo.models.quant import int4_copy

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def family(trained):  # noqa: F811 - the imported fixture
    """draft: the feature draft; qualifier: the target's int4 copy (group 32); target: the tiny target. With a
    prompt from the text the draft was fitted to (so its guesses pass)."""
    t, recs = trained
    return dataclasses.replace(t, qualifier=int4_copy(t.target, 32).eval()), recs[2]["ids"][:4].tolist()


def _spy(monkeypatch) -> dict:
    """The models of the next run, once the engine has linked the draft to the states it reads."""
    seen: dict = {}
    real = engine.connect

    def connect(lms):
        real(lms)
        seen.update(lms)

    monkeypatch.setattr(engine, "connect", connect)
    return seen


@pytest.mark.parametrize("method", ["sd", "psd_a"])
def test_the_offline_shape_writes_ars_text_and_its_draft_passes(family, method: str):
    """Rule: at T=0, SD and lossless PSD_A over the offline family's shape write AR's text token for token, and the
    feature draft's tokens pass their verifier (the check is not vacuous)."""
    family, prompt = family
    ar = generate(family, prompt, DecodeConfig(method="ar", max_new_tokens=24))
    cfg = DecodeConfig(method=method, stage2="sd", gamma=4, l_d=2, l_q=4, shape="chain", max_new_tokens=24)
    out = generate(family, prompt, cfg)
    assert out.token_ids == ar.token_ids
    verifier = "qualifier" if method == "psd_a" else "target"
    assert out.stats.accepted[verifier] > 0


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_in_a_pyramid_the_draft_reads_the_qualifiers_states_at_the_kept_rows(family, monkeypatch, shape: str):
    """Rule: in a pyramid the feature draft reads the states its verifier publishes, the qualifier's (not the
    target's), and after every round, chain or tree, those states are the qualifier's own at the kept path's
    positions: equal to a fresh pass of the qualifier over the text it holds."""
    family, prompt = family
    lms = _spy(monkeypatch)
    cfg = DecodeConfig(
        method="psd_a", stage2="sd", l_d=2, l_q=4, shape=shape, tree_nodes=6, tree_depth=3, tree_k=2, max_new_tokens=24
    )
    out = generate(family, prompt, cfg)
    draft, qualifier = lms["draft"], lms["qualifier"]
    assert draft.states is not None and draft.states is qualifier.publish and lms["target"].publish is None
    states = draft.states
    n = states.n
    assert n >= len(out.prompt_ids) + len(out.token_ids) // 2  # the run moved the states along
    fresh = open_lm(family.qualifier, family.vocab_size, "qualifier")
    fresh.publish = VerifierStates(states.taps)
    fresh.forward(list(qualifier.ids[:n]), 0, 1)
    assert list(qualifier.ids[:n]) == (list(out.prompt_ids) + list(out.token_ids))[:n]
    assert torch.allclose(states.f[:n], fresh.publish.f[:n], atol=1e-4), (
        (states.f[:n] - fresh.publish.f[:n]).abs().max()
    )


@pytest.mark.slow
def test_the_offline_shape_decodes_through_real_compiled_packages(family, monkeypatch, tmp_path):
    """Rule: with the target's and the int4 qualifier's compiled packages built for this CPU (a minute for tiny
    models, so in this tier), a run opens them, PSD_A and SD at T=0 still write AR's text, and the states the
    qualifier's package publishes for the draft are the eager pass's at the kept rows (within float rounding)."""
    from pyramid_demo.forward import compiled
    from pyramid_demo.forward.core import CoreLM
    from pyramid_demo.models.loading import planned

    family, prompt = family
    monkeypatch.setenv("PYRAMID_DEMO_CACHE", str(tmp_path))
    for model in (family.target, family.qualifier):
        ok, note = compiled.ensure(model, compiled.fingerprint(model))
        assert ok, note
    family = planned(family)  # the plan a load makes now that the packages exist
    assert family.forwards["target"] == family.forwards["qualifier"] == "compiled"
    ar = generate(family, prompt, DecodeConfig(method="ar", max_new_tokens=24))
    for method, shape in (("sd", "chain"), ("psd_a", "chain"), ("psd_a", "tree")):
        lms = _spy(monkeypatch)
        cfg = DecodeConfig(method=method, stage2="sd", l_d=2, l_q=4, shape=shape, tree_nodes=6, max_new_tokens=24)
        out = generate(family, prompt, cfg)
        assert out.token_ids == ar.token_ids, (method, shape)
        assert out.forwards["target"] == "compiled" and set(out.forwards.values()) <= {"compiled", "feature"}
        role = "qualifier" if method == "psd_a" else "target"
        verifier, n = lms[role], lms[role].publish.n
        eager = CoreLM(weights(family.model(role)), family.vocab_size, role)  # the core pass without its package
        eager.publish = VerifierStates(verifier.publish.taps)
        eager.forward(list(verifier.ids[:n]), 0, 1)
        assert torch.allclose(verifier.publish.f[:n], eager.publish.f[:n], atol=1e-3), (method, shape)

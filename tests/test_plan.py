"""The family's plan is the only word on what runs: decided once at load (`loading.planned`), held by the triplet,
read by every run; no module-level table keyed by model objects, no attribute added to a framework's module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from helpers import saved_tiny_models

from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.run import generate
from pyramid_demo.forward.weights import weights
from pyramid_demo.models import loading

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = [*sorted((ROOT / "pyramid_demo").rglob("*.py")), ROOT / "app.py"]


def _framework_attrs(model: torch.nn.Module) -> dict[str, set[str]]:
    """Each framework module of `model` (transformers', torch's) by name -> its instance attributes."""
    return {
        name: set(vars(m))
        for name, m in model.named_modules()
        if type(m).__module__.startswith(("transformers.", "torch."))
    }


def test_no_module_level_table_is_keyed_by_model_objects() -> None:
    """Rule: the product keeps nothing about a model in a weak-keyed table of its own (what a model runs lives in
    its family's plan); a planted `weakref.WeakKeyDictionary()` anywhere in the product fails this test."""
    found = []
    for path in PRODUCT:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute | ast.Name) and "WeakKeyDictionary" in ast.unparse(node):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found


def test_loading_a_family_adds_no_attribute_to_its_framework_modules(tmp_path, monkeypatch, one_thread) -> None:
    """Rule: loading a custom family whose qualifier is the target's int4 copy, deciding its plan and running it
    leaves every transformers/torch module of the three models with the attributes transformers gives a model it
    loads (the int4 swap replaces layers with the project's own; it marks no framework module)."""
    from transformers import LlamaForCausalLM

    paths = saved_tiny_models(tmp_path, "dt")
    monkeypatch.setattr(loading, "_CACHE", {})
    t = loading.load_triplet(f"{paths[0]},target@int4,{paths[1]}", device="cpu", dtype="float32")
    generate(t, "Hello there", DecodeConfig(method="psd_a", max_new_tokens=6))
    fresh = _framework_attrs(LlamaForCausalLM.from_pretrained(paths[1]))  # as transformers itself leaves it
    for role in ("draft", "qualifier", "target"):
        got = _framework_attrs(t.model(role))
        extra = {n: sorted(a - fresh[n]) for n, a in got.items() if n in fresh and a - fresh[n]}
        assert not extra, f"{role}: attributes added to framework modules: {extra}"
    assert set(t.plan) == {"draft", "qualifier", "target"} and t.gguf is None  # folders, not a GGUF


def test_a_run_reports_the_forwards_its_family_planned(monkeypatch) -> None:
    """Rule: a run's record names the forwards of its family's plan (not re-derived from the models): a plan that
    says "hf" for a core model is what the record says, and what the run opened."""
    from dataclasses import replace

    from pyramid_demo.forward.lm import Forward
    from pyramid_demo.models.tiny import tiny_random_triplet

    t = tiny_random_triplet()
    planned = replace(
        t,
        plan={
            r: Forward("eager", "planned", weights=weights(t.model(r)), model=t.model(r))
            for r in ("draft", "qualifier", "target")
        },
    )
    out = generate(planned, "Hello", DecodeConfig(method="sd", max_new_tokens=4))
    assert out.forwards == {"draft": "eager", "target": "eager"}
    planned = replace(
        t,
        plan={
            **planned.plan,
            "draft": Forward("lookup-like", "a plan's own word", weights=weights(t.draft), model=t.draft),
        },
    )
    out = generate(planned, "Hello", DecodeConfig(method="sd", max_new_tokens=4))
    assert out.forwards["draft"] == "lookup-like", "the record re-derived the draft's forward from its model"


def test_the_family_record_is_found_by_the_plans_names_without_hashing_again(tmp_path, monkeypatch) -> None:
    """Rule: where this cache holds a record, the load hashes each core model's weights once into its plan (`stem`);
    looking the family's record up afterwards (the family box, every render) reads the plan and hashes nothing."""
    from pyramid_demo.forward import compiled
    from pyramid_demo.models import runtime
    from pyramid_demo.models.tiny import tiny_random_triplet

    monkeypatch.setenv("PYRAMID_DEMO_CACHE", str(tmp_path))
    runtime.write("another family's record", {"checks": {}})
    t = loading.planned(tiny_random_triplet())
    assert all(t.plan[r].stem for r in ("draft", "qualifier", "target")), "the load left a core model unnamed"
    runtime.write(runtime.family_key(t), {"checks": {"target": {"exact": True}}})
    monkeypatch.setattr(compiled, "fingerprint", lambda m: pytest.fail("the weights were hashed again"))
    assert runtime.family_record(t) == {"checks": {"target": {"exact": True}}, "format": runtime.FORMAT}


def test_a_model_swapped_into_a_family_is_described_again() -> None:
    """Rule: the plan belongs to the models it was made for: a model swapped into a family (`dataclasses.replace`)
    runs the forward its own kind names, never the entry of the model it replaced; the others keep theirs."""
    from dataclasses import replace

    from pyramid_demo.forward.lm import Forward
    from pyramid_demo.forward.lookup import LookupLM, PromptLookup
    from pyramid_demo.models.tiny import tiny_random_triplet

    t = tiny_random_triplet()
    planned = replace(
        t,
        plan={
            r: Forward("eager", "planned", weights=weights(t.model(r)), model=t.model(r))
            for r in ("draft", "qualifier", "target")
        },
    )
    swapped = replace(planned, draft=PromptLookup(3))
    assert swapped.forward("draft").kind == "lookup" and not swapped.forward("draft").trees
    assert isinstance(swapped.open("draft"), LookupLM)
    assert swapped.forward("target") is planned.forward("target"), "an unchanged role lost its plan's entry"


def test_a_core_forwards_entry_carries_its_weights() -> None:
    """Rule: a plan entry that runs the core pass (eager or compiled) holds the core's view of its model's weights,
    built once: one without them is refused where it is written, not when a run opens it."""
    import pytest

    from pyramid_demo.forward.lm import Forward

    for kind in ("eager", "compiled"):
        with pytest.raises(ValueError, match="weights"):
            Forward(kind, "no weights")
    assert Forward("hf").weights is None and Forward("lookup").weights is None

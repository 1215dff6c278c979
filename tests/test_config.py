"""Bad arguments raise a clear error naming the problem, before any model runs."""

import pytest

from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.run import prepare_prompt
from pyramid_demo.models.tiny import tiny_random_triplet


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"method": "beam"}, "unknown method 'beam'"),
        ({"divergence": "hellinger"}, "unknown divergence 'hellinger'"),
        ({"fallback": "maybe"}, "unknown fallback"),
        ({"gamma": -1}, "gamma must be an integer from 1 to 64"),
        ({"l_d": 0}, "l_d must be an integer from 1 to 64"),
        ({"l_q": 1000}, "l_q must be an integer from 1 to 64"),
        ({"l_d": 8, "l_q": 4}, "l_d (8) must not exceed l_q (4)"),
        ({"tau_q": -0.1}, "tau_q must be a number ≥ 0"),
        ({"tau_t": float("nan")}, "tau_t must be a number ≥ 0"),
        ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer"),
        ({"max_new_tokens": -5}, "max_new_tokens must be a positive integer"),
        ({"temperature": -1.0}, "temperature must be between 0 and 10"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
    ],
)
def test_bad_settings_name_the_problem(kwargs, message):
    with pytest.raises(ValueError) as e:
        DecodeConfig(**kwargs)
    assert message in str(e.value)


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_triplet()


@pytest.mark.parametrize(
    "prompt,message",
    [("", "the prompt is empty"), ("   \n", "the prompt is empty"), ("x" * 30_000, "the limit is 20,000")],
)
def test_bad_prompts_name_the_problem(tiny, prompt, message):
    with pytest.raises(ValueError, match=message):
        prepare_prompt(tiny, prompt, DecodeConfig())


def test_prompt_beyond_context_names_the_sizes(tiny):
    """A prompt that leaves no room for the new tokens says how long it is and what the context is."""
    with pytest.raises(ValueError, match=r"the prompt is \d+ tokens.*context of 1024 tokens"):
        prepare_prompt(tiny, "yes " * 1000, DecodeConfig(max_new_tokens=64))


def test_every_setting_has_one_row_and_every_method_one_spec():
    """Adding a setting is one DecodeConfig field plus one row in core.settings; a method is one row
    in core.methods. The tables must cover the dataclass exactly."""
    from dataclasses import fields

    from pyramid_demo.core.methods import METHOD_LABELS, METHODS, TABLE, lossless, method_spec
    from pyramid_demo.core.settings import SETTINGS, TUNABLE

    assert {f.name for f in fields(DecodeConfig)} - {"method"} == {s.name for s in SETTINGS}
    assert set(TUNABLE) <= {s.name for s in SETTINGS}
    d = DecodeConfig()
    for s in SETTINGS:
        assert s.widget in ("slider", "number", "radio", "") and (s.widget != "slider" or len(s.range) == 3)
        assert not s.choices or getattr(d, s.name) in s.choices
    assert METHODS == tuple(m.key for m in TABLE) and set(METHODS) <= set(METHOD_LABELS)
    for m in TABLE:
        assert m.roles[-1] == "target" and set(m.lengths + m.thresholds) <= {s.name for s in SETTINGS}
    assert [m for m in METHODS if lossless(m)] == ["ar", "sd"] and lossless("psd_a", "sd")
    assert not lossless("fsd") and not lossless("psd_f", "sd")
    with pytest.raises(ValueError, match="unknown method 'beam'"):
        method_spec("beam")


@pytest.mark.parametrize(
    "old,new", [("sd_tree", "sd"), ("fsd_tree", "fsd"), ("psd_a_tree", "psd_a"), ("psd_f_tree", "psd_f")]
)
def test_retired_tree_keys_are_refused_naming_the_shape_setting(old, new):
    """Rule: the retired tree keys are refused in one line that names the new setting, wherever a key enters
    (the table, DecodeConfig: the app and the API build one)."""
    from pyramid_demo.core.methods import method_spec

    want = f"method '{old}' is now method '{new}' with shape 'tree' (--method {new} --shape tree)"
    for make in (lambda: method_spec(old), lambda: DecodeConfig(method=old)):
        with pytest.raises(ValueError) as e:
            make()
        assert str(e.value) == want and "\n" not in str(e.value)


def test_shape_is_validated():
    """Rule: a shape is chain, tree or auto (the default), and nothing else."""
    assert DecodeConfig().shape == "auto"
    for ok in ("chain", "tree", "auto"):
        assert DecodeConfig(shape=ok).shape == ok
    with pytest.raises(ValueError, match="unknown shape 'bush'"):
        DecodeConfig(shape="bush")


def test_every_method_row_lists_what_it_reads():
    """Rule: a method is its row: its stages chain from the draft to the target (each stage's verifier proposes to
    the next), and every setting it reads is a DecodeConfig field with a row in `core.settings` (the pyramids read
    ℓ_D, which also caps a tree's depth)."""
    from dataclasses import fields

    from helpers import reads

    from pyramid_demo.core.methods import TABLE, method_spec
    from pyramid_demo.core.settings import BY_NAME

    names = {f.name for f in fields(DecodeConfig)}
    for m in TABLE:
        assert set(reads(m)) <= names and set(reads(m)) <= set(BY_NAME), (m.key, set(reads(m)) - set(BY_NAME))
        for a, b in zip(m.stages, m.stages[1:]):
            assert a.verifier == b.proposer, m.key
        assert m.roles[-1] == "target" and (not m.stages or m.roles[0] == "draft")
    for key in ("psd_a", "psd_f"):
        assert "l_d" in reads(method_spec(key)) and "tree_depth" in reads(method_spec(key))
    assert reads(method_spec("sd")).count("gamma") == 1 and "tau_t" not in reads(method_spec("sd"))
    assert "shape" not in reads(method_spec("ar"))


def test_a_race_lane_says_what_it_runs():
    """Rule: a race's lanes are rows, not parsed keys: each method once, or side by side each proposing method as
    a chain and as a tree (AR once); every lane key has a label and names its method and shape in `LANES`."""
    from pyramid_demo.core.methods import LANES, METHOD_LABELS, METHODS, lanes

    assert [lane.key for lane in lanes()] == list(METHODS) and all(lane.shape is None for lane in lanes())
    side = lanes(True)
    assert [(lane.method, lane.shape) for lane in side] == [("ar", None)] + [
        (m, s) for m in METHODS[1:] for s in ("chain", "tree")
    ]
    assert len({lane.key for lane in side}) == len(side) and set(LANES) >= {lane.key for lane in side}
    assert all(LANES[lane.key] == lane and lane.key in METHOD_LABELS for lane in side)

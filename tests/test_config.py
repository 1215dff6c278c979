"""Bad arguments raise a clear error naming the problem, before any model runs."""
import pytest

from pyramid_demo.core.config import DecodeConfig
from pyramid_demo.core.run import prepare_prompt
from pyramid_demo.models.tiny import tiny_random_triplet


@pytest.mark.parametrize("kwargs,message", [
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
])
def test_bad_settings_name_the_problem(kwargs, message):
    with pytest.raises(ValueError) as e:
        DecodeConfig(**kwargs)
    assert message in str(e.value)


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_triplet()


@pytest.mark.parametrize("prompt,message", [("", "the prompt is empty"), ("   \n", "the prompt is empty"),
                                            ("x" * 30_000, "the limit is 20,000")])
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

    from pyramid_demo.core.config import METHOD_LABELS, METHODS
    from pyramid_demo.core.methods import TABLE, lossless, method_spec
    from pyramid_demo.core.settings import SETTINGS, TUNABLE

    assert {f.name for f in fields(DecodeConfig)} - {"method"} == {s.name for s in SETTINGS}
    assert set(TUNABLE) <= {s.name for s in SETTINGS}
    d = DecodeConfig()
    for s in SETTINGS:
        assert s.widget in ("slider", "number", "radio", "") and (s.widget != "slider" or len(s.range) == 3)
        assert not s.choices or getattr(d, s.name) in s.choices
    assert METHODS == tuple(m.key for m in TABLE) and set(METHOD_LABELS) == set(METHODS)
    for m in TABLE:
        assert m.roles[-1] == "target" and set(m.lengths + m.thresholds) <= {s.name for s in SETTINGS}
    assert [m for m in METHODS if lossless(m)] == ["ar", "sd", "sd_tree"] and lossless("psd_a", "sd")
    assert lossless("psd_a_tree", "sd") and not lossless("fsd_tree")
    with pytest.raises(ValueError, match="unknown method 'beam'"):
        method_spec("beam")

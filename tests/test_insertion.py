"""The insertion test: a qualifier earns its place only when the pyramid beats the best SD on the profile."""

import pytest

from pyramid_demo.predict import insertion

# a profile where a step of k tokens costs the target 10 + k ms, the draft 1 ms and the qualifier 3 ms per token
PROFILE = {
    "ms": {
        "target": {k: 10.0 + k for k in range(1, 18)},
        "draft": {k: 1.0 * k for k in range(1, 18)},
        "qualifier": {k: 3.0 * k for k in range(1, 18)},
    }
}


def test_a_qualifier_that_agrees_no_better_than_the_draft_does_not_earn_its_place():
    """Same acceptance for the draft and the qualified block: the qualifier only adds cost."""
    ins = insertion.insertion(PROFILE, 0.5, 0.9, 0.5)
    assert ins["earns"] is False
    assert ins["without"]["tokens_per_s"] > ins["with"]["tokens_per_s"]


def test_a_qualifier_that_agrees_far_better_earns_its_place():
    """A qualifier the target accepts at 0.95 (the draft: 0.3) makes the pyramid the faster choice."""
    ins = insertion.insertion(PROFILE, 0.3, 0.9, 0.95)
    assert ins["earns"] is True
    assert ins["cost_qualifier"] == pytest.approx(3 / 11)
    assert "**yes**" in insertion.markdown(ins)


def test_without_a_pyramid_measured_there_is_no_verdict():
    """One acceptance missing: no verdict, and the text says what to race."""
    ins = insertion.insertion(PROFILE, 0.5, None, None)
    assert ins["earns"] is None and "Race SD and a pyramid" in insertion.markdown(ins)


def test_a_draft_the_qualifier_rarely_passes_does_not_earn_its_level():
    """The qualifier passes the draft at 0.1 and the target takes the qualifier's tokens at 0.95: drafting with
    the qualifier alone is faster, and the text says so with both figures."""
    ins = insertion.insertion(PROFILE, 0.1, 0.1, 0.95)
    assert ins["draft_earns"] is False
    assert ins["qualifier_alone"]["tokens_per_s"] > ins["with"]["tokens_per_s"]
    text = insertion.markdown(ins)
    assert "**Does the draft earn its level?** **no**" in text
    assert f"{ins['qualifier_alone']['tokens_per_s']:.1f} tok/s" in text and "α 0.10" in text


# a qualifier whose k-token pass costs little more than its step (3 + 0.3·k ms), a draft at 0.5 ms a token
CHEAP_PASS = {
    "ms": {
        **PROFILE["ms"],
        "draft": {k: 0.5 * k for k in range(1, 18)},
        "qualifier": {k: 3.0 + 0.3 * k for k in range(1, 18)},
    }
}


def test_a_draft_the_qualifier_mostly_passes_earns_its_level():
    """A draft passing a qualifier with cheap passes at 0.9: the pyramid beats the qualifier alone; the same
    draft passing at 0.1 does not."""
    assert insertion.insertion(CHEAP_PASS, 0.1, 0.1, 0.95)["draft_earns"] is False
    ins = insertion.insertion(CHEAP_PASS, 0.6, 0.9, 0.95)
    assert ins["draft_earns"] is True
    assert ins["with"]["tokens_per_s"] > ins["qualifier_alone"]["tokens_per_s"]
    assert "**Does the draft earn its level?** **yes**" in insertion.markdown(ins)

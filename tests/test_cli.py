"""`python -m pyramid_demo generate`: one JSON object per run, clear errors for bad input."""

import json

import pytest

from pyramid_demo.cli import main
from pyramid_demo.core.methods import METHODS

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("method", METHODS)
def test_generate_json_for_every_method(method, capsys):
    """--json prints valid JSON holding text, token_ids, stats and steps."""
    rc = main(
        [
            "generate",
            "--models",
            "tiny-random",
            "--method",
            method,
            "--prompt",
            "hello",
            "--max-new-tokens",
            "32",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and {"text", "token_ids", "stats", "steps"} <= out.keys()
    assert len(out["token_ids"]) == 32 and out["stats"]["method"] == method


def test_generate_json_says_how_it_ran(capsys, tmp_path, monkeypatch):
    """Rule: --json carries the dtype the run used, what each role runs and why, and whether its passes are exact
    as this machine's record says: null where nothing was measured (never assumed), the record's verdict and its
    sentence once setup recorded one for these weights."""
    from helpers import clear_loaded

    from pyramid_demo.models import runtime
    from pyramid_demo.models.loading import load_triplet

    monkeypatch.setenv("PYRAMID_DEMO_CACHE", str(tmp_path))
    argv = [
        "generate",
        "--models",
        "tiny-random",
        "--method",
        "sd",
        "--prompt",
        "hello",
        "--max-new-tokens",
        "4",
        "--dtype",
        "bfloat16",
        "--json",
    ]
    clear_loaded()
    try:
        assert main(argv) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["dtype"] == "bfloat16" and out["forwards"] == {"draft": "eager", "target": "eager"}
        assert "target: the core pass, eager" in out["runs"] and out["exact"] is None
        t = load_triplet("tiny-random", device="cpu", dtype="bfloat16")
        record = {
            "exact": True,
            "top1": True,
            "passes": 7,
            "bitwise_passes": 7,
            "max_abs_diff": 0.0,
            "max_k": 17,
            "trees": None,
        }
        runtime.write(runtime.family_key(t), {"checks": {"target": record}})
        clear_loaded()
        assert main(argv) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["exact"] is True and out["exact_note"].startswith("exact: a verification pass of up to 17")
    finally:
        clear_loaded()


def test_generate_summary_is_coloured(capsys):
    """Without --json: a readable summary with ANSI colours and the tokens/s line."""
    assert (
        main(["generate", "--models", "tiny-random", "--method", "sd", "--prompt", "hi", "--max-new-tokens", "8"]) == 0
    )
    out = capsys.readouterr().out
    assert "\033[" in out and "tok/s" in out


@pytest.mark.parametrize(
    "args,message",
    [
        (["--prompt", ""], "the prompt is empty"),
        (["--prompt", "hi", "--tau-t", "-1"], "tau_t must be a number ≥ 0"),
        (["--prompt", "hi", "--models", "no-such-preset"], "error:"),
        (
            ["--prompt", "hi", "--method", "sd_tree"],
            "error: method 'sd_tree' is now method 'sd' with shape 'tree' (--method sd --shape tree)",
        ),
        (["--prompt", "hi", "--method", "beam"], "error: unknown method 'beam'"),
    ],
)
def test_generate_errors_are_one_line(args, message, capsys):
    """Bad input exits with status 2 and an `error:` line, never a traceback."""
    assert main(["generate", "--models", "tiny-random", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    if "method" in message:  # a bad or retired key: one line (the retired one names the new setting)
        assert len(err.strip().splitlines()) == 1, err


def _parsed(*argv):
    import argparse

    from pyramid_demo import generate_cli

    p = argparse.ArgumentParser()
    generate_cli.add_arguments(p)
    return generate_cli.config_from_args(p.parse_args(["--prompt", "x", *argv]))


def test_a_family_brings_its_tuned_settings_and_flags_override_them():
    """`--models smollm2-offline` uses that preset's tuned settings; a flag beats the preset; a
    custom family or a preset without tuning gets DecodeConfig's (the papers') defaults."""
    from pyramid_demo.core.methods import DecodeConfig
    from pyramid_demo.models.presets import tuned_settings

    tuned = tuned_settings("smollm2-offline")
    assert tuned, "the offline preset should carry its measured settings"
    cfg = _parsed("--models", "smollm2-offline")
    assert {k: getattr(cfg, k) for k in tuned} == tuned
    assert _parsed("--models", "smollm2-offline", "--gamma", "7").gamma == 7
    assert _parsed("--models", "smollm2-offline", "--conf-stop", "0").conf_stop == 0.0
    paper = DecodeConfig()
    for models in ("tiny-random", "a,b,c"):
        cfg = _parsed("--models", models, "--method", "psd_f")
        assert (cfg.gamma, cfg.l_q, cfg.tau_t, cfg.fallback, cfg.conf_stop) == (
            paper.gamma,
            paper.l_q,
            paper.tau_t,
            paper.fallback,
            paper.conf_stop,
        )

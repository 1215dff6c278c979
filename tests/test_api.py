"""The app's public API, as a `gradio_client` caller meets it: the real page, in-process, on tiny-random."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # app.py

gradio_client = pytest.importorskip("gradio_client")

from pyramid_demo.app import handlers as h  # noqa: E402
from pyramid_demo.app.text import RACE_METHODS  # noqa: E402
from pyramid_demo.core.settings import APP_SETTINGS  # noqa: E402

PUBLIC = {"/race", "/stop", "/export"}


@pytest.fixture(scope="module")
def url():
    from app_server import serve_app

    with serve_app() as (address, _):
        yield address


def _client(url: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gradio_client.Client(url, verbose=False, download_files=os.environ.get("TMPDIR", "/tmp"))


def test_view_api_lists_only_the_public_endpoints(url):
    """Rule: the API lists only what a caller needs (race, stop, export); the page's chained updates
    (inspector, statistics, family box, session set-up) are hidden."""
    api = _client(url).view_api(print_info=False, return_format="dict")
    assert set(api["named_endpoints"]) == PUBLIC, sorted(api["named_endpoints"])
    assert not api["unnamed_endpoints"]


def test_race_takes_named_settings_with_defaults(url):
    """Rule: /race's inputs are named (prompt, preset, the custom ids, then every decoding setting by its
    DecodeConfig name from core.settings, then the chain-vs-tree switch and the qualifier-alone reference lane's)
    and each has a default, so a caller may leave any out."""
    params = _client(url).view_api(print_info=False, return_format="dict")["named_endpoints"]["/race"]["parameters"]
    assert [p["parameter_name"] for p in params] == [
        "prompt",
        "preset",
        "draft",
        "qualifier",
        "target",
        *APP_SETTINGS,
        "side_by_side",
        "qualifier_alone",
    ]
    assert all(p["parameter_has_default"] for p in params), [
        p["parameter_name"] for p in params if not p["parameter_has_default"]
    ]
    defaults = {p["parameter_name"]: p["parameter_default"] for p in params}
    assert all(defaults[k] == v for k, v in h.START_SETTINGS.items())


@pytest.mark.slow  # a whole race at the page's default length (the slow tier, which CI runs)
def test_a_race_with_only_prompt_and_preset(url):
    """Rule: `client.predict(prompt=..., preset=..., api_name="/race")` runs a whole race; named settings
    change it (here max_new_tokens), and /export returns its trace, its table and its web page."""
    client = _client(url)
    status = client.predict(prompt="hello", preset="tiny-random", api_name="/race")[0]
    assert "finished" in status, status
    status = client.predict(prompt="hello", preset="tiny-random", max_new_tokens=8, api_name="/race")[0]
    assert "finished" in status, status
    trace_path, csv_path, page_path = client.predict(api_name="/export")
    last = json.loads(Path(trace_path).read_text(encoding="utf-8"))[-1]
    assert Path(page_path).read_text(encoding="utf-8").startswith("<!doctype html>")
    assert set(last["results"]) == set(RACE_METHODS)
    assert last["config"]["max_new_tokens"] == 8
    assert all(len(r["token_ids"]) <= 8 for r in last["results"].values())


def test_hidden_events_cannot_be_called_by_name(url):
    """Rule: a hidden chained event is not an endpoint: the client refuses its name."""
    client = _client(url)
    for name in ("/pick_race", "/inspect_round", "/preset_info"):
        with pytest.raises(ValueError, match="Cannot find a function"):
            client.predict(api_name=name)


def test_a_bad_setting_by_name_is_a_message(url):
    """Rule: a bad value sent by name comes back as a clear status line, never a stack trace."""
    status = _client(url).predict(prompt="hello", preset="tiny-random", l_d=8, l_q=4, api_name="/race")[0]
    assert status.startswith("⚠️ Settings problem") and "Traceback" not in status, status

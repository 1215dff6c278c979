import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # the tests' own helpers (mock_lm)
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network


@pytest.fixture
def one_thread():
    """Tiny tensors run fastest on one thread (and do not stall when the machine is busy)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

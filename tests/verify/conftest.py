"""One torch intra-op thread for the verify tests (as ``ortho-verify --threads 1``): the matrices
are small, and two threads on a shared 2-core machine made the quick run 4x slower."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

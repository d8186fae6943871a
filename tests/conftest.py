"""Test-session settings: one BLAS thread for the oracle's small SVDs (see verify.cli.main)."""

import pytest
from threadpoolctl import threadpool_limits


@pytest.fixture(autouse=True, scope="session")
def _single_blas_thread():
    with threadpool_limits(limits=1, user_api="blas"):
        yield

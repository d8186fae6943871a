"""Test-session settings.

- One BLAS thread for the oracle's small SVDs (see verify.cli.main): with two OpenBLAS
  threads competing with torch's, small SVDs run 100× slower on 2 cores.
- Tests marked ``slow`` are skipped unless selected with ``-m slow`` (or any ``-m``
  expression naming them) — the default run is what CI runs on 2 cores.
"""

import pytest
from threadpoolctl import threadpool_limits


@pytest.fixture(autouse=True, scope="session")
def _single_blas_thread():
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def pytest_collection_modifyitems(config, items):
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

"""Test-session settings.

- One BLAS thread for the oracle's small SVDs (see ortho_verify.cli.main.main): with two OpenBLAS
  threads competing with torch's, small SVDs run 100× slower on 2 cores.
- Tests marked ``slow`` are skipped unless selected with ``-m slow`` (or any ``-m``
  expression naming them) — the default run is what CI runs on 2 cores.
- Hypothesis: unless a profile is chosen (``--hypothesis-profile ortho-dev|ortho-ci|ortho-deep`` or
  ``ORTHO_HYPOTHESIS_PROFILE``, see ``ortho_verify.pytest_plugin``), the suite runs
  ``DEFAULT_EXAMPLES`` examples per property (tests with their own ``max_examples`` keep it),
  derandomized (every run of ``.ci/run`` tests the same examples) and without a per-example
  deadline (a shared 2-core CI machine must not turn a slow example into a failure). Deeper:
  ``--hypothesis-profile ortho-ci`` (100 examples) or ``ortho-deep``; ``ortho-dev`` and
  ``ortho-deep`` draw new examples each run.
- The heaviest test files run first (``tests/file_seconds.json``, the seconds of each file as
  ``scripts/timings.py --write-docs`` measured them; pytest-xdist with ``--no-loadscope-reorder``
  hands out files in this order): the two test processes then finish together instead of one
  waiting on a long file handed out last. The order of the tests inside a file is kept.
"""

import json
import os
from pathlib import Path

import pytest
from hypothesis import settings
from threadpoolctl import threadpool_limits

from ortho_verify.pytest_plugin import ENV_PROFILE

#: Examples per property in the default run (tests that set ``max_examples`` keep theirs). 30, not
#: hypothesis's 100: the suite must stay within 5 minutes on CI's 2 cores, and the properties'
#: deeper runs are the profiles ``ortho-ci`` (100) and ``ortho-deep`` (5000).
DEFAULT_EXAMPLES = 30
settings.register_profile("ortho-tests", deadline=None, derandomize=True, max_examples=DEFAULT_EXAMPLES)


def pytest_configure(config):
    if not config.getoption("--hypothesis-profile", default=None) and not os.environ.get(ENV_PROFILE):
        settings.load_profile("ortho-tests")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # one of several test processes on the machine's cores: one intra-op thread each, in this
        # process and in the processes its tests start (two OpenMP teams per core spin-wait)
        import torch

        torch.set_num_threads(1)
        os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True, scope="session")
def _single_blas_thread():
    with threadpool_limits(limits=1, user_api="blas"):
        yield


#: Seconds per test file (``scripts/timings.py``); a file not listed counts as 0.
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")


def pytest_collection_modifyitems(config, items):
    seconds = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.exists() else {}
    if seconds:  # heaviest file first (stable: every file's tests stay together, in their order)
        items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

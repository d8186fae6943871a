"""pytest plugin of ortho (entry point ``pytest11``: ``ortho_verify``), active once the package is installed.

Hypothesis profiles, selected with ``--hypothesis-profile NAME`` (hypothesis's own option) or
the environment variable ``ORTHO_HYPOTHESIS_PROFILE`` (used when the option is absent):

- ``dev``: 20 examples, no deadline — quick local iterations;
- ``ci``: hypothesis's built-in ``ci`` profile (derandomized, no deadline, no example database,
  print the reproduction blob) with 100 examples, so every CI run tests the same examples;
- ``deep``: 5000 examples, no deadline, too_slow health check off — a nightly search.

Nothing is loaded unless asked: without the option or the variable hypothesis keeps its own
default (or ``ci`` when it detects CI).

Fixtures: ``verify_orthogonalizer`` and ``verify_optimizer`` — ``ortho_verify.check_orthogonalizer`` /
``ortho_verify.check_optimizer`` that fail the test with the report's summary; with
``--ortho-report DIR`` each report is also saved under DIR/<test name>/.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.errors import InvalidArgument

ENV_PROFILE = "ORTHO_HYPOTHESIS_PROFILE"
PROFILES = {
    "dev": settings(max_examples=20, deadline=None),
    "ci": settings(settings.get_profile("ci"), max_examples=100, derandomize=True, deadline=None),
    "deep": settings(max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow]),
}
for _name, _profile in PROFILES.items():
    settings.register_profile(_name, _profile)


def pytest_addoption(parser):
    parser.addoption("--ortho-report", default=None, metavar="DIR",
                     help="save the report of every verify_orthogonalizer / verify_optimizer call under DIR")


def pytest_configure(config):
    option = config.getoption("--hypothesis-profile", default=None)
    name = os.environ.get(ENV_PROFILE)
    if name and not option:
        try:
            settings.load_profile(name)
        except InvalidArgument as err:
            raise pytest.UsageError(f"{ENV_PROFILE}={name!r}: {err}") from None


def pytest_report_header(config):
    name = os.environ.get(ENV_PROFILE)
    return f"ortho: hypothesis profile from {ENV_PROFILE}={name}" if name else None


def _checker(request, check):
    folder = request.config.getoption("--ortho-report")
    calls = []

    def run(*args, **kwargs):
        report = check(*args, **kwargs)
        calls.append(report)
        if folder:
            safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid)
            report.save(Path(folder) / safe / str(len(calls)))
        if not report.passed:
            pytest.fail(report.summary(), pytrace=False)
        return report

    return run


@pytest.fixture
def verify_orthogonalizer(request):
    """``verify_orthogonalizer(fn, coefficients=..., dtype=...)``: ``ortho_verify.check_orthogonalizer``
    that fails the test with the report's summary; returns the report when it passed."""
    from ortho_verify.api import check_orthogonalizer

    return _checker(request, check_orthogonalizer)


@pytest.fixture
def verify_optimizer(request):
    """``verify_optimizer(optimizer_class, conventions, ...)``: ``ortho_verify.check_optimizer`` that
    fails the test with the report's summary; returns the report when it passed."""
    from ortho_verify.api import check_optimizer

    return _checker(request, check_optimizer)

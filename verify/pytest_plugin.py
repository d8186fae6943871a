"""pytest plugin of ortho (entry point ``pytest11``: ``ortho_verify``), active once the package is installed.

Installing ortho must never change another project's test run, so this plugin does nothing
unless asked: it adds the option ``--ortho-report`` and two fixtures, and it imports nothing
from hypothesis (hypothesis need not even be installed) until a profile of its own is requested.

Hypothesis profiles, namespaced so that no user's profile (nor hypothesis's built-in ``ci``) is
replaced:

- ``ortho-dev``: 20 examples, no deadline — quick local iterations;
- ``ortho-ci``: hypothesis's built-in ``ci`` settings (no deadline, no example database, print the
  reproduction blob) with 100 examples, derandomized, so every CI run tests the same examples;
- ``ortho-deep``: 5000 examples, no deadline, too_slow health check off — a nightly search.

Select one with ``--hypothesis-profile ortho-ci`` (hypothesis's own option; this plugin registers
the three profiles just before hypothesis loads the one named) or with the environment variable
``ORTHO_HYPOTHESIS_PROFILE`` (used when the option is absent; it also accepts the short names
``dev``, ``ci``, ``deep`` for ``ortho-dev``, ``ortho-ci``, ``ortho-deep``, and any other registered
profile by its name). Without the option or the variable nothing is registered or loaded:
hypothesis keeps its own default (or its ``ci`` profile when it detects CI).
Disable the plugin entirely with ``-p no:ortho_verify``.

Fixtures: ``verify_orthogonalizer`` and ``verify_optimizer`` — ``ortho_verify.check_orthogonalizer`` /
``ortho_verify.check_optimizer`` that fail the test with the report's summary; with
``--ortho-report DIR`` each report is also saved under DIR/<test name>/. ``ortho_baseline`` —
``ortho_baseline(report, name=None)`` compares a report with its stored baseline
(``ortho_verify.report.baseline.compare_with_baseline``) and fails the test on a regression, or with
``--ortho-update-baseline`` writes it (``save_baseline``); one JSON file per full test id, beside the
test file (``ortho-baselines/<module>/<class::test[params]>.json``) or under ``--ortho-baseline-dir``
(``ortho_verify.report.baseline.baseline_path_for_test``); a baseline found only at the former path
(``<rootdir>/ortho-baselines/<test name>.json``) fails the test naming the file to move.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ENV_PROFILE = "ORTHO_HYPOTHESIS_PROFILE"
#: The profiles this plugin registers (``register_profiles``), all prefixed ``ortho-``.
PROFILE_NAMES = ("ortho-dev", "ortho-ci", "ortho-deep")
#: Short names accepted through ``ORTHO_HYPOTHESIS_PROFILE`` only (their meaning before the namespacing).
SHORT_NAMES = {"dev": "ortho-dev", "ci": "ortho-ci", "deep": "ortho-deep"}
_PREFIX = "ortho-"


def register_profiles() -> None:
    """Register ``ortho-dev``, ``ortho-ci`` and ``ortho-deep`` with hypothesis (idempotent).

    Called by the plugin only when a profile is requested; call it yourself (e.g. in a conftest) to
    load one with ``hypothesis.settings.load_profile``. Registers no other name.
    Raises: pytest.UsageError naming the extra ``ortho-optim[verify]`` if hypothesis is not installed.
    """
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:
        raise pytest.UsageError("ortho's hypothesis profiles need hypothesis, which is not installed: "
                                "pip install 'ortho-optim[verify]'") from None
    default = settings.get_profile("default")  # not the current profile: CI=true makes that hypothesis's "ci"
    profiles = {
        "ortho-dev": settings(default, max_examples=20, deadline=None),
        "ortho-ci": settings(settings.get_profile("ci"), max_examples=100, derandomize=True, deadline=None),
        "ortho-deep": settings(default, max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow]),
    }
    for name, profile in profiles.items():
        settings.register_profile(name, profile)


def requested_profile(config) -> str | None:
    """The profile name this plugin must load itself: ``ORTHO_HYPOTHESIS_PROFILE`` (short names
    mapped) when ``--hypothesis-profile`` is absent, else None (hypothesis loads the option's own)."""
    if _option(config):
        return None
    name = os.environ.get(ENV_PROFILE)
    return SHORT_NAMES.get(name, name) if name else None


def _option(config) -> str | None:
    return config.getoption("--hypothesis-profile", default=None)


def pytest_addoption(parser):
    parser.addoption("--ortho-report", default=None, metavar="DIR",
                     help="save the report of every verify_orthogonalizer / verify_optimizer call under DIR")
    parser.addoption("--ortho-device", default=None, metavar="DEVICE",
                     help="default device= of verify_orthogonalizer (cpu, cuda, cuda:1, ...; default: the CPU)")
    parser.addoption("--ortho-baseline-dir", default=None, metavar="DIR",
                     help="folder of the ortho_baseline fixture's baselines, one file per test id under the test "
                          "file's path relative to the rootdir (default: ortho-baselines/ beside each test file)")
    parser.addoption("--ortho-update-baseline", action="store_true", default=False,
                     help="ortho_baseline writes each report's baseline instead of comparing")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # tryfirst: the profiles must exist before hypothesis's plugin loads ``--hypothesis-profile ortho-*``
    option = _option(config)
    if option and option.startswith(_PREFIX):
        register_profiles()
        return
    name = requested_profile(config)
    if name is None:
        return
    register_profiles()
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    try:
        settings.load_profile(name)
    except InvalidArgument as err:
        raise pytest.UsageError(f"{ENV_PROFILE}={os.environ[ENV_PROFILE]!r}: {err}") from None


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
    """``verify_orthogonalizer(fn, coefficients=..., dtype=..., device=...)``: ``ortho_verify.check_orthogonalizer``
    that fails the test with the report's summary; returns the report when it passed. ``device``
    defaults to ``--ortho-device`` (else the CPU)."""
    from .api import check_orthogonalizer

    default_device = request.config.getoption("--ortho-device", default=None)

    def check(*args, **kwargs):
        if default_device is not None:
            kwargs.setdefault("device", default_device)
        return check_orthogonalizer(*args, **kwargs)

    return _checker(request, check)


@pytest.fixture
def verify_optimizer(request):
    """``verify_optimizer(optimizer_class, conventions, ...)``: ``ortho_verify.check_optimizer`` that
    fails the test with the report's summary; returns the report when it passed."""
    from .api import check_optimizer

    return _checker(request, check_optimizer)


@pytest.fixture
def ortho_baseline(request):
    """``ortho_baseline(report, name=None)``: compare a ``VerificationReport`` with the baseline of
    this test and fail the test when a check's error/tolerance regressed (> max(2 x baseline,
    0.1)) or a check of the baseline is missing; returns the compared report. With
    ``--ortho-update-baseline`` it writes the baseline instead (the report must have passed). A
    missing baseline fails the test with the command that writes it.
    The file is keyed by the full test id (``ortho_verify.report.baseline.baseline_path_for_test``):
    ``<test file's folder>/ortho-baselines/<module>/<class::test[params] or name>.json``, the
    same from any working directory; ``--ortho-baseline-dir DIR``:
    ``DIR/<test file relative to the rootdir>/<test id>.json``."""
    from .report.baseline import baseline_path_for_test, compare_with_baseline, legacy_baseline_path, save_baseline

    option = request.config.getoption("--ortho-baseline-dir")
    update = request.config.getoption("--ortho-update-baseline")
    node = request.node
    test_id = node.nodeid.split("::", 1)[1] if "::" in node.nodeid else node.name

    def run(report, name: str | None = None):
        path = baseline_path_for_test(node.path, name or test_id, folder=option, rootpath=request.config.rootpath)
        if update:
            try:
                save_baseline(report, path)
            except ValueError as err:
                pytest.fail(f"baseline {path} not written: {err}", pytrace=False)
            return report
        if not path.is_file():
            legacy = legacy_baseline_path(name or node.name, folder=option, rootpath=request.config.rootpath)
            if legacy.is_file():
                pytest.fail(f"no baseline {path} for {node.nodeid}, but {legacy} is one at the path used before "
                            f"baselines were keyed by the full test id: move it there (git mv {legacy} {path}) "
                            "if it belongs to this test, or run pytest --ortho-update-baseline once", pytrace=False)
            pytest.fail(f"no baseline {path} for {node.nodeid}: run pytest --ortho-update-baseline once and "
                        f"commit the file", pytrace=False)
        try:
            compared = compare_with_baseline(report, path)
        except (OSError, ValueError) as err:
            pytest.fail(str(err), pytrace=False)
        if not compared.passed:
            pytest.fail(compared.summary(), pytrace=False)
        return compared

    return run

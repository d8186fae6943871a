"""One ``ortho-verify --quick --no-real`` computation per test session, shared by the tests that
print or write its outcome (tests/verify/test_cli.py, test_cli_output.py, test_cli_width.py).

``share_quick_collect(monkeypatch, tmp_path_factory)`` replaces ``ortho_verify.cli.main.collect``
for one test: the first caller of the session runs the real ``collect`` (inputs, checks, the
singular-value points the plots draw, the phases and seconds) and stores what it returned and
filled in under the session's temporary folder, which the pytest-xdist processes of one run
share; later callers, in any process, get a copy. A file lock makes the others wait for the
first. Only runs whose arguments ``collect`` reads are ``--quick --no-real`` at the default seed
on the CPU are served (what else a test passes, such as ``--no-plots``, ``--verbose`` or
``--all-rows``, is read after ``collect``); any other run is computed as usual.
"""

from __future__ import annotations

import argparse
import os
import pickle

from filelock import FileLock

from ortho_verify.cli import main as cli

_REAL = cli.collect


def _served(args) -> bool:
    return args.quick and args.no_real and args.seed == 0 and args.device == "cpu"


def share_quick_collect(monkeypatch, tmp_path_factory) -> None:
    """Make ``cli.collect`` return the session's one ``--quick --no-real`` computation (see the module)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each process's folder is in the run's, which they share
        root = root.parent
    path = root / "ortho-quick-collect.pickle"

    def collect(args, console, sv_points, timing):
        if not _served(args):
            return _REAL(args, console, sv_points, timing)
        with FileLock(str(path) + ".lock"):
            if not path.exists():
                points: dict = {}  # recorded as a run with plots records them
                out = _REAL(argparse.Namespace(**{**vars(args), "no_plots": False}), console, points, timing)
                path.write_bytes(pickle.dumps((out, points, timing)))
        out, points, measured = pickle.loads(path.read_bytes())
        if not args.no_plots:
            sv_points.update(points)
        timing.update(measured)
        return out

    monkeypatch.setattr(cli, "collect", collect)

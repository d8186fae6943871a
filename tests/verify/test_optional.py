"""The judge's optional dependencies (the extra ``verify``): matplotlib, rich and hypothesis are
imported where they are used, through ``ortho_verify.optional``, and a missing one gives an
ImportError that names the extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ortho_verify import optional, plots, report
from ortho_verify.results import measured

ROOT = Path(__file__).resolve().parents[2]
EXTRA = "pip install 'ortho[verify]'"


def _missing(monkeypatch, *names: str) -> None:
    """Make ``import name`` (and its submodules already loaded) fail in this process."""
    for name in names:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.setitem(sys.modules, loaded, None)
        monkeypatch.setitem(sys.modules, name, None)


def test_require_names_the_extra(monkeypatch):
    _missing(monkeypatch, "rich")
    with pytest.raises(ImportError, match=r"the table needs rich: pip install 'ortho\[verify\]'") as err:
        optional.require("rich.table", "the table")
    assert isinstance(err.value.__cause__, ImportError)
    assert optional.require("math", "nothing").sqrt(4.0) == 2.0


def test_terminal_table_without_rich(monkeypatch):
    _missing(monkeypatch, "rich")
    with pytest.raises(ImportError, match="needs rich") as err:
        report.print_table([measured("c", "i", "d", 0.5, 1.0)])
    assert EXTRA in str(err.value)


def test_plots_without_matplotlib(monkeypatch, tmp_path):
    _missing(monkeypatch, "matplotlib")
    with pytest.raises(ImportError, match="needs matplotlib") as err:
        optional.pyplot("the plots")
    assert EXTRA in str(err.value)
    assert plots.write_plots([measured("c", "i", "d", 0.5, 1.0)], {}, tmp_path) == []  # documented: no plots


def _run_without(code: str, *blocked: str) -> subprocess.CompletedProcess:
    prefix = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in blocked)
    return subprocess.run([sys.executable, "-c", prefix + code], cwd=ROOT, capture_output=True, text=True, timeout=180)


def test_light_modules_need_no_optional_dependency():
    """tolerances and registry import with matplotlib, rich and hypothesis missing; the checks and
    the orthogonalizer check too (hypothesis only for the strategies)."""
    code = ("import ortho_verify.tolerances, ortho_verify.registry\n"
            "import ortho_verify.api, ortho_verify.checks, ortho_verify.report, ortho_verify.plots, ortho_verify.cli\n"
            "assert not any(m in sys.modules for m in ('matplotlib.pyplot', 'rich.console'))\n"
            "try:\n"
            "    import ortho_verify.strategies\n"
            "except ImportError as err:\n"
            "    assert 'needs hypothesis' in str(err) and \"ortho[verify]\" in str(err), err\n"
            "else:\n"
            "    raise AssertionError('strategies imported without hypothesis')\n")
    run = _run_without(code, "matplotlib", "rich", "hypothesis")
    assert run.returncode == 0, run.stderr


def test_ortho_verify_command_without_rich_says_which_extra():
    run = _run_without("from ortho_verify.cli import main\nmain(['--quick', '--no-real', '--no-plots', '--out', "
                       "'/nonexistent/never-written'])\n", "rich")
    assert run.returncode != 0 and "needs rich" in run.stderr and EXTRA in run.stderr

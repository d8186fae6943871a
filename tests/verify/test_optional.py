"""The judge's optional dependencies (the extra ``verify``): matplotlib, rich and hypothesis are
imported where they are used, through ``ortho_verify.optional``, and a missing one gives an
ImportError that names the extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ortho_verify import optional
from ortho_verify.report import plots, terminal as report
from ortho_verify.report.results import measured

ROOT = Path(__file__).resolve().parents[2]
EXTRA = "pip install 'ortho-optim[verify]'"


def _missing(monkeypatch, *names: str) -> None:
    """Make ``import name`` (and its submodules already loaded) fail in this process."""
    for name in names:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.setitem(sys.modules, loaded, None)
        monkeypatch.setitem(sys.modules, name, None)


def test_require_names_the_extra(monkeypatch):
    _missing(monkeypatch, "rich")
    with pytest.raises(ImportError, match=r"the table needs rich: pip install 'ortho-optim\[verify\]'") as err:
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
            "import ortho_verify.api, ortho_verify.checks, ortho_verify.report.terminal, ortho_verify.report.plots\n"
            "import ortho_verify.cli.main\n"
            "assert not any(m in sys.modules for m in ('matplotlib.pyplot', 'rich.console'))\n"
            "try:\n"
            "    import ortho_verify.strategies\n"
            "except ImportError as err:\n"
            "    assert 'needs hypothesis' in str(err) and \"ortho-optim[verify]\" in str(err), err\n"
            "else:\n"
            "    raise AssertionError('strategies imported without hypothesis')\n")
    run = _run_without(code, "matplotlib", "rich", "hypothesis")
    assert run.returncode == 0, run.stderr


def test_ortho_verify_command_without_rich_says_which_extra():
    run = _run_without("from ortho_verify.cli.main import main\nmain(['--quick', '--no-real', '--no-plots', '--out', "
                       "'/nonexistent/never-written'])\n", "rich")
    assert run.returncode != 0 and "needs rich" in run.stderr and EXTRA in run.stderr


BLOCKER = '''import sys


class _Uninstalled:  # a meta-path finder that makes the named packages absent, as if never installed
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _Uninstalled())
'''


@pytest.mark.parametrize("blocked", [("threadpoolctl",), ("hypothesis", "rich", "threadpoolctl", "matplotlib")])
@pytest.mark.parametrize("entry", ["console_main", "python -m"])
def test_command_without_the_extra_is_one_line_and_exit_2(blocked, entry):
    """``ortho-verify`` installed without the extra: one line naming it on stderr, exit 2, no traceback."""
    run_it = ("from ortho_verify.cli.console import console_main\nsys.exit(console_main(['--quick']))\n"
              if entry == "console_main" else "import runpy\nrunpy.run_module('ortho_verify', run_name='__main__')\n")
    run = subprocess.run([sys.executable, "-c", BLOCKER.format(blocked=set(blocked)) + run_it], cwd=ROOT,
                         capture_output=True, text=True, timeout=180)
    lines = run.stderr.splitlines()
    assert run.returncode == 2 and len(lines) == 1 and run.stdout == "", (run.returncode, run.stdout, run.stderr)
    assert lines[0].endswith(f"(missing: {', '.join(blocked)}): {EXTRA}"), lines[0]
    assert optional.DISTRIBUTION == "ortho-optim" and optional.INSTALL_HINT == EXTRA


def test_extra_modules_are_the_extra_of_pyproject():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [r.split(">")[0].split("=")[0].strip() for r in project["optional-dependencies"][optional.EXTRA]]
    assert sorted(declared) == sorted(optional.EXTRA_MODULES)
    assert project["name"] == optional.DISTRIBUTION
    assert project["scripts"]["ortho-verify"] == "ortho_verify.cli.console:console_main"

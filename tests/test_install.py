"""The package as a user installs it: the wheel and the sdist, built offline, and a fresh
environment in which installing ortho changes nobody's test run.

Built from the checkout with the pinned dev environment, without build isolation (no network):
the sdist by setuptools' PEP 517 hook, the wheel by ``pip wheel --no-deps --no-build-isolation``
from the unpacked sdist (so the sdist is proven to build). The wheel goes into a fresh venv made
without pip (``pip --python`` installs into it). The fresh venv does not install torch & co again
(measured on the project's 2-core machine: torch alone takes ~10 s and 786 MB to install; this
set-up takes ~1 s): a ``.pth`` file adds the dev environment's site-packages folders behind
its own. ``.pth`` files inside an added folder are not processed, so the dev environment's
editable ortho (a ``.pth`` import hook) stays invisible, and a test checks that ``ortho``
resolves to the wheel. ``pytest`` there is a console script written like pip's (the script's
folder, not the working directory, first on sys.path), the case that differs from
``python -m pytest``.

The user's project has its own ``verify.py``, tests importing it, and hypothesis tests with its
own profile and settings: ``python -m pytest`` and ``pytest`` must both pass and observe the
same hypothesis settings and modules as with the plugin disabled (``-p no:ortho_verify``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300


def _run(cmd, *, cwd, env=None, check=True) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ORTHO_HYPOTHESIS_PROFILE")}
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env={**base, **(env or {})}, capture_output=True,
                         text=True, timeout=TIMEOUT)
    if check:
        assert out.returncode == 0, f"{cmd}\n{out.stdout}\n{out.stderr}"
    return out


def _source_modules() -> dict[str, Path]:
    """Installed path (``ortho_verify/checks.py``) -> source file, for every package file of pyproject."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir = config.get("package-dir", {})
    files = {}
    for package in config["packages"]:
        top, *rest = package.split(".")
        folder = ROOT / package_dir.get(top, top) / Path(*rest)
        for path in folder.glob("*.py"):
            files["/".join([*package.split("."), path.name])] = path
    return files


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> tuple[Path, Path]:
    """(sdist, wheel), built offline."""
    out = tmp_path_factory.mktemp("dist")
    hook = f"from setuptools import build_meta; print(build_meta.build_sdist({str(out)!r}))"
    name = _run([sys.executable, "-c", hook], cwd=ROOT).stdout.strip().splitlines()[-1]
    sdist = out / name
    with tarfile.open(sdist) as archive:
        archive.extractall(out / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    source = next((out / "unpacked").iterdir())
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", out, source], cwd=out)
    return sdist, next(out.glob("ortho_optim-*.whl"))


@pytest.fixture(scope="module")
def fresh_python(dists, tmp_path_factory) -> Path:
    """python of a fresh venv holding the wheel, the dev environment's dependencies behind it."""
    env_dir = tmp_path_factory.mktemp("fresh") / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(env_dir)
    python = env_dir / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", dists[1]],
         cwd=env_dir)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=env_dir).stdout.strip())
    dev_folders = dict.fromkeys(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    (site / "zz_dev_environment.pth").write_text("".join(f"{p}\n" for p in dev_folders))
    script = env_dir / "bin" / "pytest"  # what pip writes for pytest's console_scripts entry point
    script.write_text(f"#!{python}\nimport sys\nfrom pytest import console_main\nsys.exit(console_main())\n")
    script.chmod(0o755)
    return python


def test_wheel_holds_every_module_py_typed_and_the_license(dists):
    names = set(zipfile.ZipFile(dists[1]).namelist())
    missing = sorted(set(_source_modules()) - names)
    assert not missing, f"modules of the source tree missing from the wheel: {missing}"
    for package in ("ortho_ref", "ortho_fast", "ortho_verify"):
        assert f"{package}/py.typed" in names
    info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    assert f"{info}/licenses/LICENSE" in names
    archive = zipfile.ZipFile(dists[1])
    metadata = archive.read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    top_level = set(archive.read(f"{info}/top_level.txt").decode().split())
    assert top_level <= {"ortho_ref", "ortho_fast", "ortho_verify"}, top_level  # no top-level `verify`
    core = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert sorted(line.split()[1].split(">")[0] for line in core) == ["mpmath", "numpy", "scipy", "torch"]
    assert "Name: ortho-optim" in metadata.splitlines()
    docs = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert docs and [d for d in docs if f"ortho_fast/docs/{d}" not in names] == []  # the documents messages cite
    assert not [n for n in names if n.startswith("ortho_fast/docs/api/")]  # the docs build's configuration stays out
    scripts = archive.read(f"{info}/entry_points.txt").decode()
    assert "ortho-verify = ortho_verify.cli.console:console_main" in scripts


def test_sdist_holds_tests_docs_benchmarks_scripts_license_citation(dists):
    with tarfile.open(dists[0]) as archive:
        names = {"/".join(n.split("/")[1:]) for n in archive.getnames()}
    expected = {"LICENSE", "CITATION.cff", "README.md", "pyproject.toml", "MANIFEST.in", "requirements-dev.txt"}
    for folder in ("tests", "docs", "benchmarks", "scripts", "ortho_ref", "ortho_fast", "verify"):
        expected |= {p.relative_to(ROOT).as_posix() for p in (ROOT / folder).rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    missing = sorted(expected - names)
    assert not missing, f"missing from the sdist: {missing}"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_fresh_environment_resolves_ortho_to_the_wheel(fresh_python):
    probe = textwrap.dedent("""
        import importlib.metadata as md, importlib.util, json, sysconfig
        import ortho_fast, ortho_ref, ortho_verify, ortho_verify.pytest_plugin
        x = ortho_fast.newton_schulz(__import__("torch").eye(3), "jordan")
        print(json.dumps({
            "site": sysconfig.get_paths()["purelib"],
            "files": [m.__file__ for m in (ortho_fast, ortho_ref, ortho_verify)],
            "dist": str(md.distribution("ortho-optim").locate_file("")),
            "plugins": [e.value for e in md.entry_points(group="pytest11") if e.name == "ortho_verify"],
            "user_verify": importlib.util.find_spec("verify") is not None,
        }))
    """)
    out = json.loads(_run([fresh_python, "-c", probe], cwd=fresh_python.parent).stdout.splitlines()[-1])
    assert all(f.startswith(out["site"]) for f in out["files"]), out
    assert Path(out["dist"]) == Path(out["site"]), out
    assert out["plugins"][0] == "ortho_verify.pytest_plugin", out
    assert not out["user_verify"], "the wheel must not install a top-level `verify`"


def test_messages_cite_documents_the_wheel_installed(fresh_python):
    """An error message that cites a document names a file that exists in the installed package."""
    probe = textwrap.dedent("""
        import re, sysconfig, torch, ortho_fast
        try:
            ortho_fast.Muon([torch.nn.Parameter(torch.ones(2, 2))], ns_coefficent=(1, 2, 3))
        except TypeError as err:
            message = str(err)
        cited = re.search(r"docs/compatibility.md \\((.+?)\\)", message).group(1)
        print(sysconfig.get_paths()["purelib"]); print(cited); print(message)
    """)
    site, cited, message = _run([fresh_python, "-c", probe], cwd=fresh_python.parent).stdout.splitlines()[-3:]
    assert Path(cited).is_file() and cited.startswith(site) and "ortho_fast/docs/" in Path(cited).as_posix(), message
    assert "ns_coefficients" in message


def test_command_without_the_extra_says_which_in_one_line(fresh_python, tmp_path):
    """The installed ``ortho-verify`` script with threadpoolctl uninstalled (a meta-path finder in
    sitecustomize makes it absent): one line on stderr naming the extra, exit 2."""
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys

        class _Uninstalled:
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] == "threadpoolctl":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, _Uninstalled())
    """))
    run = _run([fresh_python.parent / "ortho-verify", "--quick"], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)},
               check=False)
    assert run.returncode == 2 and run.stdout == "", run.stdout + run.stderr
    assert run.stderr.splitlines() == ["ortho-verify needs the extra 'verify' (missing: threadpoolctl): "
                                       "pip install 'ortho-optim[verify]'"], run.stderr


USER_VERIFY = '''"""The user's own module called verify (nothing to do with ortho)."""
OWNER = "user"


def double(x):
    return 2 * x
'''
USER_CONFTEST = '''from hypothesis import settings

settings.register_profile("user-profile", max_examples=7, deadline=None)
settings.load_profile("user-profile")
'''
USER_TESTS = '''import json
import os
import sys

from hypothesis import given, settings, strategies as st
from hypothesis.errors import InvalidArgument

import verify


def test_own_verify_module():
    assert verify.OWNER == "user" and verify.double(2) == 4


@given(st.integers())
def test_profile_of_own_conftest(x):
    assert settings().max_examples == 7 and verify.double(x) == x + x


@settings(max_examples=3)
@given(st.integers())
def test_own_settings(x):
    assert settings().max_examples == 3


def _registered(name):
    try:
        return repr(settings.get_profile(name))
    except InvalidArgument:
        return None


def test_record_what_the_session_saw():
    seen = {
        "profile": settings.get_current_profile_name(),
        "default": repr(settings.default),
        "profiles": {n: _registered(n) for n in ("ci", "dev", "deep", "default", "user-profile")},
        "verify": os.path.relpath(verify.__file__),
        "heavy_modules": sorted(m for m in sys.modules if m.split(".")[0] in
                                ("torch", "ortho_fast", "ortho_ref", "matplotlib", "rich")),
    }
    with open(os.environ["OBSERVED"], "w") as f:
        json.dump(seen, f)
'''


def _user_project(folder: Path) -> Path:
    (folder / "tests").mkdir(parents=True)
    (folder / "verify.py").write_text(USER_VERIFY)
    (folder / "conftest.py").write_text(USER_CONFTEST)
    (folder / "tests" / "test_user.py").write_text(USER_TESTS)
    return folder


@pytest.mark.parametrize("runner", ["python -m pytest", "pytest"])
def test_a_project_with_its_own_verify_and_hypothesis_is_unchanged(fresh_python, tmp_path, runner):
    project = _user_project(tmp_path / "project")
    command = [fresh_python, "-m", "pytest"] if runner == "python -m pytest" else [fresh_python.parent / "pytest"]
    seen, summaries = {}, {}
    for plugin in ("enabled", "disabled"):
        observed = tmp_path / f"{plugin}.json"
        extra = ["-p", "no:ortho_verify"] if plugin == "disabled" else []
        run = _run([*command, "-q", "-p", "no:cacheprovider", *extra], cwd=project, env={"OBSERVED": str(observed)},
                   check=False)
        assert run.returncode == 0, f"{runner} ({plugin} plugin):\n{run.stdout}\n{run.stderr}"
        summaries[plugin] = run.stdout.strip().splitlines()[-1].split(" in ")[0]
        seen[plugin] = json.loads(observed.read_text())
    assert summaries["enabled"] == summaries["disabled"] == "4 passed", summaries
    assert seen["enabled"] == seen["disabled"], seen
    assert seen["enabled"]["verify"] == "verify.py" and seen["enabled"]["heavy_modules"] == []
    helped = _run([*command, "--help"], cwd=project).stdout
    assert "--ortho-report" in helped, "the plugin did not load: the comparison above proved nothing"


def test_plugin_needs_no_hypothesis(fresh_python, tmp_path):
    """A user without hypothesis: pytest starts and runs with ortho's plugin loaded."""
    blocker = tmp_path / "blocker" / "hypothesis"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('hypothesis is not installed')\n")
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    run = _run([fresh_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest"],
               cwd=project, env={"PYTHONPATH": str(blocker.parent)}, check=False)
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr
    asked = _run([fresh_python, "-m", "pytest", "-q", "-p", "no:hypothesispytest"], cwd=project,
                 env={"PYTHONPATH": str(blocker.parent), "ORTHO_HYPOTHESIS_PROFILE": "ortho-ci"}, check=False)
    assert asked.returncode != 0 and "ortho-optim[verify]" in asked.stdout + asked.stderr


PROBE = '''import json, os
from hypothesis import settings


def test_probe():
    with open(os.environ["OBSERVED"], "w") as f:
        json.dump({"name": settings.get_current_profile_name(), "max_examples": settings().max_examples,
                   "derandomize": settings().derandomize, "deadline": settings().deadline}, f)
'''


@pytest.mark.parametrize("args, env, expected", [
    ([], {"ORTHO_HYPOTHESIS_PROFILE": "ci"}, ("ortho-ci", 100, True)),
    ([], {"ORTHO_HYPOTHESIS_PROFILE": "ortho-dev"}, ("ortho-dev", 20, False)),
    (["--hypothesis-profile", "ortho-deep"], {}, ("ortho-deep", 5000, False)),
    (["--hypothesis-profile", "ortho-dev"], {"ORTHO_HYPOTHESIS_PROFILE": "deep"}, ("ortho-dev", 20, False)),
])
def test_profiles_on_request(fresh_python, tmp_path, args, env, expected):
    (tmp_path / "test_probe.py").write_text(PROBE)
    observed = tmp_path / "observed.json"
    _run([fresh_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=tmp_path,
         env={**env, "OBSERVED": str(observed)})
    seen = json.loads(observed.read_text())
    assert (seen["name"], seen["max_examples"], seen["derandomize"]) == expected and seen["deadline"] is None, seen


def test_hypothesis_ci_profile_is_hypothesis_own(fresh_python, tmp_path):
    """``--hypothesis-profile ci`` is hypothesis's built-in profile, with or without ortho's plugin."""
    (tmp_path / "test_probe.py").write_text(PROBE)
    seen = {}
    for extra in ([], ["-p", "no:ortho_verify"]):
        observed = tmp_path / f"observed{len(extra)}.json"
        _run([fresh_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-profile", "ci", *extra],
             cwd=tmp_path, env={"OBSERVED": str(observed)})
        seen[len(extra)] = json.loads(observed.read_text())
    assert seen[0] == seen[2] and seen[0]["name"] == "ci", seen


def test_unknown_profile_from_the_variable_is_a_usage_error(fresh_python, tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE)
    run = _run([fresh_python, "-m", "pytest", "-q"], cwd=tmp_path,
               env={"ORTHO_HYPOTHESIS_PROFILE": "nonesuch", "OBSERVED": str(tmp_path / "x.json")}, check=False)
    assert run.returncode != 0 and "ORTHO_HYPOTHESIS_PROFILE='nonesuch'" in run.stdout + run.stderr

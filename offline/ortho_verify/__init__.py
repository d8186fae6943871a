"""Run the judge from a plain checkout, without installing it (docs/verification.md, "Offline GPU runs").

The judge's sources live in ``verify/`` but import as ``ortho_verify`` (pyproject's package-dir), so
``PYTHONPATH=.`` alone does not find it. With ``PYTHONPATH=.:offline`` this package stands in for
the installed one: its ``__path__`` is the checkout's ``verify/`` folder (so ``ortho_verify.cli``,
``ortho_verify.checks`` ... are the files there) and it runs ``verify/__init__.py`` as its own body.
An installed ortho (``pip install -e .``) does not need it; nothing here is packaged.
"""

from pathlib import Path as _Path

_VERIFY = _Path(__file__).resolve().parents[2] / "verify"
__path__ = [str(_VERIFY)]
__file__ = str(_VERIFY / "__init__.py")
exec(compile(_VERIFY.joinpath("__init__.py").read_text(encoding="utf-8"), __file__, "exec"))

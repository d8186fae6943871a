"""Hypothesis strategies shared by the tests: a re-export of ``ortho_verify.strategies``."""

from ortho_verify.strategies import *  # noqa: F401,F403
from ortho_verify.strategies import __all__  # noqa: F401

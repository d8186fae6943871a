"""Hypothesis strategies shared by the tests: a re-export of ``verify.strategies``."""

from verify.strategies import *  # noqa: F401,F403
from verify.strategies import __all__  # noqa: F401

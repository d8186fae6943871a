"""Hypothesis strategies shared by the tests: a re-export of ``ortho_verify.strategies``."""

from ortho_verify.strategies import *  # noqa: F401,F403
from ortho_verify.strategies import __all__  # noqa: F401


def profile_examples(divisor: int, floor: int = 2) -> dict:
    """``{"max_examples": n}`` with n the current hypothesis profile's count divided by ``divisor``
    (at least ``floor``): a property whose examples are expensive (a whole identification, a
    launched run) keeps a fraction of the profile, so ``--hypothesis-profile ortho-deep`` still
    deepens it. Use as ``@settings(deadline=None, **profile_examples(15))``."""
    from hypothesis import settings

    return {"max_examples": max(floor, settings().max_examples // divisor)}

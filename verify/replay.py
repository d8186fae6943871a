"""Replay one failure of a report from its provenance: ``replay_example``.

docs/verification.md, "Replaying a failure".
"""

from __future__ import annotations

import ast

from .api import (
    DEFAULT_TIMEOUT_S,
    CheckResult,
    Failure,
    build_example,
    check_optimizer,
    check_orthogonalizer_example,
    check_orthogonalizer_statistics,
    compute_name,
    optimizer_inputs,
)
from .checks.statistical import StatisticalBatch, statistical_batch

#: The provenance calls ``replay_example`` rebuilds (no other code is evaluated): each function under the
#: module that defines it, and the public names the provenance strings use.
_REBUILDERS = {"ortho_verify.strategies.build_example": build_example,
               "ortho_verify.api.optimizer_inputs": optimizer_inputs,
               **{f"{f.__module__}.{f.__name__}": f for f in (build_example, statistical_batch)}}


def _parse_provenance(provenance: str):
    """(function name, args, kwargs) of a provenance call, parsed with ``ast`` (literals only).
    Raises: ValueError naming provenance for anything else."""
    try:
        call = ast.parse(provenance.strip(), mode="eval").body
        name = ast.unparse(call.func) if isinstance(call, ast.Call) else None
        if name not in _REBUILDERS:
            raise ValueError(name)
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError) as err:
        raise ValueError(f"provenance: expected a call of one of {sorted(_REBUILDERS)} with literal arguments, "
                         f"got {provenance!r}") from err
    return name, args, kwargs


def replay_example(fn, failure, *, check: str | None = None, input_name: str | None = None, coefficients="jordan",
                   dtype=None, steps: int | None = None, safety: float | None = None, eps: float | None = None,
                   eps_mode: str = "add", timeout_s: float | None = DEFAULT_TIMEOUT_S, conventions=None,
                   compute_dtype=None, form: str = "standard", restarts=None, device=None,
                   **optimizer_arguments) -> list[CheckResult]:
    """Replay one failure of a report: rebuild its input, run ``fn`` again, return that check's rows.

    The input is rebuilt from the provenance, a call of ``build_example``, ``statistical_batch`` or
    ``optimizer_inputs`` with literal arguments (nothing else is evaluated): docs/verification.md,
    "Replaying a failure".

    Parameters
    ----------
    fn : callable or type
        The kernel (a ``check_orthogonalizer`` failure) or the optimizer class (``check_optimizer``).
    failure : Failure or str
        An entry of ``report.failures``, or its provenance string.
    check, input_name : str, optional
        With a provenance string: the check and input whose rows are returned (default: every row).
    coefficients, dtype, steps, safety, eps, eps_mode, timeout_s : optional
        As ``check_orthogonalizer_example``; must be the report's.
    conventions : MuonConventions or DionConventions, optional
        For an optimizer failure: the report's conventions.
    compute_dtype, form, restarts, device : optional
        As ``check_orthogonalizer``.
    **optimizer_arguments
        For an optimizer failure: the report's other ``check_optimizer`` arguments (``lr``, ...).

    Returns
    -------
    list of CheckResult
        The rows of that check and input (every row of the input if none matches).

    Raises
    ------
    ValueError
        If the provenance is not a call this function rebuilds.
    TypeError
        If a dtype is not one the checks take.

    References
    ----------
    docs/verification.md, "Replaying a failure".

    Examples
    --------
    >>> from ortho_verify import check_orthogonalizer, default_examples, replay_example
    >>> import ortho_fast
    >>> def scaled(g):
    ...     return 1.01 * ortho_fast.newton_schulz(g, dtype=g.dtype)
    >>> report = check_orthogonalizer(scaled, examples=default_examples("float32")[:1])
    >>> replay_example(scaled, report.failures[0])[0].passed
    False
    """
    if isinstance(failure, Failure):
        provenance, check, input_name = failure.provenance, check or failure.result.check, \
            input_name or failure.result.input
    else:
        provenance = str(failure)
    name, args, kwargs = _parse_provenance(provenance)
    built = _REBUILDERS[name](*args, **kwargs)
    options = dict(coefficients=coefficients, steps=steps, safety=safety, eps=eps, eps_mode=eps_mode,
                   timeout_s=timeout_s)
    if name.endswith("optimizer_inputs"):
        shapes, steps_run, cond, seed = (list(args) + [kwargs.get(k) for k in ("shapes", "steps", "cond", "seed")])[:4]
        rows = check_optimizer(fn, conventions, shapes=shapes, steps=steps_run, cond=cond, seed=seed,
                               **optimizer_arguments).results
    elif isinstance(built, StatisticalBatch):
        rows = check_orthogonalizer_statistics(fn, built, dtype=args[4], device=device, form=form, restarts=restarts,
                                               compute_dtype=compute_name(args[4] if dtype is None else dtype,
                                                                          compute_dtype), **options)
    else:
        rows = check_orthogonalizer_example(fn, built, dtype=dtype, compute_dtype=compute_dtype, form=form,
                                            restarts=restarts, device=device, **options)
    chosen = [r for r in rows if (check is None or r.check == check) and (input_name is None or r.input == input_name)]
    return chosen or rows

"""``jax_kernel``: a Newton–Schulz function on ``jax.Array`` as the torch kernel that
``check_orthogonalizer`` and ``check_orthogonalizer_statistics`` call.
"""

from __future__ import annotations

from typing import Callable

import torch

from .convert import to_jax, to_torch
from .extra import require

__all__ = ["jax_kernel"]

_WHAT = "ortho_verify.frameworks.jax_kernel"


def jax_kernel(fn: Callable, *, vmap: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    """Present a Newton–Schulz function on ``jax.Array`` as a kernel on torch tensors.

    The returned kernel converts its (..., m, n) tensor to a ``jax.Array`` of the same shape and
    dtype (DLPack, or numpy with ml_dtypes' bfloat16; always a copy, so ``fn`` never sees a later
    write to the tensor, and the tensor is never written), calls ``fn`` once, and converts the
    result back to a torch tensor of the result's own dtype on the input's device (a copy: writes
    to it never reach JAX's buffer). Nothing else happens: ``fn`` stays a pure function, and a
    ``jax.jit``-compiled ``fn`` works (JAX compiles it once per input shape and dtype). The check
    then compares each output matrix with ``ortho_ref.ns_map`` of the input it received, in the
    precision it declares (docs/verification.md, "Other array frameworks").

    Parameters
    ----------
    fn : callable
        ``fn(x) -> y``: x a ``jax.Array`` (..., m, n) float32 / bfloat16 / float16 (float64 with
        ``jax_enable_x64``), y a ``jax.Array`` (or numpy array) of the same shape. Leading dims are
        independent matrices.
    vmap : bool, default False
        True for an ``fn`` that takes one (m, n) matrix only (e.g.
        ``optax.contrib._muon.orthogonalize_via_newton_schulz``): a batched input is flattened to
        (b, m, n) and ``fn`` is mapped over it with ``jax.vmap``.

    Returns
    -------
    callable
        ``kernel(x: torch.Tensor) -> torch.Tensor`` (a plain function named after ``fn``, with
        ``kernel.__wrapped__ = fn``), for ``check_orthogonalizer(kernel, ...)`` and any other entry
        point that takes a torch kernel.

    Raises
    ------
    ImportError
        Naming the extra ``jax`` (``pip install 'ortho-optim[jax]'``) when jax is missing.
    TypeError
        Naming ``fn`` when it is not callable, or ``vmap`` when it is not a bool. The kernel raises
        TypeError naming ``fn`` when ``fn`` returns something that is not an array, naming ``x``
        for an input dtype JAX would not keep (float64 without ``jax_enable_x64``); the checks
        report such an exception as a failing ``orthogonalizer_runs`` row with the message.

    Examples
    --------
    >>> import jax.numpy as jnp
    >>> def ns(x):  # Keller Jordan's quintic on jax arrays, (..., m, n), m <= n
    ...     x = x / (jnp.linalg.norm(x, axis=(-2, -1), keepdims=True) + 1e-7)
    ...     for _ in range(5):
    ...         a = x @ x.mT
    ...         x = 3.4445 * x + (-4.7750 * a + 2.0315 * a @ a) @ x
    ...     return x
    >>> kernel = jax_kernel(ns)
    >>> kernel(torch.eye(3)[:2]).shape
    torch.Size([2, 3])
    """
    jax = require("jax", _WHAT)
    if not callable(fn):
        raise TypeError(f"fn: expected a callable mapping a jax.Array (..., m, n) to its Newton–Schulz result, got "
                        f"{type(fn).__name__}")
    if not isinstance(vmap, bool):
        raise TypeError(f"vmap: expected a bool, got {vmap!r}")
    mapped = jax.vmap(fn) if vmap else None

    def kernel(x: torch.Tensor) -> torch.Tensor:
        a = to_jax(x, "x", _WHAT)
        if mapped is not None and a.ndim > 2:
            out = mapped(a.reshape((-1,) + a.shape[-2:]))
            out = out.reshape(a.shape) if hasattr(out, "shape") and out.shape[1:] == a.shape[-2:] else out
        else:
            out = fn(a)
        if not hasattr(out, "shape") or not hasattr(out, "dtype"):
            raise TypeError(f"fn: returned {type(out).__name__}, expected a jax.Array of shape {tuple(x.shape)}")
        return to_torch(out, "fn", x.device, _WHAT)

    name = getattr(fn, "__name__", type(fn).__name__)
    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = f"{name} (a JAX function) on torch tensors: ortho_verify.frameworks.jax_kernel"
    kernel.__wrapped__ = fn
    return kernel

"""Other array frameworks judged by the same checks: adapters that present a JAX kernel or an
optax optimizer as the torch callable / torch.optim-style optimizer the checks take
(docs/verification.md, "Other array frameworks").

- ``jax_kernel(fn)``: a Newton–Schulz function on ``jax.Array`` as a torch kernel for
  ``check_orthogonalizer`` / ``check_orthogonalizer_statistics``.
- ``optax_optimizer(transform_factory)``: an optax ``GradientTransformation`` factory as an
  optimizer class for ``check_optimizer``.

jax, jaxlib and optax are the extra ``jax`` (``pip install 'ortho-optim[jax]'``): this package
imports without them, and each entry point raises an ImportError naming the extra when they are
missing (``require``).
"""

from __future__ import annotations

from .extra import EXTRA, INSTALL_HINT, require
from .kernel import jax_kernel
from .optax_adapter import OptaxOptimizer, optax_optimizer

__all__ = ["EXTRA", "INSTALL_HINT", "OptaxOptimizer", "jax_kernel", "optax_optimizer", "require"]

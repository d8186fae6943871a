"""Statistical tolerances of a whole Muon step (``check_optimizer``'s ``optimizer_mean_deviation``):
the roundings outside the Newton–Schulz kernel that the per-direction mean of
``ortho_verify.tolerances.statistical`` must also allow for (docs/tolerances.md, "Statistical
checks of low-precision kernels"; docs/verification.md, "Statistical rows of check_optimizer").

numpy and ``ortho_ref`` only.

The measured quantity is dᵢⱼ = uᵢᵀ Õⱼ vᵢ − f(σ̂ᵢⱼ), Õ = (W(1 − lr·wd) − W_new)/(lr·s) the update
recovered from the optimizer's weights, (σᵢ, uᵢ, vᵢ) the exact singular triplets of the
reference's Newton–Schulz input U (the Nesterov mix of the gradient and the optimizer's own
momentum). Under the same model as the kernel's (Higham & Mary 2019, Model 2.1: every stored
result rounded as x(1 + δ), δ independent, mean 0, |δ| ≤ u) two further groups of roundings
enter dᵢ:

- before the kernel, on U (the momentum update, the Nesterov mix, the cast to the kernel's
  dtype): a rounding E_pq = a_pq δ_pq of the normalized input X₀ = U/(s‖U‖_F) moves σ̂ᵢ by
  uᵢᵀEvᵢ − σ̂ᵢ s²⟨X₀, E⟩ and the output by f′(σ̂ᵢ) times that (first order), plus a second-order
  mean bounded as the kernel's own input rounding (the divided differences of the composed map,
  ``ortho_verify.tolerances.statistical``);
- after the kernel, on the weights (the decay W(1 − lr·wd), the scaled update, the sum, a cast
  of O to the parameters' dtype): linear in Õ with gain 1/(lr·s) and no second-order term.

Each group is a linear form in independent bounded roundings, so its variance proxy adds to the
kernel's (Azuma–Hoeffding), and the bias bound adds to the allowance.
"""

from __future__ import annotations

import numpy as np

import ortho_ref

from .roundoff import unit_roundoff
from .statistical import divided_differences

__all__ = ["optimizer_rounding_moments"]


def optimizer_rounding_moments(sigma_hat: np.ndarray, u: np.ndarray, v: np.ndarray, coefficients, *,
                               ns_input: np.ndarray, safety: float, input_magnitudes: np.ndarray,
                               weight_magnitudes: np.ndarray, step: float, state_dtype: str, ns_dtype: str
                               ) -> tuple[np.ndarray, np.ndarray]:
    """(variance proxies, bias bounds) of dᵢⱼ from the roundings around the kernel (module docstring).

    ``input_magnitudes`` (J, m, n): Σ of the squared magnitudes |x|² of the quantities rounded in
    ``state_dtype`` on the way to U, per entry (the caller sums the momentum, the mix, the
    gradient term); U itself is also rounded once more in ``ns_dtype`` (the cast before the
    kernel). ``weight_magnitudes`` (J, m, n): Σ of the squared magnitudes rounded in the
    parameters' dtype after the kernel (the decayed weight, the scaled update, the new weight);
    ``step`` = lr·s. Shapes: sigma_hat (J, k); u (J, m, k), v (J, n, k); ns_input (J, m, n) ->
    ((J, k), (J, k)) float64.
    """
    s = np.asarray(sigma_hat, dtype=np.float64)
    us, un = unit_roundoff(state_dtype), unit_roundoff(ns_dtype)
    norm = np.linalg.norm(ns_input, axis=(-2, -1), keepdims=True)
    scale = safety * norm
    x0 = ns_input / scale
    a2 = (us ** 2 * input_magnitudes + un ** 2 * ns_input ** 2) / scale ** 2  # second moments of E, normalized input
    gain = ortho_ref.ns_derivative(s, coefficients)
    u2, v2 = u * u, v * v
    u2t = np.swapaxes(u2, -1, -2)
    diag_pairs = np.einsum("jpi,jpq,jqi->ji", u2, a2, v2)
    cross = np.einsum("jpi,jpq,jqi->ji", u, x0 * a2, v)
    flat = np.sum(x0 * x0 * a2, axis=(-2, -1))[:, None]
    k2 = safety ** 2 * s
    var = gain ** 2 * np.clip(diag_pairs - 2 * k2 * cross + k2 ** 2 * flat, 0.0, None)
    # second order: as the kernel's own input rounding, with the divided differences of the whole map
    uw, vw, aw = (v, u, np.swapaxes(a2, -1, -2)) if u.shape[-2] > v.shape[-2] else (u, v, a2)
    uw2t = np.swapaxes(uw * uw, -1, -2)
    pairs = uw2t @ aw @ (vw * vw)
    v_perp2 = np.clip(1.0 - (vw * vw).sum(axis=-1), 0.0, None)[..., None]
    perp = (uw2t @ aw @ v_perp2)[..., 0]
    table = ortho_ref.schedule(coefficients) if isinstance(coefficients, str) else np.atleast_2d(coefficients)
    plus, minus, zero = divided_differences(s, table)
    eye = np.eye(s.shape[-1], dtype=bool)
    sym = 0.5 * (pairs + np.swapaxes(pairs, -1, -2)) * (plus + minus)
    bias = np.where(eye, 0.0, sym).sum(axis=-1) + np.diagonal(pairs, axis1=-2, axis2=-1) * \
        np.diagonal(plus, axis1=-2, axis2=-1) + 0.5 * perp * zero
    # after the kernel: linear, gain 1/step
    var = var + np.einsum("jpi,jpq,jqi->ji", u2, us ** 2 * weight_magnitudes, v2) / step ** 2
    del u2t
    return var, bias

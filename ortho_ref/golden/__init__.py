"""Golden files: inputs with their exact outputs, for regression checks of the float64 oracle.

Each golden file is a pair in ``ortho_ref/golden/data/``:

- ``<name>.npz``: the float64 inputs (``in_<input>``) and each output x computed by the
  mpmath tier at ``DIGITS`` = 50 digits, stored as a double-double pair ``hi_<output>``,
  ``lo_<output>`` (x = hi + lo to 2⁻¹⁰⁶|x|, ``ortho_ref.to_hi_lo``);
- ``<name>.json``: the sidecar — function and arguments, digits, generator, mpmath and numpy
  versions, mpmath backend, date, input provenance (seed and spectrum), the stored data's own
  accuracy, and the float64 oracle's tolerance against it (formula and value) when generated
  through ``scripts/regen_golden.py`` (the oracle does not import ``ortho_verify``, where tolerances
  live; ``python -m ortho_ref.golden`` leaves the values null).

Functions covered: ``polar``, ``ns_map`` (every registry schedule), and one Dion step
(``dion_step``, householder QR, power_iters = 1, column normalization, error feedback) at a
few ranks and both orientations. The Dion step's exact value is computed here in mpmath:
B = M + G (Bᵀ when m < n), P = orth(BQ) by Householder QR (``mpmath.qr``) with diag(R) > 0,
R = BᵀP, M = B − (1 − μ)PRᵀ, Q = R/(‖R_j‖ + ε), X = (1 − lr·wd)X − lr·√(m/n)·PQᵀ
(Ahn et al., arXiv 2504.05295, Algorithm 1; the conventions of ``ortho_ref.dion_step``).
"""

from __future__ import annotations

import datetime
import json
import pathlib
from dataclasses import dataclass, field

import mpmath
import numpy as np

from .. import mp
from .._validate import as_like, as_matrix, check_scalar
from ..coefficients import SCHEDULES, schedule
from ..dion import orthonormalize

#: Decimal digits of the stored outputs.
DIGITS = 50
DATA = pathlib.Path(__file__).resolve().parent / "data"
FUNCTIONS = ("polar", "ns_map", "dion_step")
#: Dion hyperparameters of every Dion golden file (OLMo-core / microsoft/dion defaults).
DION_ARGUMENTS = {"lr": 0.01, "mu": 0.95, "weight_decay": 0.1, "epsilon": 1e-8}
ACCURACY = ("every stored hi + lo is within 10^-digits·scale + 2^-106·|x| of the exact value (ortho_ref.mp "
            "contract; scale 1 for polar, max(1, max|f|) for ns_map, max|x| for the Dion outputs)")


@dataclass(frozen=True)
class CaseSpec:
    """How a golden file's input is made: ``function``, shape (m, n), spectrum of the main
    matrix ("well": linspace(1, 0.5); "geometric:<c>": geomspace(1, 1/c); "rank:<r>":
    geomspace(1, 1e-2) on r values then zeros; "clustered": half at 1 + 1e-8·i, half at
    1e-3·(1 + 1e-8·i)), times 3, Haar singular vectors from ``seed``."""

    name: str
    function: str
    shape: tuple[int, int]
    spectrum: str
    seed: int
    arguments: dict = field(default_factory=dict)


def _ns(schedule_name: str, shape, spectrum: str, seed: int, eps_mode: str = "add") -> CaseSpec:
    sched = SCHEDULES[schedule_name]
    m, n = shape
    suffix = "" if eps_mode == "add" else "_clamp"
    return CaseSpec(f"ns_map_{schedule_name}{suffix}_{m}x{n}_{spectrum.replace(':', '')}", "ns_map", shape, spectrum,
                    seed, {"schedule": schedule_name, "safety": sched.safety, "eps": sched.eps, "eps_mode": eps_mode})


CASES: tuple[CaseSpec, ...] = (
    CaseSpec("polar_4x4_well", "polar", (4, 4), "well", 1),
    CaseSpec("polar_24x12_geometric1e8", "polar", (24, 12), "geometric:1e8", 2),
    CaseSpec("polar_12x20_clustered", "polar", (12, 20), "clustered", 3),
    CaseSpec("polar_32x48_well", "polar", (32, 48), "well", 4),
    _ns("jordan", (16, 16), "geometric:1e3", 5),
    _ns("jordan", (20, 20), "rank:5", 6, eps_mode="clamp"),
    _ns("cesista5", (32, 48), "well", 7),
    _ns("polar_express", (24, 12), "geometric:1e8", 8),
    _ns("polar_express_paper", (12, 20), "clustered", 9),
    _ns("you6", (4, 4), "well", 10),
    _ns("cubic", (16, 8), "rank:4", 11),
    CaseSpec("dion_24x16_rank4", "dion_step", (24, 16), "geometric:1e3", 12, {"rank": 4, **DION_ARGUMENTS}),
    CaseSpec("dion_24x16_rank16", "dion_step", (24, 16), "geometric:1e3", 13, {"rank": 16, **DION_ARGUMENTS}),
    CaseSpec("dion_8x20_rank3", "dion_step", (8, 20), "rank:6", 14, {"rank": 3, **DION_ARGUMENTS}),
)
SPECS = {c.name: c for c in CASES}


@dataclass
class Golden:
    """One loaded golden file. ``inputs``: float64 arrays by name (``a``, ``coefficients`` for
    ns_map; ``weight``, ``grad``, ``momentum``, ``Q`` for dion_step). ``outputs``: name ->
    (hi, lo) float64 pair of one shape. ``arguments``: keyword arguments of the oracle call
    (``schedule`` is the registry name the coefficients came from, ``rank`` Dion's r).
    ``meta``: the whole JSON sidecar."""

    name: str
    function: str
    arguments: dict
    inputs: dict
    outputs: dict
    meta: dict

    @property
    def digits(self) -> int:
        return int(self.meta["digits"])

    def exact(self, output: str) -> np.ndarray:
        """The stored output as mpf (hi + lo exactly): (shape) object array."""
        return mp.from_hi_lo(*self.outputs[output])


def names(directory=None) -> list[str]:
    """Sorted names of the golden files in ``directory`` (default: the package's data folder)."""
    return sorted(p.stem for p in pathlib.Path(directory or DATA).glob("*.json"))


def load(name: str, directory=None) -> Golden:
    """Read ``<name>.npz`` and ``<name>.json``.

    Raises: KeyError naming the known files for an unknown ``name``; ValueError if the two
    files disagree on the outputs or the function is unknown.
    """
    folder = pathlib.Path(directory or DATA)
    if not (folder / f"{name}.json").exists():
        raise KeyError(f"golden file {name!r} not found in {folder}; known: {names(folder)}")
    meta = json.loads((folder / f"{name}.json").read_text())
    with np.load(folder / f"{name}.npz", allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    inputs = {k[3:]: v for k, v in arrays.items() if k.startswith("in_")}
    outputs = {o: (arrays[f"hi_{o}"], arrays[f"lo_{o}"]) for o in meta["outputs"] if f"hi_{o}" in arrays}
    if len(outputs) != len(meta["outputs"]) or meta["function"] not in FUNCTIONS:
        raise ValueError(f"golden file {name!r}: outputs {meta['outputs']} / function {meta['function']!r} do not "
                         f"match the arrays {sorted(arrays)}")
    return Golden(name, meta["function"], meta["arguments"], inputs, outputs, meta)


def _haar(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((rows, cols)))
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


def _spectrum(kind: str, k: int) -> np.ndarray:
    label, _, value = kind.partition(":")
    if label == "well":
        return np.linspace(1.0, 0.5, k)
    if label == "geometric":
        return np.geomspace(1.0, 1.0 / float(value), k)
    if label == "rank":
        r = int(value)
        return np.concatenate([np.geomspace(1.0, 1e-2, r), np.zeros(k - r)])
    if label == "clustered":
        top = (k + 1) // 2
        return np.concatenate([1 + 1e-8 * np.arange(top), 1e-3 * (1 + 1e-8 * np.arange(k - top))])
    raise ValueError(f"spectrum: unknown kind {kind!r}")


def make_inputs(spec: CaseSpec) -> dict:
    """The float64 inputs of a case, deterministic in ``spec.seed`` (numpy default_rng)."""
    rng = np.random.default_rng(spec.seed)
    m, n = spec.shape
    k = min(m, n)
    s = 3.0 * np.sort(_spectrum(spec.spectrum, k))[::-1]
    a = (_haar(rng, m, k) * s) @ _haar(rng, n, k).T
    if spec.function == "polar":
        return {"a": a}
    if spec.function == "ns_map":
        return {"a": a, "coefficients": schedule(spec.arguments["schedule"])}
    scale = float(np.linalg.norm(a)) / np.sqrt(a.size)
    return {"weight": 0.02 * rng.standard_normal((m, n)), "grad": a, "momentum": scale * rng.standard_normal((m, n)),
            "Q": rng.standard_normal((k, spec.arguments["rank"]))}


def _mpf_array(x: np.ndarray) -> np.ndarray:
    return np.array([mpmath.mpf(v) for v in x.ravel().tolist()], dtype=object).reshape(x.shape)


def dion_step_exact(weight, grad, momentum, Q, *, lr: float, mu: float, weight_decay: float, epsilon: float,
                    digits: int = DIGITS) -> dict:
    """One Dion step (power_iters = 1, Householder QR, column normalization, error feedback)
    evaluated in mpmath at the float64 values of its arguments, exact to ``digits`` digits
    relative to each output's largest entry.

    Shapes: weight, grad, momentum (m, n) float64; Q (min(m, n), r) float64 ->
    {"weight": (m, n), "momentum": (m, n), "Q": (min(m, n), r), "P": (max(m, n), r)} object
    arrays of mpf (P and Q in the working orientation, as ``ortho_ref.DionStep``).
    Precision: digits + GUARD_DIGITS + log10 κ₂(BQ) + log10(‖B‖₂/min_j ‖R_j‖) working digits
    (the sensitivity of the Q factor, Stewart 1977, and of the column normalization), from
    float64 estimates.
    Source: Ahn et al., arXiv 2504.05295, Algorithm 1; ``ortho_ref.dion_step``.
    Size: m, n <= ``mp.MAX_DIM`` = 64, as every mpmath-tier function, checked before any work
    (measured 2026-11-21 on the project's 2-core CPU machine, pure-Python mpmath: 64 × 64 at rank 64 and
    50 digits 2.8 s; 256 × 256 over 30 s).
    Raises: as ``mp.check_digits``; ValueError if m or n exceeds ``mp.MAX_DIM`` (quoting the
    limit); TypeError / ValueError for non-float, non-2-D, empty or non-finite arrays,
    mismatched shapes, lr < 0, mu outside [0, 1], weight_decay < 0, epsilon < 0; ValueError if
    BQ is rank deficient in float64 (P is then not determined by the inputs).
    """
    weight, d = mp.as_mp_input(weight, digits, "weight")
    m, n = weight.shape
    grad, momentum = as_like(grad, "grad", (m, n)), as_like(momentum, "momentum", (m, n))
    Q = as_matrix(Q, "Q")
    if Q.shape[0] != min(m, n) or Q.shape[1] > min(m, n):
        raise ValueError(f"Q: expected shape (min(m, n), r) = ({min(m, n)}, r) with r <= {min(m, n)}, got {Q.shape}")
    lr, mu = check_scalar(lr, "lr", low=0.0), check_scalar(mu, "mu", low=0.0, high=1.0)
    weight_decay, epsilon = (check_scalar(weight_decay, "weight_decay", low=0.0),
                             check_scalar(epsilon, "epsilon", low=0.0))
    transposed = m < n
    b64 = (momentum + grad).T if transposed else momentum + grad
    y64 = b64 @ Q
    sv = np.linalg.svd(y64, compute_uv=False)
    if sv[-1] <= mp.FLOAT64_RESOLVED * sv[0]:
        raise ValueError("grad, momentum, Q: B Q is numerically rank deficient; P is not determined by the inputs")
    r_norms = np.linalg.norm(b64.T @ orthonormalize(y64), axis=0)
    lost = mp.digits_lost(sv[0] / sv[-1]) + mp.digits_lost(np.linalg.norm(b64, 2) / r_norms.min())
    with mpmath.workdps(d + mp.GUARD_DIGITS + lost):
        b = _mpf_array(momentum) + _mpf_array(grad)
        b = b.T if transposed else b
        p, r_qr = mpmath.qr(mpmath.matrix((b @ _mpf_array(Q)).tolist()), mode="skinny")
        p = np.array(p.tolist(), dtype=object)
        p = p * np.array([-1 if r_qr[j, j] < 0 else 1 for j in range(p.shape[1])], dtype=object)
        r_mat = b.T @ p
        mu_, eps_ = mpmath.mpf(mu), mpmath.mpf(epsilon)
        momentum_new = b - (1 - mu_) * (p @ r_mat.T)
        norms = np.array([mpmath.sqrt(mpmath.fsum(x**2 for x in r_mat[:, j])) for j in range(r_mat.shape[1])],
                         dtype=object)
        q_new = r_mat / (norms + eps_)
        delta = p @ q_new.T
        if transposed:
            momentum_new, delta = momentum_new.T, delta.T
        weight_new = (1 - mpmath.mpf(lr) * mpmath.mpf(weight_decay)) * _mpf_array(weight) - \
            mpmath.mpf(lr) * mpmath.sqrt(mpmath.mpf(m) / n) * delta
    return {"weight": weight_new, "momentum": momentum_new, "Q": q_new, "P": p}


def compute_exact(spec: CaseSpec, inputs: dict, digits: int = DIGITS) -> dict:
    """The outputs of a case at ``digits`` digits: name -> object array of mpf."""
    if spec.function == "polar":
        return {"polar": mp.polar(inputs["a"], digits)}
    if spec.function == "ns_map":
        args = {k: spec.arguments[k] for k in ("safety", "eps", "eps_mode")}
        return {"ns_map": mp.ns_map(inputs["a"], inputs["coefficients"], digits=digits, **args)}
    args = {k: spec.arguments[k] for k in DION_ARGUMENTS}
    return dion_step_exact(inputs["weight"], inputs["grad"], inputs["momentum"], inputs["Q"], digits=digits, **args)


def generate(directory=None, *, only=None, tolerance=None) -> list[pathlib.Path]:
    """Compute every case (or the names in ``only``) at DIGITS digits and write
    ``<name>.npz`` and ``<name>.json`` into ``directory`` (default: the package's data folder).

    ``tolerance``: optional callable ``Golden -> dict`` (output name -> {"formula", "value"}),
    recorded in the sidecar; ``scripts/regen_golden.py`` passes ``ortho_verify.checks.golden.golden_tolerances``.
    Returns the paths written. Raises: KeyError for an unknown name in ``only``.
    About 10 s for all cases with the pure-Python mpmath backend.
    """
    todo = list(only) if only is not None else [c.name for c in CASES]
    unknown = sorted(set(todo) - set(SPECS))
    if unknown:
        raise KeyError(f"only: unknown golden cases {unknown}; known: {sorted(SPECS)}")
    folder = pathlib.Path(directory or DATA)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in todo:
        spec = SPECS[name]
        inputs = make_inputs(spec)
        outputs = {k: mp.to_hi_lo(v) for k, v in compute_exact(spec, inputs).items()}
        meta = {
            "name": name,
            "function": spec.function,
            "arguments": spec.arguments,
            "inputs": sorted(inputs),
            "outputs": sorted(outputs),
            "digits": DIGITS,
            "generator": "ortho_ref.golden.generate",
            "mpmath_version": mpmath.__version__,
            "mpmath_backend": mpmath.libmp.BACKEND,
            "numpy_version": np.__version__,
            "date": datetime.date.today().isoformat(),
            "provenance": {"shape": list(spec.shape), "spectrum": spec.spectrum, "scale": 3.0, "seed": spec.seed,
                           "rng": "numpy.random.default_rng", "recipe": "ortho_ref.golden.make_inputs"},
            "accuracy": ACCURACY,
        }
        golden = Golden(name, spec.function, spec.arguments, inputs, outputs, meta)
        meta["tolerance"] = tolerance(golden) if tolerance is not None else {
            "function": "ortho_verify.checks.golden.golden_tolerances", "values": None}
        arrays = {f"in_{k}": v for k, v in inputs.items()}
        for k, (hi, lo) in outputs.items():
            arrays[f"hi_{k}"], arrays[f"lo_{k}"] = hi, lo
        np.savez_compressed(folder / f"{name}.npz", **arrays)
        (folder / f"{name}.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        written += [folder / f"{name}.npz", folder / f"{name}.json"]
    return written

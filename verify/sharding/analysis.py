"""Rows and causes of ``check_sharded_optimizer`` for one layout, from every rank's results
(``ortho_verify.sharding.factory_run.layout_rank_run``) and the one-process run."""

from __future__ import annotations

import math

import torch

from ..conventions import DionConventions
from ..report.results import measured, no_claim
from .diagnosis import dion_replay, moved_fraction
from .inputs import gradient, input_name
from .tensors import relative_difference

__all__ = ["input_name", "layout_rows"]


def _state_note(got: dict, want: dict) -> str:
    """'' when the assembled state (key -> shape) has one process's keys and shapes, else what differs."""
    diffs = []
    for key in sorted(set(got) | set(want)):
        if key not in got or key not in want:
            diffs.append(f"{key}: {'only here' if key in got else 'missing here'}")
        elif tuple(got[key]) != tuple(want[key]):
            diffs.append(f"{key}: {tuple(got[key])} here, {tuple(want[key])} in one process")
    return "; ".join(diffs) + ("; a checkpoint cannot move between this layout and one process" if diffs else "")


def _orientation(plan, i: int, run: dict, reference: dict, conventions, tol: float) -> str:
    """The orientation cause of parameter i, or ''."""
    label, shape = plan.shapes[i]
    if not isinstance(conventions, DionConventions) or plan.steps < 2:
        q_key = getattr(conventions, "q_state_key", "Q")
        got, want = run["state"][i].get(q_key), reference["state"][i].get(q_key)
        if got is not None and want is not None and got.shape != want.shape and got.shape[1:] == want.shape[1:]:
            return (f"{q_key} has shape {tuple(got.shape)} here, {tuple(want.shape)} in one process: the working "
                    "matrix is transposed (an orientation choice; pass DionConventions to confirm by a replay)")
        return ""
    names = conventions.hyperparameter_names
    hyper = run["hyper"]
    if not all(names[k] in hyper for k in ("lr", "momentum", "weight_decay")):
        return ""
    state = run["state_first"][i]
    if conventions.momentum_state_key not in state or conventions.q_state_key not in state:
        return ""
    dt = getattr(torch, plan.dtype)
    grads = [gradient(i, t, 0, shape, dt).double().numpy() for t in range(1, plan.steps)]
    one_process = shape[0] < shape[1]  # ortho_ref.dion_transposed: the global shape decides
    agree = {}
    for transposed in (False, True):
        out = dion_replay(run["weights"][0][i].numpy(), state[conventions.momentum_state_key].numpy(),
                          state[conventions.q_state_key].numpy(), grads, transposed=transposed,
                          lr=hyper[names["lr"]], mu=hyper[names["momentum"]], weight_decay=hyper[names["weight_decay"]],
                          epsilon=conventions.epsilon, error_feedback=conventions.error_feedback)
        if out is not None:
            agree[transposed] = max(relative_difference(run["weights"][t + 1][i], torch.from_numpy(w))
                                    for t, w in enumerate(out))
    other = not one_process
    if agree.get(other, math.inf) <= tol:
        work = "Bᵀ" if other else "B"
        return (f"consistent with an orientation choice: steps 2-{plan.steps} equal Dion on the working matrix {work} "
                f"(one process: {'Bᵀ' if one_process else 'B'}) replayed from the run's own state "
                f"(rel. diff {agree[other]:.1e})")
    if agree.get(one_process, math.inf) <= tol:
        return (f"steps 2-{plan.steps} equal Dion from the run's own state in one process's orientation: the first "
                "step differs (Q0 drawn differently in this layout?)")
    if agree:
        return (f"not an orientation choice: Dion replayed from the run's own state disagrees in both orientations "
                f"(rel. diff {min(agree.values()):.1e})")
    return ""


def _basis(plan, i: int, run: dict, conventions, tol: float) -> str:
    """With ``DionConventions``: whether step 2 of the run is Dion with another orthonormal basis of
    span P. Replayed from the run's own state after step 1 with a deterministic factorization
    (Householder QR, diag(R) > 0; ``ortho_ref.orthonormalize``) in one process's orientation: the
    run's update lies in span P (‖(I − PPᵀ)ΔW‖ ≤ tol·‖ΔW‖) yet differs from the replay's → the update
    depends on the basis chosen for span P (a randomized sketch or a QR whose basis differs by
    layout: R = BᵀP is column-normalized, which a rotation of P changes). '' otherwise."""
    import numpy as np

    import ortho_ref

    if not isinstance(conventions, DionConventions) or plan.steps < 2:
        return ""
    names, hyper = conventions.hyperparameter_names, run["hyper"]
    state = run["state_first"][i]
    if not all(names[k] in hyper for k in ("lr", "momentum", "weight_decay")) or \
            conventions.momentum_state_key not in state or conventions.q_state_key not in state:
        return ""
    label, shape = plan.shapes[i]
    m, n = shape
    transposed = m < n
    dt = getattr(torch, plan.dtype)
    lr, mu, wd = hyper[names["lr"]], hyper[names["momentum"]], hyper[names["weight_decay"]]
    w1, w2 = (run["weights"][t][i].double().numpy() for t in (0, 1))
    b = state[conventions.momentum_state_key].double().numpy() + gradient(i, 1, 0, shape, dt).double().numpy()
    q = state[conventions.q_state_key].double().numpy()
    bw = b.T if transposed else b
    if q.shape[0] != bw.shape[1]:
        return ""
    p_mat = ortho_ref.orthonormalize(bw @ q)
    step = ((1 - lr * wd) * w1 - w2) / (lr * math.sqrt(m / n))
    step_w = step.T if transposed else step
    norm = float(np.linalg.norm(step_w))
    if norm == 0:
        return ""
    outside = float(np.linalg.norm(step_w - p_mat @ (p_mat.T @ step_w))) / norm
    replay = dion_replay(w1, state[conventions.momentum_state_key].double().numpy(), q,
                         [gradient(i, 1, 0, shape, dt).double().numpy()], transposed=transposed, lr=lr, mu=mu,
                         weight_decay=wd, epsilon=conventions.epsilon, error_feedback=conventions.error_feedback)
    if replay is None:
        return ""
    differs = relative_difference(run["weights"][1][i], torch.from_numpy(replay[0]))
    if outside <= tol and differs > tol:
        return (f"basis-dependent update: step 2 lies in span P of a deterministic replay from the run's own state "
                f"(outside it: {outside:.1e}) but differs from the replay's update ({differs:.1e}): another "
                "orthonormal basis of span P (a randomized sketch or a QR whose basis differs by layout; Dion's "
                "column normalization of R = BᵀP changes with it)")
    return ""


def _cause(plan, i: int, runs: list[dict], reference: dict, conventions, tol: float, first_bad: int | None,
           placement: str | None = None) -> str:
    """The most specific explanation of parameter i's disagreement (see ``ortho_verify.sharding.diagnosis``);
    ``placement``: the recognized state placement (state that differs across ranks by it is no cause)."""
    run, causes = runs[0], []
    spread = max(relative_difference(r["weights"][t][i], run["weights"][t][i]) for r in runs for t in range(plan.steps))
    if spread > 0:
        causes.append(f"the ranks hold different full weights (up to {spread:.1e} apart): a broadcast or reduction "
                      "that reaches only some ranks")
    shapes = {r["rank"]: {k: tuple(v.shape) for k, v in r["state"][i].items()} for r in runs}
    if placement is None and len({repr(s) for s in shapes.values()}) > 1:
        per_rank = ", ".join(f"rank {k}: {v}" for k, v in shapes.items())
        causes.append(f"the ranks hold state of different shapes ({per_rank}): a choice made per rank from its own "
                      "shard (e.g. the orientation from the local shard's shape)")
    orient = _orientation(plan, i, run, reference, conventions, tol)
    if orient.startswith("not an orientation choice"):
        basis = _basis(plan, i, run, conventions, tol)
        orient = basis or orient
    if orient:
        causes.append(orient)
    local = [r["local_shard"][i] for r in runs if r["local_shard"][i] is not None]
    if local and max(local) <= tol and first_bad is not None:
        causes.append("computed on the local shard: every rank's shard equals the same optimizer applied to that "
                      f"shard alone (rel. diff ≤ {max(local):.1e})")
    if first_bad is not None and not orient:
        old = plan_initial(plan, i) if first_bad == 0 else reference["weights"][first_bad - 1][i]
        moved = moved_fraction(run["weights"][first_bad][i], old, reference["weights"][first_bad][i])
        if moved < 0.3:
            causes.append(f"the update did not arrive: step {first_bad + 1} moved the weights {moved:.2f} of the "
                          "one-process step (a result computed on another rank never reached this one?)")
    return "; ".join(causes)


def plan_initial(plan, i: int) -> torch.Tensor:
    """Parameter i's initial weight (float64)."""
    from .inputs import initial_weight

    return initial_weight(i, plan.shapes[i][1], getattr(torch, plan.dtype)).double()


def layout_rows(plan, runs: list[dict] | None, error: str | None, reference: dict, conventions,
                tol: float, *, placement: str | None = None, compute=None,
                world_size: int = 1) -> tuple[list, list[dict], bool]:
    """(CheckResult rows, disagreements, whether the weights disagree with one process) of one
    layout. ``runs``: every rank's ``layout_rank_run`` result, or None with ``error`` (the factory
    raised, a rank hung, a parameter lost its placement). ``placement``: the declared state
    placement (``ortho_verify.sharding.placement``; None: recognized). ``compute``: a
    ``ComputeModel``; where low (bfloat16 / float16) each step's update is compared under
    ``sharded_compute_tolerance`` (``ortho_verify.sharding.compute.update_rows``) instead of the
    weights under ``tol``."""
    from .compute import update_rows
    from .placement import recognize

    name = plan.layout.name
    if error is not None:
        return [measured("layout_runs", name, "factory and every step on every rank", math.inf, 0.0, error)], \
            [{"layout": name, "shape": None, "worst": math.inf, "bound": tol, "step": None, "cause": error}], False
    if runs[0].get("unsupported"):
        return [no_claim("layout_runs", name, "factory", "the factory returned None: layout not supported")], [], False
    rows, found, numeric = [measured("layout_runs", name, "factory and every step on every rank", 0.0, 0.0)], [], False
    low = compute is not None and compute.low
    if low:
        upd, upd_found, numeric = update_rows(plan, runs, reference, compute, world_size)
        rows += upd
        bad_steps = {d["shape"]: (d["step"] - 1, d) for d in upd_found}
    for i, (label, shape) in enumerate(plan.shapes):
        inp = input_name(name, label, shape)
        errs = [relative_difference(runs[0]["weights"][t][i], reference["weights"][t][i]) for t in range(plan.steps)]
        if not low:
            rows += [measured("sharded_vs_one_process", inp, f"full weights, step {t + 1}, {plan.dtype}", e, tol)
                     for t, e in enumerate(errs)]
        spread = max(relative_difference(r["weights"][t][i], runs[0]["weights"][t][i])
                     for r in runs for t in range(plan.steps))
        rows.append(measured("ranks_agree", inp, f"every rank's full weights equal rank 0's ({len(runs)} ranks)",
                             spread, 0.0))
        held, union, how = recognize(i, runs, reference["state"][i])
        note = _state_note(union, {k: tuple(v.shape) for k, v in reference["state"][i].items()})
        if held is None:
            note = "; ".join(x for x in (how, note) if x)
        elif placement is not None and held != placement:
            note = "; ".join(x for x in (f"state_placement {placement!r} declared, but {how}", note) if x)
        rows.append(measured("state_gathers", inp, f"state after the run, union over ranks ({held or 'unrecognized'} "
                                                   "placement): keys and shapes of one process's",
                             math.inf if note else 0.0, 0.0, note))
        if low:
            first, entry = bad_steps.get(inp.split(" / ", 1)[1], (None, None))
            bad = [] if first is None else [first]
        else:
            bad = [t for t, e in enumerate(errs) if not e <= tol]
            entry = None
        numeric |= bool(bad)
        if bad or spread > 0 or note:
            cause = _cause(plan, i, runs, reference, conventions, tol, bad[0] if bad else None, held)
            found.append({"layout": name, "shape": inp.split(" / ", 1)[1],
                          "worst": entry["worst"] if entry else max(errs),
                          "bound": entry["bound"] if entry else tol, "step": bad[0] + 1 if bad else None,
                          "cause": "; ".join(c for c in (cause, note) if c) or "no specific cause found"})
    return rows, found, numeric

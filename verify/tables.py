"""Tables quoted in the docs, computed by the oracle (``python -m ortho_verify.tables`` prints them).

docs/tolerances.md embeds the output verbatim and a test regenerates it, so the numbers in
the docs are the ones the code computes.
"""

from __future__ import annotations

import numpy as np

import ortho_ref

BAND_INTERVAL = (1e-3, 1.0)


def schedule_table() -> str:
    """Markdown table: per schedule its steps, normalization, exact band of f on
    σ̂ ∈ [1e-3, 1], L_f = sup |f′| on [0, 1], Π a_t = f′(0), and the step gains G_t."""
    lines = [
        "| schedule | steps | safety | eps | band of f on [1e-3, 1] | L_f = sup\\|f′\\| on [0, 1] | Π a_t = f′(0) | gains G_0..G_T on [1e-3, 1] |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in sorted(ortho_ref.SCHEDULES):
        sched = ortho_ref.SCHEDULES[name]
        table = ortho_ref.schedule(name)
        lo, hi = ortho_ref.ns_band(table, *BAND_INTERVAL)
        lip = ortho_ref.ns_lipschitz(table)
        gains = ortho_ref.ns_step_gains(table, *BAND_INTERVAL)
        lines.append(
            f"| {name} | {len(table)} | {sched.safety:g} | {sched.eps:g} | [{lo:.4f}, {hi:.4f}] | {lip:.1f} | "
            f"{float(np.prod(table[:, 0])):.1f} | {', '.join(f'{g:.1f}' for g in gains)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(schedule_table())

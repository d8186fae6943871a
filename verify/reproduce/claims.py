"""The claims of ``ortho-verify reproduce``: each a pure function of the results with a stated
decision rule (``ortho_verify.reproduce.statistics``). Sources: Jordan et al. 2024; Liu et al.,
arXiv 2502.16982; Ahn et al., arXiv 2504.05295; Amsel et al., arXiv 2505.16932."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ortho_verify.reproduce.config import CLOSE_MARGIN, MATCH_MARGIN, METHODS_BY_KEY, SV_SCHEDULES
from ortho_verify.reproduce.statistics import (difference_text, lower_verdict, mean_std_text, paired_difference,
                                               test_losses, within_verdict)

__all__ = ["CLAIMS", "Claim", "claim_dion_full_rank_matches_muon", "claim_dion_quarter_rank_close",
           "claim_error_feedback_needed", "claim_muon_beats_adamw", "claim_polar_express_more_accurate",
           "evaluate_claims"]


@dataclass(frozen=True)
class Claim:
    """One claim of the literature, judged on the results.

    ``key``, ``statement`` (what the paper says), ``source``, ``rule`` (the decision rule),
    ``verdict`` (one of ``VERDICTS``), ``numbers`` (the measured values behind it),
    ``sentence`` (the verdict with its numbers, as the report prints it) and ``measured`` (the
    deciding difference in one line, for the verdict table)."""

    key: str
    statement: str
    source: str
    rule: str
    verdict: str
    numbers: dict
    sentence: str
    measured: str = ""


def _summary(results: Mapping, key: str) -> str:
    return f"{METHODS_BY_KEY[key].label} {mean_std_text(test_losses(results, key).values())}"


def _compare(results: Mapping, worse: str, better: str) -> tuple[dict, dict]:
    diff = paired_difference(test_losses(results, worse), test_losses(results, better))
    numbers = {worse: list(test_losses(results, worse).values()), better: list(test_losses(results, better).values()),
               "difference": diff}
    return diff, numbers


_OUTCOME = {"reproduced": "Reproduced", "not reproduced": "Not reproduced", "inconclusive": "Inconclusive"}


def _lower_rule(difference: str) -> str:
    return (f"d = {difference} per seed; reproduced if mean(d) − spread(d) > 0, not reproduced if "
            "mean(d) + spread(d) < 0, else inconclusive")


def claim_muon_beats_adamw(results: Mapping) -> Claim:
    """Jordan et al. / Liu et al.: Muon (Keller's coefficients) reaches a lower held-out loss
    than AdamW at equal steps. Rule: ``lower_verdict`` on AdamW − Muon per seed."""
    diff, numbers = _compare(results, "adamw", "muon-jordan")
    pe, _ = _compare(results, "adamw", "muon-polar_express")
    numbers["difference_polar_express"] = pe
    verdict = lower_verdict(diff)
    sentence = (f"{_OUTCOME[verdict]}: held-out loss {_summary(results, 'muon-jordan')} vs "
                f"{_summary(results, 'adamw')} nats/byte; AdamW − Muon = {difference_text(diff)} (with Polar Express: "
                f"{difference_text(pe)}).")
    return Claim("muon_vs_adamw", "Muon reaches a lower held-out loss than AdamW at equal steps",
                 "Jordan et al. 2024 (Muon blog); Liu et al., arXiv 2502.16982",
                 _lower_rule("test loss of AdamW − Muon (Keller)"), verdict, numbers, sentence,
                 f"AdamW − Muon = {difference_text(diff)}")


def _within_claim(results: Mapping, key: str, margin: float, statement: str, claim_key: str) -> Claim:
    diff, numbers = _compare(results, key, "muon-jordan")
    muon = [v for v in test_losses(results, "muon-jordan").values() if v is not None and math.isfinite(v)]
    delta = margin * float(np.mean(muon)) if muon else math.nan
    verdict = within_verdict(diff, delta) if muon else "inconclusive"
    numbers.update(margin_relative=margin, margin=delta)
    sentence = (f"{_OUTCOME[verdict]}: {_summary(results, key)} vs {_summary(results, 'muon-jordan')} nats/byte; "
                f"Dion − Muon = {difference_text(diff)}, margin ±{delta:.3f} ({margin:.1%} of Muon's loss).")
    rule = (f"d = test loss of {METHODS_BY_KEY[key].label} − Muon (Keller) per seed, δ = {margin:.1%} of Muon's mean loss; "
            "reproduced if |mean(d)| + spread(d) ≤ δ, not reproduced if |mean(d)| − spread(d) > δ, else inconclusive")
    return Claim(claim_key, statement, "Ahn et al., arXiv 2504.05295", rule, verdict, numbers, sentence,
                 f"Dion − Muon = {difference_text(diff)}; δ = {delta:.3f}")


def claim_dion_full_rank_matches_muon(results: Mapping) -> Claim:
    """Ahn et al.: Dion at full rank matches Muon. Rule: ``within_verdict`` of Dion (r = 1,
    error feedback) − Muon (Keller) with margin ``MATCH_MARGIN`` × Muon's mean loss."""
    return _within_claim(results, "dion-1-ef", MATCH_MARGIN, "Dion at full rank matches Muon", "dion_full_rank")


def claim_dion_quarter_rank_close(results: Mapping) -> Claim:
    """Ahn et al.: Dion at rank 1/4 with error feedback stays close to Muon. Rule:
    ``within_verdict`` with margin ``CLOSE_MARGIN`` × Muon's mean loss."""
    return _within_claim(results, "dion-1/4-ef", CLOSE_MARGIN,
                         "Dion at rank fraction 1/4 with error feedback stays close to Muon", "dion_quarter_rank")


def claim_error_feedback_needed(results: Mapping) -> Claim:
    """Ahn et al.: without error feedback, low-rank Dion degrades. Rule: ``lower_verdict`` of
    (no EF) − (EF) at rank fractions 1/4 and 1/16; reproduced if at both, not reproduced if
    not reproduced at either, else inconclusive. At full rank P Rᵀ = B, so the two variants
    are the same algorithm: their difference is reported as a consistency check."""
    parts, verdicts = {}, []
    for name in ("1/4", "1/16"):
        diff, numbers = _compare(results, f"dion-{name}-noef", f"dion-{name}-ef")
        parts[name] = numbers
        verdicts.append(lower_verdict(diff))
    verdict = ("reproduced" if all(v == "reproduced" for v in verdicts) else
               "not reproduced" if "not reproduced" in verdicts else "inconclusive")
    full, _ = _compare(results, "dion-1-noef", "dion-1-ef")
    numbers = {"rank_1/4": parts["1/4"], "rank_1/16": parts["1/16"], "verdicts": dict(zip(("1/4", "1/16"), verdicts)),
               "full_rank_difference": full}
    text = "; ".join(f"rank {n}: no EF − EF = {difference_text(parts[n]['difference'])} ({v})"
                     for n, v in zip(("1/4", "1/16"), verdicts))
    sentence = (f"{_OUTCOME[verdict]}: {text}. At full rank the two variants are the same algorithm in exact "
                f"arithmetic (P Rᵀ = B): there no EF − EF = {difference_text(full)}, the noise floor that rounding, "
                "amplified over the run, puts under every comparison.")
    rule = (_lower_rule("test loss without − with error feedback") + ", at rank 1/4 and at rank 1/16; reproduced "
            "if reproduced at both, not reproduced if not reproduced at either, else inconclusive")
    measured = "; ".join(f"r {n}: {difference_text(parts[n]['difference'])}" for n in ("1/4", "1/16"))
    return Claim("error_feedback", "Without error feedback, low-rank Dion degrades", "Ahn et al., arXiv 2504.05295",
                 rule, verdict, numbers, sentence, f"no EF − EF at {measured}")


def claim_polar_express_more_accurate(results: Mapping) -> Claim:
    """Amsel et al.: Polar Express coefficients orthogonalize more accurately than Keller's at
    the same number of steps (5). Measured on the model's gradients: per seed, the mean over the
    captured gradients of ‖NS(G) − U Vᵀ‖_F / √k in the training's Newton–Schulz dtype;
    rule ``lower_verdict`` on Keller − Polar Express."""
    spectral = results.get("spectral") or {}
    dtype = results.get("config", {}).get("ns_dtype", "bfloat16")
    schedules = spectral.get("schedules", {})
    if not all(s in schedules and dtype in schedules[s] for s in SV_SCHEDULES):
        diff = {"mean": None, "spread": None, "n": 0, "finite": False}
        numbers: dict = {"difference": diff}
    else:
        seeds = spectral["seeds"]
        jordan, pe = (dict(zip(seeds, schedules[s][dtype]["rms_by_seed"])) for s in SV_SCHEDULES)
        diff = paired_difference(jordan, pe)
        numbers = {"dtype": dtype, "difference": diff,
                   **{s: {k: schedules[s][k] for k in schedules[s] if isinstance(schedules[s][k], dict)}
                      for s in SV_SCHEDULES}}
    verdict = lower_verdict(diff)
    if diff["finite"]:
        j, p = (schedules[s] for s in SV_SCHEDULES)
        detail = (f"distance to the polar factor ‖NS(G) − UVᵀ‖_F/√k, {dtype}, mean over {spectral['gradients']} "
                  f"gradients per seed: Keller {mean_std_text(j[dtype]['rms_by_seed'])}, Polar Express "
                  f"{mean_std_text(p[dtype]['rms_by_seed'])}; Keller − Polar Express = {difference_text(diff)}; worst "
                  f"|σ − 1| on σ̂ ∈ [1e-3, 1]: Keller {j[dtype]['worst_in_band']:.3f} (exact map "
                  f"{j['exact']['worst_in_band']:.3f}), Polar Express {p[dtype]['worst_in_band']:.3f} (exact "
                  f"{p['exact']['worst_in_band']:.3f})")
    else:
        detail = "no gradients were measured"
    return Claim("polar_express", "Polar Express coefficients orthogonalize more accurately than Keller's at the "
                 "same number of steps", "Amsel et al., arXiv 2505.16932",
                 _lower_rule(f"‖NS(G) − UVᵀ‖_F/√k of Keller − Polar Express ({dtype}, mean over a seed's gradients)"),
                 verdict, numbers, f"{_OUTCOME[verdict]}: {detail}.",
                 f"Keller − Polar Express = {difference_text(diff)} ({dtype}, distance to UVᵀ)")


CLAIMS = (claim_muon_beats_adamw, claim_dion_full_rank_matches_muon, claim_dion_quarter_rank_close,
          claim_error_feedback_needed, claim_polar_express_more_accurate)


def evaluate_claims(results: Mapping) -> list[Claim]:
    """Every claim of ``CLAIMS`` judged on ``results`` (as ``run_study`` returns them, or a
    synthetic dict with ``evaluation`` {key: {"seeds", "test_loss"}}, ``spectral`` and
    ``config.ns_dtype``); a method missing from the results makes its claims inconclusive."""
    return [claim(results) for claim in CLAIMS]

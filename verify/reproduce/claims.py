"""The claims of ``ortho-verify reproduce``: each a pure function of the results with a stated
decision rule (``ortho_verify.reproduce.statistics``). Sources: Jordan et al. 2024; Liu et al.,
arXiv 2502.16982; Ahn et al., arXiv 2504.05295; Amsel et al., arXiv 2505.16932; Li et al., arXiv
2510.05491 (NorMuon); Ahn, Amsel, Langford, arXiv 2512.16928 (Dion2)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ortho_verify.reproduce.config import CLOSE_MARGIN, MATCH_MARGIN, METHODS_BY_KEY, SV_SCHEDULES
from ortho_verify.reproduce.statistics import (difference_text, lower_verdict, mean_std_text, paired_difference,
                                               test_losses, within_verdict)

__all__ = ["CLAIMS", "CLAIM_RULES", "Claim", "claim_dion2_quarter_close", "claim_dion_full_rank_matches_muon",
           "claim_dion_quarter_rank_close", "claim_error_feedback_needed", "claim_muon_beats_adamw",
           "claim_normuon_beats_muon", "claim_polar_express_more_accurate", "evaluate_claims"]


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


def _label(key: str, fallback: str) -> str:
    """A method's label; ``fallback`` for a method not in this installation's ``METHODS``."""
    return METHODS_BY_KEY[key].label if key in METHODS_BY_KEY else fallback


def _summary(results: Mapping, key: str) -> str:
    return f"{_label(key, key)} {mean_std_text(test_losses(results, key).values())}"


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


def _within_claim(results: Mapping, key: str, margin: float, statement: str, claim_key: str, *,
                  reference: str = "muon-jordan", source: str = "Ahn et al., arXiv 2504.05295",
                  names: tuple[str, str] = ("Dion", "Muon"), label: str = "") -> Claim:
    diff, numbers = _compare(results, key, reference)
    muon = [v for v in test_losses(results, reference).values() if v is not None and math.isfinite(v)]
    delta = margin * float(np.mean(muon)) if muon else math.nan
    verdict = within_verdict(diff, delta) if muon else "inconclusive"
    numbers.update(margin_relative=margin, margin=delta)
    ref_label = _label(reference, reference)
    method, ref = names
    summaries = (f"{_summary(results, key)} vs {_summary(results, reference)} nats/byte"
                 if key in METHODS_BY_KEY and reference in METHODS_BY_KEY else f"{label or key} was not run")
    sentence = (f"{_OUTCOME[verdict]}: {summaries}; "
                f"{method} − {ref} = {difference_text(diff)}, margin ±{delta:.3f} ({margin:.1%} of {ref}'s loss).")
    rule = (f"d = test loss of {_label(key, label or key)} − {ref_label} per seed, δ = {margin:.1%} of {ref}'s mean "
            "loss; reproduced if |mean(d)| + spread(d) ≤ δ, not reproduced if |mean(d)| − spread(d) > δ, else "
            "inconclusive")
    return Claim(claim_key, statement, source, rule, verdict, numbers, sentence,
                 f"{method} − {ref} = {difference_text(diff)}; δ = {delta:.3f}")


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


def claim_normuon_beats_muon(results: Mapping) -> Claim:
    """Li et al. (NorMuon, arXiv 2510.05491), abstract: "NorMuon consistently outperforms both Adam
    and Muon" (11.31 % better training efficiency than Muon at 1.1B parameters). Judged here as a
    lower held-out loss at equal steps, with both orthogonalizing by Polar Express (as microsoft/dion's
    NorMuon and Muon do), so that the pair differs only in the NorMuon stage. Rule:
    ``lower_verdict`` on Muon (Polar Express) − NorMuon per seed."""
    diff, numbers = _compare(results, "muon-polar_express", "normuon")
    verdict = lower_verdict(diff)
    normuon = (_summary(results, "normuon") if "normuon" in METHODS_BY_KEY else
               "NorMuon was not run (this ortho_fast's Muon has no normuon_beta2)")
    sentence = (f"{_OUTCOME[verdict]}: held-out loss {normuon} vs {_summary(results, 'muon-polar_express')} "
                f"nats/byte; Muon (Polar Express) − NorMuon = {difference_text(diff)}.")
    return Claim("normuon_vs_muon", "NorMuon reaches a lower held-out loss than Muon (Polar Express) at equal steps",
                 "Li et al., arXiv 2510.05491 (NorMuon); microsoft/dion dion/normuon.py",
                 _lower_rule("test loss of Muon (Polar Express) − NorMuon (Polar Express)"), verdict, numbers, sentence,
                 f"Muon (PE) − NorMuon = {difference_text(diff)}")


def claim_dion2_quarter_close(results: Mapping) -> Claim:
    """Dion2 (Ahn, Amsel, Langford, arXiv 2512.16928; microsoft/dion): the paper's Figure 1 shows a
    final loss nearly identical to full Muon's while orthogonalizing only 25 % of the matrix (its
    experiments: 300M and 1B models); microsoft/dion's README says Dion and Dion2 "share similar
    practical benefits" with Muon. The comparison is against Muon with Polar Express: microsoft/dion's
    Muon (the paper's codebase and baseline) and Dion2 itself orthogonalize with it, so the pair
    differs only in the row / column selection and its error feedback. Rule: ``within_verdict`` of
    Dion2 (f = 1/4) − Muon (Polar Express) with margin ``CLOSE_MARGIN`` × that Muon's mean loss."""
    return _within_claim(results, "dion2-1/4", CLOSE_MARGIN,
                         "Dion2 orthogonalizing a fraction 1/4 of the rows or columns stays close to Muon",
                         "dion2_quarter", reference="muon-polar_express",
                         source="Ahn, Amsel, Langford, arXiv 2512.16928 (Dion2), Figure 1; microsoft/dion",
                         names=("Dion2", "Muon (PE)"), label="Dion2 f=1/4")


#: Every claim, in report order: the loss claims, then the Newton–Schulz accuracy claim.
CLAIMS = (claim_muon_beats_adamw, claim_dion_full_rank_matches_muon, claim_dion_quarter_rank_close,
          claim_error_feedback_needed, claim_normuon_beats_muon, claim_dion2_quarter_close,
          claim_polar_express_more_accurate)
#: Claim key -> its decision rule ("lower": ``lower_verdict``, "within": ``within_verdict``), in the
#: order of ``CLAIMS`` (the report numbers the claims by it).
CLAIM_RULES = {"muon_vs_adamw": "lower", "dion_full_rank": "within", "dion_quarter_rank": "within",
               "error_feedback": "lower", "normuon_vs_muon": "lower", "dion2_quarter": "within",
               "polar_express": "lower"}


def evaluate_claims(results: Mapping) -> list[Claim]:
    """Every claim of ``CLAIMS`` judged on ``results`` (as ``run_study`` returns them, or a
    synthetic dict with ``evaluation`` {key: {"seeds", "test_loss"}}, ``spectral`` and
    ``config.ns_dtype``); a method missing from the results makes its claims inconclusive."""
    return [claim(results) for claim in CLAIMS]

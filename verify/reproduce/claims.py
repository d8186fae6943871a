"""The claims of ``ortho-verify reproduce``: each a pure function of the results with a stated
decision rule (``ortho_verify.reproduce.statistics``). Sources: Jordan et al. 2024; Liu et al.,
arXiv 2502.16982; Ahn et al., arXiv 2504.05295; Amsel et al., arXiv 2505.16932; Li et al., arXiv
2510.05491 (NorMuon); Ahn, Amsel, Langford, arXiv 2512.16928 (Dion2)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from .config import CLOSE_MARGIN, MATCH_MARGIN, METHODS_BY_KEY, SV_SCHEDULES
from .statistics import (
    decide_lower,
    decide_within,
    difference_text,
    mean_std_text,
    paired_difference,
    sensitivity,
    test_losses,
)

__all__ = ["CLAIMS", "CLAIM_RULES", "MEASURED", "PUBLISHED", "Claim", "claim_dion2_quarter_close",
           "claim_dion_full_rank_matches_muon", "claim_dion_quarter_rank_close", "claim_error_feedback_needed",
           "claim_muon_beats_adamw", "claim_normuon_beats_muon", "claim_polar_express_more_accurate", "evaluate_claims"]


@dataclass(frozen=True)
class Claim:
    """One claim of the literature, judged on the results.

    ``key``, ``statement`` (what the paper says), ``source``, ``rule`` (the decision rule),
    ``verdict`` (one of ``VERDICTS``), ``numbers`` (the measured values behind it),
    ``sentence`` (the verdict with its numbers, as the report prints it) and ``measured`` (the
    deciding difference in one line, for the verdict table), ``power`` (the smallest difference the rule
    can decide at this run's seeds and spread, ``statistics.resolution``, with δ where the rule has one),
    ``reason`` (why an inconclusive claim is undecided; "" otherwise), ``published`` (the published
    figure or table and the scale it was made at, ``PUBLISHED``)."""

    key: str
    statement: str
    source: str
    rule: str
    verdict: str
    numbers: dict
    sentence: str
    measured: str = ""
    power: str = ""
    reason: str = ""
    published: str = ""


#: The verdict of every claim of a measurement run (``--quick``, ``--dry-run``): it decides nothing.
MEASURED = "measured"

#: Claim key -> the published evidence it is compared with and the scale it was made at (the papers'
#: abstracts and the figures named; figure numbers as in the arXiv versions cited).
PUBLISHED = {
    "muon_vs_adamw": "NanoGPT speedrun records (Jordan et al. 2024: GPT-2 small shape, 124 M parameters, FineWeb, "
                     "validation loss 3.28); Moonlight (Liu et al., arXiv 2502.16982): scaling-law experiments, "
                     "abstract: Muon ≈ 2× AdamW's compute efficiency; Moonlight itself a 3B/16B MoE on 5.7T tokens",
    "dion_full_rank": "Ahn et al., arXiv 2504.05295: Dion against Muon on language models of 120 M–3 B parameters "
                      "(v2 abstract; v3: 160 M–3 B)",
    "dion_quarter_rank": "Ahn et al., arXiv 2504.05295, rank-fraction experiments on 120 M–3 B parameter models, "
                         "whose abstract (v2) reports that Dion's benefits improve with model and batch size",
    "error_feedback": "Ahn et al., arXiv 2504.05295: low-rank Dion with and without error feedback (models of "
                      "120 M–3 B parameters)",
    "normuon_vs_muon": "Li et al., arXiv 2510.05491, abstract: 11.31 % better training efficiency than Muon at "
                       "1.1 B parameters (experiments at several scales)",
    "dion2_quarter": "Ahn, Amsel, Langford, arXiv 2512.16928, Figure 1: final loss near full Muon's with 25 % of "
                     "the matrix orthogonalized, 300 M and 1 B parameter models",
    "polar_express": "Amsel et al., arXiv 2505.16932: the composed polynomial's worst-case error on [ℓ, 1] (a "
                     "property of the coefficients, scale-free); GPT-2 experiments",
}


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
    return (f"d = {difference} per seed, h = t_α·spread(d)/√n; reproduced if mean(d) − h > 0, not reproduced if "
            "mean(d) + h < 0, else inconclusive")


def _power_text(decision: dict, delta: float | None = None) -> str:
    if decision["resolution"] is None:
        return "none (" + (decision["reason"] or "no spread") + ")"
    text = f"{decision['resolution']:.4f} (h {decision['half_width']:.4f})"
    return text + (f" vs δ {delta:.4f}" if delta is not None else "")


def _why(decision: dict) -> str:
    return f" ({decision['reason']})" if decision["verdict"] == "inconclusive" and decision["reason"] else ""


def claim_muon_beats_adamw(results: Mapping) -> Claim:
    """Jordan et al. / Liu et al.: Muon (Keller's coefficients) reaches a lower held-out loss
    than AdamW at equal steps. Rule: ``lower_verdict`` on AdamW − Muon per seed."""
    diff, numbers = _compare(results, "adamw", "muon-jordan")
    pe, _ = _compare(results, "adamw", "muon-polar_express")
    numbers["difference_polar_express"] = pe
    decision = decide_lower(diff)
    verdict = decision["verdict"]
    numbers["decision"] = decision
    sentence = (f"{_OUTCOME[verdict]}{_why(decision)}: held-out loss {_summary(results, 'muon-jordan')} vs "
                f"{_summary(results, 'adamw')} nats/byte; AdamW − Muon = {difference_text(diff)} (with Polar Express: "
                f"{difference_text(pe)}).")
    return Claim("muon_vs_adamw", "Muon reaches a lower held-out loss than AdamW at equal steps",
                 "Jordan et al. 2024 (Muon blog); Liu et al., arXiv 2502.16982",
                 _lower_rule("test loss of AdamW − Muon (Keller)"), verdict, numbers, sentence,
                 f"AdamW − Muon = {difference_text(diff)}", _power_text(decision), decision["reason"],
                 PUBLISHED["muon_vs_adamw"])


def _within_claim(results: Mapping, key: str, margin: float, statement: str, claim_key: str, *,
                  reference: str = "muon-jordan", source: str = "Ahn et al., arXiv 2504.05295",
                  names: tuple[str, str] = ("Dion", "Muon"), label: str = "") -> Claim:
    diff, numbers = _compare(results, key, reference)
    muon = [v for v in test_losses(results, reference).values() if v is not None and math.isfinite(v)]
    delta = margin * float(np.mean(muon)) if muon else math.nan
    decision = (decide_within(diff, delta) if muon else
                {"verdict": "inconclusive", "reason": "the reference was not run or diverged", "half_width": None,
                 "resolution": None})
    control = paired_difference(test_losses(results, "adamw"), test_losses(results, reference))
    separated, why_not = sensitivity(control, delta) if muon else (False, "")
    if decision["verdict"] == "reproduced" and not separated:
        decision = {**decision, "verdict": "inconclusive", "reason": why_not}
    verdict = decision["verdict"]
    numbers.update(margin_relative=margin, margin=delta, decision=decision, control=control,
                   sensitive=separated)
    ref_label = _label(reference, reference)
    method, ref = names
    summaries = (f"{_summary(results, key)} vs {_summary(results, reference)} nats/byte"
                 if key in METHODS_BY_KEY and reference in METHODS_BY_KEY else f"{label or key} was not run")
    sentence = (f"{_OUTCOME[verdict]}{_why(decision)}: {summaries}; "
                f"{method} − {ref} = {difference_text(diff)}, margin ±{delta:.3f} ({margin:.1%} of {ref}'s loss).")
    rule = (f"d = test loss of {_label(key, label or key)} − {ref_label} per seed, δ = {margin:.1%} of {ref}'s mean "
            "loss, h = t_α·spread(d)/√n; not reproduced if |mean(d)| − h > δ; reproduced if |mean(d)| + h ≤ δ, the "
            f"resolution is ≤ δ and the run separates AdamW from {ref_label} by more than δ (assay sensitivity); "
            "else inconclusive")
    return Claim(claim_key, statement, source, rule, verdict, numbers, sentence,
                 f"{method} − {ref} = {difference_text(diff)}; δ = {delta:.3f}",
                 _power_text(decision, delta if math.isfinite(delta) else None), decision["reason"],
                 PUBLISHED[claim_key])


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
    parts, verdicts, decisions = {}, [], []
    for name in ("1/4", "1/16"):
        diff, numbers = _compare(results, f"dion-{name}-noef", f"dion-{name}-ef")
        decision = decide_lower(diff)
        numbers["decision"] = decision
        parts[name] = numbers
        decisions.append(decision)
        verdicts.append(decision["verdict"])
    verdict = ("reproduced" if all(v == "reproduced" for v in verdicts) else
               "not reproduced" if "not reproduced" in verdicts else "inconclusive")
    full, _ = _compare(results, "dion-1-noef", "dion-1-ef")
    numbers = {"rank_1/4": parts["1/4"], "rank_1/16": parts["1/16"], "verdicts": dict(zip(("1/4", "1/16"), verdicts)),
               "full_rank_difference": full}
    text = "; ".join(f"rank {n}: no EF − EF = {difference_text(parts[n]['difference'])} ({v}{_why(d)})"
                     for n, v, d in zip(("1/4", "1/16"), verdicts, decisions))
    sentence = (f"{_OUTCOME[verdict]}: {text}. At full rank the two variants are the same algorithm in exact "
                f"arithmetic (P Rᵀ = B): there no EF − EF = {difference_text(full)}, the noise floor that rounding, "
                "amplified over the run, puts under every comparison.")
    rule = (_lower_rule("test loss without − with error feedback") + ", at rank 1/4 and at rank 1/16; reproduced "
            "if reproduced at both, not reproduced if not reproduced at either, else inconclusive")
    measured = "; ".join(f"r {n}: {difference_text(parts[n]['difference'])}" for n in ("1/4", "1/16"))
    power = "; ".join(f"r {n}: {_power_text(d)}" for n, d in zip(("1/4", "1/16"), decisions))
    reason = "; ".join(f"r {n}: {d['reason']}" for n, d in zip(("1/4", "1/16"), decisions) if d["reason"])
    return Claim("error_feedback", "Without error feedback, low-rank Dion degrades", "Ahn et al., arXiv 2504.05295",
                 rule, verdict, numbers, sentence, f"no EF − EF at {measured}", power,
                 reason if verdict == "inconclusive" else "", PUBLISHED["error_feedback"])


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
    decision = decide_lower(diff)
    verdict = decision["verdict"]
    numbers["decision"] = decision
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
                 verdict, numbers, f"{_OUTCOME[verdict]}{_why(decision)}: {detail}.",
                 f"Keller − Polar Express = {difference_text(diff)} ({dtype}, distance to UVᵀ)", _power_text(decision),
                 decision["reason"], PUBLISHED["polar_express"])


def claim_normuon_beats_muon(results: Mapping) -> Claim:
    """Li et al. (NorMuon, arXiv 2510.05491), abstract: "NorMuon consistently outperforms both Adam
    and Muon" (11.31 % better training efficiency than Muon at 1.1B parameters). Judged here as a
    lower held-out loss at equal steps, with both orthogonalizing by Polar Express (as microsoft/dion's
    NorMuon and Muon do), so that the pair differs only in the NorMuon stage. Rule:
    ``lower_verdict`` on Muon (Polar Express) − NorMuon per seed."""
    diff, numbers = _compare(results, "muon-polar_express", "normuon")
    decision = decide_lower(diff)
    verdict = decision["verdict"]
    numbers["decision"] = decision
    normuon = (_summary(results, "normuon") if "normuon" in METHODS_BY_KEY else
               "NorMuon was not run (this ortho_fast's Muon has no normuon_beta2)")
    sentence = (f"{_OUTCOME[verdict]}{_why(decision)}: held-out loss {normuon} vs "
                f"{_summary(results, 'muon-polar_express')} "
                f"nats/byte; Muon (Polar Express) − NorMuon = {difference_text(diff)}.")
    return Claim("normuon_vs_muon", "NorMuon reaches a lower held-out loss than Muon (Polar Express) at equal steps",
                 "Li et al., arXiv 2510.05491 (NorMuon); microsoft/dion dion/normuon.py",
                 _lower_rule("test loss of Muon (Polar Express) − NorMuon (Polar Express)"), verdict, numbers, sentence,
                 f"Muon (PE) − NorMuon = {difference_text(diff)}", _power_text(decision), decision["reason"],
                 PUBLISHED["normuon_vs_muon"])


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
    ``config.ns_dtype``); a method missing from the results makes its claims inconclusive.
    With ``results["mode"] == "measurement"`` (``--quick``, ``--dry-run``) no claim is decided: every
    verdict is ``MEASURED`` and the sentence gives the numbers only."""
    claims = [claim(results) for claim in CLAIMS]
    if results.get("mode") == "measurement":
        return [_as_measured(c) for c in claims]
    steps = results.get("config", {}).get("steps")
    if steps:  # the run's length belongs to the reason: more steps or seeds is what would decide it
        claims = [replace(c, reason=f"{c.reason}; run of {steps} steps") if c.verdict == "inconclusive" and c.reason
                  else c for c in claims]
    return claims


def _as_measured(claim: Claim) -> Claim:
    return replace(claim, verdict=MEASURED, reason="measurement run: no claim is decided",
                   sentence=f"Measured (a measurement run decides no claim): {claim.measured}; resolution: "
                            f"{claim.power}.")

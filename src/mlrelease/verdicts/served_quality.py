"""Quality judged on the served graph: candidate and champion answers to the same labelled orders (pure).

The shadow gate replays recent orders through both versions on Triton; their actual ETAs are known, so
each order gives both versions' absolute errors and confidences. Four contracts, each a band at 1 − α
(the tolerance/α contract of `mlrelease.verdicts.decide`):

- MAE non-inferiority: on the paired per-order differences |e_cand| − (1 + t)·|e_champ|, whose mean is
  above 0 exactly when the candidate's MAE is worse than the champion's by more than the relative
  tolerance t (so the champion's own sampling error is inside the band, not a plug-in constant). The band
  is the confidence sequence of `mean_level`, as for the shadow's per-cohort ETA shifts;
- P90 absolute error: the same excess, P90(e_cand) − (1 + t)·P90(e_champ), with a seeded paired bootstrap
  band (a quantile has no simple variance);
- calibration: low confidence must go with large error on the *served* answers, so the least/most
  confident fifth error ratio (as train's `confidence_error_ratio`) with a seeded bootstrap band; it fails
  when the band's upper end is below the minimum ratio. Ties are averaged, never broken by sort order: a
  confidence with zero spread carries no information and gives exactly 1;
- per cohort, the paired difference of low-confidence shares on the same orders, either direction: a
  share that collapsed (an overconfident model) is as wrong as one that soared (an underconfident one).

MAE and P90 fail on evidence of harm and resolve an open question by `on_inconclusive` (train already
judged them on the holdout); calibration and the cohort shares fail only on evidence.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlrelease.verdicts.decide import ON_INCONCLUSIVE, Verdict, decide
from mlrelease.verdicts.sequential import Band, mean_level

MIN_COHORT_ROWS = 20  # as the shadow's per-cohort ETA shifts: below this a cohort is not judged


@dataclass(frozen=True)
class QualityContract:
    """The served-quality contract's parameters (the shadow spec's `quality_*` fields and the reference threshold)."""

    alpha: float = 0.01
    mae_tolerance: float = 0.05
    p90_tolerance: float = 0.10
    min_confidence_ratio: float = 1.2
    low_confidence_tolerance: float = 0.05
    low_confidence_threshold: float = 0.6
    on_inconclusive: str = "accept"
    resamples: int = 2000
    seed: int = 0


def fifth_error_ratio(confidence: np.ndarray, error: np.ndarray) -> float:
    """Mean error of the least-confident fifth over that of the most-confident fifth, ties averaged.

    Rows sharing a confidence value share their mean error, so which of them fall inside a fifth does not
    matter (an argsort would pick them by position, and a constant confidence could then score anything).
    """
    conf, err = np.asarray(confidence, dtype=np.float64), np.asarray(error, dtype=np.float64)
    if len(conf) == 0:
        return 1.0
    _, group = np.unique(conf, return_inverse=True)
    return _ratio_from_groups(group.ravel(), err, int(group.max()) + 1)


def _ratio_from_groups(group: np.ndarray, error: np.ndarray, groups: int) -> float:
    """The tie-averaged fifth ratio from each row's confidence group (groups numbered in rising confidence)."""
    sums = np.bincount(group, weights=error, minlength=groups)
    counts = np.bincount(group, minlength=groups).astype(np.float64)
    k = max(1, len(group) // 5)
    low = _tied_mean_of_first(k, sums, counts)
    high = _tied_mean_of_first(k, sums[::-1], counts[::-1])
    if high <= 0:
        return math.inf if low > 0 else 1.0
    return low / high


def _tied_mean_of_first(k: int, sums: np.ndarray, counts: np.ndarray) -> float:
    """Mean error of the first `k` rows in group order, the boundary group contributing its mean error."""
    cumulative = np.cumsum(counts)
    boundary = int(np.searchsorted(cumulative, k))  # a zero-count group never is the first to reach k
    before = cumulative[boundary] - counts[boundary]
    return float((sums[:boundary].sum() + (k - before) * sums[boundary] / counts[boundary]) / k)


def _resolve(verdict: Verdict, on_inconclusive: str) -> Verdict:
    """An open question (continue) after the one look the shadow gate has becomes what `on_inconclusive` says."""
    return ON_INCONCLUSIVE[on_inconclusive] if verdict is Verdict.CONTINUE else verdict


def _percentile_band(estimate: float, replicates: np.ndarray, alpha: float, n: int) -> Band:
    """The (1 − α) percentile band of bootstrap replicates around the full-sample estimate."""
    # "nearest": an infinite replicate (a ratio over zero error) must not turn an interpolation into NaN
    lower, upper = np.quantile(replicates, [alpha / 2, 1 - alpha / 2], method="nearest")
    return Band(estimate, float(lower), float(upper), n)


def mae_verdict(candidate_error: np.ndarray, champion_error: np.ndarray, contract: QualityContract) -> dict[str, Any]:
    """Is the candidate's MAE worse than the champion's by more than the relative tolerance, on the same orders?"""
    c, s = np.asarray(candidate_error, dtype=np.float64), np.asarray(champion_error, dtype=np.float64)
    excess = c - (1 + contract.mae_tolerance) * s  # mean > 0 ⟺ MAE_c > (1 + t)·MAE_s
    band = mean_level(excess, 0.0, alpha=contract.alpha, tuned_at=max(len(excess), 2))
    verdict = _resolve(decide(band, "higher", 0.0), contract.on_inconclusive)
    return _relative_report(float(c.mean()), float(s.mean()), contract.mae_tolerance, band, verdict)


def p90_verdict(
    candidate_error: np.ndarray, champion_error: np.ndarray, contract: QualityContract, rng: np.random.Generator
) -> dict[str, Any]:
    """Is the candidate's P90 absolute error worse than the champion's by more than the tolerance? Paired bootstrap."""
    c, s = np.asarray(candidate_error, dtype=np.float64), np.asarray(champion_error, dtype=np.float64)
    factor = 1 + contract.p90_tolerance
    p90_c, p90_s = float(np.quantile(c, 0.9)), float(np.quantile(s, 0.9))
    # the same resampled orders for both versions: the pairing is what makes the band narrow
    picks = rng.integers(0, len(c), size=(contract.resamples, len(c)))
    replicates = np.quantile(c[picks], 0.9, axis=1) - factor * np.quantile(s[picks], 0.9, axis=1)
    band = _percentile_band(p90_c - factor * p90_s, replicates, contract.alpha, len(c))
    verdict = _resolve(decide(band, "higher", 0.0), contract.on_inconclusive)
    return _relative_report(p90_c, p90_s, contract.p90_tolerance, band, verdict)


def _relative_report(
    candidate: float, champion: float, tolerance: float, band: Band, verdict: Verdict
) -> dict[str, Any]:
    """The evidence of a relative non-inferiority verdict, in hours (the excess is over the tolerated level)."""
    return {
        "candidate": round(candidate, 4),
        "champion": round(champion, 4),
        "relative": round(candidate / champion - 1, 4) if champion > 0 else None,
        "tolerance": tolerance,
        "excess_h": round(band.estimate, 4),
        "excess_band_h": [round(band.lower, 4), round(band.upper, 4)],
        "verdict": str(verdict),
    }


def calibration_verdict(
    confidence: np.ndarray, error: np.ndarray, contract: QualityContract, rng: np.random.Generator
) -> dict[str, Any]:
    """Does the served confidence track the served error? Fail when the ratio's band lies below the minimum."""
    conf, err = np.asarray(confidence, dtype=np.float64), np.asarray(error, dtype=np.float64)
    _, group = np.unique(conf, return_inverse=True)
    group = group.ravel()
    groups = int(group.max()) + 1 if len(group) else 1
    estimate = _ratio_from_groups(group, err, groups) if len(group) else 1.0
    replicates = np.empty(contract.resamples)
    for i in range(contract.resamples):
        picks = rng.integers(0, len(err), size=len(err))
        replicates[i] = _ratio_from_groups(group[picks], err[picks], groups)
    band = _percentile_band(estimate, replicates, contract.alpha, len(err))
    failed = band.upper < contract.min_confidence_ratio
    return {
        "ratio": _finite(band.estimate),
        "band": [_finite(band.lower), _finite(band.upper)],
        "min_ratio": contract.min_confidence_ratio,
        "confidence_spread": round(float(np.ptp(conf)), 6) if len(conf) else 0.0,
        "constant_confidence": round(float(conf[0]), 6) if len(conf) and np.ptp(conf) == 0 else None,
        "verdict": str(Verdict.FAIL if failed else Verdict.PASS),
    }


def _finite(x: float) -> float | None:
    """A JSON-safe number (an infinite ratio, all the most-confident answers exact, becomes None)."""
    return round(float(x), 4) if math.isfinite(x) else None


def low_confidence_by_cohort(
    candidate_confidence: np.ndarray, champion_confidence: np.ndarray, cohorts: np.ndarray, contract: QualityContract
) -> dict[str, dict[str, Any]]:
    """Per cohort, the paired difference of low-confidence shares on the same orders and its either-way verdict."""
    threshold = contract.low_confidence_threshold
    low_c = np.asarray(candidate_confidence) < threshold
    low_s = np.asarray(champion_confidence) < threshold
    paired = low_c.astype(np.float64) - low_s.astype(np.float64)  # −1, 0 or 1 per order
    found = {}
    for cohort in sorted(set(np.asarray(cohorts).tolist())):
        rows = np.asarray(cohorts) == cohort
        n = int(rows.sum())
        if n < MIN_COHORT_ROWS:
            continue
        band = mean_level(paired[rows], 0.0, alpha=contract.alpha, tuned_at=n)
        found[str(cohort)] = {
            "candidate_share": round(float(low_c[rows].mean()), 4),
            "champion_share": round(float(low_s[rows].mean()), 4),
            "difference": round(band.estimate, 4),
            "band": [round(band.lower, 4), round(band.upper, 4)],
            "rows": n,
            "verdict": str(decide(band, "either", contract.low_confidence_tolerance)),
        }
    return found


def served_quality(
    candidate: tuple[np.ndarray, np.ndarray],
    champion: tuple[np.ndarray, np.ndarray],
    actual: np.ndarray,
    cohorts: np.ndarray,
    contract: QualityContract,
) -> dict[str, Any]:
    """All four contracts on (eta, confidence) of both versions for the same orders and their actual ETAs.

    Orders where either version's answer or the label is not finite are left out (a non-finite answer
    fails the shadow gate on its own).
    """
    eta_c, conf_c = (np.asarray(a, dtype=np.float64) for a in candidate)
    eta_s, conf_s = (np.asarray(a, dtype=np.float64) for a in champion)
    actual = np.asarray(actual, dtype=np.float64)
    usable = np.isfinite(actual)
    for array in (eta_c, conf_c, eta_s, conf_s):
        usable &= np.isfinite(array)
    err_c, err_s = np.abs(eta_c - actual)[usable], np.abs(eta_s - actual)[usable]
    report: dict[str, Any] = {
        "rows": int(usable.sum()),
        "alpha": contract.alpha,
        "bootstrap_resamples": contract.resamples,
        "on_inconclusive": contract.on_inconclusive,
    }
    if report["rows"] < 2:
        return {**report, "verdict": str(ON_INCONCLUSIVE[contract.on_inconclusive]), "note": "no labelled orders"}
    rng = np.random.default_rng(contract.seed)  # seeded: a retry of the same run reaches the same verdict
    report["mae"] = mae_verdict(err_c, err_s, contract)
    report["p90_abs_error"] = p90_verdict(err_c, err_s, contract, rng)
    report["calibration"] = calibration_verdict(conf_c[usable], err_c, contract, rng)
    report["champion_confidence_error_ratio"] = _finite(fifth_error_ratio(conf_s[usable], err_s))
    report["low_confidence_threshold"] = contract.low_confidence_threshold
    report["low_confidence_tolerance"] = contract.low_confidence_tolerance
    report["low_confidence_by_cohort"] = low_confidence_by_cohort(
        conf_c[usable], conf_s[usable], np.asarray(cohorts)[usable], contract
    )
    verdicts = [report[k]["verdict"] for k in ("mae", "p90_abs_error", "calibration")]
    verdicts += [v["verdict"] for v in report["low_confidence_by_cohort"].values()]
    report["verdict"] = str(_worst_of(verdicts))
    return report


def _worst_of(verdicts: Iterable[str]) -> Verdict:
    """Fail if any failed, else inconclusive if any is, else pass (an open cohort share is not a breach)."""
    found = set(verdicts)
    if Verdict.FAIL in found:
        return Verdict.FAIL
    return Verdict.INCONCLUSIVE if Verdict.INCONCLUSIVE in found else Verdict.PASS


def quality_breaches(quality: dict[str, Any]) -> list[str]:
    """One human line with the numbers for each served-quality contract that fails the gate."""
    found = []
    if quality.get("rows", 0) < 2:
        if quality.get("verdict") in (Verdict.FAIL, Verdict.INCONCLUSIVE):
            found.append("served quality not judged: no labelled orders among the replayed ones")
        return found
    alpha, n = quality["alpha"], quality["rows"]
    for key, name in (("mae", "MAE"), ("p90_abs_error", "P90 absolute error")):
        part = quality[key]
        if part["verdict"] not in (Verdict.FAIL, Verdict.INCONCLUSIVE):
            continue
        low, high = part["excess_band_h"]
        shown = "worse than" if part["verdict"] == Verdict.FAIL else "not shown within"
        relative = f" ({part['relative']:+.1%})" if part["relative"] is not None else ""
        found.append(
            f"served {name} {shown} +{part['tolerance']:.0%} of the champion's on the same {n} labelled orders: "
            f"{part['candidate']:.3f} h vs {part['champion']:.3f} h{relative}; excess over the "
            f"tolerated level {part['excess_h']:+.3f} h (band {low:+.3f} … {high:+.3f} h at α={alpha:g})"
        )
    calibration = quality["calibration"]
    if calibration["verdict"] == Verdict.FAIL:
        low, high = (_shown(x) for x in calibration["band"])
        constant = calibration["constant_confidence"]
        why = (
            f"; confidence_score is constant at {constant:g}, it carries no information" if constant is not None else ""
        )
        found.append(
            f"served confidence does not track error: least/most confident fifth error ratio "
            f"{_shown(calibration['ratio'])} (band {low} … {high} at α={alpha:g}, {n} labelled orders) "
            f"< {calibration['min_ratio']:g}{why}"
        )
    tolerance, threshold = quality["low_confidence_tolerance"], quality["low_confidence_threshold"]
    for cohort, part in quality["low_confidence_by_cohort"].items():
        if part["verdict"] != Verdict.FAIL:
            continue
        low, high = part["band"]
        found.append(
            f"{cohort} low-confidence share (confidence < {threshold:g}) moved beyond ±{tolerance * 100:g} pp on "
            f"the same orders: {part['candidate_share']:.1%} vs champion {part['champion_share']:.1%} "
            f"(Δ {part['difference'] * 100:+.1f} pp, band {low * 100:+.1f} … {high * 100:+.1f} pp at α={alpha:g}, "
            f"{part['rows']} rows)"
        )
    return found


def _shown(x: float | None) -> str:
    """A ratio for a message (None is an infinite ratio)."""
    return "inf" if x is None else f"{x:.2f}"

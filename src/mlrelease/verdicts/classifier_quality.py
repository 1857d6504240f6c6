"""Quality of a binary classifier judged on the served graph: candidate and champion probabilities for the same
labelled orders (pure). The classification counterpart of `served_quality`, with the tolerances of the model's
release spec (its `gates`) and the shadow spec's α. Four contracts, each a band at 1 − α:

- log-loss non-inferiority: on the paired per-order differences ℓ_cand − (1 + t)·ℓ_champ, whose mean is above 0
  exactly when the candidate's log loss is worse than the champion's by more than the relative tolerance t. The
  shadow looks once, so the band is the fixed-sample normal one (a confidence sequence, valid at every look, costs
  power that one look does not need: at +10 % log loss on 2,000 orders it found the harm 5–82 % of the time where
  this band finds it 74–100 %, by positive rate);
- AUC: the paired drop AUC_champ − AUC_cand, with a seeded paired bootstrap band (the same resampled orders for
  both versions), failing when the drop is above the absolute tolerance;
- calibration: the candidate's expected calibration error (10 equal-width bins) with the *basic* bootstrap band
  (2·ECE − the replicates' quantiles): ECE is biased upwards on few rows and so are its replicates, so the plain
  percentile band's lower end sat above the truth and failed a candidate exactly at the bound 33 % of the time on
  300 orders; it fails only when the band's lower end is above the bound;
- per cohort, calibration in the large against the champion's: the candidate's |mean probability − observed rate|
  minus the champion's, with a paired band (see `positive_rate_by_cohort`); a cohort fails when the candidate's
  bias there exceeds the champion's by more than the tolerance (a bias the overall numbers dilute). A candidate
  that moves a cohort's probabilities *towards* the observed rate is better, not a breach; the paired shift is
  reported beside it.

Log loss and AUC fail on evidence of harm and resolve an open question by `on_inconclusive` (train already judged
them on the holdout); calibration and the cohort biases fail only on evidence. The false-fail side of every
contract is checked at its boundary (a candidate exactly at the tolerance) over seeded worlds in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mlrelease.verdicts.decide import ON_INCONCLUSIVE, Verdict, decide
from mlrelease.verdicts.sequential import Band
from mlrelease.verdicts.served_quality import _resolve, _worst_of  # the regression contract's, shared

MIN_COHORT_ROWS = 20  # as the regression contract: below this a cohort is not judged
CALIBRATION_BINS = 10
PROBABILITY_FLOOR = 1e-15  # log loss clips here, as sklearn's does
MAX_UNDEFINED_REPLICATES = 0.01  # more bootstrap replicates than this without a value (one class drawn): no band


@dataclass(frozen=True)
class ClassifierContract:
    """The served-quality contract of a classifier: the spec's gate tolerances, the shadow spec's α and bootstrap."""

    alpha: float = 0.01
    log_loss_tolerance: float = 0.02
    auc_tolerance: float = 0.01
    max_calibration_error: float = 0.05
    positive_rate_tolerance: float = 0.03
    on_inconclusive: str = "accept"
    resamples: int = 2000
    seed: int = 0


def log_losses(probability: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Each order's log loss of its predicted probability of the positive class."""
    p = np.clip(np.asarray(probability, dtype=np.float64), PROBABILITY_FLOOR, 1 - PROBABILITY_FLOOR)
    y = np.asarray(actual, dtype=np.float64)
    return -(y * np.log(p) + (1 - y) * np.log1p(-p))


def rank_auc(scores: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """AUC of each row of `scores` (shape [R, n] or [n]) against the matching `actual` labels (ties averaged).

    Mann–Whitney on average ranks, vectorized over bootstrap replicates; NaN where a row holds one class only.
    """
    from scipy.stats import rankdata

    s, y = np.atleast_2d(scores), np.atleast_2d(np.asarray(actual, dtype=bool))
    ranks = rankdata(s, axis=1)
    positives = y.sum(axis=1).astype(np.float64)
    negatives = y.shape[1] - positives
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = ((ranks * y).sum(axis=1) - positives * (positives + 1) / 2) / (positives * negatives)
    return np.where((positives > 0) & (negatives > 0), auc, np.nan)


def calibration_errors(probability: np.ndarray, actual: np.ndarray, picks: np.ndarray | None = None) -> np.ndarray:
    """Expected calibration error of the whole sample (picks None) or of each bootstrap replicate (picks [R, n])."""
    p, y = np.asarray(probability, dtype=np.float64), np.asarray(actual, dtype=np.float64)
    picks = np.arange(len(p))[None, :] if picks is None else picks
    bins = np.minimum((p * CALIBRATION_BINS).astype(int), CALIBRATION_BINS - 1)[picks]
    slot = bins + CALIBRATION_BINS * np.arange(len(picks))[:, None]  # one set of bins per replicate
    size = len(picks) * CALIBRATION_BINS
    gap = np.bincount(slot.ravel(), weights=(p[picks] - y[picks]).ravel(), minlength=size)
    # per bin |Σ(p − y)| = count·|mean p − positive share|; summed and divided by n it is the row-weighted ECE
    return np.abs(gap).reshape(len(picks), CALIBRATION_BINS).sum(axis=1) / picks.shape[1]


def _percentile_band(estimate: float, replicates: np.ndarray, alpha: float, n: int) -> Band:
    """The (1 − α) percentile band of the replicates; unbounded (undecided) when too many are undefined."""
    finite = replicates[np.isfinite(replicates)]
    if len(finite) < (1 - MAX_UNDEFINED_REPLICATES) * len(replicates):
        return Band(estimate, -np.inf, np.inf, n)
    lower, upper = np.quantile(finite, [alpha / 2, 1 - alpha / 2], method="nearest")
    return Band(estimate, float(lower), float(upper), n)


def _basic_band(estimate: float, replicates: np.ndarray, alpha: float, n: int) -> Band:
    """The (1 − α) basic bootstrap band, 2·estimate − the replicates' quantiles: it corrects a biased estimator."""
    percentile = _percentile_band(estimate, replicates, alpha, n)
    return Band(estimate, 2 * estimate - percentile.upper, 2 * estimate - percentile.lower, n)


def fixed_mean_band(values: np.ndarray, alpha: float) -> Band:
    """The fixed-sample (1 − α) normal band on a mean: for a gate that looks once (the shadow), not sequentially."""
    from scipy.stats import norm

    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return Band(float("nan"), -np.inf, np.inf, len(x))
    radius = float(norm.ppf(1 - alpha / 2) * x.std(ddof=1) / np.sqrt(len(x)))
    return Band(float(x.mean()), float(x.mean()) - radius, float(x.mean()) + radius, len(x))


def log_loss_verdict(p_c: np.ndarray, p_s: np.ndarray, y: np.ndarray, contract: ClassifierContract) -> dict[str, Any]:
    """Is the candidate's log loss worse than the champion's by more than the relative tolerance, on the same orders?"""
    loss_c, loss_s = log_losses(p_c, y), log_losses(p_s, y)
    excess = loss_c - (1 + contract.log_loss_tolerance) * loss_s  # mean > 0 ⟺ LL_c > (1 + t)·LL_s
    band = fixed_mean_band(excess, contract.alpha)
    verdict = _resolve(decide(band, "higher", 0.0), contract.on_inconclusive)
    candidate, champion = float(loss_c.mean()), float(loss_s.mean())
    return {
        "candidate": round(candidate, 5),
        "champion": round(champion, 5),
        "relative": round(candidate / champion - 1, 4) if champion > 0 else None,
        "tolerance": contract.log_loss_tolerance,
        "excess": round(band.estimate, 5),
        "excess_band": [round(band.lower, 5), round(band.upper, 5)],
        "verdict": str(verdict),
    }


def auc_verdict(
    p_c: np.ndarray, p_s: np.ndarray, y: np.ndarray, contract: ClassifierContract, rng: np.random.Generator
) -> dict[str, Any]:
    """Does the candidate rank worse than the champion by more than the absolute tolerance? Paired bootstrap."""
    auc_c, auc_s = float(rank_auc(p_c, y)[0]), float(rank_auc(p_s, y)[0])
    picks = rng.integers(0, len(y), size=(contract.resamples, len(y)))
    drops = rank_auc(p_s[picks], y[picks]) - rank_auc(p_c[picks], y[picks])
    band = _percentile_band(auc_s - auc_c, drops, contract.alpha, len(y))
    verdict = _resolve(decide(band, "higher", contract.auc_tolerance), contract.on_inconclusive)
    return {
        "candidate": round(auc_c, 4),
        "champion": round(auc_s, 4),
        "tolerance": contract.auc_tolerance,
        "drop": round(band.estimate, 4),
        "drop_band": [round(band.lower, 4), round(band.upper, 4)],
        "verdict": str(verdict),
    }


def calibration_verdict(
    p_c: np.ndarray, y: np.ndarray, contract: ClassifierContract, rng: np.random.Generator
) -> dict[str, Any]:
    """Is the candidate's expected calibration error above the bound, beyond doubt? Bootstrap band, fail on evidence."""
    picks = rng.integers(0, len(y), size=(contract.resamples, len(y)))
    band = _basic_band(float(calibration_errors(p_c, y)[0]), calibration_errors(p_c, y, picks), contract.alpha, 0)
    failed = band.lower > contract.max_calibration_error
    return {
        "expected_calibration_error": round(band.estimate, 4),
        "band": [round(band.lower, 4), round(band.upper, 4)],
        "max": contract.max_calibration_error,
        "verdict": str(Verdict.FAIL if failed else Verdict.PASS),
    }


def positive_rate_by_cohort(
    p_c: np.ndarray, p_s: np.ndarray, y: np.ndarray, cohorts: np.ndarray, contract: ClassifierContract
) -> dict[str, dict[str, Any]]:
    """Per cohort: is the candidate's |mean probability − observed rate| above the champion's by more than the
    tolerance? Failing only on evidence.

    |ḡ_c| − |ḡ_s| (ḡ: a version's mean of p − y over the cohort's orders) is a mean of per-order values once each
    gap's sign is fixed at its estimate: d_i = sign(ḡ_c)·(p_c,i − y_i) − sign(ḡ_s)·(p_s,i − y_i), whose mean is the
    estimate itself; its band is the fixed-sample normal one. Where both versions err the same way the labels cancel
    out of d_i and the band is as narrow as the paired shift's; a wrongly signed ḡ_s (the champion's gap within noise
    of 0) only lowers the estimate, which can delay a fail, never cause one.
    """
    found = {}
    for cohort in sorted(set(cohorts.tolist())):
        rows = cohorts == cohort
        n = int(rows.sum())
        if n < MIN_COHORT_ROWS:
            continue
        c, s, observed = p_c[rows], p_s[rows], y[rows]
        sign_c, sign_s = np.sign(c.mean() - observed.mean()) or 1.0, np.sign(s.mean() - observed.mean()) or 1.0
        band = fixed_mean_band(sign_c * (c - observed) - sign_s * (s - observed), contract.alpha)
        failed = band.lower > contract.positive_rate_tolerance
        found[str(cohort)] = {
            "candidate_rate": round(float(c.mean()), 4),
            "champion_rate": round(float(s.mean()), 4),
            "observed_rate": round(float(observed.mean()), 4),
            "shift": round(float((c - s).mean()), 4),  # evidence: how far the candidate moved the cohort
            "excess_bias": round(band.estimate, 4),
            "band": [round(band.lower, 4), round(band.upper, 4)],
            "rows": n,
            "verdict": str(Verdict.FAIL if failed else Verdict.PASS),
        }
    return found


def classifier_quality(
    candidate: np.ndarray, champion: np.ndarray, actual: np.ndarray, cohorts: np.ndarray, contract: ClassifierContract
) -> dict[str, Any]:
    """All four contracts on both versions' served probabilities for the same orders and their 0/1 labels.

    Orders where either probability or the label is not finite are left out (a non-finite answer fails the shadow
    gate on its own).
    """
    p_c, p_s = np.asarray(candidate, dtype=np.float64), np.asarray(champion, dtype=np.float64)
    y = np.asarray(actual, dtype=np.float64)
    usable = np.isfinite(p_c) & np.isfinite(p_s) & np.isfinite(y)
    p_c, p_s, y, cohorts = p_c[usable], p_s[usable], y[usable], np.asarray(cohorts)[usable]
    report: dict[str, Any] = {
        "task": "binary_classification",
        "rows": int(usable.sum()),
        "alpha": contract.alpha,
        "bootstrap_resamples": contract.resamples,
        "on_inconclusive": contract.on_inconclusive,
    }
    if report["rows"] < 2 or len(np.unique(y)) < 2:
        note = "no labelled orders" if report["rows"] < 2 else "the labelled orders hold one class only"
        return {**report, "verdict": str(ON_INCONCLUSIVE[contract.on_inconclusive]), "note": note}
    rng = np.random.default_rng(contract.seed)  # seeded: a retry of the same run reaches the same verdict
    report["log_loss"] = log_loss_verdict(p_c, p_s, y, contract)
    report["auc"] = auc_verdict(p_c, p_s, y, contract, rng)
    report["calibration"] = calibration_verdict(p_c, y, contract, rng)
    report["positive_rate_tolerance"] = contract.positive_rate_tolerance
    report["positive_rate_by_cohort"] = positive_rate_by_cohort(p_c, p_s, y, cohorts, contract)
    verdicts = [report[k]["verdict"] for k in ("log_loss", "auc", "calibration")]
    verdicts += [v["verdict"] for v in report["positive_rate_by_cohort"].values()]
    report["verdict"] = str(_worst_of(verdicts))
    return report


def classifier_breaches(quality: dict[str, Any]) -> list[str]:
    """One human line with the numbers for each classifier contract that fails the gate."""
    if "log_loss" not in quality:
        unjudged = quality.get("verdict") in (Verdict.FAIL, Verdict.INCONCLUSIVE)
        return [f"served quality not judged: {quality.get('note', 'no labelled orders')}"] if unjudged else []
    alpha, n = quality["alpha"], quality["rows"]
    found = []
    loss = quality["log_loss"]
    if loss["verdict"] in (Verdict.FAIL, Verdict.INCONCLUSIVE):
        low, high = loss["excess_band"]
        shown = "worse than" if loss["verdict"] == Verdict.FAIL else "not shown within"
        found.append(
            f"served log loss {shown} +{loss['tolerance']:.0%} of the champion's on the same {n} labelled orders: "
            f"{loss['candidate']:.4f} vs {loss['champion']:.4f}; excess over the tolerated level "
            f"{loss['excess']:+.4f} (band {low:+.4f} … {high:+.4f} at α={alpha:g})"
        )
    auc = quality["auc"]
    if auc["verdict"] in (Verdict.FAIL, Verdict.INCONCLUSIVE):
        low, high = auc["drop_band"]
        shown = "dropped by more than" if auc["verdict"] == Verdict.FAIL else "not shown within"
        found.append(
            f"served AUC {shown} {auc['tolerance']:g} below the champion's on the same {n} labelled orders: "
            f"{auc['candidate']:.3f} vs {auc['champion']:.3f} (drop {auc['drop']:+.3f}, band {low:+.3f} … "
            f"{high:+.3f} at α={alpha:g})"
        )
    calibration = quality["calibration"]
    if calibration["verdict"] == Verdict.FAIL:
        (low, high), ece = calibration["band"], calibration["expected_calibration_error"]
        found.append(
            f"served probabilities miscalibrated: expected calibration error {ece:.3f}"
            f" (band {low:.3f} … {high:.3f} at α={alpha:g}, {n} labelled orders) > {calibration['max']:g}"
        )
    tolerance = quality["positive_rate_tolerance"]
    for cohort, part in quality["positive_rate_by_cohort"].items():
        if part["verdict"] != Verdict.FAIL:
            continue
        low, high = part["band"]
        found.append(
            f"{cohort} predicted positive rate {part['candidate_rate']:.1%} is further from the observed "
            f"{part['observed_rate']:.1%} than the champion's {part['champion_rate']:.1%} by more than "
            f"{tolerance * 100:g} pp on the same orders (excess {part['excess_bias'] * 100:+.1f} pp, band "
            f"{low * 100:+.1f} … {high * 100:+.1f} pp at α={alpha:g}, {part['rows']} rows)"
        )
    return found

"""Anytime-valid confidence sequences: bands on a difference that may be looked at after every observation.

A confidence sequence (CS) is a band [lower, upper] around an estimate that holds *at every time at once*
with probability 1 − α, so an analysis may look as often as it likes and stop as soon as the band
answers its question, without raising the error rate (Howard, Ramdas, McAuliffe & Sekhon, "Time-uniform,
nonparametric, nonasymptotic confidence sequences", Annals of Statistics 2021; used for canary analysis
in Lindon, Sanden & Shirikian, "Rapid Regression Detection in Software Deployments through Sequential
Testing", KDD 2022).

The boundary is Robbins' two-sided normal mixture: for a Gaussian martingale S with variance (intrinsic
time) V, mixing the drift over N(0, 1/ρ) gives the test martingale sqrt(ρ/(V+ρ))·exp(S²/(2(V+ρ))), and
Ville's inequality bounds the chance it ever exceeds 1/α by α, i.e.

    P( ∃ V: |S| ≥ sqrt((V + ρ) · log((V + ρ) / (ρ α²))) ) ≤ α          (Howard et al. 2021, eq. (14))

For an estimate θ̂ with variance 1/I (I is the Fisher information, which grows with the samples), S = I·(θ̂ − θ)
and V = I, so θ lies within sqrt((I + ρ)·log((I + ρ)/(ρα²)))/I of θ̂ at every I. The variances are
estimated from the data, which makes this the *asymptotic* CS of Waudby-Smith, Arbour, Sinha, Kennedy &
Ramdas ("Time-uniform central limit theory and asymptotic confidence sequences", 2023): valid as the
samples grow, not at n = 5, which is why every guardrail also has a minimum sample count. The error rate
is checked by simulation in the tests and in `bench/bench_decisions.py`.

Written here rather than taken from a package: `confseq` has no wheel (C++ built with CMake on every fresh
machine), `savvi` pulls in cvxpy and its solvers for what is, for us, this one boundary, and `expectation`
does not install for Python 3.11 (README, "How a verdict is reached").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

# Pseudo-observations added to each arm's proportion before its variance is estimated (Agresti & Caffo 2000):
# with zero errors in both arms the raw variance is 0, and a band of width 0 would "prove" anything.
PSEUDO_COUNTS = 1.0


@dataclass(frozen=True)
class Band:
    """An estimate of a difference (candidate − stable, or candidate − a fixed level) and its (1 − α) CS."""

    estimate: float
    lower: float
    upper: float
    samples: int  # the smaller arm's count: what a minimum sample size is checked against
    variance_removed: float = 0.0  # the share of the difference's variance a pre-rollout covariate explained
    effective_users: float | None = None  # the smaller arm's effective number of users (None: not by users)
    unbalanced: bool = False  # the arms' pre-rollout ratios disagreed beyond chance: the covariate was left out

    def as_dict(self) -> dict[str, float | int]:
        """JSON-friendly form for the rollout record and the report."""
        out: dict[str, float | int] = {
            "estimate": self.estimate,
            "lower": self.lower,
            "upper": self.upper,
            "samples": self.samples,
        }
        if self.variance_removed:
            out["variance_removed"] = round(self.variance_removed, 4)
        if self.effective_users is not None:
            out["effective_users"] = round(self.effective_users, 1)
        if self.unbalanced:
            out["unbalanced"] = 1
        return out


def mixture_radius(information: float, alpha: float, rho: float) -> float:
    """Half-width of the normal-mixture CS for an estimate whose variance is 1/`information` (see module doc)."""
    if information <= 0 or not math.isfinite(information):
        return math.inf
    total = information + rho
    return math.sqrt(total * math.log(total / (rho * alpha**2))) / information


def _band(estimate: float, variance: float, alpha: float, per_sample_variance: float, tuned_at: int, n: int) -> Band:
    """A band from an estimate and its variance; the mixture is tuned to be tightest near `tuned_at` samples.

    ρ is the information `tuned_at` samples would carry (the per-sample variance converges, so ρ is
    asymptotically a constant, as the asymptotic CS requires).
    """
    if variance <= 0 and per_sample_variance <= 0:
        # every observation is the same number (e.g. two identical graphs answering the same orders): no
        # sampling spread to bound, the estimate is exact
        return Band(estimate, estimate, estimate, n)
    if variance <= 0:
        variance = per_sample_variance / max(n, 1)
    rho = tuned_at / per_sample_variance if per_sample_variance > 0 else 1.0
    radius = mixture_radius(1.0 / variance, alpha, rho)
    return Band(estimate, estimate - radius, estimate + radius, n)


def proportion_difference(
    bad_candidate: int, n_candidate: int, bad_stable: int, n_stable: int, *, alpha: float, tuned_at: int
) -> Band:
    """CS on p_candidate − p_stable from two arms' counts of bad outcomes (errors, NaN, low confidence)."""
    n = min(n_candidate, n_stable)
    if n == 0:
        return Band(math.nan, -math.inf, math.inf, 0)
    p_c, p_s = bad_candidate / n_candidate, bad_stable / n_stable
    var_c = _smoothed_variance(bad_candidate, n_candidate)
    var_s = _smoothed_variance(bad_stable, n_stable)
    variance = var_c / n_candidate + var_s / n_stable
    # per-sample variance of the difference at the current allocation, in units of the smaller arm
    per_sample = n * variance
    return _band(p_c - p_s, variance, alpha, per_sample, tuned_at, n)


def proportion_level(bad: int, n: int, level: float, *, alpha: float, tuned_at: int) -> Band:
    """CS on p − `level` for one arm's count of bad outcomes (e.g. the long tail's low-confidence share vs 15 %)."""
    if n == 0:
        return Band(math.nan, -math.inf, math.inf, 0)
    var = _smoothed_variance(bad, n)
    return _band(bad / n - level, var / n, alpha, var, tuned_at, n)


def mean_difference(
    candidate: Sequence[float] | np.ndarray, stable: Sequence[float] | np.ndarray, *, alpha: float, tuned_at: int
) -> Band:
    """CS on mean(candidate) − mean(stable) for two independent arms (e.g. log latency, log ETA)."""
    c, s = np.asarray(candidate, dtype=np.float64), np.asarray(stable, dtype=np.float64)
    n = int(min(len(c), len(s)))
    if n < 2:
        return Band(math.nan, -math.inf, math.inf, n)
    variance = float(c.var(ddof=1) / len(c) + s.var(ddof=1) / len(s))
    return _band(float(c.mean() - s.mean()), variance, alpha, n * variance, tuned_at, n)


def _smoothed_variance(bad: int, n: int) -> float:
    p = (bad + PSEUDO_COUNTS) / (n + 2 * PSEUDO_COUNTS)
    return p * (1.0 - p)


def mean_level(values: Sequence[float] | np.ndarray, level: float, *, alpha: float, tuned_at: int) -> Band:
    """CS on mean(values) − `level` for one stream (e.g. paired log-latency ratios against 0)."""
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    if n < 2:
        return Band(math.nan, -math.inf, math.inf, n)
    per_sample = float(x.var(ddof=1))
    return _band(float(x.mean() - level), per_sample / n, alpha, per_sample, tuned_at, n)


# --- Users as the unit -------------------------------------------------------------------------------------------
# Assignment is sticky per user, and a user's calls resemble each other (same routes, same device, the same order
# retried): calls are not independent observations. Every rate and mean below is a ratio estimator over users,
# θ̂ = Σ_u y_u / Σ_u n_u (y_u: the user's weighted bad calls, or summed log latency; n_u: their weighted calls), with
# the cluster-robust (sandwich, CR1) variance of the delta method:
#
#     Var(θ̂) ≈ m/(m−1) · Σ_u (y_u − θ̂ n_u)² / (Σ_u n_u)²          (m users)
#
# so a heavy user or a client's repeats widen the band instead of narrowing it. A share's variance is never taken
# below the smoothed binomial variance of its calls (with no bad call at all the sandwich is 0).


@dataclass(frozen=True)
class Ratio:
    """A ratio estimate over users: Σy / Σn, its cluster-robust variance, calls (Σn) and users (m)."""

    estimate: float
    variance: float
    calls: float
    users: int


def clustered_ratio(y: np.ndarray, n: np.ndarray, *, share: bool) -> Ratio:
    """Σy/Σn over users with its cluster-robust variance; a `share` (y counts bad calls) gets the binomial floor."""
    y, n = np.asarray(y, dtype=np.float64), np.asarray(n, dtype=np.float64)
    keep = n > 0
    y, n = y[keep], n[keep]
    total, m = float(n.sum()), int(len(n))
    if m == 0 or total <= 0:
        return Ratio(math.nan, math.inf, 0.0, 0)
    estimate = float(y.sum()) / total
    residual = y - estimate * n
    variance = float(residual @ residual) / total**2 * (m / (m - 1) if m > 1 else 1.0)
    if share:
        variance = max(variance, _smoothed_variance(int(round(float(y.sum()))), int(round(total))) / total)
    return Ratio(estimate, variance, total, m)


def ratio_difference(candidate: Ratio, stable: Ratio, *, alpha: float, tuned_at: int) -> Band:
    """CS on candidate − stable for two arms' clustered ratios (shares of calls, or mean log latency per call)."""
    n = int(min(candidate.calls, stable.calls))
    if min(candidate.users, stable.users) < 2 or n == 0:
        return Band(math.nan, -math.inf, math.inf, n)
    variance = candidate.variance + stable.variance
    return _band(candidate.estimate - stable.estimate, variance, alpha, n * variance, tuned_at, n)


# --- Pre-rollout covariates (CUPED) ---------------------------------------------------------------------------------
# Sticky users differ from each other far more than two versions usually do (one user's parcels are slow to
# route, another's answers come from a faster region), and the two arms hold different users: with heavy users,
# the arms' difference is mostly which users fell on which side, and that does not average out over time. Each
# user's own behaviour *before the rollout started* (everyone on stable) predicts that part. Regression adjustment
# with a pre-period covariate (Deng, Xu, Kohavi & Walker, "Improving the sensitivity of online controlled
# experiments by utilizing pre-experiment data", WSDM 2013 — CUPED; for ratio metrics through the delta method's
# per-user linearisation) subtracts it:
#
#     Δ̂_adj = (θ̂_C − θ̂_S) − β (φ̂_C − φ̂_S),   β = Cov(Δ̂, D̂) / Var(D̂),   Var(Δ̂_adj) = Var(Δ̂) − Cov(Δ̂, D̂)² / Var(D̂)
#
# where φ̂_a is the same ratio over the arm's users' pre-rollout sums and D̂ = φ̂_C − φ̂_S has mean 0 because
# assignment is random with respect to anything before it. Every (co)variance is the cluster-robust one over users.
# A user without pre-rollout traffic simply adds nothing to φ̂. β is estimated from the same data: its error is of
# order 1/users, negligible beside the band (and checked in the tests' A/A runs).


@dataclass(frozen=True)
class UserSums:
    """One arm's per-user sums for a ratio: in the window (y / n) and before the rollout (x / m), aligned by user."""

    y: np.ndarray
    n: np.ndarray
    x: np.ndarray
    m: np.ndarray


@dataclass(frozen=True)
class _ArmMoments:
    """One arm's ratio in the window (θ̂) and before the rollout (φ̂), their cluster-robust (co)variances."""

    theta: float
    phi: float
    variance: float  # Var(θ̂), floored for a share
    pre_variance: float  # Var(φ̂)
    covariance: float  # Cov(θ̂, φ̂)
    floor: float  # the smoothed binomial variance (shares), else 0
    users: int
    calls: float
    pre_users: int  # users with pre-rollout traffic
    effective_users: float  # Kish's effective number of users, weighting each by their requests


def _linearized(top: np.ndarray, bottom: np.ndarray) -> tuple[float, np.ndarray, float]:
    """The ratio Σtop/Σbottom, each user's influence on it, and the CR1 factor (one entry per user)."""
    total = float(bottom.sum())
    if total <= 0:
        return math.nan, np.zeros(len(top)), 1.0
    estimate = float(top.sum()) / total
    users = int((bottom > 0).sum())
    return estimate, (top - estimate * bottom) / total, (users / (users - 1) if users > 1 else 1.0)


def _moments(arm: UserSums, share: bool) -> _ArmMoments:
    keep = arm.n > 0
    y, n, x, m = arm.y[keep], arm.n[keep], arm.x[keep], arm.m[keep]
    theta, r, k = _linearized(y, n)
    phi, s, k_pre = _linearized(x, m) if float(m.sum()) > 0 else (0.0, np.zeros(len(y)), 1.0)
    calls = float(n.sum())
    floor = _smoothed_variance(int(round(float(y.sum()))), int(round(calls))) / calls if share and calls > 0 else 0.0
    variance = max(k * float(r @ r), floor)
    pre_users = int((m > 0).sum())
    effective = calls**2 / float(n @ n) if calls > 0 else 0.0
    return _ArmMoments(
        theta, phi, variance, k_pre * float(s @ s), k * float(r @ s), floor, len(y), calls, pre_users, effective
    )


# The covariate is used only when both arms have this many users with pre-rollout traffic (an arm without any has no
# pre-rollout ratio at all: subtracting the other arm's level would shift the estimate by the metric's level), and
# only when the arms' pre-rollout ratios agree as randomisation says they must (|D̂| within BALANCE_Z of its sd): a
# larger gap means the pre-rollout window was not alike for both arms (e.g. a previous candidate held its buckets).
MIN_COVARIATE_USERS = 20
BALANCE_Z = 4.0


def adjusted_difference(candidate: UserSums, stable: UserSums, *, share: bool, alpha: float, tuned_at: int) -> Band:
    """CS on candidate − stable for two arms' ratios, regression-adjusted on the users' pre-rollout ratio (CUPED).

    Without pre-rollout sums (every m zero) this is `ratio_difference` of the two `clustered_ratio`s.
    """
    c, s = _moments(candidate, share), _moments(stable, share)
    n = int(min(c.calls, s.calls))
    users = min(c.effective_users, s.effective_users)
    if min(c.users, s.users) < 2 or n == 0:
        return Band(math.nan, -math.inf, math.inf, n, effective_users=users)
    # a share's variance never goes below the smoothed binomial one (with no bad call at all the sandwich is 0)
    estimate, variance = c.theta - s.theta, c.variance + s.variance
    pre, cov = c.pre_variance + s.pre_variance, c.covariance + s.covariance
    removed = 0.0
    covariate = min(c.pre_users, s.pre_users) >= MIN_COVARIATE_USERS and pre > 0
    balanced = covariate and abs(c.phi - s.phi) <= BALANCE_Z * math.sqrt(pre)
    if balanced and variance > 0:
        adjusted = max(variance - cov * cov / pre, c.floor + s.floor)
        removed = 1.0 - adjusted / variance
        estimate, variance = estimate - cov / pre * (c.phi - s.phi), adjusted
    band = _band(estimate, variance, alpha, n * variance, tuned_at, n)
    unbalanced = covariate and not balanced
    return replace(band, variance_removed=max(removed, 0.0), effective_users=users, unbalanced=unbalanced)


def ratio_level(ratio: Ratio, level: float, *, alpha: float, tuned_at: int) -> Band:
    """CS on one arm's clustered ratio − a fixed `level` (e.g. the long tail's low-confidence share vs 15 %)."""
    n = int(ratio.calls)
    if ratio.users < 2 or n == 0:
        return Band(math.nan, -math.inf, math.inf, n)
    return _band(ratio.estimate - level, ratio.variance, alpha, n * ratio.variance, tuned_at, n)

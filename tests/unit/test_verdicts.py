"""The statistical contract, proved by simulation: A/A false-verdict rates within α, power at stated effects.

Every run looks after every block of calls (as the stage analysis does), so these are the error rates of a
*continuously monitored* test. Seeded: the counts are the same on every machine and every run.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from mlrelease.verdicts.decide import Verdict, decide
from mlrelease.verdicts.sequential import (
    mean_difference,
    mean_level,
    mixture_radius,
    proportion_difference,
    proportion_level,
)

ALPHA = 0.05  # a larger α than the plan's 0.01 makes the simulated rate measurable with few runs
RUNS = 300
LOOKS = range(100, 3001, 100)


def _allowed(alpha: float = ALPHA, runs: int = RUNS) -> int:
    """False verdicts a test with rate ≤ α may show in `runs` runs, at a 1-in-1,000 chance of a false alarm."""
    return int(binom.ppf(0.999, runs, alpha))


def _first_verdict(bands, bad: str, tolerance: float) -> Verdict:
    for band in bands:
        verdict = decide(band, bad, tolerance)
        if verdict is not Verdict.CONTINUE:
            return verdict
    return Verdict.CONTINUE


def test_the_mixture_boundary_shrinks_like_a_confidence_interval_times_a_log_factor():
    for information in (10.0, 1e3, 1e5):
        radius = mixture_radius(information, 0.01, rho=information)
        fixed = 2.576 / math.sqrt(information)  # a fixed-sample 99 % interval
        assert fixed < radius < 2.5 * fixed
    assert mixture_radius(0.0, 0.01, 1.0) == math.inf


def test_aa_proportions_false_fail_rate_within_alpha_when_monitored_continuously():
    rng = np.random.default_rng(1)
    fails = 0
    for _ in range(RUNS):
        c, s = rng.random(max(LOOKS)) < 0.05, rng.random(max(LOOKS)) < 0.05
        bands = (
            proportion_difference(int(c[:n].sum()), n, int(s[:n].sum()), n, alpha=ALPHA, tuned_at=200) for n in LOOKS
        )
        # tolerance 0: the hardest case, the candidate sits exactly on the tolerance
        fails += _first_verdict(bands, "higher", 0.0) is Verdict.FAIL
    assert fails <= _allowed(), f"{fails}/{RUNS} false fails at α={ALPHA}"


def test_aa_latency_false_fail_rate_within_alpha_on_heavy_tailed_latencies():
    rng = np.random.default_rng(2)
    fails = 0
    for _ in range(RUNS):
        # log-normal body with a 2 % tail 5x slower: what single calls on a shared machine look like
        def calls(n: int) -> np.ndarray:
            x = rng.lognormal(np.log(0.002), 0.4, n)
            return np.log(np.where(rng.random(n) < 0.02, x * 5, x))

        c, s = calls(max(LOOKS)), calls(max(LOOKS))
        bands = (mean_difference(c[:n], s[:n], alpha=ALPHA, tuned_at=200) for n in LOOKS)
        fails += _first_verdict(bands, "higher", 0.0) is Verdict.FAIL
    assert fails <= _allowed(), f"{fails}/{RUNS} false fails at α={ALPHA}"


def test_aa_a_same_quality_candidate_passes_non_inferiority():
    rng = np.random.default_rng(3)
    verdicts = []
    for _ in range(100):
        c, s = rng.lognormal(0, 0.4, 3000), rng.lognormal(0, 0.4, 3000)
        bands = (mean_difference(np.log(c[:n]), np.log(s[:n]), alpha=0.01, tuned_at=200) for n in LOOKS)
        verdicts.append(_first_verdict(bands, "higher", math.log1p(0.10)))
    assert verdicts.count(Verdict.FAIL) == 0 and verdicts.count(Verdict.PASS) >= 95


@pytest.mark.parametrize(("slowdown", "min_detected"), [(0.25, 0.95), (1.00, 1.0)])
def test_power_latency_regressions_beyond_the_tolerance_are_failed(slowdown, min_detected):
    rng = np.random.default_rng(4)
    detected = 0
    for _ in range(100):
        c = rng.lognormal(np.log(1 + slowdown), 0.4, 3000)
        s = rng.lognormal(0, 0.4, 3000)
        bands = (mean_difference(np.log(c[:n]), np.log(s[:n]), alpha=0.01, tuned_at=200) for n in LOOKS)
        detected += _first_verdict(bands, "higher", math.log1p(0.10)) is Verdict.FAIL
    assert detected / 100 >= min_detected


def test_power_error_rate_five_percent_is_caught_within_a_few_hundred_calls():
    rng = np.random.default_rng(5)
    first = []
    for _ in range(100):
        c, s = rng.random(3000) < 0.05, rng.random(3000) < 0.0
        for n in LOOKS:
            band = proportion_difference(int(c[:n].sum()), n, int(s[:n].sum()), n, alpha=0.01, tuned_at=200)
            if decide(band, "higher", 0.001) is Verdict.FAIL:
                first.append(n)
                break
    assert len(first) == 100 and max(first) <= 600


def test_aa_one_arm_level_false_fail_rate_and_the_long_tail_rule():
    rng = np.random.default_rng(6)
    fails = 0
    for _ in range(RUNS):
        x = rng.random(max(LOOKS)) < 0.15  # exactly at the 15 % limit
        bands = (proportion_level(int(x[:n].sum()), n, 0.15, alpha=ALPHA, tuned_at=200) for n in LOOKS)
        fails += _first_verdict(bands, "higher", 0.0) is Verdict.FAIL
    assert fails <= _allowed()
    at_40 = proportion_level(400, 1000, 0.15, alpha=0.01, tuned_at=200)
    assert decide(at_40, "higher", 0.0) is Verdict.FAIL


def test_either_direction_and_paired_ratios():
    rng = np.random.default_rng(7)
    up, down = rng.normal(0.3, 0.2, 500), rng.normal(-0.3, 0.2, 500)
    zero = rng.normal(0.0, 0.2, 500)
    for values, expected in ((up, Verdict.FAIL), (down, Verdict.FAIL), (zero, Verdict.PASS)):
        assert decide(mean_level(values, 0.0, alpha=0.01, tuned_at=100), "either", 0.1) is expected
    assert decide(mean_level(down, 0.0, alpha=0.01, tuned_at=100), "lower", 0.1) is Verdict.FAIL
    assert decide(mean_level(down, 0.0, alpha=0.01, tuned_at=100), "higher", 0.1) is Verdict.PASS


def test_degenerate_inputs_never_decide():
    assert decide(proportion_difference(0, 0, 0, 10, alpha=0.01, tuned_at=10), "higher", 0.0) is Verdict.CONTINUE
    assert decide(mean_difference([1.0], [1.0], alpha=0.01, tuned_at=10), "higher", 0.0) is Verdict.CONTINUE
    # zero errors in both arms is not a band of width 0 (pseudo-counts keep the variance honest)
    band = proportion_difference(0, 300, 0, 300, alpha=0.01, tuned_at=200)
    assert band.upper > 0.001 and decide(band, "higher", 0.001) is Verdict.CONTINUE

"""Users as the unit: the clustered variance is the estimate's real spread, and the relative fast guard's error rates.

The bounds are tight on purpose: a variance 25 % too small (a band 25 % too narrow would need ~44 % less) or the
calls-as-independent variance fails them.
"""

from __future__ import annotations

import numpy as np
import pytest

from mlrelease.gateway.split_guard import SplitGuard
from mlrelease.verdicts.sequential import clustered_ratio, ratio_difference


def _heavy_users(rng: np.random.Generator, users: int, calls: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """Per user: calls (heavy-tailed activity) and bad calls (each user has their own rate around `base`)."""
    activity = rng.lognormal(0.0, 1.6, users)  # the top 1 % of users make ~23 % of the calls
    n = rng.multinomial(calls, activity / activity.sum()).astype(float)
    rate = np.clip(base * rng.lognormal(0.0, 1.0, users), 0, 1)  # per-user differences
    return rng.binomial(n.astype(int), rate).astype(float), n


def test_the_clustered_variance_is_the_real_spread_of_the_estimate_across_heavy_sticky_users():
    rng = np.random.default_rng(7)
    estimates, variances, naive = [], [], []
    for _ in range(1500):
        bad, n = _heavy_users(rng, 2000, 20000, 0.05)
        ratio = clustered_ratio(bad, n, share=True)
        estimates.append(ratio.estimate)
        variances.append(ratio.variance)
        p = bad.sum() / n.sum()
        naive.append(p * (1 - p) / n.sum())
    real = float(np.var(estimates))
    # the clustered variance matches the spread; calls taken as independent understate it several times over
    assert np.mean(variances) / real == pytest.approx(1.0, abs=0.12)
    assert np.mean(naive) / real < 0.5


def test_heavy_users_and_repeats_widen_the_band_instead_of_narrowing_it():
    rng = np.random.default_rng(3)
    bad, n = _heavy_users(rng, 400, 8000, 0.05)
    once = ratio_difference(
        clustered_ratio(bad, n, share=True), clustered_ratio(bad, n, share=True), alpha=0.01, tuned_at=200
    )
    # every request of every user sent three times (client repeats): three times the calls, no more information
    thrice = ratio_difference(
        clustered_ratio(3 * bad, 3 * n, share=True),
        clustered_ratio(3 * bad, 3 * n, share=True),
        alpha=0.01,
        tuned_at=200,
    )
    assert thrice.upper - thrice.lower == pytest.approx(once.upper - once.lower, rel=0.15)


def _aa_split(rng: np.random.Generator, share: float, events: int, guard: SplitGuard, longest_burst: int = 1) -> bool:
    """A/A: each failure event falls on the candidate with its traffic share, as a burst of 1 … `longest_burst`
    back-to-back failures of that arm; True when the guard ever tripped."""
    clock = [0.0]
    guard._clock = lambda: clock[0]  # noqa: SLF001 - a deterministic clock for the test
    for _ in range(events):
        clock[0] += 0.5
        guard.observe("candidate", False, count=int(100 * share))
        guard.observe("stable", False, count=int(100 * (1 - share)))
        arm = "candidate" if rng.random() < share else "stable"
        burst = int(rng.integers(1, longest_burst + 1)) if longest_burst > 1 else 1
        for _ in range(burst):
            if guard.observe(arm, True):
                return True
    return False


@pytest.mark.parametrize("share", [0.12, 0.5])
def test_the_relative_guard_keeps_its_false_trip_rate_on_an_aa_candidate(share):
    rng = np.random.default_rng(11)
    alpha = 0.05  # large, so that 4,000 guards can measure it
    trips = sum(_aa_split(rng, share, 200, SplitGuard(ratio=20, alpha=alpha, window_s=10)) for _ in range(4000))
    assert trips / 4000 <= alpha
    # … and the bound is not vacuous: with α ten times larger the same traffic trips more often
    loose = sum(_aa_split(rng, share, 200, SplitGuard(ratio=20, alpha=0.5, window_s=10)) for _ in range(1000))
    assert loose / 1000 > trips / 4000


def test_the_relative_guard_trips_a_candidate_failing_every_call_within_a_few_calls_and_not_on_stables_outage():
    clock = [0.0]
    guard = SplitGuard(ratio=20, alpha=1e-4, window_s=10, clock=lambda: clock[0])
    guard.observe("stable", False, count=88)
    guard.observe("candidate", False, count=12)  # the first stage: 12 % of requests on the candidate
    calls = 0
    while not guard.tripped:
        clock[0] += 0.25
        calls += 1
        guard.observe("candidate", True)
        guard.observe("stable", False, count=7)
    assert calls <= 8
    # stable and candidate failing together (serving is down): the failures split by traffic, no trip
    shared = SplitGuard(ratio=20, alpha=1e-4, window_s=10, clock=lambda: clock[0])
    shared.observe("stable", False, count=88)
    shared.observe("candidate", False, count=12)
    for i in range(500):
        clock[0] += 0.01
        assert not shared.observe("candidate" if i % 8 == 0 else "stable", True)


@pytest.mark.parametrize("share", [0.12, 0.5])
def test_a_burst_of_failures_weighs_as_one_event_so_bursty_aa_traffic_keeps_the_false_trip_rate(share):
    rng = np.random.default_rng(5)
    alpha = 0.05
    guards = (SplitGuard(ratio=20, alpha=alpha, window_s=10) for _ in range(2000))
    trips = sum(_aa_split(rng, share, 200, guard, longest_burst=5) for guard in guards)
    assert trips / 2000 <= alpha
    # weighing every failure of a burst (a declared burst length of 1) trips far more often than α: the rule matters
    naive = sum(
        _aa_split(rng, share, 200, SplitGuard(ratio=20, alpha=alpha, window_s=10, burst_failures=1), longest_burst=5)
        for _ in range(300)
    )
    assert naive / 300 > 2 * alpha


def test_a_run_longer_than_any_burst_trips_while_stable_answers_but_not_when_stable_fails_too():
    clock = [0.0]
    guard = SplitGuard(ratio=20, alpha=1e-4, window_s=10, burst_failures=5, clock=lambda: clock[0])
    guard.observe("stable", False, count=88)
    guard.observe("candidate", False, count=12)
    for _ in range(5):  # a burst as long as the declared one, stable answering beside it: no trip
        clock[0] += 0.1
        assert not guard.observe("candidate", True)
        guard.observe("stable", False, count=3)
    guard.observe("candidate", False)  # the burst ends
    calls = 0
    while not guard.tripped:  # now every call fails
        clock[0] += 0.1
        calls += 1
        guard.observe("candidate", True)
        guard.observe("stable", False, count=3)
    assert calls == guard.run_to_trip == 7
    assert "failed 7 calls in a row while stable answered" in guard.describe()
    # the same run while stable fails beside it (serving is down): the run rule stays silent
    outage = SplitGuard(ratio=20, alpha=1e-4, window_s=10, burst_failures=5, clock=lambda: clock[0])
    outage.observe("stable", False, count=88)
    outage.observe("candidate", False, count=12)
    for _ in range(20):
        clock[0] += 0.1
        assert not outage.observe("candidate", True)
        assert not outage.observe("stable", True)
        outage.observe("stable", False, count=7)
    assert outage.runs["candidate"] == 20


def test_a_stable_failure_restarts_the_run_count_and_the_trip_names_what_tripped_it():
    clock = [0.0]
    guard = SplitGuard(ratio=20, alpha=1e-4, window_s=10, burst_failures=5, clock=lambda: clock[0])
    guard.observe("stable", False, count=88)
    guard.observe("candidate", False, count=12)
    calls = 0
    while not guard.tripped:  # the candidate fails every call; stable fails once, after the candidate's 3rd failure
        clock[0] += 0.1
        calls += 1
        guard.observe("candidate", True)
        if calls == 3:
            guard.observe("stable", True)
        guard.observe("stable", False, count=3)
    assert calls == 3 + guard.run_to_trip  # 7 more after stable's failure, not a rule silenced for the whole run
    assert guard.reason == "run" and "failed 7 calls in a row while stable answered" in guard.describe()
    # a candidate failing every other call: no run is long, the weighed evidence trips it, and the trip says so
    both = SplitGuard(ratio=20, alpha=1e-4, window_s=10, burst_failures=5, clock=lambda: clock[0])
    both.observe("stable", False, count=88)
    both.observe("candidate", False, count=12)
    while not both.tripped:
        clock[0] += 0.1
        both.observe("candidate", True)
        both.observe("candidate", False)
        both.observe("stable", False, count=3)
    assert both.reason == "evidence" and "log-evidence" in both.describe()


def test_the_rows_of_one_failed_call_weigh_once_and_a_failure_is_one_request():
    guard = SplitGuard(ratio=20, alpha=1e-4, window_s=10, clock=lambda: 0.0)
    guard.observe("stable", False, count=88)
    guard.observe("candidate", False, count=12)
    batch = object()
    for _ in range(40):  # one Triton call of 40 rows failed; stable answered their retries
        guard.observe("candidate", True, call=batch)
        guard.observe("stable", False)
    assert not guard.tripped and guard.failures == 1 and guard.runs["candidate"] == 1
    with pytest.raises(ValueError, match="a failure is one request"):
        guard.observe("candidate", True, count=3)

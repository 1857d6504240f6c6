"""Pre-rollout covariates (CUPED): the adjusted difference is unbiased, its variance is its real spread, and it takes
the arms' difference in users out of the band.

Sticky users with persistent offsets (latency, ETA) and heavy-tailed activity: the unadjusted difference of two
arms of the same version is mostly which users fell on which side. The bounds are tight on purpose: a variance 25 %
too small, or an adjustment that forgets the covariate's own noise, fails them.
"""

from __future__ import annotations

import numpy as np
import pytest

from mlrelease.rollout.guardrails import band_for
from mlrelease.rollout.plan import Guardrail
from mlrelease.rollout.windows import CohortWindow, summarize_calls
from mlrelease.verdicts.sequential import UserSums, adjusted_difference, clustered_ratio, ratio_difference


def _arm(rng: np.random.Generator, offset: np.ndarray, activity: np.ndarray, calls: int, shift: float) -> tuple:
    """Per user: calls and summed log latency in the stage (+`shift`) and before the rollout (the same users)."""
    p = activity / activity.sum()
    n = rng.multinomial(calls, p).astype(float)
    m = rng.multinomial(calls, p).astype(float)
    y = n * (offset + shift) + np.sqrt(n) * 0.35 * rng.standard_normal(len(n))
    x = m * offset + np.sqrt(m) * 0.35 * rng.standard_normal(len(m))
    return UserSums(y, n, x, m)


def _world(rng: np.random.Generator, users: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.normal(0.0, 0.3, users), rng.lognormal(0.0, 1.6, users)


def test_without_pre_rollout_traffic_the_adjusted_band_is_the_clustered_one():
    rng = np.random.default_rng(1)
    offset, activity = _world(rng, 400)
    c, s = _arm(rng, offset[:200], activity[:200], 4000, 0.0), _arm(rng, offset[200:], activity[200:], 4000, 0.0)
    bare = [UserSums(a.y, a.n, np.zeros_like(a.x), np.zeros_like(a.m)) for a in (c, s)]
    adjusted = adjusted_difference(*bare, share=False, alpha=0.01, tuned_at=200)
    plain = ratio_difference(
        clustered_ratio(c.y, c.n, share=False), clustered_ratio(s.y, s.n, share=False), alpha=0.01, tuned_at=200
    )
    assert (adjusted.estimate, adjusted.lower, adjusted.upper) == pytest.approx(
        (plain.estimate, plain.lower, plain.upper)
    )
    assert adjusted.variance_removed == 0.0


def test_the_adjusted_difference_is_unbiased_and_its_variance_is_its_real_spread():
    rng = np.random.default_rng(7)
    shift = 0.05  # the candidate is 5 % slower: the adjustment must keep that, not pull it toward zero
    estimates, variances, plain = [], [], []
    for _ in range(1500):
        offset, activity = _world(rng, 1000)
        c = _arm(rng, offset[:500], activity[:500], 10_000, shift)
        s = _arm(rng, offset[500:], activity[500:], 10_000, 0.0)
        band = adjusted_difference(c, s, share=False, alpha=0.05, tuned_at=200)
        estimates.append(band.estimate)
        # the band's variance, recovered from its stored share of the unadjusted one
        raw = clustered_ratio(c.y, c.n, share=False).variance + clustered_ratio(s.y, s.n, share=False).variance
        variances.append(raw * (1 - band.variance_removed))
        plain.append(c.y.sum() / c.n.sum() - s.y.sum() / s.n.sum())
    real = float(np.var(estimates))
    assert np.mean(estimates) == pytest.approx(shift, abs=0.003)
    assert np.mean(variances) / real == pytest.approx(1.0, abs=0.12)
    # and the point: the users' own history takes most of the arms' difference out (here well over half of it)
    assert real < 0.4 * float(np.var(plain))


def _window(
    rng: np.random.Generator, units: np.ndarray, offset: np.ndarray, weight: np.ndarray, calls: int, factor: float
) -> CohortWindow:
    """A cohort window built from calls (users active by `weight`), as the decision-log source builds it."""
    who = rng.choice(len(units), size=calls, p=weight / weight.sum())
    latency = 0.004 * factor * np.exp(offset[who] + rng.normal(0.0, 0.35, calls))
    return summarize_calls(units[who], np.zeros(calls, dtype=np.int64), latency)


def test_a_latency_contract_that_stalls_on_user_differences_resolves_with_the_users_history():
    rng = np.random.default_rng(5)
    units, offset, weight = np.arange(3000), rng.normal(0.0, 0.3, 3000), rng.lognormal(0.0, 1.6, 3000)
    latency = Guardrail(metric="latency", bad="higher", tolerance=0.10, alpha=5e-4)
    cand, stab = units[:1500], units[1500:]
    candidate = _window(rng, cand, offset[cand], weight[cand], 20_000, 1.0)
    stable = _window(rng, stab, offset[stab], weight[stab], 20_000, 1.0)
    before = _window(rng, units, offset, weight, 80_000, 1.0)
    plain, _, _ = band_for(latency, candidate, stable)
    adjusted, _, _ = band_for(latency, candidate, stable, before)
    assert adjusted.upper - adjusted.lower < 0.5 * (plain.upper - plain.lower)
    assert adjusted.lower < 0 < adjusted.upper  # the same version: the band holds zero
    assert adjusted.upper < np.log1p(0.10)  # … and now shows it within 10 %
    # a candidate 25 % slower is shown worse than the tolerance
    slower = _window(rng, cand, offset[cand], weight[cand], 20_000, 1.25)
    worse, _, _ = band_for(latency, slower, stable, before)
    assert worse.lower > np.log1p(0.10)


def test_an_arm_without_pre_rollout_traffic_leaves_the_band_unadjusted():
    # e.g. a rollout re-run right after one whose candidate held the same buckets: no stable traffic from them before
    rng = np.random.default_rng(2)
    offset, activity = _world(rng, 1000)
    c = _arm(rng, offset[:500], activity[:500], 10_000, 0.0)
    s = _arm(rng, offset[500:], activity[500:], 10_000, 0.0)
    bare = UserSums(c.y, c.n, np.zeros_like(c.x), np.zeros_like(c.m))
    band = adjusted_difference(bare, s, share=False, alpha=0.01, tuned_at=200)
    plain = ratio_difference(
        clustered_ratio(c.y, c.n, share=False), clustered_ratio(s.y, s.n, share=False), alpha=0.01, tuned_at=200
    )
    assert band.estimate == pytest.approx(plain.estimate) and band.variance_removed == 0.0


def test_arms_whose_pre_rollout_ratios_disagree_beyond_chance_are_not_adjusted_and_say_so():
    rng = np.random.default_rng(4)
    offset, activity = _world(rng, 1000)
    c = _arm(rng, offset[:500], activity[:500], 10_000, 0.0)
    s = _arm(rng, offset[500:], activity[500:], 10_000, 0.0)
    drifted = UserSums(c.y, c.n, c.x + 0.5 * c.m, c.m)  # the candidate arm's "before" was 65 % slower: not alike
    band = adjusted_difference(drifted, s, share=False, alpha=0.01, tuned_at=200)
    assert band.unbalanced and band.variance_removed == 0.0 and band.as_dict()["unbalanced"] == 1
    assert not adjusted_difference(c, s, share=False, alpha=0.01, tuned_at=200).unbalanced


def test_a_comparison_with_too_few_effective_users_does_not_decide():
    from mlrelease.rollout.guardrails import evaluate
    from mlrelease.verdicts.decide import Verdict

    rng = np.random.default_rng(6)
    units, offset, weight = np.arange(40), rng.normal(0.0, 0.3, 40), rng.lognormal(0.0, 1.6, 40)
    latency = Guardrail(metric="latency", bad="higher", tolerance=0.5, alpha=0.05, min_samples=20)
    few_c = _window(rng, units[:20], offset[:20], weight[:20], 5_000, 3.0)
    few_s = _window(rng, units[20:], offset[20:], weight[20:], 5_000, 1.0)
    result = evaluate(latency, "*", few_c, few_s)
    assert result.verdict is Verdict.CONTINUE and "effective users in the smaller arm, need 10" in result.reason
    assert evaluate(latency.model_copy(update={"min_users": 2}), "*", few_c, few_s).verdict is Verdict.FAIL

"""Served-quality verdicts on seeded synthetic orders: MAE, P90 error, calibration, per-cohort low-confidence shares."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from mlrelease.rollout.plan import ShadowSpec, load_plan
from mlrelease.steps.shadow import breaches, compare, quality_contract
from mlrelease.verdicts.served_quality import (
    QualityContract,
    fifth_error_ratio,
    quality_breaches,
    served_quality,
)

LOW = 0.6  # the estimator's LOW_CONFIDENCE
CONTRACT = QualityContract(low_confidence_threshold=LOW, resamples=1000, seed=7)


class Orders:
    """Labelled orders with a per-order expected error; a model answers with its own error and a confidence.

    Models fitted to the same features share most of their error (`shared`): a retrained candidate differs
    from the champion by a smaller error of its own, which is what makes the paired comparison sharp.
    """

    def __init__(self, seed: int, n: int = 1000) -> None:
        self.rng = np.random.default_rng(seed)
        self.cohorts = self.rng.choice(["core", "high_value", "long_tail"], size=n, p=[0.6, 0.2, 0.2])
        # the long tail is where errors are large: the expected absolute error is 3x there
        self.spread = np.where(self.cohorts == "long_tail", 6.0, 2.0) * self.rng.lognormal(0.0, 0.4, n)
        self.truth = 10 + self.rng.gamma(2.0, 5.0, n)
        self.actual = self.truth + self.rng.normal(0.0, self.spread)
        self.shared = self.rng.normal(0.0, 0.45 * self.spread)

    def model(self, extra: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """(eta, confidence): the shared error, its own, and `extra` (× spread) more; confidence from the spread."""
        n = len(self.truth)
        own = self.rng.normal(0.0, np.hypot(0.2, extra) * self.spread)
        confidence = np.exp(-0.085 * self.spread * self.rng.lognormal(0.0, 0.2, n))
        return self.truth + self.shared + own, confidence

    def judge(self, candidate, champion, contract: QualityContract = CONTRACT) -> dict:
        return served_quality(candidate, champion, self.actual, self.cohorts, contract)


def test_a_same_quality_candidate_passes():
    orders = Orders(seed=1)
    quality = orders.judge(orders.model(), orders.model())
    assert quality["verdict"] == "pass" and quality_breaches(quality) == []
    assert quality["rows"] == 1000 and quality["mae"]["verdict"] == "pass"
    assert quality["calibration"]["band"][0] > 1.2  # the synthetic confidence really tracks error
    assert {c["verdict"] for c in quality["low_confidence_by_cohort"].values()} <= {"pass", "continue"}


def test_same_quality_candidates_do_not_fail_across_seeds():
    # the false-fail side of the contract: retrained-like candidates (their own errors, same size) on 10 worlds
    failed = []
    for seed in range(10):
        orders = Orders(seed=100 + seed)
        quality = orders.judge(orders.model(), orders.model(), QualityContract(low_confidence_threshold=LOW, seed=seed))
        failed += quality_breaches(quality)
    assert failed == []


def test_a_constant_overconfident_candidate_fails_calibration():
    orders = Orders(seed=2)
    champion = orders.model()
    eta, _ = champion  # the champion's very ETAs: only the confidence is wrong
    quality = orders.judge((eta, np.full(len(eta), 0.99)), champion)
    calibration = quality["calibration"]
    assert calibration == {**calibration, "ratio": 1.0, "band": [1.0, 1.0], "verdict": "fail"}
    assert calibration["constant_confidence"] == 0.99 and quality["verdict"] == "fail"
    assert quality["mae"]["verdict"] == quality["p90_abs_error"]["verdict"] == "pass"
    [line] = [b for b in quality_breaches(quality) if "confidence does not track error" in b]
    assert "ratio 1.00 (band 1.00 … 1.00" in line and "< 1.2" in line and "constant at 0.99" in line
    # the long tail's low-confidence share collapsed from ~half to nothing on the same orders
    assert quality["low_confidence_by_cohort"]["long_tail"]["verdict"] == "fail"


def test_zero_spread_confidence_gives_exactly_one_whatever_the_row_order():
    error = np.arange(1000, dtype=float)[::-1]  # the largest errors first: an argsort by position would pick them
    assert fifth_error_ratio(np.full(1000, 0.99), error) == 1.0
    assert fifth_error_ratio(np.full(1000, 0.99), error[::-1]) == 1.0


def test_the_fifth_ratio_matches_the_holdout_metric_without_ties_and_averages_ties():
    from mlrelease.model.evaluate import holdout_metrics

    rng = np.random.default_rng(3)
    confidence, actual = rng.uniform(0.3, 1.0, 500), rng.uniform(5, 50, 500)
    eta = actual + rng.normal(0, 10 * (1.1 - confidence))
    expected = holdout_metrics(eta, confidence, actual)["confidence_error_ratio"]
    assert fifth_error_ratio(confidence, np.abs(eta - actual)) == pytest.approx(expected)
    # two confidence levels, 5 rows each; the fifth (2 rows) takes the mean error of its tie group
    confidence = np.array([0.5] * 5 + [0.9] * 5)
    error = np.array([1.0, 2.0, 3.0, 4.0, 10.0, 1.0, 1.0, 1.0, 1.0, 6.0])
    assert fifth_error_ratio(confidence, error) == pytest.approx(4.0 / 2.0)


def test_a_candidate_with_a_fifth_worse_mae_fails():
    # 3,000 orders: at the default 1,000 the band's half-width is ~13 % of the MAE here, so +20 % is borderline
    orders = Orders(seed=4, n=3000)
    quality = orders.judge(orders.model(extra=0.75), orders.model())
    mae = quality["mae"]
    assert 0.15 < mae["relative"] < 0.25 and mae["verdict"] == "fail" and mae["excess_band_h"][0] > 0
    [line] = [b for b in quality_breaches(quality) if b.startswith("served MAE")]
    assert "worse than +5% of the champion's on the same 3000 labelled orders" in line and "α=0.01" in line


def test_p90_error_beyond_its_tolerance_fails_on_a_paired_bootstrap():
    orders = Orders(seed=5)
    champion = orders.model()
    eta, confidence = champion
    error = eta - orders.actual
    # the largest tenth of errors grows by half, the rest unchanged: MAE +~10 %, P90 clearly worse
    worst = np.abs(error) >= np.quantile(np.abs(error), 0.85)
    candidate = (np.where(worst, orders.actual + 1.5 * error, eta), confidence)
    quality = orders.judge(candidate, champion)
    assert quality["p90_abs_error"]["verdict"] == "fail" and quality["p90_abs_error"]["excess_band_h"][0] > 0
    assert any(b.startswith("served P90 absolute error worse than +10%") for b in quality_breaches(quality))


def test_a_collapsed_long_tail_low_confidence_share_fails_that_cohort_only():
    orders = Orders(seed=6)
    champion = orders.model()
    eta, confidence = champion
    long_tail = orders.cohorts == "long_tail"
    # confidence raised on the long tail only (order kept): its share below 0.6 collapses
    candidate = (eta, np.where(long_tail, confidence**0.3, confidence))
    by_cohort = orders.judge(candidate, champion)["low_confidence_by_cohort"]
    assert by_cohort["long_tail"]["champion_share"] > 0.3 and by_cohort["long_tail"]["candidate_share"] < 0.05
    assert by_cohort["long_tail"]["verdict"] == "fail" and by_cohort["long_tail"]["band"][1] < -0.05
    assert by_cohort["core"]["verdict"] == by_cohort["high_value"]["verdict"] == "pass"  # identical there: exact
    lines = quality_breaches(orders.judge(candidate, champion))
    assert any(
        line.startswith("long_tail low-confidence share (confidence < 0.6) moved beyond ±5 pp") for line in lines
    )


def test_an_underconfident_cohort_fails_too():
    orders = Orders(seed=8)
    champion = orders.model()
    eta, confidence = champion
    core = orders.cohorts == "core"
    quality = orders.judge((eta, np.where(core, confidence * 0.6, confidence)), champion)
    assert quality["low_confidence_by_cohort"]["core"]["verdict"] == "fail"


def test_the_verdict_is_seeded_and_inconclusive_follows_the_contract():
    orders = Orders(seed=9, n=200)
    candidate, champion = orders.model(extra=0.3), orders.model()
    first, again = orders.judge(candidate, champion), orders.judge(candidate, champion)
    assert first == again
    assert first["mae"]["verdict"] == "pass"  # open (band straddles the tolerance): accepted by default
    paused = orders.judge(candidate, champion, QualityContract(low_confidence_threshold=LOW, on_inconclusive="pause"))
    assert paused["mae"]["verdict"] == "inconclusive" and paused["verdict"] == "inconclusive"
    assert any(b.startswith("served MAE not shown within +5%") for b in quality_breaches(paused))


def test_non_finite_answers_and_missing_labels_are_left_out():
    orders = Orders(seed=10, n=300)
    candidate, champion = orders.model(), orders.model()
    orders.actual[:10] = np.nan
    candidate[0][10:15] = np.nan
    assert orders.judge(candidate, champion)["rows"] == 285


def test_shadow_breaches_carry_the_quality_lines():
    orders = Orders(seed=11)
    champion = orders.model()
    eta, _ = champion
    spec = load_plan().shadow
    report = compare(eta, eta, orders.cohorts, spec)
    report["served_quality"] = orders.judge((eta, np.ones(len(eta))), champion, quality_contract(spec, seed=1))
    found = breaches(report, spec)
    assert any("served confidence does not track error" in b for b in found)


def test_the_plan_declares_the_quality_contract_and_a_two_sided_low_confidence_guardrail():
    plan = load_plan()
    spec = plan.shadow
    assert (spec.quality_alpha, spec.quality_mae_tolerance, spec.quality_p90_tolerance) == (0.001, 0.05, 0.10)
    assert (spec.quality_min_confidence_ratio, spec.quality_low_confidence_tolerance) == (1.2, 0.05)
    assert spec.quality_on_inconclusive == "accept" and spec.quality_bootstrap == 10000
    pooled = [g for s in plan.stages for g in s.guardrails if g.metric == "low_confidence_share" and g.limit is None]
    assert pooled and all(g.bad == "either" for g in pooled)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("quality_mae_tolerance", 0.0),
        ("quality_p90_tolerance", 1.5),
        ("quality_alpha", 0.5),
        ("quality_min_confidence_ratio", 0.9),
        ("quality_low_confidence_tolerance", 0.0),
        ("quality_on_inconclusive", "maybe"),
        ("quality_bootstrap", 100),
    ],
)
def test_quality_fields_out_of_range_are_refused(field, value):
    with pytest.raises(ValidationError, match=field):
        ShadowSpec(**{field: value})


def test_too_few_resamples_for_alpha_are_refused():
    too_few = "quality_bootstrap 500 is too few for quality_alpha 0.001: need at least 10000"
    with pytest.raises(ValidationError, match=too_few):
        ShadowSpec(quality_bootstrap=500)


def test_replayed_orders_get_their_labels_by_order_id_and_never_send_them(home_with_data):
    from datetime import timedelta

    from mlrelease.model.features import FEATURES, TARGET
    from mlrelease.settings import Settings
    from mlrelease.sources import read_window
    from mlrelease.steps.shadow import replay_orders
    from mlrelease.timewindow import Window, parse_timestamp
    from tests.conftest import WINDOW_END

    settings, end = Settings.from_env(), parse_timestamp(WINDOW_END, name="end")
    rows, cohorts, actual = replay_orders(settings, end, 300)
    assert TARGET not in FEATURES and rows.shape == (300, len(FEATURES)) and len(cohorts) == 300
    orders = read_window(settings.offline_dir / "orders", Window(end - timedelta(hours=24), end))
    assert np.isfinite(actual).all() and set(np.round(actual, 3)) <= set(orders[TARGET].round(3))

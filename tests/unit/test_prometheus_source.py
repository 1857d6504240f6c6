"""The Prometheus source's arithmetic: the gateway's arm series read back are the decision log's windows by unit.

The real Prometheus, real gateway processes, a restart and a scrape gap are in tests/integration/test_gateway.py;
here the exporter and the reader meet without a server, and each counter rule is pinned on its own.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mlrelease.errors import StepError
from mlrelease.gateway.arm_metrics import ANALYSIS_UNITS, UNIT_PREFIX, ArmSeries, ModelArms, analysis_unit
from mlrelease.gateway.cohorts import BUCKETS
from mlrelease.gateway.metrics import GatewayMetrics
from mlrelease.rollout.metrics_source_factory import open_metrics_source
from mlrelease.rollout.prometheus_source import COUNTERS, PrometheusSource, _cohort_windows, _increments, _spread
from mlrelease.rollout.windows import OUTCOME_CODES, summarize_calls
from mlrelease.settings import Settings
from mlrelease.verdicts.sequential import MIN_COVARIATE_USERS
from tests.conftest import free_port

OUTCOMES = np.array(["ok"] * 12 + ["error", "timeout", "nan", "out_of_range", "unavailable"])


def _scraped(series: ArmSeries) -> dict[tuple[str, int, int, str], float]:
    """What `PrometheusSource._increase` would sum from a scrape of `series` (every series born in the window), read
    back with prometheus_client's own parser of the text format (so the exposition must be valid)."""
    names = {f"{UNIT_PREFIX}_{counter}_total": name for counter, name in COUNTERS.items()}
    sums: dict[tuple[str, int, int, str], float] = {}
    for family in text_string_to_metric_families(series.exposition().decode()):
        for sample in family.samples:
            labels = sample.labels
            if sample.name in names:
                name = names[sample.name]
            elif sample.name == f"{UNIT_PREFIX}_latency_seconds_bucket":
                name = f"le={labels['le']}"
            else:
                continue
            sums[(labels["cohort"], int(labels["assigned"]), int(labels["unit"]), name)] = sample.value
    return sums


def test_the_gateways_arm_series_read_back_are_the_decision_logs_window_summed_by_unit():
    """Random calls (every outcome, retries, heavy and light users) exported by the gateway's ArmSeries and read back
    by the source equal rollout/windows.py's per-user summary of the same calls with each user mapped to its unit."""
    rng = np.random.default_rng(11)
    n = 4_000
    users = rng.zipf(1.6, n) % 900  # a few heavy users, a long tail of light ones
    buckets = rng.integers(0, BUCKETS, 900)[users]  # each user's canary bucket
    outcome = rng.choice(OUTCOMES, n)
    latency = rng.lognormal(-5.5, 1.2, n)
    prediction = rng.lognormal(2.5, 0.6, n)
    score = rng.uniform(0.3, 1.0, n)
    retry = rng.random(n) < 0.05
    series = ArmSeries()
    arms = ModelArms(series, "parcel_eta")
    for i in range(n):
        ok = outcome[i] == "ok"
        arms.observe(
            cohort="core",
            assigned=2,
            bucket=int(buckets[i]),
            retry=bool(retry[i]),
            outcome=str(outcome[i]),
            latency_s=float(latency[i]),
            prediction=float(prediction[i]) if ok else None,
            score=float(score[i]) if ok else None,
        )
    got = _cohort_windows(_scraped(series))
    assert set(got) == {("core", 2), ("*", 2)}
    made = outcome != "unavailable"  # a request stable's breaker rested made no model call: no contract reads it
    expected = summarize_calls(
        unit=np.array([analysis_unit(int(b)) for b in buckets])[made],
        outcome=np.array([OUTCOME_CODES[o] for o in outcome])[made],
        latency_s=latency[made],
        retry=retry[made],
        eta=np.where(outcome == "ok", prediction, np.nan)[made],
        confidence=np.where(outcome == "ok", score, np.nan)[made],
    )
    window = got[("core", 2)]
    np.testing.assert_array_equal(window.units, expected.units)
    for name in ("calls", "failed", "nan", "answers", "low_confidence"):
        np.testing.assert_allclose(getattr(window, name), getattr(expected, name), err_msg=name)
    for name in ("log_latency", "log_eta", "log_confidence"):
        np.testing.assert_allclose(getattr(window, name), getattr(expected, name), atol=1e-6, err_msg=name)
    np.testing.assert_allclose(window.slow, expected.slow)
    assert window.total("failed") > 0 and window.total("nan") > 0 and window.slow[:, 20].sum() > 0
    np.testing.assert_allclose(got[("*", 2)].calls, window.calls)


def test_analysis_units_are_contiguous_bucket_ranges_fine_where_a_small_arm_lives():
    """Every unit holds neighbouring buckets, so a canary threshold cuts at most one unit (the others stay in one arm);
    a 5 % arm at either end (a canary's candidate, the last stage's control) holds 25 units, each half of a 50/50
    split 70: enough clusters for a variance and for the pre-rollout covariate."""
    units = np.array([analysis_unit(b) for b in range(BUCKETS)])
    assert units[0] == 0 and units[-1] == ANALYSIS_UNITS - 1 and np.all(np.diff(units) >= 0)
    assert set(np.diff(units)) == {0, 1}
    for threshold in (500, 5_000, 9_500):
        assert len(set(units[:threshold]) & set(units[threshold:])) <= 1
    assert [len(set(units[:500])), len(set(units[9_500:]))] == [25, 25]
    assert [len(set(units[:5_000])), len(set(units[5_000:]))] == [70, 70]
    assert MIN_COVARIATE_USERS <= 25


def test_pooled_cohorts_add_up_unit_by_unit_because_a_unit_holds_the_same_users_in_every_cohort():
    """A user's orders fall in several cohorts: the pooled window must not count unit 3 of two cohorts as two
    independent clusters (that would understate the variance)."""
    sums = {("core", 2, 3, "calls"): 5.0, ("long_tail", 2, 3, "calls"): 2.0, ("core", 2, 4, "calls"): 1.0}
    sums.update({(c, 2, u, "le=+Inf"): v for (c, _, u, _), v in list(sums.items())})
    pooled = _cohort_windows(sums)[("*", 2)]
    assert pooled.units.tolist() == [3, 4] and pooled.calls.tolist() == [7.0, 1.0]


def test_a_gateway_process_exports_its_start_time_beside_the_arm_series():
    """The reader tells a restarted replica by process_start_time_seconds: /metrics must carry it with the arm
    series, and a label value that needs escaping stays one label value."""
    metrics = GatewayMetrics()
    metrics.for_model('odd"model').arms.observe(
        cohort="core", assigned=1, bucket=7, retry=False, outcome="ok", latency_s=0.01, prediction=3.0, score=0.9
    )
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    assert "process_start_time_seconds" in families
    (requests,) = families[f"{UNIT_PREFIX}_requests"].samples
    assert requests.labels == {"model": 'odd"model', "cohort": "core", "assigned": "1", "unit": "0"}
    assert requests.value == 1.0


def test_counter_increments_count_a_restart_from_zero_even_past_the_old_value():
    """A restarted counter that has already passed its old value at the next scrape shows no decrease: the process
    start time tells it (12 → 15 is 15 new calls, not 3); without it, a decrease still counts as a reset."""
    samples = [(100.0, 10.0), (101.0, 12.0), (102.0, 15.0), (103.0, 16.0)]
    starts = [(100.0, 50.0), (101.0, 50.0), (102.0, 101.5), (103.0, 101.5)]
    increments = _increments(samples, starts, window_start=100.5)
    assert [amount for _, _, amount in increments] == [0.0, 2.0, 15.0, 1.0]
    assert [amount for _, _, amount in _increments(samples, [], window_start=100.5)] == [0.0, 2.0, 3.0, 1.0]
    dropped = [(100.0, 10.0), (101.0, 4.0)]
    assert [amount for _, _, amount in _increments(dropped, [], window_start=99.0)] == [10.0, 4.0]


def test_a_series_born_in_the_window_counts_its_first_value_and_one_seen_before_is_the_baseline():
    assert _increments([(105.0, 3.0), (106.0, 5.0)], [], window_start=100.0)[0][2] == 3.0
    assert _increments([(95.0, 3.0), (106.0, 5.0)], [], window_start=100.0)[0][2] == 0.0


def test_a_scrape_gap_spreads_its_calls_over_the_gap_instead_of_a_silence():
    """Ten calls between scrapes at 2 s and 7 s land evenly on seconds 3…7, none outside; a born series' first value
    lands on its own second."""
    per_second = _spread([(2.0, 7.0, 10.0), (7.0, 8.5, 0.0), (9.2, 9.2, 4.0)], start=0.0, seconds=10)
    np.testing.assert_allclose(per_second, [0, 0, 0, 2, 2, 2, 2, 2, 0, 4])


def test_an_unreachable_prometheus_is_a_step_error_naming_it():
    url = f"http://127.0.0.1:{free_port()}"
    source = PrometheusSource(url, "parcel_eta", timeout_s=2)
    now = datetime.now(UTC)
    # a fixed hour back: a window cut at midnight is empty just after 00:00 and asks Prometheus nothing
    with pytest.raises(StepError, match=f"Prometheus at {url} cannot be reached"):
        source.windows(now - timedelta(hours=1), now)
    with pytest.raises(StepError, match="must start with http"):
        PrometheusSource("prometheus:9090", "parcel_eta")


def test_the_prometheus_source_needs_its_url(tmp_path):
    settings = replace(Settings.from_env(), home=tmp_path, metrics_source="prometheus", model="parcel_eta")
    with pytest.raises(StepError, match="needs MLRELEASE_PROMETHEUS_URL"):
        open_metrics_source(settings)
    chosen = open_metrics_source(replace(settings, prometheus_url="http://127.0.0.1:9090", prometheus_selector='a="b"'))
    assert isinstance(chosen, PrometheusSource)
    assert chosen._matchers == 'model="parcel_eta", a="b"'

"""The rollout plan YAML and the guardrail verdicts (pure)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from mlrelease.errors import StepError
from mlrelease.gateway.config import load_config
from mlrelease.rollout.guardrails import SEVERITY, CohortWindow, Verdict, evaluate, threshold, worst
from mlrelease.rollout.plan import DEFAULT_PLAN, Guardrail, load_plan


def test_the_default_plan_follows_the_reference_practice():
    plan = load_plan()
    plan.check_cohorts(load_config().cohorts.names)
    assert [s.name for s in plan.stages] == ["high_value", "long_tail", "everyone"]
    first, tail, everyone = plan.stages
    assert first.candidate_percent == {"high_value": 100}
    assert [s.duration_s["production"] for s in plan.stages] == [3600, 3600, 86400]
    assert all(s.duration_s["demo"] <= 60 for s in plan.stages)
    rule = next(g for g in tail.guardrails if g.metric == "low_confidence_share")
    assert (rule.max, rule.cohorts, tail.on_breach, tail.diagnose) == (0.15, ("long_tail",), "rollback_cohort", True)
    assert everyone.candidate_percent == {"*": 95}


def _write(tmp_path, plan):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p["stages"][0].update(on_breach="explode"), "stages.0.on_breach"),
        (lambda p: p["stages"][0].update(candidate_percent={"high_value": 140}), "within|in \\(0, 100\\]"),
        (lambda p: p["stages"][0].update(duration_s={"production": 60}), "duration_s"),
        (lambda p: p["stages"][0]["guardrails"][0].update(metric="vibes"), "stages.0.guardrails.0.metric"),
        (lambda p: p["stages"][1].update(name="high_value"), "stage names must be unique"),
        (lambda p: p["stages"][0].update(guardrails=[]), "stages.0.guardrails"),
        (lambda p: p.update(extra=1), "extra"),
    ],
)
def test_a_bad_plan_is_refused_naming_the_field(tmp_path, change, message):
    plan = yaml.safe_load(DEFAULT_PLAN.read_text())
    change(plan)
    with pytest.raises(StepError, match=message):
        load_plan(_write(tmp_path, plan))


def test_a_plan_naming_an_unknown_cohort_is_refused(tmp_path):
    plan = yaml.safe_load(DEFAULT_PLAN.read_text())
    plan["stages"][0]["candidate_percent"] = {"vip": 100}
    with pytest.raises(StepError, match=r"unknown cohort\(s\) \['vip'\]"):
        load_plan(_write(tmp_path, plan)).check_cohorts(load_config().cohorts.names)


def test_missing_and_malformed_plans_name_the_file(tmp_path):
    with pytest.raises(StepError, match="cannot be read"):
        load_plan(tmp_path / "none.yaml")
    (tmp_path / "bad.yaml").write_text("stages: [")
    with pytest.raises(StepError, match="not valid YAML"):
        load_plan(tmp_path / "bad.yaml")


def test_verdict_precedence_is_data():
    assert SEVERITY[Verdict.PASS] < SEVERITY[Verdict.INCONCLUSIVE] < SEVERITY[Verdict.FAIL]
    assert worst([Verdict.PASS, Verdict.INCONCLUSIVE]) is Verdict.INCONCLUSIVE
    assert worst([Verdict.INCONCLUSIVE, Verdict.FAIL, Verdict.PASS]) is Verdict.FAIL
    assert worst([]) is Verdict.PASS


def _window(requests=1000, errors=0, nan=0, low=50, p99=0.010, predictions=None):
    rng = np.random.default_rng(requests + errors + low)
    return CohortWindow(
        requests, errors, nan, low, p99, tuple(predictions if predictions is not None else rng.normal(20, 5, 400))
    )


def test_long_tail_low_confidence_rule():
    rule = Guardrail(metric="low_confidence_share", max=0.15)
    ok = evaluate(rule, "long_tail", _window(low=120), _window(low=60), min_samples=200)
    bad = evaluate(rule, "long_tail", _window(low=220), _window(low=60), min_samples=200)
    assert ok.verdict is Verdict.PASS and ok.candidate == pytest.approx(0.12)
    assert bad.verdict is Verdict.FAIL and bad.candidate == pytest.approx(0.22) and bad.stable == pytest.approx(0.06)
    assert "long_tail low_confidence_share 0.22 (stable 0.06) > 0.15 [fixed]" == bad.reason


def test_too_little_traffic_is_inconclusive_not_pass():
    rule = Guardrail(metric="error_rate", max=0.001)
    result = evaluate(rule, "high_value", _window(requests=50, errors=40), _window(), min_samples=200)
    assert result.verdict is Verdict.INCONCLUSIVE and "not enough traffic" in result.reason
    ratio = Guardrail(metric="p99_latency_ratio", max=1.2)
    assert evaluate(ratio, "core", _window(), _window(requests=20), min_samples=200).verdict is Verdict.INCONCLUSIVE


def test_latency_ratio_and_prediction_shift():
    slow = evaluate(
        Guardrail(metric="p99_latency_ratio", max=1.2), "core", _window(p99=0.03), _window(p99=0.01), min_samples=100
    )
    assert slow.verdict is Verdict.FAIL and slow.candidate == pytest.approx(3.0)
    rng = np.random.default_rng(1)
    same = evaluate(
        Guardrail(metric="prediction_shift_ks", max=0.15),
        "core",
        _window(predictions=rng.normal(20, 5, 500)),
        _window(predictions=rng.normal(20, 5, 500)),
        min_samples=100,
    )
    shifted = evaluate(
        Guardrail(metric="prediction_shift_ks", max=0.15),
        "core",
        _window(predictions=rng.normal(26, 5, 500)),
        _window(predictions=rng.normal(20, 5, 500)),
        min_samples=100,
    )
    assert same.verdict is Verdict.PASS and shifted.verdict is Verdict.FAIL


def test_dynamic_baseline_follows_stables_own_history():
    rule = Guardrail(metric="low_confidence_share", max=0.10, baseline="stable_dynamic")
    assert threshold(rule, [0.2, 0.21]) == (0.10, "fixed")  # too little history: the fixed number
    limit, source = threshold(rule, [0.20, 0.22, 0.18, 0.20])
    assert limit == pytest.approx(0.20 + 2 * np.std([0.20, 0.22, 0.18, 0.20])) and source.startswith("stable mean 0.2")
    # A cohort whose stable model always sits at ~20 % low confidence: a fixed 10 % would fail every candidate.
    result = evaluate(
        rule, "long_tail", _window(low=210), _window(low=200), min_samples=100, stable_history=[0.20, 0.22, 0.18, 0.20]
    )
    assert result.verdict is Verdict.PASS
    # A stable that was perfect (0 ± 0) never lowers the bar below the fixed number.
    assert threshold(rule, [0.0, 0.0, 0.0])[0] == 0.10


def test_stables_own_latency_spread_widens_a_latency_threshold_only():
    rule = Guardrail(metric="p99_latency_ratio", max=1.2)
    noisy = evaluate(rule, "core", _window(p99=0.03), _window(p99=0.01), min_samples=100, noise=3.5)
    assert noisy.verdict is Verdict.PASS and noisy.threshold == 3.5 and "stable's own spread" in noisy.reason
    quiet = evaluate(rule, "core", _window(p99=0.03), _window(p99=0.01), min_samples=100, noise=1.1)
    assert quiet.verdict is Verdict.FAIL and quiet.threshold == 1.2
    rate = Guardrail(metric="error_rate", max=0.001)
    assert evaluate(rate, "core", _window(errors=5), _window(), min_samples=100, noise=9).threshold == 0.001

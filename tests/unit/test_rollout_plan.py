"""The rollout plan YAML and the guardrail contracts judged on windows (pure)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from mlrelease.errors import StepError
from mlrelease.gateway.config import load_config
from mlrelease.rollout.guardrails import SEVERITY, Verdict, evaluate, resolve_inconclusive, worst
from mlrelease.rollout.plan import Guardrail, load_plan
from mlrelease.settings import REPO_ROOT
from mlrelease.yamlconfig import safe_load
from tests.unit.arms import arm_window

DEFAULT_PLAN = REPO_ROOT / "config" / "rollout_plan.yaml"  # the parcel model's (its release spec names it)


def test_the_default_plan_follows_the_reference_practice():
    plan = load_plan()
    plan.check_cohorts(load_config().cohorts.names)
    assert [s.name for s in plan.stages] == ["high_value", "long_tail", "everyone"]
    first, tail, everyone = plan.stages
    # Every judged cohort keeps a concurrent control slice on stable.
    assert first.candidate_percent == {"high_value": 50}
    assert tail.candidate_percent == {"high_value": 50, "long_tail": 50}
    assert everyone.candidate_percent == {"*": 95} and everyone.judged == ("*",)
    assert all(s.max_exposure_s["demo"] <= 120 for s in plan.stages)
    rule = next(g for g in tail.guardrails if g.limit is not None)
    assert (rule.metric, rule.limit, rule.cohorts) == ("low_confidence_share", 0.15, ("long_tail",))
    assert (tail.on_breach, tail.diagnose) == ("rollback_cohort", True)
    assert all(g.alpha is None and g.bad for s in plan.stages for g in s.guardrails)  # α comes from the budget
    # one budget: 18 stage contracts share what the shadow tests (11 × 0.001) and the fast guard leave of 0.02
    cohorts = load_config().cohorts.names
    allocated = plan.allocated(cohorts)
    alphas = [g.alpha for s in allocated.stages for g in s.guardrails for _ in (g.cohorts or s.judged) if not g.exact]
    assert len(alphas) == 18 and len(set(alphas)) == 1
    spent = plan.shadow_spend(len(cohorts)) + plan.budget.fast_guard + sum(alphas)
    assert spent == pytest.approx(plan.budget.false_rollback)
    assert allocated.spending(cohorts)["per_stage_contract"] == pytest.approx((0.02 - 0.011 - 0.0005) / 18, rel=1e-4)
    # the demo judges with its own declared tolerances and without the ETA contract it cannot resolve in seconds
    demo = allocated.under("demo")
    error = next(g for g in demo.stages[0].guardrails if g.metric == "error_rate")
    assert error.tolerance == 0.01 and error.alpha == alphas[0]
    assert "prediction_shift" in {g.metric for g in allocated.stages[0].guardrails}
    assert "prediction_shift" not in {g.metric for g in demo.stages[0].guardrails}


def test_a_contract_that_cannot_reach_a_verdict_at_the_declared_traffic_is_refused_one_line_each(tmp_path):
    plan = safe_load(DEFAULT_PLAN.read_text())
    plan["traffic"]["production"]["requests_per_s"] = {"high_value": 0.5, "long_tail": 18, "core": 58}
    with pytest.raises(StepError, match="would only ever be inconclusive") as refused:
        load_plan(_write(tmp_path, plan))
    lines = [line for line in str(refused.value).splitlines() if line.startswith("stage ")]
    # only high value traffic is thin: its contracts in the first two stages, by name, with what they would need
    assert lines and all(", high_value:" in line or ", *:" in line for line in lines)
    assert any(line.startswith("stage high_value, high_value: error_rate +0.1 pp vs stable") for line in lines)
    assert all("(production)" in line and "requests per arm" in line and "it needs ~" in line for line in lines)
    assert all("smallest tolerance it can resolve there is" in line for line in lines)
    # the same plan at the traffic it declared resolves every contract
    assert load_plan(DEFAULT_PLAN).traffic["production"].requests_per_s["high_value"] == 24


def test_the_power_check_is_not_vacuous():
    from mlrelease.rollout.power import POWER_Z, contract_power, spread

    plan = load_plan().allocated(load_config().cohorts.names)
    stage = plan.stages[0]
    error = next(g for g in stage.guardrails if g.metric == "error_rate")
    traffic = plan.traffic["production"]
    power = contract_power(stage, error, "high_value", traffic, "production")
    assert power.resolves and power.radius < error.tolerance < 10 * power.radius
    # its half-width is the contract's own boundary: the band of an A/A window of that many independent requests
    # (design effect 1) is as wide, within the smoothing of 9 errors (10/9 of the variance: 5 % of the width)
    n = int(power.requests)
    independent = traffic.model_copy(update={"design_effect": 1.0})
    half_width, sd = spread(error, independent, n, n)
    band = evaluate(error, "high_value", _window(n=n, errors=round(n * 1e-4)), _window(n=n, errors=round(n * 1e-4)))
    assert (band.band["upper"] - band.band["lower"]) / 2 == pytest.approx(half_width, rel=0.08)
    # … and what it asks of a plan is that half-width plus POWER_Z sd, at the declared design effect
    clustered = spread(error, traffic, n, n)
    assert power.radius == pytest.approx(clustered[0] + POWER_Z * clustered[1])
    assert clustered[0] == pytest.approx(half_width * np.sqrt(traffic.design_effect), rel=0.05)


def test_a_budget_spent_before_the_stages_is_refused_naming_the_numbers(tmp_path):
    plan = safe_load(DEFAULT_PLAN.read_text())
    plan["budget"]["false_rollback"] = 0.005  # the shadow tests alone spend 0.011
    with pytest.raises(StepError, match=r"false_rollback 0.005 is spent before the stages: shadow 0.011"):
        load_plan(_write(tmp_path, plan)).allocated(load_config().cohorts.names)
    plan["budget"]["false_rollback"] = 0.3
    with pytest.raises(StepError, match=r"budget.false_rollback"):
        load_plan(_write(tmp_path, plan))


def _write(tmp_path, plan):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


def _guardrail(p, **change):
    rule = dict(p["stages"][0]["guardrails"][0])
    rule.update(change)
    p["stages"][0]["guardrails"] = [rule]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p["stages"][0].update(on_breach="explode"), "stages.0.on_breach"),
        (lambda p: p["stages"][0].update(candidate_percent={"high_value": 100}), "no concurrent control slice"),
        (lambda p: p["stages"][0].update(candidate_percent={"high_value": 0}), "above 0"),
        (lambda p: p["stages"][0].update(min_exposure_s={"production": 60}), "min_exposure_s"),
        (lambda p: p["stages"][0].update(max_exposure_s={"production": 1, "demo": 1}), "shorter than min_exposure_s"),
        (lambda p: _guardrail(p, metric="vibes"), "stages.0.guardrails.0.metric"),
        (lambda p: p["stages"][0]["guardrails"][0].pop("bad"), "stages.0.guardrails.0.bad: Field required"),
        (lambda p: _guardrail(p, alpha=0.5), "stages.0.guardrails.0.alpha"),
        (lambda p: _guardrail(p, alpha=0), "stages.0.guardrails.0.alpha"),
        (lambda p: _guardrail(p, tolerance=-0.1), "stages.0.guardrails.0.tolerance"),
        (lambda p: _guardrail(p, tolerance=1.5), "tolerance of a share"),
        (lambda p: _guardrail(p, metric="latency", tolerance=0), "tolerance of a relative shift"),
        (lambda p: _guardrail(p, on_inconclusive="shrug"), "stages.0.guardrails.0.on_inconclusive"),
        (lambda p: _guardrail(p, on_inconclusive="accept"), "stages.0.guardrails.0.on_inconclusive"),
        (lambda p: _guardrail(p, demo_tolerance=2.0), "demo_tolerance of a share"),
        (lambda p: _guardrail(p, metric="latency_p95"), "stages.0.guardrails.0.metric"),
        (lambda p: p["budget"].update(false_rollback=0.3), "budget.false_rollback"),
        (lambda p: p["budget"].update(false_rollback=0), "budget.false_rollback"),
        (lambda p: p["traffic"]["demo"]["requests_per_s"].update(core=0), "requests_per_s must be above 0"),
        (lambda p: p.update(baseline_s={"production": -1, "demo": 60}), "baseline_s"),
        (lambda p: p["stages"][1].update(name="high_value"), "stage names must be unique"),
        (lambda p: p["stages"][0].update(guardrails=[]), "stages.0.guardrails"),
        (lambda p: p.update(extra=1), "extra"),
    ],
)
def test_a_bad_plan_is_refused_naming_the_field(tmp_path, change, message):
    plan = safe_load(DEFAULT_PLAN.read_text())
    change(plan)
    with pytest.raises(StepError, match=message):
        load_plan(_write(tmp_path, plan))


def test_a_plan_naming_an_unknown_cohort_is_refused(tmp_path):
    plan = safe_load(DEFAULT_PLAN.read_text())
    plan["stages"][0]["candidate_percent"] = {"vip": 50}
    # refused at load (its declared traffic has no such cohort) …
    with pytest.raises(StepError, match=r"does not declare cohort\(s\) \['vip'\]"):
        load_plan(_write(tmp_path, plan))
    # … and, without a traffic declaration, against the gateway's cohorts
    plan.pop("traffic")
    with pytest.raises(StepError, match=r"unknown cohort\(s\) \['vip'\]"):
        load_plan(_write(tmp_path, plan)).check_cohorts(load_config().cohorts.names)


def test_missing_and_malformed_plans_name_the_file(tmp_path):
    with pytest.raises(StepError, match="cannot be read"):
        load_plan(tmp_path / "none.yaml")
    (tmp_path / "bad.yaml").write_text("stages: [")
    with pytest.raises(StepError, match="not valid YAML"):
        load_plan(tmp_path / "bad.yaml")


def test_verdict_precedence_is_data():
    assert SEVERITY[Verdict.PASS] < SEVERITY[Verdict.CONTINUE] < SEVERITY[Verdict.INCONCLUSIVE] < SEVERITY[Verdict.FAIL]
    assert worst([Verdict.PASS, Verdict.CONTINUE]) is Verdict.CONTINUE
    assert worst([Verdict.INCONCLUSIVE, Verdict.FAIL, Verdict.PASS]) is Verdict.FAIL
    assert worst([]) is Verdict.PASS


RNG = np.random.default_rng(11)


def _window(n=2000, errors=0, nan=0, low=0, latency=0.002, eta=20.0, users=None):
    return arm_window(n, errors=errors, nan=nan, low=low, latency=latency, eta=eta, users=users, rng=RNG)


def test_the_long_tail_rule_is_a_fixed_level_on_the_candidate():
    rule = Guardrail(metric="low_confidence_share", bad="higher", tolerance=0.0, limit=0.15, alpha=0.01)
    ok = evaluate(rule, "long_tail", _window(low=100), _window(low=1900))  # stable is not the reference here
    bad = evaluate(rule, "long_tail", _window(low=500), _window(low=0))
    assert ok.verdict is Verdict.PASS and ok.candidate == pytest.approx(0.05) and ok.stable is None
    assert bad.verdict is Verdict.FAIL and bad.candidate == pytest.approx(0.25)
    assert "Δ vs limit 0.15 +10.00 pp" in bad.reason and "low_confidence_share ≤ 0.15 at α=0.01" in bad.reason


def test_too_little_traffic_continues_and_the_plan_decides_at_the_end():
    rule = Guardrail(metric="error_rate", bad="higher", tolerance=0.001, on_inconclusive="pause", alpha=0.01)
    result = evaluate(rule, "high_value", _window(n=50, errors=40), _window())
    assert result.verdict is Verdict.CONTINUE and "need 200" in result.reason
    assert resolve_inconclusive(result, rule).verdict is Verdict.INCONCLUSIVE
    assert resolve_inconclusive(result, rule, final=False).verdict is Verdict.CONTINUE  # before the end: open
    rollback = Guardrail(metric="error_rate", bad="higher", tolerance=0.001, on_inconclusive="rollback", alpha=0.01)
    assert resolve_inconclusive(result, rollback).verdict is Verdict.FAIL


def test_one_error_in_a_few_hundred_calls_is_not_a_rollback():
    # The fixed judge failed `error_rate <= 0.1 %` on a single error in 200 calls (0.5 %).
    rule = Guardrail(metric="error_rate", bad="higher", tolerance=0.001, alpha=0.01)
    assert evaluate(rule, "core", _window(n=200, errors=1), _window(n=200)).verdict is Verdict.CONTINUE
    assert evaluate(rule, "core", _window(n=4000, errors=200), _window(n=4000)).verdict is Verdict.FAIL


def test_latency_and_prediction_shift_are_relative_and_two_sided_where_declared():
    latency = Guardrail(metric="latency", bad="higher", tolerance=0.10, alpha=0.01)
    slow = evaluate(latency, "core", _window(latency=0.003), _window(latency=0.002))
    fast = evaluate(latency, "core", _window(latency=0.0015), _window(latency=0.002))
    same = evaluate(latency, "core", _window(), _window())
    assert slow.verdict is Verdict.FAIL and "latency: shift +" in slow.reason
    assert slow.band["estimate"] == pytest.approx(np.log(1.5), abs=0.03)
    assert fast.verdict is Verdict.PASS and same.verdict is Verdict.PASS
    shift = Guardrail(metric="prediction_shift", bad="either", tolerance=0.10, alpha=0.01)
    assert evaluate(shift, "core", _window(eta=30), _window()).verdict is Verdict.FAIL
    assert evaluate(shift, "core", _window(eta=14), _window()).verdict is Verdict.FAIL
    assert evaluate(shift, "core", _window(eta=20.2), _window()).verdict is Verdict.PASS


def test_a_zero_limit_fails_at_the_first_event_without_spending_alpha():
    rule = Guardrail(metric="nan_rate", bad="higher", tolerance=0.0, limit=0.0)
    one_nan = evaluate(rule, "long_tail", _window(n=300, nan=1), _window(n=300))
    assert one_nan.verdict is Verdict.FAIL and "1 of 300 calls, over a zero limit" in one_nan.reason
    assert evaluate(rule, "long_tail", _window(n=300), _window(n=300)).verdict is not Verdict.FAIL

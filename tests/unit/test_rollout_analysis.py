"""Stage analysis over a fake metrics source, the rollout record store, and the shadow gate's arithmetic."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from mlrelease.errors import StepError
from mlrelease.rollout.analysis import analyze_stage, open_cohorts
from mlrelease.rollout.guardrails import CohortWindow, Verdict
from mlrelease.rollout.machine import Phase, RolloutState
from mlrelease.rollout.plan import ShadowSpec, load_plan
from mlrelease.rollout.store import RolloutBusy, RolloutRecord, RolloutStore
from mlrelease.steps.shadow import breaches, compare

PLAN = load_plan()
COHORTS = ("high_value", "long_tail", "core")
T0 = datetime(2026, 11, 30, 9, tzinfo=UTC)
RNG = np.random.default_rng(5)


def _window(n: int, *, low: int = 0, nan: int = 0, errors: int = 0, p50: float = 0.002, shift: float = 0.0):
    return CohortWindow(
        requests=n,
        errors=errors,
        nan=nan,
        low_confidence=low,
        p99_latency_s=p50 * 3,
        predictions=tuple(RNG.normal(20 + shift, 4, size=n - nan - errors)),
        p50_latency_s=p50,
    )


class FakeSource:
    """Windows by time range: `current` for the stage itself, `before` for anything earlier."""

    location = "fake"

    def __init__(self, current: dict, before: dict) -> None:
        self.current, self.before = current, before

    def windows(self, since: datetime, until: datetime) -> dict:
        return self.current if since >= T0 else self.before

    def features(self, cohort: str, since: datetime, until: datetime) -> np.ndarray:
        return np.zeros((0, 14))


def _analyze(stage_index: int, current: dict, before: dict | None = None, tripped: str | None = None):
    stage = PLAN.stages[stage_index]
    return analyze_stage(
        stage,
        open_cohorts(stage, COHORTS, ()),
        FakeSource(current, before or {}),
        candidate=2,
        stable=1,
        opened_at=T0,
        now=T0 + timedelta(seconds=30),
        tripped=tripped,
    )


def test_open_cohorts_follow_the_stage_and_skip_rolled_back_ones():
    assert open_cohorts(PLAN.stages[0], COHORTS, ()) == ("high_value",)
    assert open_cohorts(PLAN.stages[1], COHORTS, ()) == ("high_value", "long_tail")
    assert open_cohorts(PLAN.stages[2], COHORTS, ("long_tail",)) == ("high_value", "core")


def test_low_confidence_on_the_long_tail_fails_only_that_cohort_with_its_numbers():
    current = {
        ("high_value", 2): _window(400),
        ("long_tail", 2): _window(400, low=120),
        ("*", 1): _window(800),
        ("core", 1): _window(800),
    }
    before = {("high_value", 1): _window(400), ("long_tail", 1): _window(400, low=20)}
    analysis = _analyze(1, current, before)
    assert analysis.verdicts == {"high_value": Verdict.PASS, "long_tail": Verdict.FAIL}
    (breach,) = analysis.breaches()
    assert (breach.metric, breach.candidate, breach.stable) == ("low_confidence_share", 0.3, 0.05)
    assert "long_tail low_confidence_share 0.3 (stable 0.05)" in breach.reason and "0.15" in breach.reason
    assert analysis.samples["long_tail"] == {"candidate": 400, "stable": 400}  # stable from before the stage


def test_latency_is_compared_with_stable_under_the_same_load():
    slow = {("high_value", 2): _window(400, p50=0.006), ("*", 1): _window(800, p50=0.002)}
    before = {("high_value", 1): _window(400, p50=0.006)}  # an earlier, busier period would hide the slowdown
    analysis = _analyze(0, slow, before)
    failed = {r.metric for r in analysis.breaches()}
    assert failed == {"p50_latency_ratio", "p99_latency_ratio"}
    assert analysis.verdicts["high_value"] is Verdict.FAIL


def test_a_prediction_shift_must_be_large_and_significant():
    small_same = {("high_value", 2): _window(40), ("high_value", 1): _window(40), ("*", 1): _window(400)}
    assert _analyze(0, {**small_same}, {}).verdicts["high_value"] is not Verdict.FAIL
    shifted = {("high_value", 2): _window(400, shift=6), ("high_value", 1): _window(400), ("*", 1): _window(800)}
    analysis = _analyze(0, shifted)
    assert [r.metric for r in analysis.breaches()] == ["prediction_shift_ks"]
    assert "p=" in analysis.breaches()[0].reason


def test_too_little_traffic_is_inconclusive_not_a_pass():
    analysis = _analyze(0, {("high_value", 2): _window(20), ("*", 1): _window(20)})
    assert analysis.verdicts == {"high_value": Verdict.INCONCLUSIVE}


def test_a_fast_guard_trip_fails_the_cohorts_whose_calls_failed():
    current = {
        ("high_value", 2): _window(300),
        ("long_tail", 2): _window(300, nan=4),
        ("*", 1): _window(800),
    }
    before = {("high_value", 1): _window(300), ("long_tail", 1): _window(300)}
    analysis = _analyze(1, current, before, tripped="nan: version 2 answered eta=nan")
    guard = {r.cohort: r.verdict for r in analysis.results if r.metric == "fast_guard"}
    assert guard == {"high_value": Verdict.PASS, "long_tail": Verdict.FAIL}
    # A trip with no failed call in this window (it happened earlier) fails every open cohort.
    quiet = _analyze(1, {**current, ("long_tail", 2): _window(300)}, before, tripped="error")
    assert {r.cohort for r in quiet.breaches() if r.metric == "fast_guard"} == {"high_value", "long_tail"}


def _record(run_key: str, candidate: int) -> RolloutRecord:
    return RolloutRecord(
        model="parcel_eta",
        run_key=run_key,
        candidate_version=candidate,
        stable_version=1,
        profile="demo",
        plan=PLAN,
        started_at=T0,
    )


def test_one_rollout_at_a_time_and_the_owner_resumes(tmp_path):
    store = RolloutStore(tmp_path, "parcel_eta")
    first = store.begin(_record("20261129T020000Z", 2))
    assert first.revision == 1 and store.begin(_record("20261129T020000Z", 2)) == first  # a rerun resumes
    with pytest.raises(RolloutBusy, match="v2 is still being rolled out .* run 20261129T020000Z"):
        store.begin(_record("20261130T020000Z", 3))
    done = first.with_state(RolloutState(2, 1, phase=Phase.ROLLED_BACK, reason="x"), T0)
    store.update(lambda current: done)
    assert (tmp_path / "history" / "parcel_eta-v2-20261129T020000Z.json").is_file()  # finished ones are archived
    assert store.read().finished_at == T0
    assert store.begin(_record("20261130T020000Z", 3)).candidate_version == 3  # now the next run may start


def test_a_corrupt_record_is_a_clear_error(tmp_path):
    (tmp_path / "parcel_eta.json").write_text("{not json")
    with pytest.raises(StepError, match="rollout record .*parcel_eta.json is invalid"):
        RolloutStore(tmp_path, "parcel_eta").read()


def test_shadow_gate_arithmetic():
    spec = ShadowSpec()
    stable = RNG.normal(20, 4, 1000).clip(1)
    cohorts = np.array(["core"] * 800 + ["high_value"] * 200)
    same = compare(stable.copy(), stable, cohorts, spec)
    assert same["disagreement_share"] == 0.0 and same["ks_pvalue"] == 1.0
    assert breaches({**same, "p95_latency_ratio": 1.0}, spec) == []
    shifted = stable.copy()
    shifted[800:] *= 1.5
    report = {**compare(shifted, stable, cohorts, spec), "p95_latency_ratio": 1.3}
    assert report["disagreement_by_cohort"] == {"core": 0.0, "high_value": 1.0}
    found = breaches(report, spec)
    assert len(found) == 3 and "20.0% of rows differ" in found[0] and "p95 latency ratio 1.30" in found[-1]
    broken = stable.copy()
    broken[:3] = np.nan
    assert "3 non-finite predictions" in breaches(
        {**compare(broken, stable, cohorts, spec), "p95_latency_ratio": 1}, spec
    )

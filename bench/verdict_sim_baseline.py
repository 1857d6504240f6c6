"""The baseline engine of `bench_verdict_sim.py`: the same simulated traffic judged by an earlier commit's analysis.

Run by `bench_verdict_sim.py --baseline REV` with PYTHONPATH on that commit's `src/` (its `config/` beside it), and
prints every outcome as JSON. That engine (up to 9de3f55) judged the calls each version *answered*, per call: its
windows are keyed by the served version (a candidate failure retried on stable is a stable call), hold every call's
latency and answer, and its fast guard is the absolute breaker (3 candidate failures within 10 s on one replica).

Changes for speed only, none changing a verdict (the outcomes are identical, seed by seed): the old
`CohortWindow.merged` concatenates numpy arrays instead of building tuples, once per look for each pool (the old
analysis pooled once per contract); each (cohort, served version) keeps its calls' latencies and its distinct
requests' answers in growing arrays (a request's key never leaves its tick, so they are deduplicated tick by tick
and the window's keys are left empty); and the old timeline gets a call time in the first and last second of each
run of seconds with calls and every `max_gap_s` − 1 seconds within (its gap rule finds the same silences as from
every call) plus every stable failure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict, deque
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verdict_traffic as traffic  # noqa: E402
from verdict_scenarios import CANDIDATE, REFRESH_S, SCENARIOS, STABLE, T0, Outcome  # noqa: E402

from mlrelease.rollout import guardrails  # noqa: E402  (the baseline commit's, via PYTHONPATH)
from mlrelease.rollout.analysis import analyze_stage  # noqa: E402
from mlrelease.rollout.machine import (  # noqa: E402
    ActionKind,
    Phase,
    RolloutState,
    apply,
    candidate_percent,
    exposure,
    next_action,
)
from mlrelease.rollout.outage import CallTimeline  # noqa: E402
from mlrelease.rollout.plan import load_plan  # noqa: E402

HARD = (traffic.ERROR, traffic.TIMEOUT)


_POOLED: dict[tuple[int, int], Any] = {}  # this look's pooled windows (the old analysis pools once per contract)


def _merged(self: Any, other: Any) -> Any:
    key = (id(self), id(other))
    if key in _POOLED:
        return _POOLED[key][0]
    join = lambda a, b: np.concatenate([np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)])  # noqa: E731
    merged = guardrails.CohortWindow(
        self.requests + other.requests,
        self.errors + other.errors,
        self.nan + other.nan,
        self.low_confidence + other.low_confidence,
        join(self.latencies_s, other.latencies_s),
        join(self.predictions, other.predictions),
        join(self.confidences, other.confidences),
        join(self.keys, other.keys),
    )
    _POOLED[key] = (merged, self, other)  # (holding both keeps their ids from being reused within the look)
    return merged


guardrails.CohortWindow.merged = _merged  # type: ignore[method-assign]


class _Growing:
    """A float64 array appended to tick by tick, its buffer doubled when full (a look reads a view, no copy)."""

    def __init__(self) -> None:
        self.buffer, self.size = np.zeros(1024), 0

    def extend(self, values: np.ndarray) -> None:
        """Append `values`."""
        if self.size + len(values) > len(self.buffer):
            grown = np.zeros(max(2 * len(self.buffer), self.size + len(values)))
            grown[: self.size] = self.buffer[: self.size]
            self.buffer = grown
        self.buffer[self.size : self.size + len(values)] = values
        self.size += len(values)

    def view(self) -> np.ndarray:
        """Everything appended so far."""
        return self.buffer[: self.size]


class _Served:
    """One (cohort, served version)'s calls as the old summary reads them: counts, every call's latency, and the
    answers of its distinct requests."""

    def __init__(self) -> None:
        self.requests = self.errors = self.nan = self.low_confidence = 0
        self.latencies, self.eta, self.confidence = _Growing(), _Growing(), _Growing()

    def add(self, outcome: np.ndarray, latency: np.ndarray, eta: np.ndarray, confidence: np.ndarray, key: Any) -> None:
        ok = outcome == traffic.OK
        self.requests += len(outcome)
        self.errors += int(np.isin(outcome, HARD).sum())
        self.nan += int((outcome == traffic.NAN).sum())
        self.low_confidence += int((confidence[ok] < 0.6).sum())
        self.latencies.extend(latency)
        # A request's key never leaves its tick (repeats and retries fall within it) and one version answers it the
        # same each time, so the distinct answers of a window are those of its ticks: deduplicated here, once.
        _, first = np.unique(key[ok], return_index=True)
        self.eta.extend(eta[ok][first])
        self.confidence.extend(confidence[ok][first])

    def window(self) -> Any:
        return guardrails.CohortWindow(
            requests=self.requests,
            errors=self.errors,
            nan=self.nan,
            low_confidence=self.low_confidence,
            latencies_s=self.latencies.view(),
            predictions=self.eta.view(),
            confidences=self.confidence.view(),
            keys=(),  # already distinct: `distinct_answers` takes them as they are
        )


class OldSource:
    """Per (cohort, served version): every call's numbers, as the old decision-log source summarised them."""

    location = "simulated"

    def __init__(self, cohorts: tuple[str, ...], max_gap_s: float) -> None:
        self.cohorts = cohorts
        self.served: dict[tuple[str, int], _Served] = {}
        self.runs: list[list[int]] = []  # runs of consecutive seconds with calls: [first, last]
        self.step = max(int(math.floor(max_gap_s)) - 1, 1)  # seconds between moments shown within a run
        self.stable_failures: list[float] = []

    def add(self, calls: traffic.Calls) -> None:
        """Fold one tick's calls in, grouped by who answered."""
        for index, name in enumerate(self.cohorts):
            for served, version in ((0, STABLE), (1, CANDIDATE)):
                rows = np.flatnonzero((calls.cohort == index) & (calls.served == served))
                if len(rows):
                    part = self.served.setdefault((name, version), _Served())
                    pick = (calls.outcome, calls.latency_s, calls.eta, calls.confidence, calls.key)
                    part.add(*(a[rows] for a in pick))
        seconds = np.unique(np.floor(calls.t).astype(np.int64))
        breaks = np.flatnonzero(np.diff(seconds) > 1)
        firsts, lasts = (seconds[np.r_[0, breaks + 1]], seconds[np.r_[breaks, -1]]) if len(seconds) else ([], [])
        for first, last in zip(np.asarray(firsts).tolist(), np.asarray(lasts).tolist(), strict=True):
            if self.runs and self.runs[-1][0] <= first <= self.runs[-1][1] + 1:  # (ticks overlap by retries)
                self.runs[-1][1] = max(self.runs[-1][1], last)
            else:
                self.runs.append([first, last])
        failed = (calls.served == 0) & np.isin(calls.outcome, HARD)
        self.stable_failures.extend(calls.t[failed].tolist())

    def windows(self, since: Any, until: Any) -> dict:
        """The old summary: counts, and every call's latency and answer."""
        _POOLED.clear()  # a new look: new windows
        return {key: part.window() for key, part in self.served.items()}

    def timeline(self, since: Any, until: Any) -> CallTimeline:
        """A moment in the middle of the first and the last second of each run of seconds with calls and every
        `max_gap_s` − 1 seconds between (a silence longer than a second lies only between runs: the old gap rule
        finds the very same outages as from a moment in every second with calls), and every stable failure (unix
        seconds from T0)."""
        base = T0.timestamp() + 0.5
        moments: set[float] = set()
        for first, last in self.runs:
            moments.update((base + np.r_[np.arange(first, last, self.step), last]).tolist())
        return CallTimeline(
            calls=tuple(sorted(moments)), stable_failures=tuple(T0.timestamp() + t for t in self.stable_failures)
        )

    def features(self, cohort: str, since: Any, until: Any) -> np.ndarray:
        """No feature rows."""
        return np.zeros((0, 14))


def _breaker_trip(calls: traffic.Calls, replicas: int, windows: dict[int, deque]) -> float | None:
    """The old fast guard: a replica's breaker opens at 3 candidate failures within 10 s."""
    failed = (calls.served == 1) & np.isin(calls.outcome, (*HARD, traffic.NAN))
    first = None
    for t, replica in zip(calls.t[failed], calls.replica[failed], strict=True):
        recent = windows[int(replica)]
        recent.append(float(t))
        while recent and t - recent[0] > 10.0:
            recent.popleft()
        if len(recent) >= 3 and first is None:
            first = float(t)
    return first


def simulate(scenario: str, profile: str, seed: int) -> Outcome:
    """The same rollout as bench_verdict_sim.simulate (same seed, same traffic), judged by the old engine."""
    plan, effect = load_plan(), SCENARIOS[scenario][0]
    rng = np.random.default_rng(seed)
    shape = traffic.TrafficProfile(rate_per_s=100.0 if profile == "production" else 200.0)
    world = traffic.make_world(shape, rng)
    state = RolloutState(candidate_version=CANDIDATE, stable_version=STABLE)
    clock, opened, stage_times, tripped_at = 0.0, 0.0, [], None
    breakers: dict[int, deque] = defaultdict(deque)
    source = OldSource(shape.cohorts, plan.max_gap_s[profile])
    while True:
        now = T0 + timedelta(seconds=clock)
        action = next_action(state, plan, profile, now, None)
        if action.kind is ActionKind.OPEN_STAGE:
            state, opened = apply(state, action, plan, now), clock
            source = OldSource(shape.cohorts, plan.max_gap_s[profile])
            continue
        spec = plan.stages[state.stage]
        step = spec.check_every_s[profile]
        calls = traffic.generate(world, effect, rng, clock, clock + step, candidate_percent(state, plan))
        source.add(calls)
        trip = _breaker_trip(calls, shape.replicas, breakers)
        tripped_at = tripped_at if tripped_at is not None else (trip - opened + REFRESH_S if trip else None)
        clock += step
        now = T0 + timedelta(seconds=clock)
        enough, final = exposure(state, plan, profile, now)
        analysis = analyze_stage(
            spec, shape.cohorts, source, candidate=CANDIDATE, stable=STABLE, opened_at=state.stage_opened_at,
            now=now, excluded=state.excluded_cohorts, exposed_enough=enough, final=final,
            tripped="breaker" if tripped_at is not None else None, max_gap_s=plan.max_gap_s[profile],
        )  # fmt: skip
        action = next_action(state, plan, profile, now, analysis.verdicts)
        if action.kind is ActionKind.WAIT:
            continue
        stage_times.append(clock - opened)
        why = "; ".join(sorted({f"{r.cohort} {r.metric}" for r in analysis.breaches()})) or action.reason
        state = apply(state, action, plan, now)
        if action.kind is ActionKind.ROLLBACK_COHORT:  # never promoted automatically after this: the rollout ends
            return Outcome("cohort_rolled_back", action.stage + 1, why, clock / 3600, tripped_at, stage_times)
        if state.phase in (Phase.PROMOTED, Phase.PAUSED, Phase.ROLLING_BACK):
            result = {Phase.PROMOTED: "promoted", Phase.PAUSED: "paused", Phase.ROLLING_BACK: "rolled_back"}
            return Outcome(result[state.phase], action.stage + 1, why, clock / 3600, tripped_at, stage_times)


def _run(args: tuple[str, str, int]) -> dict[str, Any]:
    began = time.process_time()
    outcome = simulate(*args).as_dict()
    return {**outcome, "cpu_s": time.process_time() - began}


def main() -> None:
    """Print {scenario: [outcome, …]} as JSON."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="production")
    parser.add_argument("--rollouts", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scenarios", required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    scenarios = args.scenarios.split(",")
    jobs = [(s, args.profile, args.seed + i) for s in scenarios for i in range(args.rollouts)]
    began, done = time.perf_counter(), []
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for outcome in pool.map(_run, jobs, chunksize=2):
            done.append(outcome)
            if len(done) % max(len(jobs) // 10, 1) == 0:  # progress on stderr (stdout is the JSON)
                print(
                    f"baseline: {len(done)}/{len(jobs)} rollouts, {time.perf_counter() - began:.0f} s", file=sys.stderr
                )
    outcomes: dict[str, list] = {s: [] for s in scenarios}
    for (scenario, _, _), outcome in zip(jobs, done, strict=True):
        outcomes[scenario].append(outcome)
    print(json.dumps(outcomes))


if __name__ == "__main__":
    main()

"""The baseline engine of `bench_verdict_sim.py`: the same simulated traffic judged by an earlier commit's analysis.

Run by `bench_verdict_sim.py --baseline REV` with PYTHONPATH on that commit's `src/` (its `config/` beside it), and
prints every outcome as JSON. That engine (up to 9de3f55) judged the calls each version *answered*, per call: its
windows are keyed by the served version (a candidate failure retried on stable is a stable call), hold every call's
latency and answer, and its fast guard is the absolute breaker (3 candidate failures within 10 s on one replica).

Two changes for speed only, neither changing a verdict: the old `CohortWindow.merged` concatenates numpy arrays
instead of building tuples, and the old timeline gets one call time per occupied second (its gap rule looks for
silences of `max_gap_s` ≥ 5 s, which that keeps exactly) plus every stable failure.
"""

from __future__ import annotations

import argparse
import json
import sys
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


def _merged(self: Any, other: Any) -> Any:
    join = lambda a, b: np.concatenate([np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)])  # noqa: E731
    return guardrails.CohortWindow(
        self.requests + other.requests,
        self.errors + other.errors,
        self.nan + other.nan,
        self.low_confidence + other.low_confidence,
        join(self.latencies_s, other.latencies_s),
        join(self.predictions, other.predictions),
        join(self.confidences, other.confidences),
        join(self.keys, other.keys),
    )


guardrails.CohortWindow.merged = _merged  # type: ignore[method-assign]


class OldSource:
    """Per (cohort, served version): every call's numbers, as the old decision-log source summarised them."""

    location = "simulated"

    def __init__(self, cohorts: tuple[str, ...]) -> None:
        self.cohorts = cohorts
        self.parts: dict[tuple[str, int], list[traffic.Calls]] = defaultdict(list)
        self.seconds: set[int] = set()
        self.stable_failures: list[float] = []

    def add(self, calls: traffic.Calls) -> None:
        """Fold one tick's calls in, grouped by who answered."""
        for index, name in enumerate(self.cohorts):
            for served, version in ((0, STABLE), (1, CANDIDATE)):
                rows = (calls.cohort == index) & (calls.served == served)
                self.parts[(name, version)].append(
                    traffic.Calls(**{k: getattr(calls, k)[rows] for k in calls.__dataclass_fields__})
                )
        self.seconds.update(np.floor(calls.t).astype(np.int64).tolist())
        failed = (calls.served == 0) & np.isin(calls.outcome, HARD)
        self.stable_failures.extend(calls.t[failed].tolist())

    def windows(self, since: Any, until: Any) -> dict:
        """The old summary: counts, and every call's latency and answer."""
        result = {}
        for key, parts in self.parts.items():
            c = parts[0].concat(parts[1]) if len(parts) == 2 else _concat(parts)
            ok = c.outcome == traffic.OK
            result[key] = guardrails.CohortWindow(
                requests=len(c),
                errors=int(np.isin(c.outcome, HARD).sum()),
                nan=int((c.outcome == traffic.NAN).sum()),
                low_confidence=int((c.confidence[ok] < 0.6).sum()),
                latencies_s=c.latency_s,
                predictions=c.eta[ok],
                confidences=c.confidence[ok],
                keys=c.key[ok],
            )
        return result

    def timeline(self, since: Any, until: Any) -> CallTimeline:
        """One moment per second with calls, and every stable failure (unix seconds from T0)."""
        base = T0.timestamp()
        return CallTimeline(
            calls=tuple(base + s + 0.5 for s in sorted(self.seconds)),
            stable_failures=tuple(base + t for t in self.stable_failures),
        )

    def features(self, cohort: str, since: Any, until: Any) -> np.ndarray:
        """No feature rows."""
        return np.zeros((0, 14))


def _concat(parts: list[traffic.Calls]) -> traffic.Calls:
    fields = traffic.Calls.__dataclass_fields__
    return traffic.Calls(**{k: np.concatenate([getattr(p, k) for p in parts]) for k in fields})


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
    source = OldSource(shape.cohorts)
    while True:
        now = T0 + timedelta(seconds=clock)
        action = next_action(state, plan, profile, now, None)
        if action.kind is ActionKind.OPEN_STAGE:
            state, opened, source = apply(state, action, plan, now), clock, OldSource(shape.cohorts)
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
    return simulate(*args).as_dict()


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
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        done = list(pool.map(_run, jobs, chunksize=1))
    outcomes: dict[str, list] = {s: [] for s in scenarios}
    for (scenario, _, _), outcome in zip(jobs, done, strict=True):
        outcomes[scenario].append(outcome)
    print(json.dumps(outcomes))


if __name__ == "__main__":
    main()

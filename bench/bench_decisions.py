"""Release verdicts, replayed: the sequential judge against the fixed-threshold judge on recorded traffic.

Usage: python bench/bench_decisions.py [--decisions DIR] [--runs 20] [--rate 200] [--seed 1]

The calls come from a gateway decision log (default: the last `make run`'s, under
$MLRELEASE_HOME/gateway/decisions): real latencies, answers and confidences of this box under make-run load.
Each decision run replays the default plan's stages (demo exposure) at `--rate` req/s with the recorded
cohort mix: every stage's candidate and control arms are drawn, call by call, from the recorded calls of
the cohort (bootstrap), so both judges see the very same traffic.

- A/A (a): both arms drawn from stable's recorded calls (a byte-identical copy of the champion).
- A/A (b): the candidate arm drawn from the recorded calls of the healthy candidate that make run promoted
  (a retrained model of the same quality) during the last stage, the control from stable's calls of the same
  seconds (the last stage is the only one in which both versions serve every cohort at once).
- Power: the A/A (a) traffic with a fault injected into the candidate arm only.

The new judge is the product's own analysis (`analyze_stage` + `next_action`, ticking every check_every_s);
the fixed judge is the one this project shipped before (thresholds on point estimates, looked at once at
the end of fixed stage durations, extended up to 3x while short of samples), kept here as the baseline.
The gateway's fast guard (which stops hard failures within seconds in a real run) is not part of either.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO  # noqa: E402

from mlrelease.gateway.decision_log import DecisionReader  # noqa: E402
from mlrelease.model.estimator import LOW_CONFIDENCE  # noqa: E402
from mlrelease.rollout.analysis import analyze_stage  # noqa: E402
from mlrelease.rollout.guardrails import CohortWindow  # noqa: E402
from mlrelease.rollout.machine import ActionKind, RolloutState, apply, exposure, next_action  # noqa: E402
from mlrelease.rollout.outage import CallTimeline  # noqa: E402
from mlrelease.rollout.plan import RolloutPlan, load_plan  # noqa: E402

COHORTS = ("high_value", "long_tail", "core")
T0 = datetime(2026, 11, 29, 2, tzinfo=UTC)
HARD = ("error", "timeout", "out_of_range")


@dataclass(frozen=True)
class Call:
    """One recorded model call, reduced to what the guardrails read."""

    latency_s: float
    outcome: str
    eta: float
    confidence: float
    key: int


Pools = dict[str, list[Call]]
Fault = Callable[[str, Call, np.random.Generator], Call]


def load_pools(directory: Path) -> tuple[Pools, Pools, Pools, dict[str, float]]:
    """Recorded stable calls, the candidate's calls, stable's calls while the candidate was live, the cohort mix."""
    stable: Pools = defaultdict(list)
    candidate: Pools = defaultdict(list)
    during: Pools = defaultdict(list)
    mix: dict[str, int] = defaultdict(int)
    records = DecisionReader(directory).read(datetime(2000, 1, 1, tzinfo=UTC))
    # The last stage is the only one in which both versions serve every cohort at once: the candidate's first
    # core call opens it. Both A/A (b) pools come from that span, so the control is concurrent.
    live = [r["t"] for r in records if r.get("role") == "candidate"]
    core = [r["t"] for r in records if r.get("role") == "candidate" and r["cohort"] == "core"]
    span = (min(core), max(live)) if core else (0.0, -1.0)
    for r in records:
        call = Call(
            float(r["latency_s"]),
            r["outcome"],
            float(r.get("eta") or 0.0),
            float(r.get("confidence") or 1.0),
            int(r.get("key", -1 - sum(mix.values()))),  # older logs have no key: each call counts as distinct
        )
        if r.get("role") == "candidate":
            if span[0] <= r["t"] <= span[1]:
                candidate[r["cohort"]].append(call)
        else:
            stable[r["cohort"]].append(call)
            if span[0] <= r["t"] <= span[1]:
                during[r["cohort"]].append(call)
        mix[r["cohort"]] += 1
    total = sum(mix.values()) or 1
    return dict(stable), dict(candidate), dict(during), {c: n / total for c, n in mix.items()}


def window(calls: list[Call]) -> CohortWindow:
    """The guardrails' view of a list of calls."""
    answered = [c for c in calls if c.outcome == "ok"]
    return CohortWindow(
        requests=len(calls),
        errors=sum(c.outcome in HARD for c in calls),
        nan=sum(c.outcome == "nan" for c in calls),
        low_confidence=sum(c.confidence < LOW_CONFIDENCE for c in answered),
        latencies_s=tuple(c.latency_s for c in calls),
        predictions=tuple(c.eta for c in answered),
        confidences=tuple(c.confidence for c in answered),
        keys=tuple(c.key for c in answered),
    )


class ReplaySource:
    """A MetricsSource over simulated arms: (cohort, version) → calls, each with its second of arrival."""

    location = "replay"

    def __init__(self) -> None:
        self.calls: dict[tuple[str, int], list[tuple[float, Call]]] = defaultdict(list)

    def windows(self, since: datetime, until: datetime) -> dict[tuple[str, int], CohortWindow]:
        start, end = (since - T0).total_seconds(), (until - T0).total_seconds()
        return {k: window([c for t, c in v if start <= t < end]) for k, v in self.calls.items()}

    def timeline(self, since: datetime, until: datetime) -> CallTimeline:
        start, end = (since - T0).total_seconds(), (until - T0).total_seconds()
        seen = [(t, version, c) for (_, version), v in self.calls.items() for t, c in v if start <= t < end]
        return CallTimeline(
            calls=tuple(T0.timestamp() + t for t, _, _ in seen),
            stable_failures=tuple(
                T0.timestamp() + t for t, version, c in seen if version == 1 and c.outcome in ("error", "timeout")
            ),
        )

    def features(self, cohort: str, since: datetime, until: datetime) -> np.ndarray:
        return np.zeros((0, 0))


def draw(pool: list[Call], n: int, rng: np.random.Generator) -> list[Call]:
    """`n` calls drawn with replacement from a recorded pool."""
    return [pool[i] for i in rng.integers(0, len(pool), size=n)]


def simulate_stage_traffic(
    source: ReplaySource,
    shares: dict[str, float],
    start_s: float,
    seconds: float,
    *,
    rate: float,
    mix: dict[str, float],
    pools: tuple[Pools, Pools],
    fault: Fault | None,
    rng: np.random.Generator,
) -> None:
    """One stage's calls, second by second: each cohort's traffic split between the candidate and its control."""
    control_pool, candidate_pool = pools
    for second in range(int(seconds)):
        t = start_s + second
        for cohort in COHORTS:
            n = rng.poisson(rate * mix.get(cohort, 0.0))
            share = shares.get(cohort, shares.get("*", 0.0)) / 100
            to_candidate = rng.binomial(n, share)
            for call in draw(control_pool[cohort], n - to_candidate, rng):
                source.calls[(cohort, 1)].append((t + rng.random(), call))
            for call in draw(candidate_pool[cohort], to_candidate, rng):
                hurt = fault(cohort, call, rng) if fault else call
                source.calls[(cohort, 2)].append((t + rng.random(), hurt))


@dataclass
class Outcome:
    """What one decision run ended in."""

    action: str  # promote | rollback_all | rollback_cohort | pause
    stage: str
    cohorts: tuple[str, ...]
    seconds: float  # from the first exposure to the decision (of the breach, or of the promotion)


def run_sequential(
    plan: RolloutPlan,
    args: Any,
    pools: tuple[Pools, Pools],
    mix: dict[str, float],
    fault: Fault | None,
    rng: np.random.Generator,
) -> Outcome:
    """The product's judge: tick every check_every_s; the first rollback, pause or the promotion ends the run."""
    source, state, clock = ReplaySource(), RolloutState(candidate_version=2, stable_version=1), 0.0
    while True:
        stage = plan.stages[state.stage]
        state = replace(state, stage_opened_at=T0 + timedelta(seconds=clock))
        every = stage.check_every_s["demo"]
        while True:
            shares = _shares(state, plan)
            simulate_stage_traffic(
                source, shares, clock, every, rate=args.rate, mix=mix, pools=pools, fault=fault, rng=rng
            )
            clock += every
            now = T0 + timedelta(seconds=clock)
            exposed, final = exposure(state, plan, "demo", now)
            assert state.stage_opened_at is not None
            analysis = analyze_stage(
                stage,
                COHORTS,
                source,
                candidate=2,
                stable=1,
                opened_at=state.stage_opened_at,
                now=now,
                excluded=state.excluded_cohorts,
                exposed_enough=exposed,
                final=final,
                max_gap_s=plan.max_gap_s["demo"],
            )
            action = next_action(state, plan, "demo", now, analysis.verdicts)
            if action.kind is not ActionKind.WAIT:
                break
        if action.kind is not ActionKind.ADVANCE:
            return Outcome(str(action.kind), stage.name, action.cohorts, clock)
        state = apply(state, action, plan, now)


def _shares(state: RolloutState, plan: RolloutPlan) -> dict[str, float]:
    shares = dict(plan.stages[state.stage].candidate_percent)
    shares.update(dict.fromkeys(state.excluded_cohorts, 0.0))
    return shares


# The fixed judge this project shipped before: stage shares without a control slice where a stage sent a
# whole cohort, thresholds on point estimates, one look at the end of the stage (extended up to 3x while a
# cohort has fewer than min_samples calls), reference = stable's traffic of the cohort before the stage.
FIXED_STAGES = (
    (
        "high_value",
        {"high_value": 100.0},
        20.0,
        200,
        "rollback_all",
        {"error_rate": 0.001, "nan_rate": 0.0, "p50": 1.3, "p99": 3.0, "low": 0.10, "ks": 0.15},
        None,
    ),
    (
        "long_tail",
        {"high_value": 100.0, "long_tail": 100.0},
        20.0,
        200,
        "rollback_cohort",
        {"error_rate": 0.001, "nan_rate": 0.0, "p50": 1.3, "p99": 3.0, "low": 0.15, "ks": 0.15},
        "long_tail",
    ),
    (
        "everyone",
        {"*": 95.0},
        30.0,
        500,
        "rollback_all",
        {"error_rate": 0.001, "nan_rate": 0.0, "p50": 1.3, "p99": 3.0, "low": 0.15, "ks": 0.15},
        None,
    ),
)


def fixed_breaches(mine: CohortWindow, ref: CohortWindow, same_load: CohortWindow, limits: dict[str, float]) -> bool:
    """Whether any old-style threshold is breached (the KS shift also had to be significant at p < 0.01)."""
    from scipy.stats import ks_2samp

    share = lambda k, w: k / w.requests if w.requests else 0.0  # noqa: E731
    low = mine.low_confidence / len(mine.predictions) if mine.predictions else 0.0
    p50 = mine.quantile_latency_s(0.5) / max(same_load.quantile_latency_s(0.5), 1e-9)
    p99 = mine.quantile_latency_s(0.99) / max(same_load.quantile_latency_s(0.99), 1e-9)
    ks = ks_2samp(mine.predictions, ref.predictions) if mine.predictions and ref.predictions else None
    return (
        share(mine.errors, mine) > limits["error_rate"]
        or share(mine.nan, mine) > limits["nan_rate"]
        or p50 > limits["p50"]
        or p99 > limits["p99"]
        or low > limits["low"]
        or (ks is not None and ks.statistic > limits["ks"] and ks.pvalue < 0.01)
    )


def run_fixed(
    args: Any, pools: tuple[Pools, Pools], mix: dict[str, float], fault: Fault | None, rng: np.random.Generator
) -> Outcome:
    """The fixed-threshold, fixed-duration judge on the same kind of traffic."""
    source, clock, excluded = ReplaySource(), 0.0, []
    warm = 10.0  # stable-only traffic before the first stage, the old reference for whole-cohort stages
    simulate_stage_traffic(source, {}, -warm, warm, rate=args.rate, mix=mix, pools=pools, fault=None, rng=rng)
    for name, shares, duration, min_samples, on_breach, limits, cohort_rule in FIXED_STAGES:
        shares = {**shares, **dict.fromkeys(excluded, 0.0)}
        opened, looked = clock, 0.0
        while True:
            simulate_stage_traffic(
                source,
                shares,
                clock,
                duration if looked == 0 else 5.0,
                rate=args.rate,
                mix=mix,
                pools=pools,
                fault=fault,
                rng=rng,
            )
            clock += duration if looked == 0 else 5.0
            looked = clock - opened
            now = T0 + timedelta(seconds=clock)
            current = source.windows(T0 + timedelta(seconds=opened), now)
            earlier = source.windows(T0 + timedelta(seconds=opened - 6 * looked), now)
            judged = [c for c in COHORTS if shares.get(c, shares.get("*", 0)) > 0 and c not in excluded]
            same_load = _pool(current, 1, COHORTS)
            failed, short = [], False
            for c in judged:
                mine = current.get((c, 2), window([]))
                ref = current.get((c, 1), window([]))
                ref = ref if ref.requests >= min_samples else earlier.get((c, 1), window([]))
                if mine.requests < min_samples or ref.requests < min_samples:
                    short = True
                    continue
                if fixed_breaches(mine, ref, same_load if same_load.requests >= min_samples else ref, limits):
                    failed.append(c)
            if failed:
                if on_breach == "rollback_cohort" and cohort_rule in failed and len(failed) < len(judged):
                    excluded.append(cohort_rule)
                    return Outcome("rollback_cohort", name, tuple(excluded), clock)
                return Outcome("rollback_all", name, tuple(failed), clock)
            if short and looked < 3 * duration:
                continue
            if short:
                return Outcome("pause", name, (), clock)
            break
    return Outcome("promote", "everyone", (), clock)


def _pool(current: dict[tuple[str, int], CohortWindow], version: int, cohorts: tuple[str, ...]) -> CohortWindow:
    merged = window([])
    for c in cohorts:
        merged = merged.merged(current.get((c, version), window([])))
    return merged


def faults() -> dict[str, tuple[Fault | None, str]]:
    """The injected faults of the power table, and where the plan should stop each."""

    def slower(factor: float) -> Fault:
        return lambda cohort, call, rng: replace(call, latency_s=call.latency_s * factor)

    def errors(rate: float) -> Fault:
        return lambda cohort, call, rng: replace(call, outcome="error") if rng.random() < rate else call

    def nan_on(cohort_name: str, rate: float) -> Fault:
        return lambda cohort, call, rng: (
            replace(call, outcome="nan") if cohort == cohort_name and rng.random() < rate else call
        )

    def low_confidence(share: float) -> Fault:
        return lambda cohort, call, rng: (
            replace(call, confidence=0.3) if cohort == "long_tail" and rng.random() < share else call
        )

    def biased(factor: float) -> Fault:
        return lambda cohort, call, rng: replace(call, eta=call.eta * factor) if cohort == "high_value" else call

    return {
        "latency +25 %": (slower(1.25), "shadow or stage 1"),
        "latency +100 %": (slower(2.0), "shadow or stage 1"),
        "error rate 0.5 %": (errors(0.005), "stage 1, all"),
        "error rate 5 %": (errors(0.05), "stage 1, all"),
        "NaN on 1 % of long_tail": (nan_on("long_tail", 0.01), "stage 2, long_tail"),
        "long_tail low confidence 20 %": (low_confidence(0.20), "stage 2, long_tail"),
        "long_tail low confidence 40 %": (low_confidence(0.40), "stage 2, long_tail"),
        "high_value ETA +10 %": (biased(1.10), "shadow"),
        "high_value ETA +30 %": (biased(1.30), "shadow"),
    }


def shadow_outcome(
    plan: RolloutPlan, stable: Pools, fault: Fault | None, rng: np.random.Generator, identical: bool = True
) -> str:
    """The shadow gate on a sample of recorded orders: the fault applied to the candidate's answers and latencies.

    ETAs are paired on the same recorded answers (as the real shadow replays the same orders); latency pairs
    are drawn independently from stable's recorded calls (the real pairs share the server's load, so they
    are closer than these: this is the pessimistic case for the test's power).
    """
    from mlrelease.steps.shadow import breaches, cohort_shifts, compare
    from mlrelease.verdicts.decide import Verdict as V
    from mlrelease.verdicts.decide import decide
    from mlrelease.verdicts.sequential import mean_level

    spec = plan.shadow
    rows = [(c, call) for c in COHORTS for call in draw(stable[c], int(1000 * len(stable[c]) / 20000) + 50, rng)]
    rows = [(c, call) for c, call in rows if call.outcome == "ok"][: spec.samples]
    cohorts = np.array([c for c, _ in rows])
    base = np.array([call.eta for _, call in rows])
    hurt = [fault(c, call, rng) if fault else call for c, call in rows]
    eta = np.array([h.eta if h.outcome == "ok" else np.nan for h in hurt])
    report = {**compare(eta, base, cohorts, spec), "eta_shift_by_cohort": cohort_shifts(eta, base, cohorts, spec)}
    everyone = [call for c in COHORTS for call in stable[c]]
    ratios: list[float] = []
    verdict, band = V.CONTINUE, None
    while verdict is V.CONTINUE and len(ratios) < spec.latency_max_pairs:
        for a, b in zip(draw(everyone, 50, rng), draw(everyone, 50, rng), strict=True):
            slowed = fault("core", a, rng).latency_s if fault else a.latency_s
            ratios.append(math.log(slowed / b.latency_s))
        if len(ratios) >= spec.latency_min_pairs:
            band = mean_level(ratios, 0.0, alpha=spec.latency_alpha, tuned_at=spec.latency_min_pairs)
            verdict = decide(band, "higher", math.log1p(spec.latency_tolerance))
    assert band is not None
    report.update(
        latency_verdict="inconclusive" if verdict is V.CONTINUE else str(verdict),
        latency_ratio=math.exp(band.estimate),
        latency_ratio_band=[math.exp(band.lower), math.exp(band.upper)],
        latency_pairs=len(ratios),
    )
    found = breaches(report, spec)
    return "refused: " + found[0].split(":")[0][:40] if found else "passed"


def summarize(outcomes: list[Outcome], bad: bool) -> str:
    """'k/n rollbacks (stage: scope), median time' for one judge in one scenario."""
    n = len(outcomes)
    hits = [o for o in outcomes if o.action != "promote"]
    where = defaultdict(int)
    for o in hits:
        where[f"{o.stage}:{o.action}{'(' + ','.join(o.cohorts) + ')' if o.action == 'rollback_cohort' else ''}"] += 1
    places = ", ".join(f"{k} {v}" for k, v in sorted(where.items(), key=lambda kv: -kv[1])) or "-"
    times = [o.seconds for o in (hits if bad else outcomes)]
    median = f"{statistics.median(times):.0f} s" if times else "-"
    label = "stopped" if bad else "refused"
    return f"{len(hits)}/{n} {label} [{places}] median {median}"


def main() -> None:
    """Replay every scenario through both judges and print the comparison table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    home = Path(os.environ.get("MLRELEASE_HOME", REPO / ".mlrelease"))
    parser.add_argument("--decisions", type=Path, default=home / "gateway" / "decisions")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    stable, candidate, during, mix = load_pools(args.decisions)
    missing = [c for c in COHORTS if len(stable.get(c, ())) < 100]
    if missing:
        raise SystemExit(f"{args.decisions}: fewer than 100 recorded stable calls for {missing}; run `make run` first")
    plan = load_plan()
    alphas = sorted({g.alpha for s in plan.stages for g in s.guardrails})
    contracts = sum(len(s.guardrails) * len(s.judged) for s in plan.stages)
    print(
        f"recorded calls: {sum(map(len, stable.values()))} stable, {sum(map(len, candidate.values()))} candidate; "
        f"mix {', '.join(f'{c} {mix.get(c, 0):.0%}' for c in COHORTS)}; {args.runs} runs per scenario at "
        f"{args.rate:g} req/s; α per contract {alphas}, {contracts} contracts per rollout"
    )
    scenarios: list[tuple[str, tuple[Pools, Pools], Fault | None, str]] = [
        ("A/A (a) identical copy", (stable, stable), None, "promote"),
    ]
    if all(len(candidate.get(c, ())) >= 100 and len(during.get(c, ())) >= 20 for c in COHORTS):
        # the control drawn from stable's calls of the same minutes: a concurrent control, as in a stage
        scenarios.append(("A/A (b) retrained, same quality", (during, candidate), None, "promote"))
    scenarios += [(name, (stable, stable), fault, where) for name, (fault, where) in faults().items()]
    rng = np.random.default_rng(args.seed)
    print(
        f"\n{'scenario':<32} {'expected':<19} {'shadow gate (this plan)':<34} "
        f"{'stages, sequential judge (this plan)':<60} stages, fixed-threshold judge (before)"
    )
    for name, pools, fault, expected in scenarios:
        shadows = [shadow_outcome(plan, stable, fault, rng) for _ in range(args.runs)]
        passed = shadows.count("passed")
        refused = sorted({s for s in shadows if s != "passed"})
        gate = f"{len(shadows) - passed}/{len(shadows)} refused" + (f" ({refused[0][9:]})" if refused else "")
        seq = [run_sequential(plan, args, pools, mix, fault, rng) for _ in range(args.runs)]
        old = [run_fixed(args, pools, mix, fault, rng) for _ in range(args.runs)]
        bad = fault is not None
        print(f"{name:<32} {expected:<19} {gate:<34} {summarize(seq, bad):<60} {summarize(old, bad)}")
    print("\nA/A rows: 'refused' counts rollbacks and pauses of a good candidate; 'median' is the time to promote.")
    print("Power rows: 'stopped' counts rollbacks (and pauses); 'median' is the time from first exposure to it.")
    print(
        f"Designed false-verdict rate: α = {alphas} per contract; the simulation tests prove it per contract "
        "(tests/unit/test_verdicts.py)."
    )


if __name__ == "__main__":
    main()

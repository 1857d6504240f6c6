"""The guardrails' evidence as Prometheus series: each model call summed by assigned arm and by *analysis unit*.

The verdict engine judges arms by assignment and clusters every variance by user (rollout/windows.py). Prometheus
cannot hold a series per user, so users are grouped into `ANALYSIS_UNITS` units by their canary bucket, in contiguous
ranges (unit = bucket × units ÷ buckets). A unit is a cluster of whole users, so a variance clustered by unit is a valid
variance clustered by user (coarser, never finer). Contiguous ranges make every unit belong to one arm (a cohort's
candidate holds the buckets below its threshold), except the one unit the threshold cuts: so a unit's sums before the
rollout are the sums of the same users, and the comparison's covariate (each user's own pre-rollout level, CUPED) keeps
its power. Hashing users into units independently of the bucket would mix both arms' users in every unit and leave the
covariate little to explain (measured: `bench/bench_verdict_sim.py --analysis-units`). The sums:

- `…_unit_requests_total`, `…_unit_failed_total` (error, timeout, out of range), `…_unit_nan_total`,
  `…_unit_answers_total` and `…_unit_low_score_total` (answers with a score under LOW_CONFIDENCE): counts;
- `…_unit_log_latency_total`, `…_unit_log_prediction_total`, `…_unit_log_score_total`: sums of log(x) + LOG_OFFSET
  (x clipped at 1e-6, as rollout/windows.py does), so that they only grow, as a Prometheus counter must; the reader
  subtracts LOG_OFFSET × requests (or answers);
- `…_unit_latency_seconds`: a histogram on rollout/windows.py's LATENCY_BOUNDS_S, so the tail contract finds its
  bound exactly where the decision log would.

A retry (stable answering a candidate-assigned request whose candidate call failed) is not a request of its own and is
not counted here; a request stable's breaker rested (`unavailable`) made no model call and is not either. Both are in
`…_arm_calls_total` (no unit label: by outcome and retry), which the outage finder's per-second timeline reads.

Unlike the decision log, answers are not de-duplicated by request key (a replica cannot know another's): a repeated
request is counted each time. Repeats come from the same user, so they stay in one unit and the clustered variance
accounts for them; only the weighting of the answer contracts' means differs a little.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from mlrelease.gateway.cohorts import BUCKETS
from mlrelease.verdicts.calls import HARD_FAILURES, LATENCY_BOUNDS_S, LOW_CONFIDENCE, NAN, OK, OUTCOME_CODES

# Canary-bucket ranges per cohort. More units: a finer clustering (closer to per user), more clusters in a small arm
# (the last stage's 5 % control holds ~6 units per cohort) and more series: each unit has 8 counters and a 41-bound
# histogram, and it is in one arm at a time, so 128 units × 3 cohorts ≈ 20,000 series per model and replica (up to
# twice that once a rollout moved units from stable to the candidate). The reader takes whatever units it finds.
ANALYSIS_UNITS = 128
FLOOR = 1e-6  # what rollout/windows.py clips latencies, predictions and scores at before taking the log
LOG_OFFSET = -math.log(FLOOR)  # log(x) + LOG_OFFSET ≥ 0 for every clipped x
UNIT_PREFIX = "mlrelease_gateway_unit"
ARM_CALLS = "mlrelease_gateway_arm_calls"
UNIT_LABELS = ["model", "cohort", "assigned", "unit"]


def analysis_unit(bucket: int) -> int:
    """The analysis unit of a canary bucket: its contiguous range of BUCKETS ÷ ANALYSIS_UNITS buckets."""
    return bucket * ANALYSIS_UNITS // BUCKETS


def _positive_log(x: float) -> float:
    return math.log(max(x, FLOOR)) + LOG_OFFSET if math.isfinite(x) else 0.0


# The per-unit sums, in this order in each unit's list (then Σ latency, and one count per latency bucket, +Inf last).
SUMS = ("requests", "failed", "nan", "answers", "low_score", "log_latency", "log_prediction", "log_score")
HELP = {
    "requests": "Requests by assigned arm and analysis unit (retries not counted).",
    "failed": "Requests whose model call failed (error, timeout, out of range).",
    "nan": "Requests answered with NaN or infinity.",
    "answers": "Requests answered by a model.",
    "low_score": f"Answers whose score is under {LOW_CONFIDENCE}.",
    "log_latency": f"Σ log(latency s) + {LOG_OFFSET:.4f} over requests.",
    "log_prediction": f"Σ log(prediction) + {LOG_OFFSET:.4f} over answers.",
    "log_score": f"Σ log(score) + {LOG_OFFSET:.4f} over answers.",
}
BOUNDS = tuple(float(b) for b in LATENCY_BOUNDS_S)
REQUESTS, FAILED, NAN_SUM, ANSWERS, LOW, LOG_LATENCY, LOG_PREDICTION, LOG_SCORE = range(len(SUMS))
LATENCY_SUM = len(SUMS)  # Σ latency in seconds: the histogram's _sum
FIRST_BUCKET = LATENCY_SUM + 1


class ArmSeries(Collector):
    """The per-unit and per-outcome series of one gateway process (every served model's, by the `model` label).

    A collector of plain sums rather than prometheus_client children: a call adds to one list (no lock per
    increment, a bisect instead of a walk over 41 buckets), which keeps the bookkeeping a few µs per call
    (`bench/bench_arm_metrics.py`). The gateway records calls on its event loop, and `/metrics` collects there
    too, so nothing changes the sums while they are read.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.models: list[ModelArms] = []
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        """The sums as Prometheus counters and a histogram (cumulative buckets)."""
        families = {name: CounterMetricFamily(f"{UNIT_PREFIX}_{name}", HELP[name], labels=UNIT_LABELS) for name in SUMS}
        latency = HistogramMetricFamily(
            f"{UNIT_PREFIX}_latency_seconds",
            "Model-call latency of requests, by assigned arm and analysis unit.",
            labels=UNIT_LABELS,
        )
        calls = CounterMetricFamily(
            ARM_CALLS,
            "Model calls (and requests stable's breaker rested: outcome unavailable) by assigned arm and outcome.",
            labels=["model", "cohort", "assigned", "outcome", "retry"],
        )
        les = [*(floatToGoString(b) for b in BOUNDS), "+Inf"]
        for arms in self.models:
            for (cohort, assigned, unit), sums in arms.units.items():
                labels = [arms.model, cohort, str(assigned), str(unit)]
                for index, name in enumerate(SUMS):
                    families[name].add_metric(labels, sums[index])
                cumulative = list(accumulate(sums[FIRST_BUCKET:]))
                latency.add_metric(labels, list(zip(les, cumulative, strict=True)), sum_value=sums[LATENCY_SUM])
            for (cohort, assigned, outcome, retry), count in arms.calls.items():
                calls.add_metric([arms.model, cohort, str(assigned), outcome, str(retry)], count)
        yield from families.values()
        yield latency
        yield calls


class ModelArms:
    """One served model's sums (see the module docstring for what counts): `observe` records one model call."""

    def __init__(self, series: ArmSeries, model: str) -> None:
        self.model = model
        self.units: dict[tuple[str, int, int], list[float]] = {}
        self.calls: dict[tuple[str, int, str, bool], float] = {}
        series.models.append(self)

    def observe(
        self,
        *,
        cohort: str,
        assigned: int,
        bucket: int,
        retry: bool,
        outcome: str,
        latency_s: float,
        prediction: float | None,
        score: float | None,
    ) -> None:
        """Record one model call of a request assigned to `assigned` whose user has canary `bucket` (see the module
        docstring for what counts)."""
        key = (cohort, assigned, outcome, retry)
        self.calls[key] = self.calls.get(key, 0.0) + 1.0
        if retry or outcome == "unavailable":
            return
        unit = (cohort, assigned, analysis_unit(bucket))
        sums = self.units.get(unit)
        if sums is None:
            sums = self.units[unit] = [0.0] * (FIRST_BUCKET + len(BOUNDS) + 1)
        sums[REQUESTS] += 1.0
        sums[LOG_LATENCY] += _positive_log(latency_s)
        sums[LATENCY_SUM] += latency_s
        sums[FIRST_BUCKET + bisect_left(BOUNDS, latency_s)] += 1.0  # the first bound ≥ latency (le: at or below)
        code = OUTCOME_CODES[outcome]
        if code in HARD_FAILURES:
            sums[FAILED] += 1.0
        elif code == NAN:
            sums[NAN_SUM] += 1.0
        elif code == OK and prediction is not None and score is not None:
            sums[ANSWERS] += 1.0
            sums[LOG_PREDICTION] += _positive_log(prediction)
            sums[LOG_SCORE] += _positive_log(score)
            if score < LOW_CONFIDENCE:
                sums[LOW] += 1.0

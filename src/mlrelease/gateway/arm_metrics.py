"""The guardrails' evidence as Prometheus series: each model call summed by assigned arm and by *analysis unit*.

The verdict engine judges arms by assignment and clusters every variance by user (rollout/windows.py). Prometheus
cannot hold a series per user, so users are grouped into `ANALYSIS_UNITS` units by their canary bucket, in contiguous
ranges (UNIT_OF_BUCKET). A unit is a cluster of whole users in every cohort: a user's orders may fall in several
cohorts and a unit number holds the same users in each, so pooled cohorts are summed unit by unit, never kept apart.
A variance clustered by unit is then a valid variance clustered by user (coarser, never finer). Contiguous ranges
keep every unit in one arm (a cohort's candidate holds the buckets below its threshold), except the one unit the
threshold cuts: a unit's sums before the rollout are its own users', and the comparison's covariate (each user's
pre-rollout level, CUPED) keeps its power. Hashing users into units apart from their bucket mixed both arms' users in
every unit and left the covariate little to explain (README, "The same verdicts from Prometheus"). The sums:

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
from itertools import accumulate

from prometheus_client.utils import floatToGoString

from mlrelease.gateway.cohorts import BUCKETS
from mlrelease.verdicts.calls import HARD_FAILURES, LATENCY_BOUNDS_S, LOW_CONFIDENCE, NAN, OK, OUTCOME_CODES

# Units are canary-bucket ranges, finer at both ends of the bucket range, where a stage's smaller arm lives: a
# canary's candidate holds the lowest buckets, the last stage's control (stable keeping 5 %) the highest. 20 buckets a
# unit in the lowest and the highest 1,000, 200 in between: 140 units, 25 in a 5 % arm (enough clusters for a variance
# and for the users' pre-rollout covariate, verdicts/sequential.MIN_COVARIATE_USERS), 70 in each half of a 50/50
# split. Each unit has 8 sums and a 41-bound histogram: 140 × 51 ≈ 7,000 series per cohort, model and replica (up to
# twice that once a rollout moved units from stable to the candidate). The reader takes whatever units it finds.
EDGE_BUCKETS, FINE_WIDTH, COARSE_WIDTH = 1_000, 20, 200
_TOP_FIRST = EDGE_BUCKETS // FINE_WIDTH + (BUCKETS - 2 * EDGE_BUCKETS) // COARSE_WIDTH
ANALYSIS_UNITS = _TOP_FIRST + EDGE_BUCKETS // FINE_WIDTH
UNIT_OF_BUCKET: tuple[int, ...] = tuple(
    b // FINE_WIDTH
    if b < EDGE_BUCKETS
    else _TOP_FIRST + (b - (BUCKETS - EDGE_BUCKETS)) // FINE_WIDTH
    if b >= BUCKETS - EDGE_BUCKETS
    else EDGE_BUCKETS // FINE_WIDTH + (b - EDGE_BUCKETS) // COARSE_WIDTH
    for b in range(BUCKETS)
)
FLOOR = 1e-6  # what rollout/windows.py clips latencies, predictions and scores at before taking the log
LOG_OFFSET = -math.log(FLOOR)  # log(x) + LOG_OFFSET ≥ 0 for every clipped x
UNIT_PREFIX = "mlrelease_gateway_unit"
ARM_CALLS = "mlrelease_gateway_arm_calls"
UNIT_LABELS = ["model", "cohort", "assigned", "unit"]


def analysis_unit(bucket: int) -> int:
    """The analysis unit of a canary bucket: the contiguous range of buckets it falls in (see UNIT_OF_BUCKET)."""
    return UNIT_OF_BUCKET[bucket]


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
LATENCY_HELP = "Model-call latency of requests, by assigned arm and analysis unit."
CALLS_HELP = "Model calls (and requests stable's breaker rested: outcome unavailable) by assigned arm and outcome."
BOUNDS = tuple(float(b) for b in LATENCY_BOUNDS_S)
REQUESTS, FAILED, NAN_SUM, ANSWERS, LOW, LOG_LATENCY, LOG_PREDICTION, LOG_SCORE = range(len(SUMS))
LATENCY_SUM = len(SUMS)  # Σ latency in seconds: the histogram's _sum
FIRST_BUCKET = LATENCY_SUM + 1


class ArmSeries:
    """The per-unit and per-outcome series of one gateway process (every served model's, by the `model` label).

    Plain sums rather than prometheus_client children: a call adds to one list (no lock per increment, a bisect
    instead of a walk over 41 buckets), which keeps the bookkeeping a few µs per call, and `exposition` writes them
    in Prometheus' text format directly, each unit's label set formatted once (prometheus_client's generic renderer
    took ~0.5 s for a rollout's ~44,000 lines; `bench/bench_arm_metrics.py`). The gateway records calls on its event
    loop and `/metrics` renders in a thread: a scrape may see a call's sums half added (one request early or late in
    one unit), never a broken series.
    """

    def __init__(self) -> None:
        self.models: list[ModelArms] = []

    def exposition(self) -> bytes:
        """The sums as Prometheus counters and a histogram (cumulative buckets), in the text exposition format."""
        families: dict[str, list[str]] = {name: [] for name in (*SUMS, "latency", "calls")}
        les = [f'le="{floatToGoString(b)}"' for b in BOUNDS] + ['le="+Inf"']
        for arms in self.models:
            # iterate over copies (dict.copy runs under the GIL in one step): a unit added by the event loop meanwhile
            # cannot change the dict being read
            for (cohort, assigned, unit), sums in arms.units.copy().items():
                labels = f'model="{_escape(arms.model)}",cohort="{_escape(cohort)}",assigned="{assigned}",unit="{unit}"'
                for index, name in enumerate(SUMS):
                    families[name].append(f"{UNIT_PREFIX}_{name}_total{{{labels}}} {sums[index]!r}")
                cumulative = list(accumulate(sums[FIRST_BUCKET:]))
                lines = families["latency"]
                lines += [
                    f"{UNIT_PREFIX}_latency_seconds_bucket{{{labels},{le}}} {count!r}"
                    for le, count in zip(les, cumulative, strict=True)
                ]
                lines.append(f"{UNIT_PREFIX}_latency_seconds_count{{{labels}}} {cumulative[-1]!r}")
                lines.append(f"{UNIT_PREFIX}_latency_seconds_sum{{{labels}}} {sums[LATENCY_SUM]!r}")
            for (cohort, assigned, outcome, retry), count in arms.calls.copy().items():
                labels = (
                    f'model="{_escape(arms.model)}",cohort="{_escape(cohort)}",assigned="{assigned}",'
                    f'outcome="{outcome}",retry="{retry}"'
                )
                families["calls"].append(f"{ARM_CALLS}_total{{{labels}}} {count!r}")
        out: list[str] = []
        for name in SUMS:
            out += [f"# HELP {UNIT_PREFIX}_{name}_total {HELP[name]}", f"# TYPE {UNIT_PREFIX}_{name}_total counter"]
            out += families[name]
        out += [
            f"# HELP {UNIT_PREFIX}_latency_seconds {LATENCY_HELP}",
            f"# TYPE {UNIT_PREFIX}_latency_seconds histogram",
        ]
        out += families["latency"]
        out += [f"# HELP {ARM_CALLS}_total {CALLS_HELP}", f"# TYPE {ARM_CALLS}_total counter", *families["calls"]]
        return ("\n".join(out) + "\n").encode()


def _escape(value: str) -> str:
    """A label value escaped for the text format (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


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

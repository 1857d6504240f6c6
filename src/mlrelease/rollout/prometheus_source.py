"""A MetricsSource read with PromQL from Prometheus: the gateway replicas' per-unit arm series (gateway/arm_metrics.py).

The Kubernetes way of reading the evidence: every gateway replica (or, in Gateway API mode, every per-version
gateway) exports its calls summed by model, cohort, *assigned* arm and analysis unit; Prometheus scrapes them, and
this source asks it for the increase of each sum over a judged window. The windows it returns are the very
`CohortWindow`s the decision-log source returns, with analysis units (clusters of whole users) in place of users,
so the same contracts judge them with the same code.

- `windows`: per sum, the exact increase summed by cohort, assigned and unit (see `_exact_increase`: no
  extrapolation, series born in the window counted whole, restarted replicas read sample by sample), half an hour at a
  time so a long stage never exceeds Prometheus' per-query sample limit; an excluded stretch is the same over the
  stretch, subtracted. Cohort "*" pools the cohorts unit by unit (a unit holds the same users in each).
- `timeline`: the raw samples of the per-outcome call counters over the window, their reset-corrected increments
  spread evenly over the seconds between two scrapes. A scrape gap therefore spreads the calls across the gap
  instead of reading as a silence, while a real silence (no calls: the counters stand still) stays one. The timeline
  ends at the newest scrape, but no earlier than `stale_s` before `until`: seconds not scraped yet are not a
  silence, and a gateway that stopped being scraped is. Cut-out outages are cut at scrape resolution: the scrape
  interval must be well below the plan's `max_gap_s` (15 s against production's 30 s).
- `features`: Prometheus holds no feature rows; diagnose then says it has none to compare.

Prometheus that cannot be reached, or that answers an error, is a StepError naming the URL and the query: a rollout
then moves no traffic (the step fails before any verdict).
"""

from __future__ import annotations

import bisect
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import requests

from mlrelease.errors import StepError
from mlrelease.gateway.arm_metrics import ARM_CALLS, LOG_OFFSET, UNIT_PREFIX
from mlrelease.rollout.outage import CallTimeline
from mlrelease.rollout.windows import LATENCY_BOUNDS_S, CohortWindow

ALL_COHORTS = "*"
SERVING_FAILURE_OUTCOMES = ("error", "timeout", "unavailable")  # rollout/windows.py SERVING_FAILURES, by name
# The per-unit counters and the CohortWindow sums they become (log sums are corrected by LOG_OFFSET × their count).
COUNTERS = {
    "requests": "calls",
    "failed": "failed",
    "nan": "nan",
    "answers": "answers",
    "low_score": "low_confidence",
    "log_latency": "log_latency",
    "log_prediction": "log_eta",
    "log_score": "log_confidence",
}
LOG_SUMS = {"log_latency": "calls", "log_eta": "answers", "log_confidence": "answers"}
Arm = tuple[str, int]  # (cohort, assigned version)
Sample = tuple[float, float]  # (unix time, value)
Target = tuple[str, str]  # a scraped process: (job, instance)
UnitKey = tuple[str, int, int, str]  # (cohort, assigned, unit, sum name)


class PrometheusSource:
    """Reads one model's arm series from the Prometheus HTTP API.

    :param url: Prometheus' base URL (http://prometheus:9090).
    :param model: the model whose series are read (the `model` label).
    :param selector: extra label matchers for the gateway's series, e.g. `namespace="serving"` (empty: none).
    :param stale_s: how stale the newest scrape may be before the rest of a timeline counts as silence: at least
        twice the scrape interval.
    :param baseline_s: how far before a window (or a chunk of it) a counter's previous sample is looked for: a scrape
        gap longer than this right at a window's start would count a counter's whole value as the window's.
    :param chunk_s: the longest stretch one query reads, so a 48 h stage never asks Prometheus for more samples than
        its `query.max-samples` (50 M by default) allows: ~7,000 series per cohort × 240 samples an hour at 15 s. A
        chunk after the first looks a whole chunk back for its baseline (the previous chunk's last sample), so a
        scrape gap at a chunk boundary costs nothing unless it is longer than a chunk: each reads ≤ 2 × chunk_s.
    :param timeout_s: one HTTP request's timeout.
    """

    def __init__(
        self,
        url: str,
        model: str,
        *,
        selector: str = "",
        stale_s: float = 30.0,
        baseline_s: float = 600.0,
        chunk_s: float = 1800.0,
        timeout_s: float = 30.0,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise StepError(f"the Prometheus URL must start with http:// or https://; got {url!r}")
        self.url = url.rstrip("/")
        self.location = f"{self.url} (model {model})"
        self.model, self.stale_s, self.baseline_s, self.chunk_s = model, stale_s, baseline_s, chunk_s
        self.timeout_s = timeout_s
        self._extra = selector.strip()  # what selects the gateway's targets (their process metrics have no model)
        self._matchers = ", ".join(m for m in (f'model="{model}"', self._extra) if m)
        self._session = requests.Session()

    # --- windows -------------------------------------------------------------------------------------------

    def windows(
        self, since: datetime, until: datetime, exclude: Sequence[tuple[datetime, datetime]] = ()
    ) -> dict[tuple[str, int], CohortWindow]:
        """Per (cohort, assigned version) and analysis unit, the increase of every sum over [since, until) minus the
        `exclude` stretches; cohort "*" pools every cohort (unit by unit: a unit holds the same users in each)."""
        sums = self._increase(since, until)
        for start, end in exclude:
            start, end = max(start, since), min(end, until)
            if end > start:
                for key, values in self._increase(start, end).items():
                    sums[key] -= values
        return _cohort_windows(sums)

    def _increase(self, since: datetime, until: datetime) -> dict[UnitKey, float]:
        """(cohort, assigned, unit, sum name) → its increase in (since, until], read chunk by chunk (increases add
        up: each chunk's baseline is the previous one's last value); `le=<bound>` keys for the tail."""
        out: dict[UnitKey, float] = defaultdict(float)
        start = since
        while start < until:
            end = min(until, start + timedelta(seconds=self.chunk_s))
            # inside the window the baseline is the previous chunk's last sample, however old: look a chunk back
            back = self.baseline_s if start == since else max(self.baseline_s, self.chunk_s)
            restarted = self._restarted(start, end, back)
            for counter, name in COUNTERS.items():
                for labels, value in self._exact_increase(
                    f"{UNIT_PREFIX}_{counter}_total", start, end, restarted, back=back
                ):
                    out[_unit_key(labels, name)] += value
            bucket = f"{UNIT_PREFIX}_latency_seconds_bucket"
            for labels, value in self._exact_increase(bucket, start, end, restarted, by=("le",), back=back):
                out[_unit_key(labels, f"le={labels.get('le')}")] += value
            start = end
        return out

    def _restarted(self, since: datetime, until: datetime, back: float) -> dict[Target, list[Sample]]:
        """The replicas (by job and instance) whose process restarted in (since − back, until], with their
        process start times as scraped: (scrape time, start time). A restart shows as a new
        `process_start_time_seconds`, or, for an exporter without it, as a request counter that went down."""
        span, at = _ms(until - since, back), f"{until.timestamp():.3f}"
        starts = f"process_start_time_seconds{{{self._extra}}}[{span}] @ {at}"
        # the fallback for an exporter without process metrics: its request counters went down
        went_down = f"resets({UNIT_PREFIX}_requests_total{{{self._matchers}}}[{span}] @ {at}) > 0"
        targets = {_target(s["metric"]) for s in self._query(f"changes({starts}) > 0")}
        targets |= {_target(s["metric"]) for s in self._query(went_down)}
        if not targets:
            return {}
        return self._process_starts(targets, since, until, back)

    def _process_starts(
        self, targets: set[Target], since: datetime, until: datetime, back: float
    ) -> dict[Target, list[Sample]]:
        """Per target, its scraped `process_start_time_seconds` samples over the stretch and `back` seconds before."""
        span, at = _ms(until - since, back), f"{until.timestamp():.3f}"
        instances = {instance for _, instance in targets}
        query = f"process_start_time_seconds{{{self._with_instances(instances, extra_only=True)}}}[{span}] @ {at}"
        starts: dict[Target, list[Sample]] = {t: [] for t in targets}
        for series in self._query(query):
            starts.setdefault(_target(series["metric"]), []).extend(_samples(series["values"]))
        return {t: sorted(v) for t, v in starts.items()}

    def _exact_increase(
        self,
        metric: str,
        since: datetime,
        until: datetime,
        restarted: dict[Target, list[Sample]],
        by: tuple[str, ...] = (),
        back: float = 600.0,
    ) -> list[tuple[dict[str, str], float]]:
        """The increase of `metric` over (since, until] summed by cohort, assigned and unit (and `by`), without
        PromQL's extrapolation (a count is a count).

        A series' increase is its last value in the stretch minus its last value at or before `since` (looked for
        `back` seconds back), or its whole value when it has none (a replica that started, a unit's first request:
        the first increment of a lazily created counter is otherwise lost to `increase`). The replicas that
        restarted are read sample by sample instead, each process's counts from zero (a restarted counter that has
        already passed its old value shows no reset, so `resets` alone would miss it). Every replica counts, those
        no longer scraped included.
        """
        instances = {instance for _, instance in restarted}
        span, at, before = _ms(until - since), f"{until.timestamp():.3f}", f"{since.timestamp():.3f}"
        selector = f"{metric}{{{self._with_instances(instances, exclude=True)}}}"
        last = f"last_over_time({selector}[{span}] @ {at})"
        first = f"last_over_time({selector}[{_ms(timedelta(seconds=back))}] @ {before})"
        group = ", ".join(("cohort", "assigned", "unit", *by))
        found = [
            (s["metric"], float(s["value"][1])) for s in self._query(f"sum by ({group}) (({last} - {first}) or {last})")
        ]
        if restarted:  # rare: a replica restarted in the stretch
            raw = f"{metric}{{{self._with_instances(instances)}}}[{_ms(until - since, back)}] @ {at}"
            for series in self._query(raw):
                starts = restarted.get(_target(series["metric"]), [])
                increments = _increments(_samples(series["values"]), starts, since.timestamp())
                found.append((series["metric"], sum(amount for _, t, amount in increments if t > since.timestamp())))
        return found

    def _with_instances(self, instances: set[str], *, exclude: bool = False, extra_only: bool = False) -> str:
        """The series' matchers, limited to `instances` (or to all others with `exclude`; no limit when empty)."""
        base = self._extra if extra_only else self._matchers
        if not instances:
            return base
        pattern = "|".join(_regex_quote(i) for i in sorted(instances))
        return ", ".join(m for m in (base, f'instance{"!~" if exclude else "=~"}"{pattern}"') if m)

    # --- timeline ------------------------------------------------------------------------------------------

    def timeline(self, since: datetime, until: datetime, stable: int) -> CallTimeline:
        """Per second of [since, until): model calls, requests assigned to `stable`, and those whose stable call
        failed or was not made (its breaker rested it); see the module docstring for scrapes and gaps."""
        start, end = since.timestamp(), until.timestamp()
        query = f"{ARM_CALLS}_total{{{self._matchers}}}[{_ms(until - since, self.baseline_s)}] @ {end:.3f}"
        matrix = self._query(query)
        targets = {_target(s["metric"]) for s in matrix}
        starts = self._process_starts(targets, since, until, self.baseline_s) if matrix else {}
        newest = max((float(s["values"][-1][0]) for s in matrix if s["values"]), default=start)
        end = min(end, max(newest, end - self.stale_s))
        seconds = max(int(np.ceil(end - start)), 0)
        calls, stable_requests, stable_failures = np.zeros(seconds), np.zeros(seconds), np.zeros(seconds)
        for series in matrix:
            labels = series["metric"]
            increments = _increments(_samples(series["values"]), starts.get(_target(labels), []), start)
            per_second = _spread(increments, start, seconds)
            if labels.get("outcome") != "unavailable":
                calls += per_second
            if labels.get("retry") == "False" and labels.get("assigned") == str(stable):
                stable_requests += per_second
                if labels.get("outcome") in SERVING_FAILURE_OUTCOMES:
                    stable_failures += per_second
        return CallTimeline(start, calls, stable_requests, stable_failures)

    def features(self, cohort: str, since: datetime, until: datetime) -> np.ndarray:
        """No feature rows: Prometheus keeps sums, not the rows themselves (diagnose reads the decision log)."""
        return np.zeros((0, 0))

    # --- the HTTP API --------------------------------------------------------------------------------------

    def _query(self, query: str) -> list[dict[str, Any]]:
        """The result of an instant query (a vector, or a matrix for a range selector); StepError on any failure."""
        try:
            response = self._session.get(f"{self.url}/api/v1/query", params={"query": query}, timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise StepError(f"Prometheus at {self.url} cannot be reached: {type(exc).__name__}: {exc}") from None
        try:
            body = response.json()
        except ValueError:
            body = {}
        if response.status_code != 200 or body.get("status") != "success":
            error = body.get("error") or response.text[:200]
            status = response.status_code
            raise StepError(f"Prometheus at {self.url} refused the query {query!r}: HTTP {status}: {error}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


def _target(labels: dict[str, str]) -> Target:
    """The scraped process a series comes from: two jobs may share an instance label (relabelled to the pod)."""
    return labels.get("job", ""), labels.get("instance", "")


def _unit_key(labels: dict[str, str], name: str) -> tuple[str, int, int, str]:
    """The key of one aggregated series; a series without the arm's labels is not the gateway's and is refused."""
    try:
        return labels["cohort"], int(labels["assigned"]), int(labels["unit"]), name
    except (KeyError, ValueError):
        raise StepError(f"a Prometheus series {labels} lacks the gateway's cohort/assigned/unit labels") from None


def _cohort_windows(sums: dict[tuple[str, int, int, str], float]) -> dict[Arm, CohortWindow]:
    """The per-unit sums as one CohortWindow per (cohort, assigned), and per (`*`, assigned) over every cohort."""
    arms: dict[Arm, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    for (cohort, assigned, unit, name), value in sums.items():
        for arm in ((cohort, assigned), (ALL_COHORTS, assigned)):
            # a unit number holds the same users in every cohort (a user's orders may fall in several): pooled
            # cohorts add up unit by unit, so each cluster stays whole users, as the decision log's per-user pool
            arms[arm][unit][name] += value
    return {arm: window for arm, units in arms.items() if (window := _window(units)) is not None}


def _window(units: dict[int, dict[str, float]]) -> CohortWindow | None:
    """One arm's CohortWindow from its units' sums (None when no unit had a request)."""
    ids = np.array(sorted(u for u, s in units.items() if s.get("calls", 0.0) > 1e-9), dtype=np.int64)
    if not len(ids):
        return None
    column = {name: np.array([max(units[u].get(name, 0.0), 0.0) for u in ids]) for name in COUNTERS.values()}
    for name, count in LOG_SUMS.items():  # undo the offset that kept the counters growing
        column[name] = column[name] - LOG_OFFSET * column[count]
    requests = np.array([units[u].get("le=+Inf", 0.0) for u in ids])
    below = {float(k[3:]): k for k in next(iter(units.values())) if k.startswith("le=") and k != "le=+Inf"}
    slow = np.zeros((len(ids), len(LATENCY_BOUNDS_S)))
    for i, bound in enumerate(LATENCY_BOUNDS_S):
        key = below.get(float(bound)) or _bucket_key(units, float(bound))
        within = np.array([units[u].get(key, 0.0) for u in ids]) if key else requests
        slow[:, i] = np.clip(requests - within, 0.0, None)
    return CohortWindow(ids, slow=slow, **column)


def _bucket_key(units: dict[int, dict[str, float]], bound: float) -> str | None:
    """The `le=` key of `bound` in any unit (units differ in which buckets they reported only when empty)."""
    for sums in units.values():
        for key in sums:
            if key.startswith("le=") and key != "le=+Inf" and float(key[3:]) == bound:
                return key
    return None


def _samples(values: Iterable[Sequence[Any]]) -> list[Sample]:
    """The Prometheus API's [time, "value"] pairs as floats."""
    return [(float(t), float(v)) for t, v in values]


def _process_at(starts: list[Sample], t: float) -> float | None:
    """The process start time a replica reported at its latest scrape at or before `t` (None: none known)."""
    at = bisect.bisect_right(starts, (t, math.inf)) - 1
    return starts[at][1] if at >= 0 else None


def _increments(samples: list[Sample], starts: list[Sample], window_start: float) -> list[tuple[float, float, float]]:
    """(previous sample time, sample time, increase) of one counter series' samples.

    The first sample is the baseline when it precedes `window_start`; after it, the series was born in the window and
    its whole value is its first increase. A sample scraped from a new process (`starts`: the replica's process
    start times as scraped) or lower than the one before counts its whole value: the counter started again at 0.
    """
    out: list[tuple[float, float, float]] = []
    previous: tuple[float, float, float | None] | None = None
    for t, v in samples:
        process = _process_at(starts, t)
        if previous is None:
            out.append((t, t, v if t > window_start else 0.0))
        else:
            before_t, before_v, before_process = previous
            restarted = v < before_v or (
                process is not None and before_process is not None and process != before_process
            )
            out.append((before_t, t, v if restarted else v - before_v))
        previous = (t, v, process)
    return out


def _spread(increments: list[tuple[float, float, float]], start: float, seconds: int) -> np.ndarray:
    """Each increment spread evenly over the seconds between its two samples, on the window's per-second grid."""
    per_second = np.zeros(seconds)
    for before, after, amount in increments:
        if amount <= 0 or seconds == 0:
            continue
        first = int(np.floor(before - start)) + 1 if after > before else int(np.floor(after - start))
        last = int(np.floor(after - start))
        first, last = max(first, 0), min(last, seconds - 1)
        if last < first:
            continue
        per_second[first : last + 1] += amount / (last - first + 1)
    return per_second


def _ms(span: Any, extra_s: float = 0.0) -> str:
    """A PromQL duration of `span` (a timedelta) plus `extra_s` seconds, in whole milliseconds (at least 1)."""
    return f"{max(int(round((span.total_seconds() + extra_s) * 1000)), 1)}ms"


def _regex_quote(value: str) -> str:
    """`value` as a literal inside a PromQL regular expression in a double-quoted string (PromQL unescapes once)."""
    return re.escape(value).replace("\\", "\\\\").replace('"', '\\"')

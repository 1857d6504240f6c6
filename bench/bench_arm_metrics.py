"""Benchmark: what the Prometheus arm series add to the gateway's bookkeeping per model call.

Every model call the gateway makes is recorded in its decision log and in its answer metrics (the baseline, as
before the Prometheus metrics source) and, now, in the per-unit arm series (gateway/arm_metrics.py: up to 8 counter
increments and a 41-bound histogram observation). This times both per call on the same mixed traffic (users spread
over every analysis unit, 3 cohorts, both arms, ~2 % failures), in interleaved rounds, and prints them side by side
with the µs it adds (the gateway's whole Python path per request is in README, "Benchmarks").
    python bench/bench_arm_metrics.py [--calls 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table  # noqa: E402

from mlrelease.gateway.cohorts import BUCKETS  # noqa: E402
from mlrelease.gateway.decision_log import DecisionLog  # noqa: E402
from mlrelease.gateway.metrics import GatewayMetrics  # noqa: E402


def _traffic(calls: int, seed: int = 5) -> list[tuple[str, int, int, str, float, float, float]]:
    """(cohort, assigned, bucket, outcome, latency s, prediction, score) per call."""
    rng = np.random.default_rng(seed)
    cohorts = rng.choice(["high_value", "long_tail", "core"], calls)
    assigned = rng.choice([1, 2], calls)
    buckets = rng.integers(0, BUCKETS, calls)
    outcomes = rng.choice(["ok"] * 49 + ["error"], calls)
    latency = rng.lognormal(-6.0, 0.5, calls)
    prediction = rng.lognormal(3.0, 0.5, calls)
    score = rng.uniform(0.3, 1.0, calls)
    return [
        (str(c), int(a), int(b), str(o), float(lat), float(p), float(s))
        for c, a, b, o, lat, p, s in zip(cohorts, assigned, buckets, outcomes, latency, prediction, score, strict=True)
    ]


def _per_call_us(calls: list[tuple[str, int, int, str, float, float, float]], *, arms: bool, directory: Path) -> float:
    """µs per call of the bookkeeping the gateway does for one model call (arm series included or not)."""
    model = GatewayMetrics().for_model("parcel_eta")
    log = DecisionLog(directory, with_features=False)
    began = time.perf_counter()
    for cohort, assigned, bucket, outcome, latency, prediction, score in calls:
        ok = outcome == "ok"
        if arms:
            model.arms.observe(
                cohort=cohort,
                assigned=assigned,
                bucket=bucket,
                retry=False,
                outcome=outcome,
                latency_s=latency,
                prediction=prediction if ok else None,
                score=score if ok else None,
            )
        log.record(
            cohort=cohort,
            version=assigned,
            role="stable",
            outcome=outcome,
            latency_s=latency,
            assigned=assigned,
            unit=bucket,
            eta=prediction if ok else None,
            confidence=score if ok else None,
            key=bucket,
        )
        if ok:
            model.observe_answer(cohort, str(assigned), "model", prediction, score, latency)
    spent = time.perf_counter() - began
    log._buffer.clear()  # noqa: SLF001 - nothing is flushed: the file write is the log's own thread's cost
    return spent / len(calls) * 1e6


def _render_ms(rounds: int) -> tuple[float, int, int]:
    """(median ms, lines, bytes) of one /metrics exposition with every unit of both arms in 3 cohorts recorded: the
    largest a scrape gets during a rollout (it renders in a thread, off the gateway's event loop)."""
    metrics = GatewayMetrics()
    arms = metrics.for_model("parcel_eta").arms
    for cohort in ("high_value", "long_tail", "core"):
        for assigned in (1, 2):
            for bucket in range(0, BUCKETS, 5):
                arms.observe(
                    cohort=cohort,
                    assigned=assigned,
                    bucket=bucket,
                    retry=False,
                    outcome="ok",
                    latency_s=0.002,
                    prediction=20.0,
                    score=0.9,
                )
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        text = metrics.exposition()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times), text.count(b"\n"), len(text)


def main() -> None:
    """Interleaved rounds of both, then the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    calls = _traffic(args.calls)
    before, after = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            before.append(_per_call_us(calls, arms=False, directory=Path(tmp)))
            after.append(_per_call_us(calls, arms=True, directory=Path(tmp)))
    b, a = statistics.median(before), statistics.median(after)
    print(f"\nper-call bookkeeping of {args.calls:,} mixed calls, median of {args.rounds} interleaved rounds")
    print_table(
        ["path", "µs per call", "range", "added µs"],
        [
            ["decision log + answer metrics (before)", f"{b:.1f}", f"{min(before):.1f}–{max(before):.1f}", ""],
            [
                "+ Prometheus arm series (now)",
                f"{a:.1f}",
                f"{min(after):.1f}–{max(after):.1f}",
                f"{a - b:+.1f}",
            ],
        ],
    )
    ms, lines, size = _render_ms(args.rounds)
    print(
        f"\n/metrics with every analysis unit of both arms in 3 cohorts: {lines:,} lines, {size / 1e6:.1f} MB, "
        f"{ms:.0f} ms to render (median of {args.rounds}; in a thread, off the event loop)"
    )


if __name__ == "__main__":
    main()

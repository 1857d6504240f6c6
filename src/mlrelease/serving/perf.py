"""Running the real perf_analyzer and reading its CSV; the latency/throughput gate as a pure function."""

from __future__ import annotations

import csv
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mlrelease.errors import StepError
from mlrelease.serving.triton_client import host_port

UNSTABLE = "Failed to obtain stable measurement"


@dataclass(frozen=True)
class Level:
    """One concurrency level of a perf_analyzer run."""

    concurrency: int
    throughput: float  # inferences per second
    p50_us: float
    p99_us: float


def parse_csv(path: Path) -> list[Level]:
    """Levels from a perf_analyzer `-f` CSV, sorted by concurrency; a CSV without rows is an error naming it."""
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise StepError(f"perf_analyzer wrote no measurements to {path}")
    return sorted(
        (
            Level(
                int(r["Concurrency"]), float(r["Inferences/Second"]), float(r["p50 latency"]), float(r["p99 latency"])
            )
            for r in rows
        ),
        key=lambda level: level.concurrency,
    )


@dataclass(frozen=True)
class PerfSettings:
    """perf_analyzer settings shared by champion and challenger so the comparison is fair."""

    concurrency_range: str = "1:4:3"
    measurement_interval_ms: int = 1000
    rounds: int = 3  # interleaved champion/challenger rounds; the gate compares medians
    stability_steps: tuple[int, ...] = (10, 25, 50)  # looser on each retry of an unstable measurement


def run_perf_analyzer(
    binary: Path,
    env: dict[str, str],
    url: str,
    model: str,
    version: int,
    out_csv: Path,
    settings: PerfSettings,
    protocol: str = "http",
    timeout_s: float = 600.0,
) -> tuple[list[Level], int]:
    """Measure one version; retries an unstable measurement with a looser stability; returns levels and the % used.
    A run past `timeout_s` is killed and raises StepError."""
    if not binary.is_file():
        raise StepError(f"perf_analyzer not found at {binary}: build the toolchain with `make setup`")
    address, tls = host_port(url)
    if tls:
        raise StepError(f"benchmarking over https ({url}) is not supported: point it at Triton's in-cluster http URL")
    last_error = ""
    for stability in settings.stability_steps:
        argv = [
            str(binary),
            "-m",
            model,
            "-x",
            str(version),
            "-u",
            address,
            "-i",
            protocol,
            "--concurrency-range",
            settings.concurrency_range,
            "--measurement-interval",
            str(settings.measurement_interval_ms),
            "--stability-percentage",
            str(stability),
            "-f",
            str(out_csv),
        ]
        try:
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise StepError(
                f"perf_analyzer on {model} version {version} did not finish within {timeout_s:g} s"
            ) from None
        if proc.returncode == 0:
            return parse_csv(out_csv), stability
        lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        last_error = lines[-1] if lines else f"exit {proc.returncode}"
        if UNSTABLE not in proc.stdout + proc.stderr:
            break
    raise StepError(f"perf_analyzer failed on {model} version {version}: {last_error}")


@dataclass(frozen=True)
class Verdict:
    """Outcome of the performance gate: the medians, and how many paired measurements were beyond tolerance."""

    passed: bool
    worst_p99_ratio: float
    worst_throughput_ratio: float
    pairs: int  # paired (round, concurrency) measurements of challenger and champion
    p99_beyond: int  # of them, how many had the challenger's p99 beyond the tolerance
    throughput_beyond: int
    false_fail_rate: float  # the sign test's rate of failing a challenger exactly at the tolerance
    reason: str


def _by_concurrency(rounds: list[list[Level]]) -> dict[int, list[Level]]:
    grouped: dict[int, list[Level]] = {}
    for levels in rounds:
        for level in levels:
            grouped.setdefault(level.concurrency, []).append(level)
    return grouped


def median_levels(rounds: list[list[Level]]) -> list[Level]:
    """Per concurrency level, the median throughput and latencies over repeated rounds."""
    return [
        Level(
            c,
            statistics.median(x.throughput for x in xs),
            statistics.median(x.p50_us for x in xs),
            statistics.median(x.p99_us for x in xs),
        )
        for c, xs in sorted(_by_concurrency(rounds).items())
    ]


def compare(
    challenger: list[list[Level]], champion: list[list[Level]], *, max_p99_ratio: float, min_throughput_ratio: float
) -> Verdict:
    """A sign test over paired measurements: fail only when *every* pair shows the challenger beyond tolerance.

    Round n of the challenger and round n of the champion ran back to back (`measure` alternates their
    order), so each (round, concurrency) is a paired comparison under the same machine state. If the
    challenger were exactly at the tolerance, each pair would land beyond it with probability 1/2, so all
    k pairs do with probability 2^-k: the false-fail rate at the boundary (1/64 for 3 rounds × 2 levels),
    and far less for a challenger of the champion's speed. A slower challenger is beyond tolerance in every
    pair. The allowance never widens with the machine's noise: noise makes some pair fall inside, and the
    gate passes — the shadow's paired test and the stages' latency contract judge latency precisely.
    """
    ours, theirs = _by_concurrency(challenger), _by_concurrency(champion)
    shared = sorted(set(ours) & set(theirs))
    if not shared:
        raise StepError("champion and challenger were measured at no common concurrency level")
    p99_pairs, tput_pairs = [], []
    for c in shared:
        for mine, base in zip(ours[c], theirs[c], strict=False):
            p99_pairs.append((c, mine.p99_us / base.p99_us))
            tput_pairs.append((c, mine.throughput / base.throughput))
    k = len(p99_pairs)
    p99_beyond = sum(r > max_p99_ratio for _, r in p99_pairs)
    tput_beyond = sum(r < min_throughput_ratio for _, r in tput_pairs)
    worst_p99 = max(statistics.median(r for c2, r in p99_pairs if c2 == c) for c in shared)
    worst_tput = min(statistics.median(r for c2, r in tput_pairs if c2 == c) for c in shared)
    problems = []
    if p99_beyond == k:
        problems.append(f"p99 latency ratio above {max_p99_ratio} in all {k} paired measurements")
    if tput_beyond == k:
        problems.append(f"throughput ratio below {min_throughput_ratio} in all {k} paired measurements")
    rate = 0.5**k
    evidence = (
        f"p99 beyond {max_p99_ratio} in {p99_beyond}/{k} pairs, throughput below {min_throughput_ratio} in "
        f"{tput_beyond}/{k} (sign test: false-fail rate at the tolerance {rate:.3f})"
    )
    reason = "; ".join(problems) or f"worst p99 ratio {worst_p99:.2f}, worst throughput ratio {worst_tput:.2f}"
    return Verdict(not problems, worst_p99, worst_tput, k, p99_beyond, tput_beyond, rate, f"{reason}; {evidence}")

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
) -> tuple[list[Level], int]:
    """Measure one version; retries an unstable measurement with a looser stability; returns levels and the % used."""
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
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            raise StepError(f"perf_analyzer on {model} version {version} did not finish within 600 s") from None
        if proc.returncode == 0:
            return parse_csv(out_csv), stability
        lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        last_error = lines[-1] if lines else f"exit {proc.returncode}"
        if UNSTABLE not in proc.stdout + proc.stderr:
            break
    raise StepError(f"perf_analyzer failed on {model} version {version}: {last_error}")


@dataclass(frozen=True)
class Verdict:
    """Outcome of the performance gate, with the measurement noise it allowed for."""

    passed: bool
    worst_p99_ratio: float
    worst_throughput_ratio: float
    p99_noise: float
    throughput_noise: float
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


MAX_NOISE_ALLOWANCE = 1.5  # measurement noise may widen the p99 allowance to at most 1.5x (throughput: 1/1.5)


def compare(
    challenger: list[list[Level]], champion: list[list[Level]], *, max_p99_ratio: float, min_throughput_ratio: float
) -> Verdict:
    """Challenger vs champion on medians over interleaved rounds; the worst shared concurrency level decides.

    At each level the champion's own round-to-round spread (max/min of its p99 and throughput) is the
    measurement noise on this machine: a ratio within that noise is not evidence of a regression, so the
    allowance is the configured ratio or the noise, whichever is looser, but never looser than
    MAX_NOISE_ALLOWANCE. On a quiet GPU node the noise is small and the configured ratios decide; a 2x
    slowdown fails however noisy the machine.
    """
    ours, theirs = _by_concurrency(challenger), _by_concurrency(champion)
    shared = sorted(set(ours) & set(theirs))
    if not shared:
        raise StepError("champion and challenger were measured at no common concurrency level")
    problems: list[str] = []
    worst_p99, worst_tput, p99_noise, tput_noise = 0.0, float("inf"), 1.0, 1.0
    for c in shared:
        base_p99 = [x.p99_us for x in theirs[c]]
        base_tput = [x.throughput for x in theirs[c]]
        noise_p99 = min(max(base_p99) / min(base_p99), MAX_NOISE_ALLOWANCE)
        noise_tput = max(min(base_tput) / max(base_tput), 1 / MAX_NOISE_ALLOWANCE)
        r_p99 = statistics.median(x.p99_us for x in ours[c]) / statistics.median(base_p99)
        r_tput = statistics.median(x.throughput for x in ours[c]) / statistics.median(base_tput)
        allowed_p99, allowed_tput = max(max_p99_ratio, noise_p99), min(min_throughput_ratio, noise_tput)
        if r_p99 > allowed_p99:
            problems.append(f"concurrency {c}: p99 latency ratio {r_p99:.2f} > {allowed_p99:.2f}")
        if r_tput < allowed_tput:
            problems.append(f"concurrency {c}: throughput ratio {r_tput:.2f} < {allowed_tput:.2f}")
        worst_p99, worst_tput = max(worst_p99, r_p99), min(worst_tput, r_tput)
        p99_noise, tput_noise = max(p99_noise, noise_p99), min(tput_noise, noise_tput)
    noise = f"(configured {max_p99_ratio}/{min_throughput_ratio}, champion noise {p99_noise:.2f}/{tput_noise:.2f})"
    reason = "; ".join(problems) or f"worst p99 ratio {worst_p99:.2f}, worst throughput ratio {worst_tput:.2f}"
    return Verdict(not problems, worst_p99, worst_tput, p99_noise, tput_noise, f"{reason} {noise}")

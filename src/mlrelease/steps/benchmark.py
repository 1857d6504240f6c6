"""Step `benchmark`: perf_analyzer on challenger and champion in paired rounds up to a peak load; one sign test."""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlrelease.errors import GateFailed, StepError
from mlrelease.registry import CHAMPION, MODEL_NAME, Registry
from mlrelease.rollout.gates import held_by_open_rollout
from mlrelease.serving.integrity import verify_version
from mlrelease.serving.local_layout import triton_url
from mlrelease.serving.local_triton import perf_analyzer_command
from mlrelease.serving.perf import (
    Level,
    PerfSettings,
    Verdict,
    compare,
    fail_threshold,
    median_levels,
    paired_excesses,
    round_statistic,
    run_perf_analyzer,
    sign_test_decided,
)
from mlrelease.serving.perf_plot import plot_levels
from mlrelease.serving.triton_client import TritonClient
from mlrelease.serving.triton_repo import model_repository, versions_present
from mlrelease.serving.withdraw import withdraw_refused
from mlrelease.settings import Settings


def _check_served(settings: Settings, client: TritonClient, registry: Registry, versions: list[int]) -> None:
    """Each version is in the repository, is the file export recorded, and is loaded; else the step fails first."""
    root = model_repository(settings)
    for v in versions:
        if v not in versions_present(root, MODEL_NAME):
            raise StepError(f"version {v} is not in the model repository {root}; re-export it or move the alias")
        # A number measured on bytes nobody checked would vouch for a model that was never validated.
        verify_version(root, v, registry=registry)
        if not client.version_ready(MODEL_NAME, v):
            raise StepError(f"{MODEL_NAME} version {v} is not loaded in Triton: run validate-serving first")


def measure(
    settings: Settings,
    url: str,
    runs: list[tuple[str, int]],
    n_rounds: int,
    perf: PerfSettings,
    out: Path,
    coin: random.Random | None = None,
    settled: Callable[[dict[str, list[list[Level]]]], bool] | None = None,
) -> tuple[dict[str, list[list[Level]]], list[dict[str, int]], list[str]]:
    """Paired rounds over every level of `perf`, at most `n_rounds`, fewer once `settled` says so; CSVs in `out`.

    Returns each version's levels per round, the stability % each version needed per round (its loosest), and
    which version ran first in each round.
    """
    binary, env = perf_analyzer_command(settings)
    coin = coin or random.Random()
    rounds: dict[str, list[list[Level]]] = {label: [] for label, _ in runs}
    stabilities, first = [], []
    for n in range(1, n_rounds + 1):
        # One fair coin per round orders the versions for all its levels: at the tolerance, which run is called
        # challenger is then a coin flip, which is what makes the sign test over rounds exact (perf.compare).
        order = runs if coin.random() < 0.5 else list(reversed(runs))
        measured, used = _measure_round(binary, env, url, order, perf, out, n)
        for label in rounds:
            rounds[label].append(measured[label])
        stabilities.append(used)
        first.append(order[0][0])
        if settled is not None and settled(rounds):
            break
    return rounds, stabilities, first


def settled_by_sign_test(
    perf: PerfSettings, *, max_p99_ratio: float, min_throughput_ratio: float
) -> Callable[[dict[str, list[list[Level]]]], bool]:
    """A stop rule for `measure`: the rounds so far settle the sign test of `perf.rounds` (same verdict, fewer runs)."""
    fail_at = fail_threshold(perf.rounds, perf.max_false_fail)

    def settled(rounds: dict[str, list[list[Level]]]) -> bool:
        per_round = paired_excesses(
            rounds["challenger"],
            rounds["champion"],
            max_p99_ratio=max_p99_ratio,
            min_throughput_ratio=min_throughput_ratio,
        )
        if not all(per_round):
            return True  # no common level: compare names the problem now rather than after every round
        harmed = sum(round_statistic(excess.values()) > 0 for excess in per_round)
        return sign_test_decided(harmed, len(per_round), perf.rounds, fail_at)

    return settled


def _measure_round(
    binary: Path, env: dict[str, str], url: str, order: list[tuple[str, int]], perf: PerfSettings, out: Path, n: int
) -> tuple[dict[str, list[Level]], dict[str, int]]:
    """Round `n`: each level on each version in `order`; the levels per version, and the loosest stability used."""
    measured: dict[str, list[Level]] = {label: [] for label, _ in order}
    used: dict[str, int] = {}
    for concurrency, batch in perf.levels:
        for label, v in order:  # back to back per level: the pair shares the machine's state
            levels, stability = run_perf_analyzer(
                *(binary, env, url, MODEL_NAME, v, out / f"{label}_v{v}_round{n}_c{concurrency}x{batch}.csv"),
                perf,
                timeout_s=perf.level_timeout_s,
                concurrency=concurrency,
                batch=batch,
            )
            measured[label] += levels
            used[label] = max(used.get(label, 0), stability)
    return measured, used


def log_evidence(
    registry: Registry, version: int, out: Path, series: dict[str, list[Level]], verdict: Verdict | None
) -> None:
    """CSVs, the latency-vs-concurrency PNG and the gate's numbers, on the candidate's MLflow run."""
    import mlflow

    plot = plot_levels(series, out / "latency_vs_concurrency.png")
    with mlflow.start_run(run_id=registry.run_id(version)):
        for path in [*sorted(out.glob("*.csv")), plot]:
            mlflow.log_artifact(str(path), "benchmark")
        for level in series[f"challenger v{version}"]:
            mlflow.log_metrics(
                {f"perf_p99_us_{level.name}": level.p99_us, f"perf_throughput_{level.name}": level.throughput}
            )
        if verdict is not None:
            mlflow.log_metrics(
                {
                    "perf_p99_ratio": verdict.worst_p99_ratio,
                    "perf_throughput_ratio": verdict.worst_throughput_ratio,
                    "perf_harmed_rounds": verdict.harmed_rounds,
                    "perf_false_fail_rate": verdict.false_fail_rate,
                }
            )


def benchmark(
    settings: Settings,
    version: int,
    *,
    max_p99_ratio: float = 1.10,
    min_throughput_ratio: float = 0.90,
    perf: PerfSettings | None = None,
) -> dict[str, Any]:
    """Benchmark `version` against the champion; with no champion yet, a passing version becomes champion."""
    held = held_by_open_rollout(settings, version, "benchmark")
    if held is not None:
        return held
    perf = perf or PerfSettings()
    registry = Registry.from_settings(settings)
    champion = registry.alias_version(CHAMPION)
    baseline = champion if champion not in (None, version) else None
    runs = [("challenger", version)] + ([("champion", baseline)] if baseline is not None else [])
    client = TritonClient(triton_url())
    client.ensure_live()
    try:
        _check_served(settings, client, registry, [version])
    except GateFailed as refused:  # its file is not the one export checked: it leaves the policy too
        raise withdraw_refused(settings, version, refused) from None
    _check_served(settings, client, registry, [v for _, v in runs if v != version])

    with tempfile.TemporaryDirectory(prefix="mlrelease-perf-") as tmp:
        # Bootstrap has nothing to compare with: one round records the candidate's numbers.
        n_rounds = perf.rounds if baseline else 1
        limits = {"max_p99_ratio": max_p99_ratio, "min_throughput_ratio": min_throughput_ratio}
        settled = settled_by_sign_test(perf, **limits) if baseline else None
        rounds, stabilities, first = measure(settings, client.url, runs, n_rounds, perf, Path(tmp), settled=settled)
        series = {f"{label} v{v}": median_levels(rounds[label]) for label, v in runs}
        verdict = None
        if baseline is not None:
            verdict = compare(
                rounds["challenger"],
                rounds["champion"],
                **limits,
                max_false_fail=perf.max_false_fail,
                planned_rounds=perf.rounds,
            )
        log_evidence(registry, version, Path(tmp), series, verdict)

    result: dict[str, Any] = {
        "model_version": version,
        "champion_version": champion,
        "rounds": len(stabilities),
        "planned_rounds": n_rounds,
        "stability_percentage": stabilities,
        "first_in_round": first,
        "peak": {"concurrency": perf.peak_concurrency, "batch": perf.peak_batch},
        "levels": {name: [lv.__dict__ for lv in levels] for name, levels in series.items()},
    }
    if verdict is None:
        registry.tag_version(version, benchmark_status="passed", benchmark_reason="no champion to compare against")
        if champion is None:
            registry.set_alias(CHAMPION, version)
            return {**result, "status": "bootstrap: no champion yet; this version becomes champion"}
        return {**result, "status": "this version is already champion"}
    registry.tag_version(
        version, benchmark_status="passed" if verdict.passed else "failed", benchmark_reason=verdict.reason
    )
    if not verdict.passed:
        too_slow = GateFailed(
            f"version {version} is too slow against champion {champion} ({verdict.planned_rounds} paired rounds"
            f"{'' if verdict.rounds == verdict.planned_rounds else f', settled after {verdict.rounds}'}): "
            f"{verdict.reason}"
        )
        raise withdraw_refused(settings, version, too_slow)
    return {**result, "status": "passed", **_verdict_fields(verdict)}


def _verdict_fields(verdict: Verdict) -> dict[str, Any]:
    """The gate's evidence as the step's result keeps it (the summary and the report read the first three)."""
    return {
        "verdict": verdict.reason,
        "p99_ratio": verdict.worst_p99_ratio,
        "throughput_ratio": verdict.worst_throughput_ratio,
        "pairs": verdict.pairs,
        "harmed_rounds": verdict.harmed_rounds,
        "fail_at": verdict.fail_at,
        "false_fail_rate": verdict.false_fail_rate,
        "round_statistics": list(verdict.round_statistics),
        "worst": verdict.worst,
    }

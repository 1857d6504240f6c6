"""Step `benchmark`: perf_analyzer on challenger and champion in paired rounds; a sign test on p99 and throughput."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from mlrelease.errors import GateFailed, StepError
from mlrelease.registry import CHAMPION, MODEL_NAME, Registry
from mlrelease.rollout.gates import held_by_open_rollout
from mlrelease.serving.endpoint import triton_url
from mlrelease.serving.integrity import verify_version
from mlrelease.serving.local_triton import perf_analyzer_command
from mlrelease.serving.perf import Level, PerfSettings, Verdict, compare, median_levels, run_perf_analyzer
from mlrelease.serving.perf_plot import plot_levels
from mlrelease.serving.triton_client import TritonClient
from mlrelease.serving.triton_repo import model_repository, versions_present
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
    settings: Settings, url: str, runs: list[tuple[str, int]], n_rounds: int, perf: PerfSettings, out: Path
) -> tuple[dict[str, list[list[Level]]], list[dict[str, int]]]:
    """Interleaved perf_analyzer rounds (order alternates each round); CSVs land in `out`."""
    binary, env = perf_analyzer_command(settings)
    rounds: dict[str, list[list[Level]]] = {label: [] for label, _ in runs}
    stabilities = []
    for n in range(1, n_rounds + 1):
        used = {}
        for label, v in runs if n % 2 else list(reversed(runs)):
            levels, used[label] = run_perf_analyzer(
                binary, env, url, MODEL_NAME, v, out / f"{label}_v{v}_round{n}.csv", perf
            )
            rounds[label].append(levels)
        stabilities.append(used)
    return rounds, stabilities


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
                {
                    f"perf_p99_us_c{level.concurrency}": level.p99_us,
                    f"perf_throughput_c{level.concurrency}": level.throughput,
                }
            )
        if verdict is not None:
            mlflow.log_metrics(
                {"perf_p99_ratio": verdict.worst_p99_ratio, "perf_throughput_ratio": verdict.worst_throughput_ratio}
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
    _check_served(settings, client, registry, [v for _, v in runs])

    with tempfile.TemporaryDirectory(prefix="mlrelease-perf-") as tmp:
        # Bootstrap has nothing to compare with: one round records the candidate's numbers.
        rounds, stabilities = measure(settings, client.url, runs, perf.rounds if baseline else 1, perf, Path(tmp))
        series = {f"{label} v{v}": median_levels(rounds[label]) for label, v in runs}
        verdict = None
        if baseline is not None:
            verdict = compare(
                rounds["challenger"],
                rounds["champion"],
                max_p99_ratio=max_p99_ratio,
                min_throughput_ratio=min_throughput_ratio,
            )
        log_evidence(registry, version, Path(tmp), series, verdict)

    result: dict[str, Any] = {
        "model_version": version,
        "champion_version": champion,
        "rounds": len(stabilities),
        "stability_percentage": stabilities,
        "levels": {name: [lv.__dict__ for lv in levels] for name, levels in series.items()},
    }
    if verdict is None:
        registry.tag_version(version, benchmark_status="passed", benchmark_reason="no champion to compare against")
        if champion is None:
            registry.client().set_registered_model_alias(MODEL_NAME, CHAMPION, str(version))
            return {**result, "status": "bootstrap: no champion yet; this version becomes champion"}
        return {**result, "status": "this version is already champion"}
    registry.tag_version(
        version, benchmark_status="passed" if verdict.passed else "failed", benchmark_reason=verdict.reason
    )
    if not verdict.passed:
        raise GateFailed(
            f"version {version} is too slow against champion {champion} ({perf.rounds} paired rounds): {verdict.reason}"
        )
    return {
        **result,
        "status": "passed",
        "verdict": verdict.reason,
        "p99_ratio": verdict.worst_p99_ratio,
        "throughput_ratio": verdict.worst_throughput_ratio,
        "pairs": verdict.pairs,
        "false_fail_rate": verdict.false_fail_rate,
    }

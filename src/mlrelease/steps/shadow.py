"""Step `shadow`: replay the interval's orders through candidate and stable on Triton before any real traffic.

The same rows go to both versions, so every difference is the model's: the share of rows whose ETA
moves by more than `max_relative_diff`, a KS test of the two ETA distributions, and p95 latency of
single-row calls, interleaved so both versions see the same server load (with stable measured against
itself too: on a busy machine that noise, up to 1.5x, widens the latency allowance, as in `benchmark`).
Any breach fails the gate with a report (also written under the run's artifacts and tagged on the
MLflow version).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import ks_2samp

from mlrelease.errors import GateFailed, Skipped, StepError
from mlrelease.model.onnx_export import OUTPUTS
from mlrelease.registry import CHAMPION, MODEL_NAME, Registry
from mlrelease.rollout.plan import ShadowSpec, load_plan
from mlrelease.serving.endpoint import triton_url
from mlrelease.serving.perf import MAX_NOISE_ALLOWANCE
from mlrelease.serving.triton_client import TritonClient, require_ready
from mlrelease.settings import Settings
from mlrelease.storage import write_json_atomic
from mlrelease.timewindow import run_key

BATCH = 256
LATENCY_BLOCKS = 5


def replay_rows(settings: Settings, data_end: datetime, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Encoded rows of orders from the 24 h before `data_end` (a fixed sample per interval) and their cohorts."""
    from mlrelease.gateway.config import load_config
    from mlrelease.gateway.traffic import order_pool
    from mlrelease.model.features import FEATURES, encode

    pool = order_pool(settings.offline_dir, data_end, load_config().cohorts, hours=24)
    rng = np.random.default_rng(int(data_end.timestamp()))  # the same sample on every retry of this run
    picks = rng.choice(len(pool), size=min(samples, len(pool)), replace=False)
    chosen = pool.iloc[np.sort(picks)]
    return np.asarray(encode(chosen[list(FEATURES)]), dtype=np.float32), chosen["cohort"].to_numpy()


def _eta(client: TritonClient, version: int, rows: np.ndarray) -> np.ndarray:
    parts = [
        client.infer(MODEL_NAME, version, rows[i : i + BATCH], OUTPUTS)[OUTPUTS[0]] for i in range(0, len(rows), BATCH)
    ]
    return np.concatenate(parts).astype(np.float64)


def latency_ratio(client: TritonClient, versions: tuple[int, int], rows: np.ndarray, n: int) -> dict[str, Any]:
    """Candidate/stable p95 of single-row calls, and the same ratio for stable against itself (the noise).

    Three streams take turns call by call (candidate, stable, stable again; the order rotates), so they
    share the server's load; per block of calls each stream's p95 is taken, and the medians over
    LATENCY_BLOCKS blocks are reported. Stable against itself says how far two identical streams drift
    apart on this machine under this load.
    """
    candidate, stable = versions
    streams = ("candidate", "stable", "stable_again")
    target = {"candidate": candidate, "stable": stable, "stable_again": stable}
    block = max(10, n // LATENCY_BLOCKS)
    p95: dict[str, list[float]] = {name: [] for name in streams}
    for b in range(LATENCY_BLOCKS):
        seen: dict[str, list[float]] = {name: [] for name in streams}
        for i in range(block):
            k = (b * block + i) % len(rows)
            for j in range(3):
                name = streams[(i + j) % 3]
                started = time.perf_counter()
                client.infer(MODEL_NAME, target[name], rows[k : k + 1], OUTPUTS)
                seen[name].append(time.perf_counter() - started)
        for name in streams:
            p95[name].append(float(np.quantile(seen[name], 0.95)))
    ratio = np.median([c / s for c, s in zip(p95["candidate"], p95["stable"], strict=True)])
    noise = np.median([max(a / b, b / a) for a, b in zip(p95["stable_again"], p95["stable"], strict=True)])
    return {
        "p95_latency_ms": {
            str(v): round(float(np.median(p95[name])) * 1000, 3) for name, v in target.items() if name != "stable_again"
        },
        "p95_latency_ratio": round(float(ratio), 3),
        "p95_noise_ratio": round(float(noise), 3),
    }


def compare(candidate: np.ndarray, stable: np.ndarray, cohorts: np.ndarray, spec: ShadowSpec) -> dict[str, Any]:
    """Disagreement share (overall and per cohort) and the KS test of candidate vs stable ETAs."""
    relative = np.abs(candidate - stable) / np.maximum(np.abs(stable), 1.0)
    disagrees = ~np.isfinite(candidate) | (relative > spec.max_relative_diff)
    test = ks_2samp(candidate[np.isfinite(candidate)], stable)
    return {
        "rows": len(candidate),
        "non_finite": int((~np.isfinite(candidate)).sum()),
        "disagreement_share": round(float(disagrees.mean()), 4),
        "disagreement_by_cohort": {
            str(c): round(float(disagrees[cohorts == c].mean()), 4) for c in sorted(set(cohorts.tolist()))
        },
        "median_relative_diff": round(float(np.nanmedian(relative)), 4),
        "ks_statistic": round(float(test.statistic), 4),
        "ks_pvalue": float(test.pvalue),
    }


def breaches(report: dict[str, Any], spec: ShadowSpec) -> list[str]:
    """Why the shadow gate fails (empty when it passes)."""
    found = []
    if report["non_finite"]:
        found.append(f"{report['non_finite']} non-finite predictions")
    if report["disagreement_share"] > spec.max_disagreement_share:
        found.append(
            f"{report['disagreement_share']:.1%} of rows differ by more than {spec.max_relative_diff:.0%} "
            f"(max {spec.max_disagreement_share:.0%}; by cohort {report['disagreement_by_cohort']})"
        )
    if report["ks_pvalue"] < spec.min_ks_pvalue:
        found.append(
            f"ETA distributions differ: KS {report['ks_statistic']:.3f}, p={report['ks_pvalue']:.2g} "
            f"< {spec.min_ks_pvalue}"
        )
    # Measurement noise (stable against itself) may widen the allowance, never beyond MAX_NOISE_ALLOWANCE.
    allowed = min(max(spec.max_p95_latency_ratio, report.get("p95_noise_ratio", 1.0)), MAX_NOISE_ALLOWANCE)
    if report["p95_latency_ratio"] > allowed:
        found.append(
            f"p95 latency ratio {report['p95_latency_ratio']:.2f} > {allowed:.2f} (configured "
            f"{spec.max_p95_latency_ratio}, stable against itself {report.get('p95_noise_ratio', 1.0):.2f})"
        )
    return found


def shadow(settings: Settings, version: int, data_end: datetime, *, plan_path: Path | None = None) -> dict[str, Any]:
    """Run the shadow gate for `version` against the champion; GateFailed with the numbers on a breach."""
    registry = Registry.from_settings(settings)
    champion = registry.alias_version(CHAMPION)
    if champion is None or champion == version:
        raise Skipped(f"v{version} is the champion already (first release or promoted): nothing to shadow")
    spec = load_plan(plan_path).shadow
    url = triton_url()
    require_ready(url, MODEL_NAME, [version, champion])
    rows, cohorts = replay_rows(settings, data_end, spec.samples)
    if len(rows) < 50:
        raise StepError(f"only {len(rows)} orders in the 24 h before {data_end.isoformat()}: nothing to replay")
    client = TritonClient(url)
    try:
        report = compare(_eta(client, version, rows), _eta(client, champion, rows), cohorts, spec)
        report.update(latency_ratio(client, (version, champion), rows, spec.latency_samples))
    finally:
        client.close()
    report.update(model_version=version, champion_version=champion)
    found = breaches(report, spec)
    report["status"] = "failed" if found else "passed"
    write_json_atomic(settings.artifacts_dir / run_key(data_end) / "rollout" / "shadow.json", report)
    registry.tag_version(version, shadow_status=report["status"], shadow_reason="; ".join(found)[:500] or "ok")
    if found:
        raise GateFailed(f"shadow evaluation of v{version} against v{champion} failed: {'; '.join(found)}")
    return report

"""Step `shadow`: replay the interval's orders through candidate and stable on Triton before any real traffic.

The same rows go to both versions, so every difference is the model's: the share of rows whose ETA
moves by more than `max_relative_diff`, each cohort's mean ETA shift on the very same orders (paired, with a
tolerance: a test of "the distributions differ at all" would fail any retrained model given enough rows), and
latency judged by sequential paired tests of single-row calls, interleaved so both versions see the same server
load: the geometric mean, and the tail (the share of calls slower than stable's p95).
The replayed orders' actual ETAs are known, so both versions' served answers (ETA and confidence, from
the graph Triton runs, not the native model train scored) are also judged on them: MAE, P90 error,
calibration and per-cohort low-confidence shares (`mlrelease.verdicts.served_quality`); a binary classifier's
served probabilities on log loss, AUC, calibration and per-cohort predicted positive rates, with the tolerances of
its release spec's gates (`mlrelease.verdicts.classifier_quality`), in place of the regression contracts and the
per-cohort ETA shifts. The labels are
joined on order_id after the call; they are never part of the rows sent. Any breach fails the gate with
a report (also written under the run's artifacts and tagged on the MLflow version).
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from mlrelease.errors import GateFailed, Skipped, StepError
from mlrelease.model.onnx_export import OUTPUTS
from mlrelease.registry import CHAMPION, MODEL_NAME, Registry
from mlrelease.release_spec import ClassificationGates, process_spec
from mlrelease.rollout.gates import held_by_open_rollout
from mlrelease.rollout.plan import ShadowSpec, load_plan
from mlrelease.serving.integrity import verify_version
from mlrelease.serving.local_layout import triton_url
from mlrelease.serving.triton_client import TritonClient, require_ready
from mlrelease.serving.triton_repo import model_repository
from mlrelease.serving.withdraw import withdraw_refused
from mlrelease.settings import Settings
from mlrelease.storage import write_json_atomic
from mlrelease.timewindow import run_key
from mlrelease.verdicts.classifier_quality import ClassifierContract, classifier_breaches, classifier_quality
from mlrelease.verdicts.decide import ON_INCONCLUSIVE, Verdict, decide
from mlrelease.verdicts.sequential import Band, mean_level
from mlrelease.verdicts.served_quality import QualityContract, quality_breaches, served_quality

BATCH = 256
PAIR_BLOCK = 50  # interleaved call pairs between two looks at the latency band


def replay_rows(settings: Settings, data_end: datetime, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Encoded rows of orders from the 24 h before `data_end` (a fixed sample per interval) and their cohorts."""
    rows, cohorts, _ = replay_orders(settings, data_end, samples)
    return rows, cohorts


def replay_orders(settings: Settings, data_end: datetime, samples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`replay_rows` and each order's label (the model's: an ETA in hours, or 0/1; NaN where the order has none)."""
    from mlrelease.gateway.traffic import order_pool
    from mlrelease.model.features import FEATURES, TARGET, encode
    from mlrelease.sources import read_window
    from mlrelease.timewindow import Window

    pool = order_pool(settings.offline_dir, data_end, process_spec().cohorts, hours=24)
    rng = np.random.default_rng(int(data_end.timestamp()))  # the same sample on every retry of this run
    picks = rng.choice(len(pool), size=min(samples, len(pool)), replace=False)
    chosen = pool.iloc[np.sort(picks)]
    # The pool drops the label (traffic must not send it): take it back from the orders, by order_id only.
    orders = read_window(settings.offline_dir / "orders", Window(data_end - timedelta(hours=24), data_end))
    labels = orders.drop_duplicates("order_id", keep="last").set_index("order_id")[TARGET]
    actual = chosen["order_id"].map(labels).to_numpy(dtype=np.float64)
    return np.asarray(encode(chosen[list(FEATURES)]), dtype=np.float32), chosen["cohort"].to_numpy(), actual


def _answers(client: TritonClient, version: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(prediction, score) of one version for every row, as Triton serves them (the spec's two outputs)."""
    parts = [client.infer(MODEL_NAME, version, rows[i : i + BATCH], OUTPUTS) for i in range(0, len(rows), BATCH)]
    eta, confidence = (np.concatenate([p[name] for p in parts]).astype(np.float64) for name in OUTPUTS)
    return eta, confidence


def quality_contract(spec: ShadowSpec, seed: int) -> QualityContract:
    """The served-quality contract the shadow spec declares (the low-confidence threshold is the estimator's)."""
    from mlrelease.model.estimator import LOW_CONFIDENCE  # here: the estimator module imports sklearn

    return QualityContract(
        alpha=spec.quality_alpha,
        mae_tolerance=spec.quality_mae_tolerance,
        p90_tolerance=spec.quality_p90_tolerance,
        min_confidence_ratio=spec.quality_min_confidence_ratio,
        low_confidence_tolerance=spec.quality_low_confidence_tolerance,
        low_confidence_threshold=LOW_CONFIDENCE,
        on_inconclusive=spec.quality_on_inconclusive,
        resamples=spec.quality_bootstrap,
        seed=seed,
    )


def classifier_contract(spec: ShadowSpec, gates: ClassificationGates, seed: int) -> ClassifierContract:
    """A classifier's served-quality contract: its release spec's tolerances at the shadow spec's α."""
    return ClassifierContract(
        alpha=spec.quality_alpha,
        log_loss_tolerance=gates.log_loss_tolerance,
        auc_tolerance=gates.auc_tolerance,
        max_calibration_error=gates.max_calibration_error,
        positive_rate_tolerance=gates.max_positive_rate_gap,
        on_inconclusive=spec.quality_on_inconclusive,
        resamples=spec.quality_bootstrap,
        seed=seed,
    )


def judge_quality(
    spec: ShadowSpec,
    candidate: tuple[np.ndarray, np.ndarray],
    stable: tuple[np.ndarray, np.ndarray],
    actual: np.ndarray,
    cohorts: np.ndarray,
    seed: int,
) -> dict[str, Any]:
    """The served-quality contracts of the model's task on both versions' (prediction, score) for the same orders.

    A regression model is judged on its predictions and confidences, with the per-cohort shift of its predictions
    (`eta_shift_by_cohort`); a binary classifier on its probabilities (the score), whose per-cohort positive rates
    take the shifts' place (a 0/1 decision has no ratio to shift).
    """
    gates = process_spec().gates
    if isinstance(gates, ClassificationGates):
        contract = classifier_contract(spec, gates, seed)
        return {"served_quality": classifier_quality(candidate[1], stable[1], actual, cohorts, contract)}
    return {
        "eta_shift_by_cohort": cohort_shifts(candidate[0], stable[0], cohorts, spec),
        "served_quality": served_quality(candidate, stable, actual, cohorts, quality_contract(spec, seed=seed)),
    }


def latency_verdict(
    client: TritonClient, versions: tuple[int, int], rows: np.ndarray, spec: ShadowSpec
) -> dict[str, Any]:
    """Is the candidate slower than stable by more than the tolerance? A sequential paired test of single-row calls.

    Calls go in pairs under the same server load, candidate and stable back to back (which goes first
    alternates); each pair gives the log of candidate/stable latency. An anytime-valid confidence sequence on
    the mean log ratio (the geometric-mean latency ratio) is checked after every block of pairs: fail when it
    lies above log(1 + tolerance), pass when below, otherwise more pairs, up to `latency_max_pairs`. The
    whole distribution decides, not one noisy quantile. Beside it, the tail: per pair, whether the candidate's call
    was slower than (1 + tolerance) × stable's `latency_tail_quantile` of the pairs so far, and whether stable's call
    was slower than that quantile; the CS on the mean difference of those indicators must lie within
    `latency_tail_tolerance` (a candidate fast on average but slow one call in five fails it). Pairs are added until
    both are decided.
    """
    candidate, stable = versions
    tolerance = math.log1p(spec.latency_tolerance)
    before = {v: client.inference_stats(MODEL_NAME, v) for v in versions}
    ratios: list[float] = []
    seconds: dict[int, list[float]] = {candidate: [], stable: []}
    verdict, band, tail = Verdict.CONTINUE, None, None
    while len(ratios) < spec.latency_max_pairs:
        for _ in range(PAIR_BLOCK):
            k = len(ratios) % len(rows)
            order = (candidate, stable) if len(ratios) % 2 == 0 else (stable, candidate)
            took = {}
            for version in order:
                started = time.perf_counter()
                client.infer(MODEL_NAME, version, rows[k : k + 1], OUTPUTS)
                took[version] = time.perf_counter() - started
            seconds[candidate].append(took[candidate])
            seconds[stable].append(took[stable])
            ratios.append(math.log(took[candidate] / took[stable]))
        if len(ratios) < spec.latency_min_pairs:
            continue
        band = mean_level(ratios, 0.0, alpha=spec.latency_alpha, tuned_at=spec.latency_min_pairs)
        verdict = decide(band, "higher", tolerance)
        tail = tail_band(np.array(seconds[candidate]), np.array(seconds[stable]), spec)
        tail_open = decide(tail, "higher", spec.latency_tail_tolerance) is Verdict.CONTINUE
        if verdict is not Verdict.CONTINUE and not tail_open:
            break
    if verdict is Verdict.CONTINUE:
        verdict = ON_INCONCLUSIVE[spec.latency_on_inconclusive]
    assert band is not None and tail is not None
    tail_verdict = decide(tail, "higher", spec.latency_tail_tolerance)
    if tail_verdict is Verdict.CONTINUE:
        tail_verdict = ON_INCONCLUSIVE[spec.latency_on_inconclusive]
    return {
        "server_side_us": _server_side(client, before),
        "latency_pairs": len(ratios),
        "median_latency_ms": {str(v): round(float(np.median(xs)) * 1000, 3) for v, xs in seconds.items()},
        "latency_ratio": round(math.exp(band.estimate), 4),
        "latency_ratio_band": [round(math.exp(band.lower), 4), round(math.exp(band.upper), 4)],
        "latency_tolerance": spec.latency_tolerance,
        "latency_alpha": spec.latency_alpha,
        "latency_verdict": str(verdict),
        "latency_tail_quantile": spec.latency_tail_quantile,
        "latency_tail_tolerance": spec.latency_tail_tolerance,
        "latency_tail_diff": round(tail.estimate, 5),
        "latency_tail_band": [round(tail.lower, 5), round(tail.upper, 5)],
        "latency_tail_verdict": str(tail_verdict),
    }


def tail_band(candidate_s: np.ndarray, stable_s: np.ndarray, spec: ShadowSpec) -> Band:
    """CS on the candidate's share of calls beyond the tolerated tail minus stable's share beyond its own.

    Stable's tail starts at its `latency_tail_quantile` q; the candidate's at q × (1 + `latency_tolerance`), the
    slowdown the mean test already allows. Without that scaling a uniform slowdown well inside the tolerance moved
    many calls past q when latencies are tight (a same-speed candidate measured 7 % slower here counted as a tail
    regression); with it, only calls slower than stable's tail by more than the tolerance count against it.
    """
    bound = float(np.quantile(stable_s, spec.latency_tail_quantile))
    tolerated = bound * (1.0 + spec.latency_tolerance)
    slower = (candidate_s > tolerated).astype(float) - (stable_s > bound).astype(float)
    return mean_level(slower, 0.0, alpha=spec.latency_alpha, tuned_at=spec.latency_min_pairs)


def _server_side(client: TritonClient, before: dict[int, dict[str, int]]) -> dict[str, dict[str, float]]:
    """Per version, Triton's own mean queue and compute time (µs) over the calls since `before` (evidence)."""
    found = {}
    for version, start in before.items():
        now = client.inference_stats(MODEL_NAME, version)
        calls = max(now["success"] - start["success"], 1)
        found[str(version)] = {
            "calls": now["success"] - start["success"],
            "queue_us": round((now["queue_ns"] - start["queue_ns"]) / calls / 1000, 2),
            "compute_us": round((now["compute_ns"] - start["compute_ns"]) / calls / 1000, 2),
        }
    return found


def compare(candidate: np.ndarray, stable: np.ndarray, cohorts: np.ndarray, spec: ShadowSpec) -> dict[str, Any]:
    """Disagreement share (overall and per cohort) of candidate vs stable ETAs on the same orders."""
    relative = np.abs(candidate - stable) / np.maximum(np.abs(stable), 1.0)
    disagrees = ~np.isfinite(candidate) | (relative > spec.max_relative_diff)
    return {
        "rows": len(candidate),
        "non_finite": int((~np.isfinite(candidate)).sum()),
        "disagreement_share": round(float(disagrees.mean()), 4),
        "disagreement_by_cohort": {
            str(c): round(float(disagrees[cohorts == c].mean()), 4) for c in sorted(set(cohorts.tolist()))
        },
        "median_relative_diff": round(float(np.nanmedian(relative)), 4),
    }


def cohort_shifts(candidate: np.ndarray, stable: np.ndarray, cohorts: np.ndarray, spec: ShadowSpec) -> dict[str, Any]:
    """Per cohort, the mean log ETA ratio on the very same orders with its (1 − α) band, and the verdict.

    Paired on identical rows, so the only difference is the model's: a cohort fails when the band shows its
    ETAs moved by more than `shift_tolerance` either way (a bias on one cohort that the overall numbers
    dilute); an open question does not fail the gate (the disagreement share still applies).
    """
    tolerance = math.log1p(spec.shift_tolerance)
    shifts = {}
    usable = np.isfinite(candidate) & (candidate > 0) & (stable > 0)
    for cohort in sorted(set(cohorts.tolist())):
        rows = usable & (cohorts == cohort)
        if rows.sum() < 20:
            continue
        ratios = np.log(candidate[rows] / stable[rows])
        band = mean_level(ratios, 0.0, alpha=spec.shift_alpha, tuned_at=int(rows.sum()))
        shifts[str(cohort)] = {
            "ratio": round(math.exp(band.estimate), 4),
            "band": [round(math.exp(band.lower), 4), round(math.exp(band.upper), 4)],
            "rows": int(rows.sum()),
            "verdict": str(decide(band, "either", tolerance)),
        }
    return shifts


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
    for cohort, shift in (report.get("eta_shift_by_cohort") or {}).items():
        if shift["verdict"] == Verdict.FAIL:
            low, high = shift["band"]
            found.append(
                f"{cohort} ETAs moved beyond ±{spec.shift_tolerance:.0%} on the same orders: mean ratio "
                f"{shift['ratio']:.3f} (band {low:.3f} … {high:.3f} at α={spec.shift_alpha:g}, {shift['rows']} rows)"
            )
    quality = report.get("served_quality")
    if quality is not None:
        found.extend(classifier_breaches(quality) if quality.get("task") else quality_breaches(quality))
    verdict = report.get("latency_verdict")
    if verdict in (Verdict.FAIL, Verdict.INCONCLUSIVE):
        low, high = report["latency_ratio_band"]
        shown = "slower than" if verdict == Verdict.FAIL else "not shown within"
        found.append(
            f"latency {shown} +{spec.latency_tolerance:.0%} of stable: geometric-mean ratio "
            f"{report['latency_ratio']:.3f} (band {low:.3f} … {high:.3f} at α={spec.latency_alpha:g}, "
            f"{report['latency_pairs']} interleaved pairs)"
        )
    tail = report.get("latency_tail_verdict")
    if tail in (Verdict.FAIL, Verdict.INCONCLUSIVE):
        low, high = report["latency_tail_band"]
        shown = "above" if tail == Verdict.FAIL else "not shown within"
        q = f"p{report['latency_tail_quantile'] * 100:g}"
        found.append(
            f"latency tail {shown} +{spec.latency_tail_tolerance * 100:g} pp: the share of calls slower than "
            f"{1 + spec.latency_tolerance:g}× stable's {q} differs from stable's share beyond its {q} by "
            f"{report['latency_tail_diff'] * 100:+.2f} pp (band {low * 100:+.2f} … "
            f"{high * 100:+.2f} pp, {report['latency_pairs']} interleaved pairs)"
        )
    return found


def shadow(settings: Settings, version: int, data_end: datetime, *, plan_path: Path | None = None) -> dict[str, Any]:
    """Run the shadow gate for `version` against the champion; GateFailed with the numbers on a breach."""
    registry = Registry.from_settings(settings)
    champion = registry.alias_version(CHAMPION)
    if champion is None or champion == version:
        raise Skipped(f"v{version} is the champion already (first release or promoted): nothing to shadow")
    held = held_by_open_rollout(settings, version, "shadow")
    if held is not None:
        return held
    plan = load_plan(plan_path)
    plan.check_task(process_spec().task)  # a plan that judges this model by another task's metrics: refused here
    spec = plan.shadow
    # The answers judged must come from the exported, checked files; a candidate whose file is not leaves the policy.
    try:
        verify_version(model_repository(settings), version, registry=registry)
    except GateFailed as refused:
        raise withdraw_refused(settings, version, refused) from None
    verify_version(model_repository(settings), champion, registry=registry)
    url = triton_url()
    require_ready(url, MODEL_NAME, [version, champion])
    rows, cohorts, actual = replay_orders(settings, data_end, spec.samples)
    if len(rows) < 50:
        raise StepError(f"only {len(rows)} orders in the 24 h before {data_end.isoformat()}: nothing to replay")
    client = TritonClient(url)
    try:
        candidate, stable = _answers(client, version, rows), _answers(client, champion, rows)
        report = compare(candidate[0], stable[0], cohorts, spec)
        report.update(judge_quality(spec, candidate, stable, actual, cohorts, seed=int(data_end.timestamp())))
        report.update(latency_verdict(client, (version, champion), rows, spec))
    finally:
        client.close()
    report.update(model_version=version, champion_version=champion)
    found = breaches(report, spec)
    report["status"] = "failed" if found else "passed"
    write_json_atomic(settings.artifacts_dir / run_key(data_end) / "rollout" / "shadow.json", report)
    registry.tag_version(version, shadow_status=report["status"], shadow_reason="; ".join(found)[:500] or "ok")
    if found:
        failed = GateFailed(f"shadow evaluation of v{version} against v{champion} failed: {'; '.join(found)}")
        raise withdraw_refused(settings, version, failed)
    return report

"""Step `train`: fit a candidate on point-in-time features, compare it with the champion, register it as challenger."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from mlrelease.errors import GateFailed, StepError
from mlrelease.gitinfo import git_commit
from mlrelease.model.entrypoint import fit_candidate, model_params
from mlrelease.model.evaluate import prefixed
from mlrelease.model.features import FEATURE_SERVICE, FEATURES, TARGET, encode
from mlrelease.model.gate import judge
from mlrelease.model.tracking import log_native_model, log_training_window
from mlrelease.model.training_data import (
    historical_frame,
    orders_source,
    time_split,
    training_window,
    window_partitions,
)
from mlrelease.registry import CHALLENGER, CHAMPION, MODEL_NAME, Registry
from mlrelease.release_spec import process_spec
from mlrelease.settings import Settings
from mlrelease.timewindow import Window, run_key

MIN_TRAINING_ROWS = 500
PARITY_SAMPLE_ROWS = 256


def _already_trained(registry: Registry, key: str) -> int | None:
    """The version an earlier successful attempt of this run registered, if any (reruns are no-ops)."""
    versions = registry.versions_tagged("data_interval_end", key)
    return versions[-1] if versions else None


def _data_quality_summary(settings: Settings, key: str) -> dict[str, Any] | None:
    path = settings.artifacts_dir / key / "data_quality" / "validation.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text(encoding="utf-8"))
    return {
        "success": summary["success"],
        "failures": summary["failures"],
        "rows": {t: v["rows"] for t, v in summary["tables"].items()},
    }


def train(
    settings: Settings,
    window: Window,
    *,
    training_days: int = 7,
    holdout_share: float | None = None,
    mae_tolerance: float = 0.05,
    min_confidence_ratio: float | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Train, evaluate, and register the candidate as `challenger`; refuse (fail) with numbers when it is worse.

    The model's code and gate thresholds come from its release spec (`training`, `gates`); `holdout_share` and
    `min_confidence_ratio` given here override the spec's.
    """
    import mlflow

    spec = process_spec()
    holdout_share = spec.training.holdout_share if holdout_share is None else holdout_share
    gates = spec.gates
    if min_confidence_ratio is not None:  # an override of the spec's (tests, a by-hand retrain)
        gates = gates.model_copy(update={"min_confidence_ratio": min_confidence_ratio})
    spec.training_function()  # a spec naming code that is not there fails before any data is read

    began = time.perf_counter()
    key = run_key(window.end)
    registry = Registry.from_settings(settings)
    existing = _already_trained(registry, key)
    if existing is not None:
        registry.set_alias(CHALLENGER, existing)
        return {"model_version": existing, "status": "already trained for this data interval", "run_key": key}

    train_window = training_window(window, training_days)
    frame = historical_frame(settings, train_window)
    if len(frame) < MIN_TRAINING_ROWS:
        raise StepError(
            f"only {len(frame)} labelled orders in [{train_window.start}, {train_window.end}); "
            f"need at least {MIN_TRAINING_ROWS}"
        )
    fit_part, holdout = time_split(frame, holdout_share)
    X_fit, y_fit = encode(fit_part), fit_part[TARGET].to_numpy()
    X_hold, y_hold = encode(holdout), holdout[TARGET].to_numpy()

    model = fit_candidate(spec, X_fit, y_fit, seed=seed)
    champion_version = registry.alias_version(CHAMPION)
    champion = registry.load_native(champion_version) if champion_version is not None else None
    judged = judge(spec, gates, model, champion, X_hold, y_hold, mae_tolerance=mae_tolerance)
    metrics, champion_metrics, decision = judged.metrics, judged.champion_metrics, judged.decision

    registry.client()
    with mlflow.start_run(experiment_id=registry.experiment_id(), run_name=f"train-{key}") as run:
        mlflow.log_params(
            {
                **model_params(model),
                "training_entrypoint": spec.training.entrypoint,
                **{f"gate_{name}": value for name, value in gates.model_dump().items()},  # what it was judged by
                "training_start": train_window.start.isoformat(),
                "training_end": train_window.end.isoformat(),
                "feature_service": FEATURE_SERVICE,
                "features": ",".join(FEATURES),
                "rows_fit": len(fit_part),
                "rows_holdout": len(holdout),
                "mae_tolerance": mae_tolerance,
                "champion_version": champion_version,
            }
        )
        mlflow.log_metrics({**metrics, **prefixed(champion_metrics or {}, "champion_")})
        mlflow.set_tags(
            {
                "git_commit": git_commit(),
                "data_interval_end": key,
                "decision_reason": decision.reason,
                "decision": "accepted" if decision.accepted else "rejected",
            }
        )
        # The window the model learnt from, as a dataset input (a refused candidate's run keeps it too).
        log_training_window(frame, train_window, orders_source(settings), window_partitions(settings, train_window))
        quality = _data_quality_summary(settings, key)
        if quality is not None:
            mlflow.log_dict(quality, "data_quality/summary.json")
        if not decision.accepted:
            raise GateFailed(f"candidate refused: {decision.reason}")
        with tempfile.TemporaryDirectory() as tmp:
            np.save(Path(tmp) / "parity_sample.npy", X_hold[:PARITY_SAMPLE_ROWS])
            mlflow.log_artifact(str(Path(tmp) / "parity_sample.npy"))
        info = log_native_model(model, X_fit)  # with a signature and a small input example

    version = mlflow.register_model(
        info.model_uri,
        MODEL_NAME,
        tags={
            "data_interval_end": key,
            "run_id": run.info.run_id,
            "git_commit": git_commit(),
        },
    )
    registry.set_alias(CHALLENGER, int(version.version))
    return {
        "model_version": int(version.version),
        "status": "registered as challenger",
        "run_id": run.info.run_id,
        "run_key": key,
        "metrics": metrics,
        "champion_version": champion_version,
        "champion_metrics": champion_metrics,
        "decision": decision.reason,
        "duration_s": round(time.perf_counter() - began, 3),
    }

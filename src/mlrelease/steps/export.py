"""Step `export`: ONNX export with checker, shape inference and parity, published as an immutable Triton version.

Every graph this step publishes or reuses passes the ONNX checker (full check), strict shape inference and
the serving contract (inputs and outputs exactly as config.pbtxt declares them). A rerun first verifies the
published model.onnx against its record (serving.integrity) and checks those very bytes again, so the parity
outputs that validate-serving compares with are only ever derived from verified bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mlrelease.errors import GateFailed, StepError
from mlrelease.gitinfo import git_commit
from mlrelease.model.features import FEATURES
from mlrelease.model.onnx_export import INPUT, OUTPUTS, parity, run_onnx, to_onnx
from mlrelease.model.tracking import ONNX_MODEL_ID_TAG, ONNX_MODEL_URI_TAG, find_onnx_model, log_onnx_model
from mlrelease.registry import CHAMPION, MODEL_NAME, Registry
from mlrelease.serving.integrity import REGISTRY_TAG, graph_problems, one_line, verified_bytes
from mlrelease.serving.triton_repo import (
    ServingConfig,
    build_config,
    model_repository,
    parity_file,
    read_metadata,
    served_versions,
    version_dir,
    write_config,
    write_version,
)
from mlrelease.settings import Settings
from mlrelease.storage import write_npz_atomic

DEFAULT_PARITY_TOLERANCE = 1e-3
# `make run CANDIDATE_FAULT=…` sets this for tonight's run only: the candidate is exported with a drill fault
# (after every export check passed on the good graph), tagged `drill_fault`, to show a gate stopping it.
DRILL_ENV = "MLRELEASE_DRILL_CANDIDATE_FAULT"


def _contract(version: int) -> Any:
    """The config the graph must fit: its inputs and outputs are what the written config.pbtxt declares."""
    return build_config(MODEL_NAME, len(FEATURES), OUTPUTS, [version], ServingConfig())


def _check_graph(registry: Registry, version: int, model_bytes: bytes) -> None:
    """Checker, strict shape inference and the serving contract on these bytes; a failure tags and raises GateFailed."""
    problems = graph_problems(model_bytes, _contract(version))
    if problems:
        reason = "; ".join(problems)
        registry.tag_version(version, export_status="failed", export_reason=reason[:500])
        raise GateFailed(f"ONNX graph of version {version} cannot be served: {reason}")


def _outputs(registry: Registry, version: int, model_bytes: bytes, sample: np.ndarray) -> tuple[Any, Any]:
    """(prediction, score) of the graph on the sample; an onnxruntime refusal tags the version and is one GateFailed."""
    try:
        return run_onnx(model_bytes, sample)
    except Exception as exc:  # onnxruntime's Fail/InvalidGraph/RuntimeException: a verdict about the graph
        registry.tag_version(version, export_status="failed", export_reason=one_line(exc)[:500])
        raise GateFailed(f"onnxruntime cannot run the ONNX graph of version {version}: {one_line(exc)}") from None


def _convert_and_check(
    registry: Registry, model: Any, version: int, sample: np.ndarray, tolerance: float
) -> tuple[bytes, float]:
    """ONNX bytes that passed the checker, the serving contract, the NaN check and parity; failures tag and raise."""
    try:
        model_bytes = to_onnx(model)
    except Exception as exc:  # checker / shape inference / converter errors
        registry.tag_version(version, export_status="failed", export_reason=one_line(exc)[:500])
        raise GateFailed(f"ONNX export of version {version} failed: {one_line(exc)}") from None
    _check_graph(registry, version, model_bytes)
    prediction, score = _outputs(registry, version, model_bytes, sample)
    if not (np.isfinite(prediction).all() and np.isfinite(score).all()):
        registry.tag_version(version, export_status="failed", export_reason="non-finite outputs")
        bad = int((~np.isfinite(prediction) | ~np.isfinite(score)).sum())
        raise GateFailed(f"version {version} emits NaN/inf on {bad} of {len(prediction)} sample rows")
    check = parity(model, model_bytes, sample)
    if not check.ok(tolerance):
        registry.tag_version(version, export_status="failed", export_reason="parity")
        raise GateFailed(
            f"ONNX/native parity failed for version {version}: max |diff| {check.describe()} > {tolerance:.0e}"
        )
    return model_bytes, check.worst()


def _published_bytes(root: Path, registry: Registry, version: int) -> bytes:
    """The published model.onnx, verified against its record and checked again; GateFailed (tagged) otherwise."""
    try:
        model_bytes = verified_bytes(root, version, registry=registry)
    except GateFailed as exc:
        registry.tag_version(version, export_status="failed", export_reason=str(exc)[:500])
        raise
    _check_graph(registry, version, model_bytes)  # the bytes may predate today's checks
    return model_bytes


def _drill_hook() -> Callable[[bytes, str], bytes]:
    """`mlrelease_drills.faults.drill_candidate`, imported only for a drill: the product never needs the package."""
    try:
        from mlrelease_drills.faults import drill_candidate
    except ModuleNotFoundError as exc:
        if exc.name not in ("mlrelease_drills", "mlrelease_drills.faults"):
            raise  # the drills package is there but something it needs is not: its own error says what
        raise StepError(
            f"{DRILL_ENV} is set, but the drills package mlrelease_drills (src/mlrelease_drills, shipped with the "
            "repository's distribution) is not installed here: install it to run a drill, or unset the variable"
        ) from None
    return drill_candidate


def _drill(registry: Registry, version: int, model_bytes: bytes) -> bytes:
    """The drill fault of DRILL_ENV injected into a candidate (never into a first champion); else unchanged."""
    drill = os.environ.get(DRILL_ENV, "").strip()
    if not drill or registry.alias_version(CHAMPION) in (None, version):
        return model_bytes
    drill_candidate = _drill_hook()
    try:
        faulty = drill_candidate(model_bytes, drill)
    except ValueError as exc:
        raise StepError(f"{DRILL_ENV}: {exc}") from None
    registry.tag_version(version, drill_fault=drill)
    return faulty


def _onnx_model(registry: Registry, version: int, run_id: str, model_bytes: bytes, digest: str, sample: Any) -> Any:
    """The version's served bytes as an mlflow.onnx model of its training run: logged once, found again on a rerun.

    A model version has one source model (the sklearn one train registered); this second logged model of the
    same run is tied to the version by its tags (`onnx_model_id`, `onnx_model_uri`) and carries the version and
    the bytes' SHA-256 as its own tags.
    """
    import mlflow

    client = registry.client()
    found = find_onnx_model(client, client.get_run(run_id).info.experiment_id, run_id, digest)
    if found is not None:
        return found
    with mlflow.start_run(run_id=run_id):
        return log_onnx_model(client, model_bytes, sample, version=version)


def export(settings: Settings, version: int, *, tolerance: float = DEFAULT_PARITY_TOLERANCE) -> dict[str, Any]:
    """Export registered `version`; a rerun never rewrites a published version but completes what a failed try left.

    Publishing the version directory is the commit point; everything after it (config, parity file,
    MLflow evidence, tags) is idempotent and is redone on every run, so a retry repairs a partial export.
    """
    import mlflow

    root = model_repository(settings)
    registry = Registry.from_settings(settings)
    tags = registry.version_tags(version)  # fails clearly for an unknown version
    run_id = registry.run_id(version)
    sample = np.load(
        mlflow.artifacts.download_artifacts(
            run_id=run_id, artifact_path="parity_sample.npy", tracking_uri=registry.tracking_uri
        )
    )
    target = version_dir(root, MODEL_NAME, version)
    if target.exists():
        meta = read_metadata(root, MODEL_NAME, version)
        if meta.get("mlflow_run_id") != run_id:
            raise StepError(
                f"{target} holds a model from MLflow run {meta.get('mlflow_run_id')}, but version {version} is run "
                f"{run_id}: the repository and the registry disagree; move the old directory away first"
            )
        model_bytes, created = _published_bytes(root, registry, version), False
    else:
        if REGISTRY_TAG in tags:
            # A digest recorded for a directory that no longer exists (a reset repository): this export's bytes
            # supersede it, and a stale tag would refuse them on every later step.
            registry.untag_version(version, REGISTRY_TAG)
        model_bytes, parity_diff = _convert_and_check(
            registry, registry.load_native(version), version, sample, tolerance
        )
        model_bytes = _drill(registry, version, model_bytes)
        metadata = {
            "parity_max_abs_diff": parity_diff,
            "model": MODEL_NAME,
            "mlflow_run_id": run_id,
            "git_commit": git_commit(),
            "input_schema": {"name": INPUT, "datatype": "FP32", "columns": list(FEATURES)},
            "outputs": list(OUTPUTS),
        }
        created = write_version(root, MODEL_NAME, version, model_bytes, metadata)
        # What is on disk now, read back and verified: another writer may have published first (created False).
        model_bytes = verified_bytes(root, version) if created else _published_bytes(root, registry, version)

    served = _outputs(registry, version, model_bytes, sample)  # parity data from the verified bytes only
    config = build_config(MODEL_NAME, len(FEATURES), OUTPUTS, served_versions(root, registry, version), ServingConfig())
    config_path = write_config(root, config)
    write_npz_atomic(parity_file(settings, version), features=sample, **dict(zip(OUTPUTS, served, strict=True)))
    meta = read_metadata(root, MODEL_NAME, version)
    # The verified bytes (their digest is the record's) with the mlflow.onnx flavor, and the Triton config as written.
    onnx_model = _onnx_model(registry, version, run_id, model_bytes, meta["sha256"], sample)
    with mlflow.start_run(run_id=run_id):
        mlflow.log_artifact(str(config_path), "triton")
    registry.tag_version(version, **{ONNX_MODEL_ID_TAG: onnx_model.model_id, ONNX_MODEL_URI_TAG: onnx_model.model_uri})
    registry.tag_version(version, export_status="exported", onnx_sha256=meta["sha256"])  # last: export is complete
    return {
        "model_version": version,
        "status": "exported" if created else "already exported; version files unchanged",
        "path": str(target),
        "sha256": meta["sha256"],
        "served_versions": list(config.version_policy.specific.versions),
        "parity_max_abs_diff": meta.get("parity_max_abs_diff"),
        "onnx_model_uri": onnx_model.model_uri,
    }

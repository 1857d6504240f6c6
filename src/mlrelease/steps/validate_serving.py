"""Step `validate-serving`: load the version into a real Triton, check its config and its answers against parity.

Before anything is loaded, the version's model.onnx is verified against the export's record (integrity);
at load, Triton refuses a graph whose outputs are not the config's (the CPU model.py checks both again);
after load, one real inference must return every declared output with the declared shape and type before
any answer is compared. Each refusal takes the version out of service (exit 3).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from mlrelease.errors import GateFailed, StepError
from mlrelease.model.features import FEATURES
from mlrelease.model.onnx_export import OUTPUTS
from mlrelease.registry import CHAMPION, MODEL_NAME, Registry
from mlrelease.rollout.gates import held_by_open_rollout
from mlrelease.serving.endpoint import publish_to_local_server
from mlrelease.serving.integrity import verify_version
from mlrelease.serving.local_layout import triton_url
from mlrelease.serving.triton_client import TritonClient, TritonUnreachable, one_line_reason
from mlrelease.serving.triton_repo import (
    model_repository,
    parity_file,
    served_versions,
    set_version_policy,
    versions_present,
)
from mlrelease.serving.withdraw import take_out_of_service
from mlrelease.settings import Settings

log = logging.getLogger(__name__)

SERVING_TOLERANCE = 1e-4
# numpy dtypes of the Triton types an answer may carry; anything else is named as it is.
_NUMPY_TYPES = {"TYPE_FP32": np.float32, "TYPE_FP64": np.float64, "TYPE_FP16": np.float16, "TYPE_INT64": np.int64}


def config_mismatches(reported: dict[str, Any], expected_versions: list[int]) -> list[str]:
    """Differences between the config Triton reports and the contract we wrote (types, dims, batching, versions)."""
    problems = []
    inputs = [(i["name"], i["data_type"], [int(d) for d in i["dims"]]) for i in reported.get("input", [])]
    if inputs != [("features", "TYPE_FP32", [len(FEATURES)])]:
        problems.append(f"inputs {inputs} are not [features TYPE_FP32 [{len(FEATURES)}]]")
    outputs = sorted((o["name"], o["data_type"], [int(d) for d in o["dims"]]) for o in reported.get("output", []))
    if outputs != sorted((name, "TYPE_FP32", [1]) for name in OUTPUTS):
        problems.append(f"outputs {outputs} are not {sorted(OUTPUTS)} TYPE_FP32 [1]")
    if int(reported.get("max_batch_size", 0)) <= 0:
        problems.append("max_batch_size is not set: dynamic batching would be off")
    versions = sorted(int(v) for v in reported.get("version_policy", {}).get("specific", {}).get("versions", []))
    if versions != sorted(expected_versions):
        problems.append(f"version policy serves {versions}, expected {sorted(expected_versions)}")
    return problems


def _take_out_of_service(
    settings: Settings, client: TritonClient, root: Path, registry: Registry, version: int, reason: str
) -> GateFailed:
    """Take a failed version out of service, keep the others loaded, tag it; returns the error to raise.

    The refusal is the step's verdict even when Triton drops the reload of the remaining versions (a stub that
    crashed on the broken file can take the connection with it): the policy no longer lists the version by then,
    and the supervisor's reconcile loads the rest (as serving/withdraw.withdraw_refused does for the later gates).
    """
    try:
        take_out_of_service(settings, client, root, version)
    except StepError as exc:
        log.error("v%s left the policy, but reloading the rest failed: %s", version, exc)
    finally:
        registry.tag_version(version, validation_status="failed", validation_reason=reason[:500])
    return GateFailed(f"version {version} failed serving validation: {reason}")


def _serve(settings: Settings, root: Path, registry: Registry, version: int) -> list[int]:
    """Make the repository's version policy champion + `version` (idempotent, so a retry starts clean)."""
    versions = served_versions(root, registry, version)
    set_version_policy(root, MODEL_NAME, versions)
    publish_to_local_server(settings, root, registry=registry)  # verifies every version it is about to serve
    return versions


def output_problems(answers: dict[str, np.ndarray], n_rows: int, reported: dict[str, Any]) -> list[str]:
    """How one inference's answers differ from the reported config: each output present, (n_rows, *dims), typed."""
    problems = []
    for declared in reported.get("output", []):
        name, dims = declared["name"], [int(d) for d in declared.get("dims", [])]
        want_shape = (n_rows, *dims)
        want_type = _NUMPY_TYPES.get(declared.get("data_type", ""))
        if name not in answers:
            problems.append(f"output {name} is missing from the answer")
            continue
        got = answers[name]
        shape_ok = got.shape[:1] == (n_rows,) and len(got.shape) == len(want_shape)
        shape_ok = shape_ok and all(d in (-1, g) for d, g in zip(dims, got.shape[1:], strict=True))
        if not shape_ok or (want_type is not None and got.dtype != want_type):
            problems.append(
                f"output {name} has shape {list(got.shape)} {got.dtype} for {n_rows} rows, "
                f"the config declares {list(want_shape)} {declared.get('data_type')}"
            )
    return problems


def _verdict(client: TritonClient, version: int, expected: Any, versions: list[int]) -> tuple[str | None, dict]:
    """Why the loaded version is not fit to serve (None when it is), and the max |diff| per output."""
    reported = client.model_config(MODEL_NAME, version)
    problems = config_mismatches(reported, versions)
    if problems:
        return "; ".join(problems), {}
    features = expected["features"]
    answers = client.infer_tensors(MODEL_NAME, version, features, OUTPUTS)
    # Shapes and types first: a [N, 2] answer would otherwise end in a numpy broadcast error (exit 2, the
    # version left loaded) instead of a verdict that takes the version out of service.
    problems = output_problems(answers, len(features), reported)
    if problems:
        return "; ".join(problems), {}
    flat = {name: answers[name].reshape(-1) for name in OUTPUTS}
    nonfinite = {name: int((~np.isfinite(flat[name])).sum()) for name in OUTPUTS}
    if any(nonfinite.values()):
        return f"non-finite outputs {nonfinite}", {}
    diffs = {name: float(np.max(np.abs(flat[name] - expected[name]))) for name in OUTPUTS}
    if max(diffs.values()) > SERVING_TOLERANCE:
        return f"served outputs differ from the export by {diffs}", diffs
    return None, diffs


def _parity_outputs(settings: Settings, version: int) -> Any:
    """The export's parity sample and its expected outputs; StepError when missing or not one value per row."""
    expected_file = parity_file(settings, version)
    if not expected_file.is_file():
        raise StepError(f"no parity outputs for version {version} at {expected_file}: rerun the export step")
    expected = np.load(expected_file)
    rows = len(expected["features"])
    shapes = {name: expected[name].shape for name in OUTPUTS if name in expected.files}
    if any(shape != (rows,) for shape in shapes.values()) or len(shapes) != len(OUTPUTS):
        # Not a verdict about the served model: the export's own record is bad, and rerunning export rebuilds it.
        raise StepError(f"parity file {expected_file} holds {shapes} for {rows} rows: rerun the export step")
    return expected


def validate_serving(settings: Settings, version: int, *, revalidate: bool = False) -> dict[str, Any]:
    """Load `version` (with the champion) into Triton, wait ready, compare config and outputs with the export.

    Only a verdict about the model (refused load, wrong config, wrong answers) takes it out of service;
    an unreachable Triton fails the step without touching anything, so a retry can succeed.
    """
    held = held_by_open_rollout(settings, version, "validate-serving")
    if held is not None:
        return held
    root = model_repository(settings)
    registry = Registry.from_settings(settings)
    tags = registry.version_tags(version)
    if tags.get("validation_status") == "failed" and not revalidate:
        # A retry or a cleared task must not load a retired version back next to the champion.
        raise GateFailed(
            f"version {version} already failed serving validation ({tags.get('validation_reason', 'no reason')}); "
            "pass --revalidate to load it again"
        )
    if version not in versions_present(root, MODEL_NAME):
        raise StepError(f"version {version} is not in the model repository {root}: run the export step first")
    expected = _parity_outputs(settings, version)
    client = TritonClient(triton_url())
    client.ensure_live()
    try:
        # Before anything loads it: the bytes Triton would read must be the bytes export checked.
        verify_version(root, version, registry=registry)
    except GateFailed as exc:
        raise _take_out_of_service(settings, client, root, registry, version, str(exc)) from None
    versions = _serve(settings, root, registry, version)
    try:
        client.load(MODEL_NAME)
        client.wait_ready(MODEL_NAME, version)
        reason, diffs = _verdict(client, version, expected, versions)
    except TritonUnreachable:
        raise
    except StepError as exc:  # Triton answered: it refused the load, or the version never became ready
        reason, diffs = one_line_reason(str(exc)), {}
    if reason is not None:
        raise _take_out_of_service(settings, client, root, registry, version, reason)
    registry.tag_version(version, validation_status="passed")
    return {
        "model_version": version,
        "status": "serving validated",
        "triton": client.url,
        "rows_compared": len(expected["features"]),
        "max_abs_diff": diffs,
        "loaded_versions": versions,
        "champion_version": registry.alias_version(CHAMPION),
    }

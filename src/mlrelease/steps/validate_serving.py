"""Step `validate-serving`: load the version into a real Triton, check its config and its answers against parity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mlrelease.errors import StepError
from mlrelease.model.features import FEATURES
from mlrelease.model.onnx_export import OUTPUTS
from mlrelease.registry import CHAMPION, MODEL_NAME, Registry
from mlrelease.serving.endpoint import publish_to_local_server, triton_url
from mlrelease.serving.triton_client import TritonClient
from mlrelease.serving.triton_repo import parse_pbtxt, versions_present, write_config
from mlrelease.settings import Settings
from mlrelease.steps.export import model_repository, parity_file

SERVING_TOLERANCE = 1e-4


def config_mismatches(reported: dict[str, Any], version_count_expected: int) -> list[str]:
    """Differences between the config Triton reports and the contract we wrote (inputs, outputs, batching)."""
    problems = []
    inputs = {i["name"]: i for i in reported.get("input", [])}
    if list(inputs) != ["features"] or [int(d) for d in inputs["features"]["dims"]] != [len(FEATURES)]:
        problems.append(f"input {reported.get('input')} is not features FP32 [{len(FEATURES)}]")
    outputs = {o["name"]: o for o in reported.get("output", [])}
    if sorted(outputs) != sorted(OUTPUTS):
        problems.append(f"outputs {sorted(outputs)} are not {sorted(OUTPUTS)}")
    if int(reported.get("max_batch_size", 0)) <= 0:
        problems.append("max_batch_size is not set: dynamic batching would be off")
    versions = reported.get("version_policy", {}).get("specific", {}).get("versions", [])
    if len(versions) != version_count_expected:
        problems.append(f"version policy serves {versions}")
    return problems


def _fall_back(
    settings: Settings, client: TritonClient, root: Path, registry: Registry, version: int, reason: str
) -> StepError:
    """Take a failed version out of service, keep the others loaded, tag it; returns the error to raise.

    The repository's version policy is the record of what should be served, so the failed version is
    removed there first and Triton reloads from it.
    """
    config = parse_pbtxt((root / MODEL_NAME / "config.pbtxt").read_text(encoding="utf-8"))
    keep = [v for v in config.version_policy.specific.versions if v != version]
    try:
        if keep:
            del config.version_policy.specific.versions[:]
            config.version_policy.specific.versions.extend(keep)
            write_config(root, config)
            publish_to_local_server(settings, root)
            client.load(MODEL_NAME)
        else:
            client.unload(MODEL_NAME)
    finally:
        registry.tag_version(version, validation_status="failed", validation_reason=reason[:500])
    return StepError(f"version {version} failed serving validation: {reason}")


def validate_serving(settings: Settings, version: int) -> dict[str, Any]:
    """Load `version` (with the champion) into Triton, wait ready, compare config and outputs with the export."""
    root = model_repository(settings)
    registry = Registry.from_settings(settings)
    if version not in versions_present(root, MODEL_NAME):
        raise StepError(f"version {version} is not in the model repository {root}: run the export step first")
    expected_file = parity_file(settings, version)
    if not expected_file.is_file():
        raise StepError(f"no parity outputs for version {version} at {expected_file}: rerun the export step")
    expected = np.load(expected_file)
    client = TritonClient(triton_url())
    client.ensure_live()
    publish_to_local_server(settings, root)
    served = parse_pbtxt((root / MODEL_NAME / "config.pbtxt").read_text(encoding="utf-8"))
    try:
        client.load(MODEL_NAME)
        client.wait_ready(MODEL_NAME, version)
    except StepError as exc:
        raise _fall_back(settings, client, root, registry, version, str(exc)) from None

    problems = config_mismatches(client.model_config(MODEL_NAME, version), len(served.version_policy.specific.versions))
    if problems:
        raise _fall_back(settings, client, root, registry, version, "; ".join(problems))
    try:
        answers = client.infer(MODEL_NAME, version, expected["features"], OUTPUTS)
    except StepError as exc:
        raise _fall_back(settings, client, root, registry, version, str(exc)) from None
    diffs = {name: float(np.max(np.abs(answers[name] - expected[name]))) for name in OUTPUTS}
    nonfinite = {name: int((~np.isfinite(answers[name])).sum()) for name in OUTPUTS}
    if any(nonfinite.values()):
        raise _fall_back(settings, client, root, registry, version, f"non-finite outputs {nonfinite}")
    if max(diffs.values()) > SERVING_TOLERANCE:
        raise _fall_back(settings, client, root, registry, version, f"served outputs differ from the export by {diffs}")
    registry.tag_version(version, validation_status="passed")
    champion = registry.alias_version(CHAMPION)
    return {
        "model_version": version,
        "status": "serving validated",
        "triton": client.url,
        "rows_compared": len(expected["features"]),
        "max_abs_diff": diffs,
        "loaded_versions": list(served.version_policy.specific.versions),
        "champion_version": champion,
    }

"""Declared serving state: the model repository's version policy is what Triton must have loaded.

Every step that changes what is served writes the policy first (config.pbtxt), so after a Triton restart
the policy still says what to serve. `reconcile` brings a Triton back to it (verified files only); the
local `mlrelease triton up` runs it after every start, the Kubernetes Deployment does the same with
`--load-model`, and routing calls `ensure_ready` so a rollback reaches stable even right after a restart.
One Triton serves every model of the repository: `reconcile_all` reconciles each on its own, so a refused version
of one model never touches another model's versions.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from mlrelease.errors import StepError
from mlrelease.registry import MODEL_NAME
from mlrelease.serving.endpoint import load_only
from mlrelease.serving.integrity import verify_each
from mlrelease.serving.triton_client import TritonClient, TritonUnreachable, one_line_reason
from mlrelease.serving.triton_repo import CONFIG_FILE, model_repository, read_config
from mlrelease.settings import Settings

RELOAD_TIMEOUT_S = 60.0  # a CPU python-backend version loads in a few seconds; a GPU one may take longer


def declared_versions(settings: Settings, model: str = MODEL_NAME) -> list[int]:
    """The versions the production repository's policy serves (empty when the model is disabled or absent)."""
    root = model_repository(settings)
    if not (root / model / CONFIG_FILE).is_file():
        return []
    return sorted(int(v) for v in read_config(root, model).version_policy.specific.versions)


def repository_models(settings: Settings) -> list[str]:
    """The models the production repository holds a config for (whatever released them), sorted by name."""
    root = model_repository(settings)
    return sorted(p.parent.name for p in root.glob(f"*/{CONFIG_FILE}")) if root.is_dir() else []


def reconcile_all(settings: Settings, url: str, *, timeout_s: float = RELOAD_TIMEOUT_S) -> dict[str, dict[str, Any]]:
    """`reconcile` for every model of the repository, by model name (empty when the repository holds none)."""
    return {model: reconcile(settings, url, timeout_s=timeout_s, model=model) for model in repository_models(settings)}


def reconcile(
    settings: Settings, url: str, *, timeout_s: float = RELOAD_TIMEOUT_S, model: str = MODEL_NAME
) -> dict[str, Any]:
    """Load the declared versions that Triton at `url` does not have ready, one version at a time; what happened.

    Each declared version is verified on its own: one whose file is not the one export recorded, or that Triton
    refuses (or that never gets ready), is `refused` with a one-line reason, and every other version is still
    loaded, so one bad file never takes the champion down with it. `serving` is what Triton has ready afterwards.
    """
    declared = declared_versions(settings, model)
    if not declared:
        return {"declared": [], "serving": [], "reloaded": [], "refused": {}, "status": "nothing declared"}
    root = model_repository(settings)
    _, refused = verify_each(root, declared, model=model)
    verified = [v for v in declared if v not in refused]
    client = TritonClient(url, timeout=10)
    began = time.monotonic()
    try:
        missing = [v for v in verified if not client.version_ready(model, v)]
        if missing:
            refused.update(_load(settings, client, root, model, verified, missing, timeout_s))
        serving = [v for v in declared if v not in refused and client.version_ready(model, v)]
    finally:
        client.close()
    reloaded = [v for v in missing if v in serving]
    status = "refused some" if refused else "reloaded" if reloaded else "in sync"
    result: dict[str, Any] = {
        "declared": declared,
        "serving": serving,
        "reloaded": reloaded,
        "refused": {str(v): reason for v, reason in sorted(refused.items())},  # str keys: it is saved as JSON
        "status": status,
    }
    if missing:
        result["seconds"] = round(time.monotonic() - began, 2)
    return result


def _load(
    settings: Settings,
    client: TritonClient,
    root: Path,
    model: str,
    verified: list[int],
    missing: list[int],
    timeout_s: float,
) -> dict[int, str]:
    """Load the verified versions; the missing ones Triton refused or never made ready, with why."""
    try:
        load_only(settings, client, root, verified, model=model)
    except TritonUnreachable:
        raise
    except StepError as exc:  # Triton's load is synchronous: what is not ready now was refused by it
        reason = f"Triton at {client.url} refused it: {one_line_reason(str(exc))}"
        return {v: reason for v in missing if not client.version_ready(model, v)}
    refused = {}
    for version in missing:
        try:
            client.wait_ready(model, version, timeout_s=timeout_s)
        except StepError as exc:
            refused[version] = one_line_reason(str(exc))
    return refused


def refusal_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    """One line per version `reconcile_all` refused (results by model), for logs, alerts and `triton status`."""
    return [
        f"{model} v{v} is declared but not served: {why}"
        for model, result in sorted(results.items())
        for v, why in result.get("refused", {}).items()
    ]


def ensure_ready(settings: Settings, url: str, versions: list[int], *, timeout_s: float = RELOAD_TIMEOUT_S) -> None:
    """Make sure Triton serves `versions`: reload what the policy declares if any is missing (bounded wait)."""
    client = TritonClient(url, timeout=5)
    try:
        missing = [v for v in versions if not client.version_ready(MODEL_NAME, v)]
    finally:
        client.close()
    if not missing:
        return
    undeclared = sorted(set(missing) - set(declared_versions(settings)))
    if undeclared:
        raise StepError(
            f"{MODEL_NAME} version(s) {undeclared} are not ready on Triton at {url} and the repository's policy "
            "does not serve them; load them first"
        )
    result = reconcile(settings, url, timeout_s=timeout_s)
    refused = {v: result["refused"][str(v)] for v in versions if str(v) in result["refused"]}
    if refused:
        raise StepError(
            f"{MODEL_NAME} version(s) {sorted(refused)} cannot be served by Triton at {url}: "
            + "; ".join(f"v{v}: {why}" for v, why in refused.items())
        )

"""Declared serving state: the model repository's version policy is what Triton must have loaded.

Every step that changes what is served writes the policy first (config.pbtxt), so after a Triton restart
the policy still says what to serve. `reconcile` brings a Triton back to it (verified files only); the
local `mlrelease triton up` runs it after every start, the Kubernetes Deployment does the same with
`--load-model`, and routing calls `ensure_ready` so a rollback reaches stable even right after a restart.
"""

from __future__ import annotations

import time
from typing import Any

from mlrelease.errors import StepError
from mlrelease.registry import MODEL_NAME
from mlrelease.serving.triton_client import TritonClient, TritonUnreachable
from mlrelease.serving.triton_repo import model_repository, read_config
from mlrelease.settings import Settings

RELOAD_TIMEOUT_S = 60.0  # a CPU python-backend version loads in a few seconds; a GPU one may take longer


def declared_versions(settings: Settings) -> list[int]:
    """The versions the production repository's policy serves (empty when the model is disabled or absent)."""
    root = model_repository(settings)
    if not (root / MODEL_NAME / "config.pbtxt").is_file():
        return []
    return sorted(int(v) for v in read_config(root, MODEL_NAME).version_policy.specific.versions)


def reconcile(settings: Settings, url: str, *, timeout_s: float = RELOAD_TIMEOUT_S) -> dict[str, Any]:
    """Load the declared versions that Triton at `url` does not have ready; what was declared and reloaded.

    A version Triton refuses (or that never gets ready) is a StepError naming it and Triton's reason: the
    one case that needs a person.
    """
    from mlrelease.serving.endpoint import publish_to_local_server

    declared = declared_versions(settings)
    if not declared:
        return {"declared": [], "reloaded": [], "status": "nothing declared"}
    client = TritonClient(url, timeout=10)
    try:
        missing = [v for v in declared if not client.version_ready(MODEL_NAME, v)]
        if not missing:
            return {"declared": declared, "reloaded": [], "status": "in sync"}
        began = time.monotonic()
        publish_to_local_server(settings, model_repository(settings))  # files verified before any load
        try:
            client.load(MODEL_NAME)
            for version in missing:
                client.wait_ready(MODEL_NAME, version, timeout_s=timeout_s)
        except TritonUnreachable:
            raise
        except StepError as exc:
            raise StepError(
                f"Triton at {url} cannot load the declared {MODEL_NAME} version(s) {missing}: {exc}; a person must "
                "fix the version (or the server) before traffic can be served by it"
            ) from None
        return {
            "declared": declared,
            "reloaded": missing,
            "status": "reloaded",
            "seconds": round(time.monotonic() - began, 2),
        }
    finally:
        client.close()


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
    reconcile(settings, url, timeout_s=timeout_s)

"""How the repository of the Triton the steps talk to is fed and verified in the embedded default."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from mlrelease.registry import MODEL_NAME
from mlrelease.serving.cpu_repo import sync_cpu_repository
from mlrelease.serving.integrity import verify_policy
from mlrelease.serving.local_layout import TritonPaths
from mlrelease.serving.triton_repo import disable_config, read_config
from mlrelease.settings import Settings

if TYPE_CHECKING:
    from mlrelease.registry import Registry
    from mlrelease.serving.triton_client import TritonClient


def publish_to_local_server(settings: Settings, production_root: Path, *, registry: Registry | None = None) -> None:
    """Verify every version the config serves, then (embedded default only) mirror the repository for the local server.

    Every load request our code makes follows this call, so no (re)load can bring up a model.onnx that is not
    the file export recorded: a swapped file is GateFailed here, in production too, where Triton reads the
    production repository itself (MLRELEASE_TRITON_URL set) and nothing is copied. `registry` adds the check
    against each version's MLflow `onnx_sha256` tag.
    """
    verify_policy(production_root, registry=registry)
    if os.environ.get("MLRELEASE_TRITON_URL"):
        return
    sync_cpu_repository(production_root, TritonPaths.from_settings(settings).cpu_repository, MODEL_NAME)


def load_only(
    settings: Settings, client: TritonClient, production_root: Path, versions: list[int], *, model: str = MODEL_NAME
) -> None:
    """Have Triton load exactly `versions` (already verified) of the model, whatever else the repository's policy lists.

    Locally the CPU mirror is written to serve only them; against a cluster's Triton, which reads the production
    repository itself, the load carries that config with its policy narrowed. Either way a refused version's
    file is never offered to the server, so it cannot stop the others from loading.
    """
    if os.environ.get("MLRELEASE_TRITON_URL"):
        config = read_config(production_root, model)
        del config.version_policy.specific.versions[:]
        config.version_policy.specific.versions.extend(sorted(versions))
        client.load(model, config=config)
        return
    sync_cpu_repository(production_root, TritonPaths.from_settings(settings).cpu_repository, model, serve_only=versions)
    client.load(model)


def disable_everywhere(settings: Settings, production_root: Path) -> None:
    """Disable the model's config in the production repository and, locally, in the CPU mirror."""
    disable_config(production_root, MODEL_NAME)
    if not os.environ.get("MLRELEASE_TRITON_URL"):
        disable_config(TritonPaths.from_settings(settings).cpu_repository, MODEL_NAME)

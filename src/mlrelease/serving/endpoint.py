"""Which Triton the steps talk to, and how its repository is fed in the embedded default."""

from __future__ import annotations

import os
from pathlib import Path

from mlrelease.registry import MODEL_NAME
from mlrelease.serving.cpu_repo import sync_cpu_repository
from mlrelease.serving.local_triton import Ports, TritonPaths
from mlrelease.serving.triton_repo import disable_config
from mlrelease.settings import Settings


def triton_url() -> str:
    """MLRELEASE_TRITON_URL (a cluster's Triton service), else the local server's HTTP endpoint."""
    return os.environ.get("MLRELEASE_TRITON_URL") or Ports.from_env().http_url


def publish_to_local_server(settings: Settings, production_root: Path) -> None:
    """Embedded default only: mirror the production repository into the CPU repository the local server reads.

    In production Triton reads the production repository itself (MLRELEASE_TRITON_URL set), so nothing is copied.
    """
    if os.environ.get("MLRELEASE_TRITON_URL"):
        return
    sync_cpu_repository(production_root, TritonPaths.from_settings(settings).cpu_repository, MODEL_NAME)


def disable_everywhere(settings: Settings, production_root: Path) -> None:
    """Disable the model's config in the production repository and, locally, in the CPU mirror."""
    disable_config(production_root, MODEL_NAME)
    if not os.environ.get("MLRELEASE_TRITON_URL"):
        disable_config(TritonPaths.from_settings(settings).cpu_repository, MODEL_NAME)

"""Strict Kubernetes schema validation (kubernetes-validate) with each schema file parsed once per process."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

KUBERNETES_VERSION = "1.37.0"  # the schema manifests are validated against (`--kubernetes-version` overrides)


def strict_validate(manifest: dict[str, Any], kubernetes_version: str) -> None:
    """`kubernetes_validate.validate(manifest, version, strict=True)`: unknown fields are errors; raises its
    ValidationError naming the field path."""
    from kubernetes_validate import utils

    # validate() re-reads and parses the version's whole definitions file (megabytes of JSON) on every call, ~25 ms
    # each, so rendering and checking every step's pod paid it dozens of times. The parsed schemas are only read.
    if not hasattr(utils.schema_contents, "cache_info"):
        utils.schema_contents = lru_cache(maxsize=32)(utils.schema_contents)
    utils.validate(manifest, kubernetes_version, strict=True)

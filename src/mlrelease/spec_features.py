"""Does the feature repo give each declared model what its release spec reads? (Checked before a Feast apply.)"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mlrelease.release_spec import ReleaseSpec


def service_columns(service: Any) -> set[str]:
    """The feature names a Feast FeatureService returns (the columns of a retrieval without full names)."""
    return {field.name for projection in service.feature_view_projections for field in projection.features}


def spec_problems(spec: ReleaseSpec, services: dict[str, Any]) -> list[str]:
    """One line per way the repo's feature services fail the spec: its service undefined, or columns it lacks."""
    name = spec.features.service
    service = services.get(name)
    if service is None:
        defined = ", ".join(sorted(services)) or "none"
        return [f"{spec.source}: features.service {name!r} is not defined in the feature repo (defined: {defined})"]
    provided = service_columns(service)
    missing = [column for column in spec.features.columns if column not in provided]
    if missing:
        return [
            f"{spec.source}: features.columns {missing} are not features of service {name!r} "
            f"(it provides {sorted(provided)})"
        ]
    return []


def repo_problems(specs: Iterable[ReleaseSpec], feature_services: Iterable[Any]) -> list[str]:
    """Every declared model's problems with a repo defining `feature_services` (empty: all are served)."""
    services = {service.name: service for service in feature_services}
    return [line for spec in specs for line in spec_problems(spec, services)]

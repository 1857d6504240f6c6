"""The rule-based ETA served when no model version can answer (source `fallback_rule`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlrelease.gateway.config import FallbackConfig


def rule_eta(config: FallbackConfig, features: Mapping[str, Any]) -> float:
    """Base hours + distance at the network's speed slowed by congestion + remote-route and bulky-parcel terms.

    The same shape the network team uses for quotes; a missing feature counts as zero.
    """
    distance = float(features.get("distance_km") or 0.0)
    congestion = float(features.get("congestion_index") or 0.0)
    eta = config.base_hours + distance / config.km_per_hour * (1 + config.congestion_slowdown * congestion)
    eta += config.remote_hours * bool(features.get("is_remote")) + config.bulky_hours * bool(features.get("is_bulky"))
    return round(eta, 3)

"""Fallback rules a release spec may name (`fallback.rule`): the answer served when no model version can.

A rule takes the request's features and the spec's `fallback.params` and returns the prediction; the spec's
`fallback.values` give the other outputs (e.g. a low confidence), so the caller can tell a rule's answer apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def eta_rule(
    features: Mapping[str, Any],
    *,
    base_hours: float = 8.0,
    km_per_hour: float = 55.0,
    congestion_slowdown: float = 0.8,
    remote_hours: float = 20.0,
    bulky_hours: float = 6.0,
) -> float:
    """Base hours + distance at the network's speed slowed by congestion + remote-route and bulky-parcel terms.

    The same shape the network team uses for quotes; a missing feature counts as zero.
    """
    distance = float(features.get("distance_km") or 0.0)
    congestion = float(features.get("congestion_index") or 0.0)
    eta = base_hours + distance / km_per_hour * (1 + congestion_slowdown * congestion)
    eta += remote_hours * bool(features.get("is_remote")) + bulky_hours * bool(features.get("is_bulky"))
    return round(eta, 3)

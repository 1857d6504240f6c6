"""Do the rollout record, the routing in force, the MLflow aliases and Triton's loaded versions agree?

`mlrelease rollout status` shows the four side by side; this module names every disagreement, so a
fault drill (or a person after an incident) can tell at a glance whether the system healed.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlrelease.rollout.machine import Phase
from mlrelease.rollout.store import RolloutRecord
from mlrelease.rollout.traffic_router import Routing


@dataclass(frozen=True)
class ServingView:
    """Everything that says what is served: record, routing, aliases, the policy and what Triton has ready."""

    record: RolloutRecord | None
    routing: Routing | None
    champion: int | None
    challenger: int | None
    declared: list[int]
    loaded: list[int] | None  # None: Triton did not answer


def disagreements(view: ServingView) -> list[str]:
    """One line per way the four sources of truth disagree; empty when they tell one story."""
    if view.routing is None:
        return ["no routing document: the gateway serves nothing"]
    routed = view.routing.serving_versions()
    return _serving_problems(view, routed) + _record_problems(view, view.routing, routed)


def _serving_problems(view: ServingView, routed: list[int]) -> list[str]:
    """Routed versions that Triton or the repository's policy does not serve."""
    found = []
    if view.loaded is None:
        found.append("Triton did not answer: cannot tell what is loaded")
    else:
        found += [
            f"routing sends traffic to v{v}, which Triton does not have ready" for v in routed if v not in view.loaded
        ]
    found += [
        f"routing sends traffic to v{v}, which the repository's policy does not serve"
        for v in routed
        if v not in view.declared
    ]
    return found


def _record_problems(view: ServingView, routing: Routing, routed: list[int]) -> list[str]:
    """Where the rollout record (or, without one, the champion alias) and the routing tell different stories.

    Whatever the phase, one version must be routing's stable and the champion alias: the stable version
    during a rollout and after a rollback, the candidate after a promotion. A rollout rolling back is never
    consistent: it is a decision that routing has not (or the record has not yet) confirmed.
    """
    record = view.record
    if record is None:
        if view.champion is not None and routing.stable_version != view.champion:
            return [f"the champion alias is v{view.champion}, routing's stable is v{routing.stable_version}"]
        return []
    expected = record.candidate_version if record.phase is Phase.PROMOTED else record.stable_version
    story = f"the record ({record.phase}, candidate v{record.candidate_version})"
    found = []
    if routing.stable_version != expected:
        found.append(f"{story} means stable v{expected}, routing's stable is v{routing.stable_version}")
    if view.champion != expected:
        found.append(f"{story} means champion v{expected}, the champion alias is v{view.champion}")
    if record.phase is Phase.ROLLED_BACK and record.candidate_version in routed:
        found.append(f"{story} says rolled back, but routing still sends traffic to v{record.candidate_version}")
    if record.phase is Phase.ROLLING_BACK:
        # Decided, not confirmed: the expected moment between the decision and the routing write (or a routing
        # that failed); `mlrelease step rollback` finishes it either way.
        if record.candidate_version in routed:
            found.append(f"rolling back: routing still sends traffic to v{record.candidate_version}")
        else:
            found.append(
                f"rolling back: routing is on stable v{routing.stable_version}, but the rollback of "
                f"v{record.candidate_version} is not recorded as finished"
            )
    return found

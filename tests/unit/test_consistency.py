"""Record, routing, aliases and Triton's loaded versions: every disagreement named, none when they agree."""

from __future__ import annotations

from mlrelease.rollout.consistency import ServingView, disagreements
from mlrelease.rollout.machine import Phase
from mlrelease.rollout.traffic_router import Routing
from tests.unit.records import rollout_record


def test_a_healed_rollback_tells_one_story():
    view = ServingView(rollout_record(Phase.ROLLED_BACK), Routing(stable_version=1), 1, None, [1], [1])
    assert disagreements(view) == []


def test_a_record_ahead_of_routing_and_a_lost_stable_are_named():
    routing = Routing(stable_version=1, candidate_version=2, candidate_percent={"high_value": 100.0})
    view = ServingView(rollout_record(Phase.ROLLED_BACK), routing, 1, None, [1, 2], [2])
    assert disagreements(view) == [
        "routing sends traffic to v1, which Triton does not have ready",
        "the record (rolled_back, candidate v2) says rolled back, but routing still sends traffic to v2",
    ]


def test_a_promotion_whose_alias_did_not_move_is_named():
    view = ServingView(rollout_record(Phase.PROMOTED), Routing(stable_version=2), 1, None, [2], None)
    assert disagreements(view) == [
        "Triton did not answer: cannot tell what is loaded",
        "the record (promoted, candidate v2) means champion v2, the champion alias is v1",
    ]


def test_a_rollback_decided_but_not_routed_is_named_until_it_is_finished():
    routing = Routing(stable_version=1, candidate_version=2, candidate_percent={"high_value": 50.0})
    view = ServingView(rollout_record(Phase.ROLLING_BACK), routing, 1, 2, [1, 2], [1, 2])
    assert disagreements(view) == ["rolling back: routing still sends traffic to v2"]
    routed = ServingView(rollout_record(Phase.ROLLING_BACK), Routing(stable_version=1), 1, None, [1], [1])
    assert disagreements(routed) == [
        "rolling back: routing is on stable v1, but the rollback of v2 is not recorded as finished"
    ]

"""Everything a rollout step talks to, opened once: record store, traffic router, metrics, registry, Triton."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from mlrelease.errors import StepError
from mlrelease.registry import CHALLENGER, CHAMPION, MODEL_NAME, Registry
from mlrelease.release_spec import spec_named
from mlrelease.rollout.machine import Phase, RolloutState, candidate_percent
from mlrelease.rollout.metrics_source import MetricsSource
from mlrelease.rollout.metrics_source_factory import open_metrics_source
from mlrelease.rollout.store import RolloutRecord, RolloutStore
from mlrelease.rollout.traffic_router import Routing, TrafficRouter
from mlrelease.rollout.traffic_router_factory import open_traffic_router
from mlrelease.serving.endpoint import publish_to_local_server
from mlrelease.serving.local_layout import triton_url
from mlrelease.serving.triton_client import TritonClient
from mlrelease.serving.triton_repo import model_repository, set_version_policy, versions_present
from mlrelease.settings import Settings

DRAIN_S = 1.0  # after traffic moves, in-flight calls (candidate timeout 0.5 s) finish before an unload


@dataclass
class RolloutContext:
    """The stores and clients of one rollout step."""

    settings: Settings
    store: RolloutStore
    router: TrafficRouter
    source: MetricsSource
    registry: Registry
    cohorts: tuple[str, ...]

    @classmethod
    def open(cls, settings: Settings) -> RolloutContext:
        """Open everything named by the settings and the gateway config, for the model this process releases."""
        return cls(
            settings,
            RolloutStore.from_settings(settings, MODEL_NAME),
            open_traffic_router(settings, MODEL_NAME),
            open_metrics_source(settings),
            Registry.from_settings(settings),
            spec_named(MODEL_NAME).cohorts.names,
        )

    def require_observed(self) -> None:
        """Refuse to expose traffic that the guardrails' metrics source cannot see (StepError)."""
        kind = self.settings.metrics_source
        if kind not in self.router.observed_by:
            raise StepError(
                f"the metrics source {kind!r} does not see the traffic that {self.router.location} routes, so no "
                "guardrail could judge a stage: no stage was opened (configure a source that observes this "
                f"router: {sorted(self.router.observed_by) or 'none is built yet'})"
            )

    def owned(self, run_key: str, version: int) -> RolloutRecord:
        """The rollout this run started for `version`; anything else is a StepError naming what was found."""
        record = self.store.read()
        if record is None or (record.run_key, record.candidate_version) != (run_key, version):
            found = "none" if record is None else f"v{record.candidate_version} of run {record.run_key}"
            raise StepError(
                f"no rollout of v{version} for run {run_key} (the current rollout is {found}): "
                "run rollout-stage for stage 1 first"
            )
        return record

    def route(self, record: RolloutRecord, state: RolloutState, reason: str, *, clear_trips: bool = False) -> Routing:
        """Apply the routing that `state` means (traffic moves here, before the record says so)."""
        shares = candidate_percent(state, record.plan)
        if state.phase is Phase.PROMOTED:
            routing = Routing(stable_version=record.candidate_version)
        elif state.phase in (Phase.ROLLING_BACK, Phase.ROLLED_BACK):
            routing = Routing(stable_version=record.stable_version)
        else:
            routing = Routing(record.stable_version, record.candidate_version, shares)
        return self.router.apply(routing, reason=reason, clear_trips=clear_trips)

    def record_update(self, record: RolloutRecord, changed: RolloutRecord) -> RolloutRecord:
        """Store `changed`, unless someone else changed the record since `record` was read."""

        def mutate(current: RolloutRecord | None) -> RolloutRecord:
            if current is None or current.revision != record.revision:
                raise StepError(
                    f"rollout record changed underneath this step (revision {record.revision} → "
                    f"{current.revision if current else 'gone'}); rerun the step"
                )
            return changed

        return self.store.update(mutate)

    def serve_only(self, versions: list[int]) -> list[int]:
        """Make Triton serve exactly these versions (present in the repository); the others are unloaded."""
        root = model_repository(self.settings)
        keep = sorted(v for v in set(versions) if v in versions_present(root, MODEL_NAME))
        if not keep:
            raise StepError(f"none of versions {sorted(set(versions))} is in the model repository {root}")
        set_version_policy(root, MODEL_NAME, keep)
        publish_to_local_server(self.settings, root)
        client = TritonClient(triton_url())
        try:
            client.load(MODEL_NAME)
            for version in keep:
                client.wait_ready(MODEL_NAME, version)
        finally:
            client.close()
        return keep

    def retire_candidate(self, record: RolloutRecord, reason: str) -> dict[str, object]:
        """After traffic left it: unload the candidate (after a drain), restore aliases, tag the version."""
        time.sleep(DRAIN_S)
        champion = self.registry.alias_version(CHAMPION)
        if champion != record.stable_version and champion in (None, record.candidate_version):
            self.registry.set_alias(CHAMPION, record.stable_version)
            champion = record.stable_version
        self.registry.clear_alias(CHALLENGER, if_version=record.candidate_version)
        serving = self.serve_only([record.stable_version])
        self.registry.tag_version(record.candidate_version, rollout_status="rolled_back", rollout_reason=reason[:500])
        return {"champion_version": champion, "serving_versions": serving}


def iso(moment: datetime | None) -> str | None:
    """ISO-8601 text of a datetime, or None."""
    return moment.isoformat() if moment else None

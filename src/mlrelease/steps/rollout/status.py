"""`mlrelease rollout status`: the record, routing and stores side by side."""

from __future__ import annotations

from typing import Any

from mlrelease.registry import CHALLENGER, CHAMPION, MODEL_NAME
from mlrelease.rollout.consistency import ServingView, disagreements
from mlrelease.rollout.context import RolloutContext
from mlrelease.rollout.machine import Phase
from mlrelease.serving.local_layout import triton_url
from mlrelease.settings import Settings


def status(settings: Settings) -> dict[str, Any]:
    """Record, routing, MLflow aliases and Triton's loaded versions side by side, with every disagreement named."""
    from mlrelease.serving.integrity import verify_each
    from mlrelease.serving.reconcile import declared_versions
    from mlrelease.serving.triton_client import TritonClient, TritonUnreachable
    from mlrelease.serving.triton_repo import model_repository

    ctx = RolloutContext.open(settings)
    record = ctx.store.read()
    routing = ctx.router.current()
    declared = declared_versions(settings)
    _, refused = verify_each(model_repository(settings), declared)  # what a restart's reconcile would refuse, and why
    candidates = sorted({*declared, *(routing.serving_versions() if routing else [])})
    client = TritonClient(ctx.router.triton if hasattr(ctx.router, "triton") else triton_url(), timeout=5)
    try:
        loaded: list[int] | None = [v for v in candidates if client.version_ready(MODEL_NAME, v)]
    except TritonUnreachable:
        loaded = None
    finally:
        client.close()
    view = ServingView(
        record, routing, ctx.registry.alias_version(CHAMPION), ctx.registry.alias_version(CHALLENGER), declared, loaded
    )
    problems = disagreements(view)
    pending = None
    if record is not None and record.phase is Phase.ROLLING_BACK:
        pending = f"rollback of v{record.candidate_version} not confirmed yet: `mlrelease step rollback` finishes it"
    return {
        "consistent": not problems,
        "disagreements": problems,
        "pending": pending,
        "rollout": record.model_dump(mode="json") if record else None,
        "routing": routing.__dict__ if routing else None,
        "aliases": {CHAMPION: view.champion, CHALLENGER: view.challenger},
        "triton": {"declared": declared, "loaded": loaded, "refused": {str(v): why for v, why in refused.items()}},
        "routing_store": ctx.router.location,
        "metrics_source": ctx.source.location,
    }

"""The gates a version must have passed before it takes real traffic, enforced where traffic moves.

Each earlier step records its verdict as an MLflow version tag; rollout-stage and promote read them, so a
step run by hand cannot route a candidate whose export, serving validation, benchmark or shadow failed
or never ran. A human may override, explicitly: the override is recorded (rollout history, MLflow tag)
and alerted.
"""

from __future__ import annotations

import logging
from typing import Any

from mlrelease.errors import GateFailed
from mlrelease.settings import Settings

log = logging.getLogger(__name__)

# tag -> the value that means passed; the matching `<gate>_reason` tag says why when it did not.
REQUIRED_GATES = {
    "export_status": "exported",
    "validation_status": "passed",
    "benchmark_status": "passed",
    "shadow_status": "passed",
}
ALERT_WEBHOOK_ENV = "MLRELEASE_ALERT_WEBHOOK"


def gate_problems(tags: dict[str, str]) -> list[str]:
    """One entry per required gate that is missing or not passed, e.g. `shadow_status=failed (latency …)`."""
    problems = []
    for tag, passed in REQUIRED_GATES.items():
        value = tags.get(tag)
        if value is None:
            problems.append(f"{tag} missing (the step never passed it)")
        elif value != passed:
            reason = tags.get(tag.replace("_status", "_reason"))
            problems.append(f"{tag}={value}" + (f" ({reason[:160]})" if reason else ""))
    return problems


def require_gates(version: int, tags: dict[str, str], step: str, override: str | None) -> list[str]:
    """Refuse (exit 3) a version with missing or failed gates unless `override` gives a reason; the problems."""
    problems = gate_problems(tags)
    if problems and not override:
        raise GateFailed(
            f"{step} refuses v{version}: {'; '.join(problems)}; rerun the failed gate, or pass "
            "--override-gates REASON to route it anyway (recorded and alerted)"
        )
    return problems


def alert_override(version: int, step: str, problems: list[str], reason: str, webhook: str) -> dict[str, Any]:
    """Post a `gates_overridden` alert to `webhook` (the settings' MLRELEASE_ALERT_WEBHOOK) when one is set; what was
    sent (or why not)."""
    import requests

    payload = {"event": "gates_overridden", "step": step, "model_version": version, "gates": problems, "reason": reason}
    log.warning("gates overridden for v%s by %s: %s (%s)", version, step, "; ".join(problems), reason)
    url = webhook.strip()
    if not url:
        return {**payload, "alerted": False, "why": f"{ALERT_WEBHOOK_ENV} is not set"}
    try:
        requests.post(url, json=payload, timeout=10).raise_for_status()
    except requests.RequestException as exc:  # the override stands; the failed alert is reported in the result
        return {**payload, "alerted": False, "why": f"{type(exc).__name__}: {exc}"}
    return {**payload, "alerted": True}


def held_by_open_rollout(settings: Settings, version: int, step: str) -> dict[str, Any] | None:
    """A result for a pre-traffic gate rerun while `version`'s rollout holds traffic (None when it does not).

    Repeating validate-serving, benchmark or shadow then would leave real traffic on the candidate with no
    stage analysing it for minutes (and load the server the guardrails measure): the gates passed before
    the rollout opened (rollout-stage refuses otherwise), so the rerun goes straight on to the open stage.
    """
    from mlrelease.registry import MODEL_NAME
    from mlrelease.rollout.store import RolloutStore

    record = RolloutStore.from_settings(settings, MODEL_NAME).read()
    if record is None or not record.active or record.candidate_version != version:
        return None
    return {
        "model_version": version,
        "status": f"skipped: v{version}'s rollout holds traffic (stage {record.stage}, {record.phase}); its "
        f"gates passed before it opened, so {step} is not repeated",
        "rollout_run_key": record.run_key,
    }

"""Take one refused version out of service: off the repository's version policy first, then out of Triton.

The policy (config.pbtxt) is the record of what should be served: every reload, restart and reconcile reads
it. A version any gate refused must leave it at once, or the next restart would offer the refused file to
Triton again; the other versions stay declared and loaded.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mlrelease.errors import GateFailed, StepError
from mlrelease.registry import MODEL_NAME
from mlrelease.serving.endpoint import disable_everywhere, publish_to_local_server
from mlrelease.serving.local_layout import triton_url
from mlrelease.serving.triton_client import TritonClient
from mlrelease.serving.triton_repo import model_repository, read_config, set_version_policy
from mlrelease.settings import Settings

log = logging.getLogger(__name__)


def take_out_of_service(settings: Settings, client: TritonClient, root: Path, version: int) -> list[int]:
    """Remove `version` from the policy and reload the rest (unload and disable if alone); what stays declared."""
    if not (root / MODEL_NAME / "config.pbtxt").is_file():
        return []
    declared = list(read_config(root, MODEL_NAME).version_policy.specific.versions)
    keep = [v for v in declared if v != version]
    if keep:
        set_version_policy(root, MODEL_NAME, keep)
        publish_to_local_server(settings, root)
        client.load(MODEL_NAME)
    else:  # nothing else to serve: unload, and make sure no later reload brings it back
        client.unload(MODEL_NAME)
        disable_everywhere(settings, root)
    return keep


def withdraw_refused(settings: Settings, version: int, refusal: GateFailed) -> GateFailed:
    """Take a version a gate just refused out of service; the refusal, to raise (a failed reload is logged, not lost).

    The policy changes before Triton is asked to reload, so even when Triton cannot be reached now, the next
    reconcile serves the versions that remain.
    """
    root = model_repository(settings)
    if not (root / MODEL_NAME / "config.pbtxt").is_file():
        return refusal
    if version not in read_config(root, MODEL_NAME).version_policy.specific.versions:
        return refusal  # already out (a retry of the step)
    client = TritonClient(triton_url())
    try:
        kept = take_out_of_service(settings, client, root, version)
        log.warning("v%s taken out of service (%s); still declared: %s", version, refusal, kept)
    except StepError as exc:
        log.error("v%s left the policy, but reloading the rest failed: %s", version, exc)
    finally:
        client.close()
    return refusal

"""The gateway's config as it runs on the cluster: the repo's gateway YAML plus the fields the cluster decides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlrelease.deploy.meta import STATE_MOUNT
from mlrelease.deploy.values import DeployValues
from mlrelease.errors import StepError
from mlrelease.gateway.config import GatewayConfig, load_config

CONFIG_DIR = "/etc/mlrelease/gateway"
CONFIG_KEY = "gateway.yaml"
KEYS_DIR = "/etc/mlrelease/gateway-keys"
KEYS_KEY = "api_keys.yaml"


def triton_url(values: DeployValues) -> str:
    """Triton's HTTP endpoint through its Service."""
    triton = values.triton
    return f"http://{triton.name}.{values.namespace}.svc:{triton.ports.http}"


def cluster_fields(values: DeployValues, models: tuple[str, ...]) -> dict[tuple[str, ...], str]:
    """Gateway config fields whose cluster value comes from deploy values, by their path in the config."""
    fields = {
        ("triton_url",): triton_url(values),
        ("routing", "state_url"): values.routing.stateUrl,
        ("auth", "keys_file"): f"{KEYS_DIR}/{KEYS_KEY}",
    }
    if len(models) == 1:
        # The same place the step pods find by default (MLRELEASE_HOME/gateway/<model>/decisions): guardrails read it.
        # A gateway serving several models keeps the default, the same folder per model (its MLRELEASE_HOME is the
        # state volume too).
        fields["decision_log", "directory"] = f"{STATE_MOUNT}/gateway/{models[0]}/decisions"
    return fields


def config_path(values: DeployValues, values_dir: Path) -> Path:
    """The gateway YAML named by `gateway.configFile` (relative paths are relative to the values file)."""
    path = Path(values.gateway.configFile)
    return path if path.is_absolute() else (values_dir / path).resolve()


def cluster_gateway_config(values: DeployValues, values_dir: Path) -> GatewayConfig:
    """The gateway config for the cluster; a field the file sets to something the cluster overrides is an error."""
    path = config_path(values, values_dir)
    config = load_config(path)
    document: dict[str, Any] = config.model_dump(mode="json")
    for keys, wanted in cluster_fields(values, config.served_models).items():
        parent = document
        for key in keys[:-1]:
            parent = parent[key]
        current = parent[keys[-1]]
        if current and current != wanted:
            raise StepError(
                f"gateway config {path}: {'.'.join(keys)} is {current!r}, but on Kubernetes it is {wanted!r} "
                "(from deploy values): leave it empty in the file"
            )
        parent[keys[-1]] = wanted
    return GatewayConfig.model_validate(document)

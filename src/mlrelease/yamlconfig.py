"""Typed YAML files (gateway config, rollout plan, API keys): strict pydantic models, one clear error per problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from mlrelease.errors import StepError

M = TypeVar("M", bound=BaseModel)
# libyaml's parser when PyYAML was built with it (its wheels are): the same safe YAML, an order of magnitude faster
# than the pure-Python one, which was seconds of every test run's CPU.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """`yaml.safe_load` through libyaml's C parser where available."""
    return yaml.load(text, Loader=_SAFE_LOADER)  # noqa: S506 - a safe loader, C or pure Python


class StrictModel(BaseModel):
    """Frozen, and an unknown key is an error (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def validation_problems(exc: ValidationError) -> str:
    """Every problem of a ValidationError as `dotted.field: message`, joined by '; '."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors())


def load_yaml_model(path: Path, schema: type[M], what: str, /, **overrides: Any) -> M:
    """Read a YAML mapping, apply top-level `overrides` (None ones skipped), validate it as `schema`.

    Errors name `what`, the file and the field: "gateway config X is invalid: guard.window_s: …".
    """
    try:
        raw = safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise StepError(f"{what} {path} cannot be read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise StepError(f"{what} {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise StepError(f"{what} {path} must be a mapping, got {type(raw).__name__}")
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        raise StepError(f"{what} {path} is invalid: {validation_problems(exc)}") from None

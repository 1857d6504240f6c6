"""Gateway configuration: one YAML file validated on load, so a bad value fails at start-up naming its field."""

from __future__ import annotations

import functools
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from mlrelease.cohort_rules import CohortConfig
from mlrelease.errors import StepError
from mlrelease.gateway.routing_state import Arm
from mlrelease.release_spec import ReleaseSpec, process_spec, spec_named
from mlrelease.settings import REPO_ROOT, Settings
from mlrelease.yamlconfig import StrictModel, load_yaml_model

DEFAULT_CONFIG = REPO_ROOT / "config" / "gateway.yaml"


class GuardConfig(StrictModel):
    """The fast guard: what counts as a hard failure and when a version's breaker opens."""

    failures_to_trip: int = Field(3, ge=1, description="stable's breaker: failures within window_s that rest it")
    window_s: float = Field(10.0, gt=0, description="stable's breaker window, and the candidate guard's share window")
    stable_open_s: float = Field(5.0, gt=0, description="how long a failed stable version rests before a retry")
    # The candidate's guard is relative to stable (gateway/split_guard.py): it trips on evidence that the candidate's
    # hard failures outnumber its share of the traffic, never on a count that stable's own failures would reach too.
    # Tuned to a candidate that fails on a fair share of its calls (1,000 × stable's 1 in 10,000): then every failure
    # on the candidate weighs most, and one on stable wipes the evidence out (bursts of stable's own failures reset it).
    failure_ratio: float = Field(
        1000.0, gt=1, description="the candidate / stable failure-rate ratio the candidate's guard is tuned to detect"
    )
    false_trip_rate: float = Field(
        1e-4, gt=0, le=0.01, description="chance that one replica's guard ever trips a candidate as good as stable"
    )
    invalid_to_trip: int = Field(
        3, ge=1, description="the candidate's NaN/inf or out-of-range answers that trip it (never acceptable)"
    )
    burst_failures: int = Field(
        5,
        ge=1,
        description="the longest run of back-to-back failures a healthy version shows, on one replica or across them: "
        "a run weighs once per this many failures, and a candidate run 2 longer (while stable answers) trips it, on "
        "one replica or pooled across the replicas (gateway/run_pool.py)",
    )
    pool_runs: bool = Field(
        True,
        description="with a Redis routing state, pool the candidate's failure runs across the replicas "
        "(gateway/run_pool.py): a candidate failing every call is stopped at the fleet's pace; off, each replica "
        "decides alone",
    )
    pool_heartbeat_s: float = Field(
        1.0,
        gt=0,
        le=10,
        description="with a Redis routing state, how often each replica writes its candidate failure run to the pool "
        "the replicas share (gateway/run_pool.py); one silent for 3 heartbeats no longer counts",
    )
    candidate_timeout_ms: float = Field(500.0, gt=0)
    stable_timeout_ms: float = Field(2000.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _no_output_ranges_here(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and {"min_eta_hours", "max_eta_hours"} & set(raw):
            raise ValueError(
                "min_eta_hours/max_eta_hours: a model's valid answers are declared in its release spec "
                "(models/<name>/release.yaml, outputs[].range), not in the gateway config: move them there"
            )
        return raw


class BatchingConfig(StrictModel):
    """Micro-batching into Triton: concurrent rows for one version share one call (see gateway/batcher.py)."""

    enabled: bool = True
    max_batch: int = Field(64, ge=1, le=4096, description="most rows per call (also capped by the model's own)")
    max_delay_ms: float = Field(
        0.5, ge=0, le=1.0, description="longest a row waits for company, and only while a call is already running"
    )
    max_in_flight: int = Field(2, ge=1, le=64, description="calls per version and role at once; more rows queue")


class RoutingConfig(StrictModel):
    """Where the routing state lives and how often replicas look at it."""

    state_url: str = Field("", description="file:///path.json or redis://host:port/db; empty: under MLRELEASE_HOME")
    refresh_interval_s: float = Field(0.2, gt=0, le=1.0)
    arm: Arm = Field(
        "split",
        description="split: this gateway assigns each user to stable or candidate (its canary bucket); stable or "
        "candidate: a Gateway API data plane in front assigned them (HTTPRoute backends: gateways), and every request "
        "this replica gets is of that arm",
    )


class RateLimit(StrictModel):
    """A token bucket: sustained requests per second and burst size."""

    per_second: float = Field(500.0, gt=0)
    burst: int = Field(1000, ge=1)


class AuthConfig(StrictModel):
    """API keys (sha256 in a keys file) and the default per-client rate limit."""

    required: bool = True
    keys_file: str = Field("", description="empty: $MLRELEASE_HOME/gateway/api_keys.yaml")
    header: str = "X-API-Key"
    default_rate: RateLimit = RateLimit()


class DecisionLogConfig(StrictModel):
    """What the gateway records per model call for the rollout's guardrails (see gateway/decision_log.py)."""

    directory: str = Field("", description="empty: $MLRELEASE_HOME/gateway/<model>/decisions")
    sample_rate: float = Field(1.0, gt=0, le=1, description="share of successful calls recorded; failures always")
    features: bool = Field(True, description="record the encoded features too (diagnose needs them)")
    retention_hours: float = Field(48.0, gt=0)


class GatewayConfig(StrictModel):
    """Everything `mlrelease gateway` reads at start-up."""

    # The model POST /v1/predict answers (a declared release spec): by default the first of `models`, else the model
    # this process releases (MLRELEASE_MODEL, else the only spec). `mlrelease routing …` manages its routing state.
    model: str = Field(default_factory=lambda: process_spec().name)
    models: tuple[str, ...] = Field(
        (),
        description="every model this gateway serves, each at POST /v1/models/<name>/predict with its own routing "
        "state, guard, decision log and metrics label; empty: `model` alone",
    )
    triton_url: str = Field("", description="empty: MLRELEASE_TRITON_URL, else the local server")
    max_body_bytes: int = Field(16_384, ge=256)
    feature_timeout_ms: float = Field(1000.0, gt=0, description="an online lookup slower than this is a 503")
    replay_as_of: datetime | None = Field(
        None, description="judge feature freshness as of this instant instead of now (replays and demos only)"
    )
    guard: GuardConfig = GuardConfig()
    batching: BatchingConfig = BatchingConfig()
    routing: RoutingConfig = RoutingConfig()
    auth: AuthConfig = AuthConfig()
    decision_log: DecisionLogConfig = DecisionLogConfig()

    @model_validator(mode="before")
    @classmethod
    def _default_model_is_the_first_served(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and raw.get("models") and "model" not in raw:
            return {**raw, "model": raw["models"][0]}
        return raw

    @model_validator(mode="after")
    def _one_state_per_model(self) -> GatewayConfig:
        if len(set(self.models)) != len(self.models):
            raise ValueError(f"models: {list(self.models)} names a model twice")
        if self.models and self.model not in self.models:
            raise ValueError(f"model: {self.model!r} (the model POST /v1/predict answers) is not one of models")
        if len(self.served_models) > 1:
            # One file or folder cannot hold several models' routing documents or decision logs apart.
            if self.routing.state_url.startswith("file:"):
                raise ValueError(
                    "routing.state_url: a file holds one model's routing state; a gateway serving several models "
                    'needs redis://… (keyed per model) or "" (each model\'s file under MLRELEASE_HOME)'
                )
            if self.decision_log.directory:
                raise ValueError(
                    "decision_log.directory: a gateway serving several models writes each model's log under "
                    "$MLRELEASE_HOME/gateway/<model>/decisions; leave it empty"
                )
        return self

    @property
    def served_models(self) -> tuple[str, ...]:
        """Every model this gateway serves, the default model (`model`) first."""
        return (self.model, *(m for m in self.models if m != self.model))

    @model_validator(mode="before")
    @classmethod
    def _no_model_blocks_here(cls, raw: Any) -> Any:
        for key in ("cohorts", "fallback"):  # an older gateway.yaml: say where they live now
            if isinstance(raw, dict) and key in raw:
                raise ValueError(
                    f"{key}: a model's {key} is declared in its release spec (models/<name>/release.yaml, "
                    f"key {key}), not in the gateway config: move the block there"
                )
        return raw

    @property
    def spec(self) -> ReleaseSpec:
        """The default model's release spec (its cohorts, outputs and fallback)."""
        return spec_named(self.model)

    @property
    def cohorts(self) -> CohortConfig:
        """The default model's cohort rules and bucket key, from its release spec."""
        return self.spec.cohorts

    @field_validator("replay_as_of")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("replay_as_of needs a timezone, e.g. 2026-11-29T02:00:00Z")
        return value

    def state_url(self, settings: Settings, model: str | None = None) -> str:
        """A served model's routing-state URL (default: `model`'s), defaulting to its file under MLRELEASE_HOME."""
        if self.routing.state_url.startswith("file:"):  # one model's file: never another model's
            self._require_served(model, "routing.state_url")
        return self.routing.state_url or f"file://{model_state_dir(settings, model or self.model) / 'routing.json'}"

    def decision_dir(self, settings: Settings, model: str | None = None) -> Path:
        """Where every replica writes a served model's decision log (by default the model's own folder)."""
        if self.decision_log.directory:  # one model's folder: never another model's
            self._require_served(model, "decision_log.directory")
        return Path(self.decision_log.directory or model_state_dir(settings, model or self.model) / "decisions")

    def _require_served(self, model: str | None, field: str) -> None:
        """Refuse to hand one served model's explicit `field` to a step of a model this config does not serve."""
        if model is not None and model not in self.served_models:
            raise StepError(
                f"the gateway config serves {list(self.served_models)}, not {model!r}: its {field} is theirs "
                f"(serve {model!r} with `models:`, or give its steps their own config, MLRELEASE_GATEWAY_CONFIG)"
            )

    def keys_file(self, settings: Settings) -> Path:
        """The API keys file."""
        return Path(self.auth.keys_file) if self.auth.keys_file else settings.home / "gateway" / "api_keys.yaml"


def model_state_dir(settings: Settings, model: str) -> Path:
    """A served model's own gateway state under MLRELEASE_HOME: each model's routing and decisions apart."""
    return settings.home / "gateway" / model


@functools.lru_cache(maxsize=8)
def _step_config(path: Path, version: tuple[int, int], model: str) -> GatewayConfig:
    return load_config(path)  # `model`: the process's model, the config's default `model` when it names none


def step_gateway_config(settings: Settings) -> GatewayConfig:
    """The gateway config a step reads (its settings' MLRELEASE_GATEWAY_CONFIG, else config/gateway.yaml), read and
    validated once per process however many parts of the step need it (again only if the file changes)."""
    path = Path(settings.gateway_config or DEFAULT_CONFIG).resolve()
    try:
        stat = path.stat()
    except OSError:
        return load_config(path)  # the loader names the missing or unreadable file
    return _step_config(path, (stat.st_mtime_ns, stat.st_size), settings.release_model)


def load_config(path: Path | None = None, **overrides: Any) -> GatewayConfig:
    """Read and validate a gateway YAML (default: MLRELEASE_GATEWAY_CONFIG, else config/gateway.yaml)."""
    path = Path(path or os.environ.get("MLRELEASE_GATEWAY_CONFIG") or DEFAULT_CONFIG)
    return load_yaml_model(path, GatewayConfig, "gateway config", **overrides)

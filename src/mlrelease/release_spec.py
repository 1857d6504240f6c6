"""A model's release spec: one YAML file per model (`models/<name>/release.yaml`) that says what the model is.

The platform owns the pipeline (gates, export, serving, rollout); the spec owns what belongs to one model: its
name and task, the Feast feature service and label it trains on, its input columns in model order (with the
vocabulary of each categorical one), its output contract, the training code the platform calls (a `module:function`),
the thresholds of its training gate, its benchmark limits and peak load, and its rollout plan. Loading validates
the whole file and every error names the file and the field. A process releases one model: `process_spec()` is the
spec MLRELEASE_MODEL names (the DAG's tasks, the step pods and the gateway set it), else the only one declared.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import os
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator

from mlrelease.cohort_rules import CohortConfig
from mlrelease.errors import StepError
from mlrelease.settings import REPO_ROOT
from mlrelease.yamlconfig import StrictModel, load_yaml_model, validation_problems

# Where the release specs live: MLRELEASE_SPECS_DIR (an image that installs the package away from its checkout, as
# the Airflow image does), else models/ beside the code.
SPECS_DIR = Path(os.environ.get("MLRELEASE_SPECS_DIR") or REPO_ROOT / "models")
SPEC_FILE = "release.yaml"
NAME_PATTERN = r"^[a-z][a-z0-9_]{0,62}$"  # an MLflow registered model, a Triton model folder and a DAG id part
ENTRYPOINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


class Task(StrEnum):
    """What the model predicts (decides which quality gates apply)."""

    REGRESSION = "regression"
    BINARY_CLASSIFICATION = "binary_classification"


class Label(StrictModel):
    """The training label: a column of an offline table, joined on the table's own key."""

    column: str = Field(min_length=1)
    table: str = Field(min_length=1, description="the offline table (folder under data/offline) holding it")


class Features(StrictModel):
    """The model's input contract: where features come from, and the columns in the model's input order."""

    service: str = Field(min_length=1, description="the Feast feature service training and serving read")
    entity_keys: tuple[str, ...] = Field(min_length=1)
    columns: tuple[str, ...] = Field(min_length=1, description="model inputs, in ONNX input order")
    # A categorical column becomes its index in this list; an unseen value becomes -1 (training and serving alike).
    vocabularies: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    label: Label

    @model_validator(mode="after")
    def _check(self) -> Features:
        for name, keys in (("columns", self.columns), ("entity_keys", self.entity_keys)):
            repeated = sorted({c for c in keys if keys.count(c) > 1})
            if repeated:
                raise ValueError(f"{name} repeat {repeated}")
        stray = sorted(set(self.vocabularies) - set(self.columns))
        if stray:
            raise ValueError(f"vocabularies name columns the model does not take: {stray}")
        empty = sorted(name for name, values in self.vocabularies.items() if not values)
        if empty:
            raise ValueError(f"vocabularies must list at least one value: {empty}")
        if self.label.column in self.columns:
            raise ValueError(f"the label {self.label.column!r} is also an input column")
        return self


class Output(StrictModel):
    """One named output of the served model (float32, one value per row)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")
    role: Literal["prediction", "score"] = Field(
        description="prediction: the answer; score: how sure the model is (a confidence or a probability)"
    )
    range: tuple[float, float] | None = Field(
        None,
        description="[lowest, highest] valid value: the gateway treats an answer outside it as a failure of the "
        "version (default: any finite value for the prediction, [0, 1] for the score)",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Output:
        if self.range is not None and not self.range[0] < self.range[1]:
            raise ValueError(f"range {list(self.range)} must be [lowest, highest] with lowest < highest")
        return self

    @property
    def valid(self) -> tuple[float, float]:
        """The valid range, with the role's default when the spec declares none."""
        if self.range is not None:
            return self.range
        return (0.0, 1.0) if self.role == "score" else (-math.inf, math.inf)


class Fallback(StrictModel):
    """What the gateway answers when no model version can (source `fallback_rule`): a rule, constants, or both.

    `rule` computes the prediction from the request's features, `rule(features, **params) -> float`; `values` gives
    constant answers per output name (every output the rule does not give needs one).
    """

    rule: str | None = Field(None, pattern=ENTRYPOINT_PATTERN, description="module:function for the prediction")
    params: dict[str, float] = Field(default_factory=dict, description="keyword arguments of the rule")
    values: dict[str, float] = Field(default_factory=dict, description="constant answers by output name")


class Training(StrictModel):
    """How a candidate is fitted: the model team's code, called by the platform on the encoded training rows.

    The entrypoint is called as `function(X, y, random_state=seed, **params)` with X the input columns in spec
    order (float, categoricals as vocabulary indexes) and y the label; it returns a fitted, picklable,
    sklearn-compatible estimator. The platform owns everything after: holdout gate, registry, export, serving.
    """

    entrypoint: str = Field(
        pattern=ENTRYPOINT_PATTERN, description="an importable `package.module:function` (installed with the steps)"
    )
    params: dict[str, bool | int | float | str] = Field(
        default_factory=dict, description="keyword arguments of the entrypoint (logged as the run's parameters)"
    )
    holdout_share: float = Field(0.2, gt=0.0, lt=0.5, description="latest share of the window held out to judge")


class RegressionGates(StrictModel):
    """The training gate's thresholds for a regression model with a confidence score (besides the run's MAE bound)."""

    min_confidence_ratio: float = Field(
        1.2, ge=1.0, description="least- over most-confident fifth's mean error on the holdout must reach this"
    )


class ClassificationGates(StrictModel):
    """The training gate's thresholds for a binary classifier's probability."""

    log_loss_tolerance: float = Field(0.02, ge=0.0, description="relative holdout log-loss excess over the champion")
    auc_tolerance: float = Field(0.01, ge=0.0, le=0.5, description="absolute holdout AUC drop below the champion")
    max_calibration_error: float = Field(0.05, gt=0.0, le=1.0, description="expected calibration error bound")
    max_positive_rate_gap: float = Field(
        0.02, gt=0.0, le=1.0, description="|mean probability - observed positive rate| bound on the holdout"
    )
    min_auc: float = Field(0.55, ge=0.5, le=1.0, description="a candidate that ranks no better than this is refused")


class Perf(StrictModel):
    """The benchmark gate against the champion (perf_analyzer, paired rounds) and the load it is measured at."""

    max_p99_ratio: float = Field(1.10, ge=1.0, description="largest challenger/champion p99 latency ratio accepted")
    min_throughput_ratio: float = Field(
        0.90, gt=0.0, le=1.0, description="smallest challenger/champion throughput ratio accepted"
    )
    peak_concurrency: int = Field(16, ge=1, le=1024, description="highest concurrency of the sweep 1, 4, 16, ...")
    # at most the exported config's max_batch_size (serving/triton_repo.py): a bigger request is refused by Triton
    peak_batch: int = Field(16, ge=1, le=256, description="rows per request at the peak (the gateway's batches)")


GATES_BY_TASK: dict[Task, type[StrictModel]] = {
    Task.REGRESSION: RegressionGates,
    Task.BINARY_CLASSIFICATION: ClassificationGates,
}


class ReleaseSpec(StrictModel):
    """Everything about one model that the pipeline needs (see module docstring)."""

    name: str = Field(pattern=NAME_PATTERN)
    task: Task
    description: str = ""
    features: Features
    outputs: tuple[Output, ...] = Field(min_length=1)
    cohorts: CohortConfig = Field(description="value-density cohorts over the request's keys and input columns")
    training: Training
    gates: RegressionGates | ClassificationGates = Field(
        default=None, validate_default=True, description="the training gate's thresholds; which ones: by task"
    )
    fallback: Fallback = Field(description="what the gateway answers when no version of the model can")
    perf: Perf = Perf()
    # Five cron fields, UTC; the nightly DAG's CronDataIntervalTimetable checks the expression when it is parsed.
    schedule: str = Field(
        "0 2 * * *",
        pattern=r"^\S+( \S+){4}$",
        description="when the model's nightly release runs (cron, UTC): each run releases the interval that closed",
    )
    rollout_plan: str = Field(
        "config/rollout_plan.yaml",
        min_length=1,
        description="the rollout plan YAML (stages over this model's cohorts), relative to the repository root",
    )
    _path: Path | None = PrivateAttr(default=None)  # the file it was read from, for errors raised after loading

    @field_validator("gates", mode="before")
    @classmethod
    def _gates_of_the_task(cls, raw: Any, info: ValidationInfo) -> Any:
        """Read `gates` as the thresholds of the spec's task (an unknown threshold for that task is an error)."""
        task = info.data.get("task")
        if task is None:  # the task itself is invalid: that error is enough
            return raw
        schema = GATES_BY_TASK[task]
        if isinstance(raw, schema):
            return raw
        try:
            return schema.model_validate(raw or {})
        except ValidationError as exc:
            raise ValueError(f"the gates of a {task} model: {validation_problems(exc)}") from None

    @model_validator(mode="after")
    def _check(self) -> ReleaseSpec:
        names = [o.name for o in self.outputs]
        if len(set(names)) != len(names):
            raise ValueError(f"outputs: names repeat in {names}")
        request_fields = {*self.features.entity_keys, *self.features.columns}
        unknown = sorted(self.cohorts.fields() - request_fields)
        if unknown:
            raise ValueError(
                f"cohorts: rules use unknown fields {unknown}; a rule may use the entity keys and input columns "
                f"{sorted(request_fields)}"
            )
        if self.cohorts.bucket_key not in self.features.entity_keys:
            raise ValueError(
                f"cohorts.bucket_key {self.cohorts.bucket_key!r} is not one of the entity keys "
                f"{list(self.features.entity_keys)}"
            )
        roles = [o.role for o in self.outputs]
        if roles.count("prediction") != 1 or roles.count("score") > 1:
            raise ValueError(f"outputs: exactly one prediction and at most one score, got roles {roles}")
        self._check_fallback()
        return self

    def _check_fallback(self) -> None:
        """Every output has a fallback answer (the prediction may come from the rule), each inside its range."""
        by_name = {o.name: o for o in self.outputs}
        unknown = sorted(set(self.fallback.values) - set(by_name))
        if unknown:
            raise ValueError(f"fallback.values names no output: {unknown} (outputs: {sorted(by_name)})")
        if self.fallback.params and self.fallback.rule is None:
            raise ValueError("fallback.params without fallback.rule: the params are the rule's")
        given = {*self.fallback.values, *([self.prediction.name] if self.fallback.rule else [])}
        missing = [name for name in by_name if name not in given]
        if missing:
            raise ValueError(f"fallback: no answer for output(s) {missing}: give fallback.values (or a rule)")
        for name, value in self.fallback.values.items():
            low, high = by_name[name].valid
            if not low <= value <= high:
                raise ValueError(f"fallback.values.{name} {value:g} is outside that output's range [{low:g}, {high:g}]")

    @property
    def output_names(self) -> tuple[str, ...]:
        """The outputs' names in declared order (the order Triton's config and the clients list them)."""
        return tuple(o.name for o in self.outputs)

    @property
    def prediction(self) -> Output:
        """The output that carries the answer."""
        return next(o for o in self.outputs if o.role == "prediction")

    @property
    def score(self) -> Output | None:
        """The output that says how sure the model is, if it declares one."""
        return next((o for o in self.outputs if o.role == "score"), None)

    @property
    def rollout_plan_path(self) -> Path:
        """The rollout plan file (a relative path is the repository root's, as the DAG's form takes it)."""
        return REPO_ROOT / self.rollout_plan

    @property
    def source(self) -> str:
        """Where the spec came from, for error messages: its file, or its name when built in code."""
        return f"release spec {self._path}" if self._path else f"release spec of {self.name}"

    def training_function(self) -> Callable[..., Any]:
        """The callable `training.entrypoint` names, imported now; an error names the spec, the field and why."""
        return _import_function(self.training.entrypoint, f"{self.source}: training.entrypoint")

    def fallback_answer(self) -> Callable[[dict[str, Any]], dict[str, float]]:
        """The gateway's answer when no version can, by output name: the rule's prediction and the constants.

        The rule is imported and its params bound now (an error names the spec and the field), so a gateway fails at
        start, not at the first outage; the rule's prediction is clipped to the output's range, as a version's answer
        outside it would not be served either.
        """
        values, prediction = dict(self.fallback.values), self.prediction.name
        if self.fallback.rule is None:
            return lambda features: values
        rule, params = _import_function(self.fallback.rule, f"{self.source}: fallback.rule"), self.fallback.params
        try:
            inspect.signature(rule).bind({}, **params)
        except TypeError as exc:
            raise StepError(f"{self.source}: fallback.params {params} do not fit {self.fallback.rule}: {exc}") from None
        low, high = self.prediction.valid
        return lambda features: {**values, prediction: min(max(float(rule(features, **params)), low), high)}

    def prediction_and_score(self) -> tuple[str, str]:
        """(prediction, score) output names, for the parts that serve both (the exporter, the gateway's client)."""
        if self.score is None:
            raise StepError(f"model {self.name}: its release spec declares no score output, and serving needs one")
        return self.prediction.name, self.score.name


def _import_function(entrypoint: str, where: str) -> Callable[..., Any]:
    """The callable a `module:function` entrypoint names; StepError naming `where` and why it is not usable."""
    module_name, _, attribute = entrypoint.partition(":")
    where = f"{where} {entrypoint!r}"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # ModuleNotFoundError, or the module's own imports failing
        raise StepError(f"{where}: module {module_name} cannot be imported: {exc}") from None
    function = getattr(module, attribute, None)
    if function is None:
        raise StepError(f"{where}: module {module_name} has no {attribute}")
    if not callable(function):
        raise StepError(f"{where}: {attribute} is a {type(function).__name__}, not a function")
    return function


def load_spec(path: Path) -> ReleaseSpec:
    """Read and validate one release spec; its `name` must be its folder's (`models/<name>/release.yaml`)."""
    spec = load_yaml_model(path, ReleaseSpec, "release spec")
    if spec.name != path.parent.name:
        raise StepError(
            f"release spec {path} is invalid: name: {spec.name!r} differs from its folder {path.parent.name!r} "
            f"(a model lives in models/<name>/{SPEC_FILE})"
        )
    spec._path = path
    return spec


def spec_paths(folder: Path = SPECS_DIR) -> list[Path]:
    """The spec files in `folder` (`<name>/release.yaml`), sorted by model folder; nothing is read."""
    return sorted(folder.glob(f"*/{SPEC_FILE}"))


def load_specs(folder: Path = SPECS_DIR) -> dict[str, ReleaseSpec]:
    """Every release spec in `folder` (`<name>/release.yaml`), by name; an empty or missing folder is an error."""
    paths = spec_paths(folder)
    if not paths:
        raise StepError(f"no release spec in {folder}: declare a model as {folder}/<name>/{SPEC_FILE}")
    return {spec.name: spec for spec in map(load_spec, paths)}


def declared_specs(folder: Path = SPECS_DIR) -> dict[str, ReleaseSpec | StepError]:
    """Every spec in `folder` by folder name, each loaded on its own: one that does not load is its error instead.

    For callers that must go on with the good ones (the DAG file: one model's broken spec never hides another's DAG).
    """
    found: dict[str, ReleaseSpec | StepError] = {}
    for path in spec_paths(folder):
        try:
            found[path.parent.name] = load_spec(path)
        except StepError as exc:
            found[path.parent.name] = exc
    return found


@functools.cache
def spec_named(name: str, folder: Path = SPECS_DIR) -> ReleaseSpec:
    """The declared model called `name`; an unknown name is an error listing the declared ones."""
    specs = load_specs(folder)
    if name not in specs:
        raise StepError(f"no model {name!r} is declared in {folder} (declared: {', '.join(sorted(specs))})")
    return specs[name]


# The model this process releases: set by whoever starts it (the Makefile, a DAG's task, a step pod, the gateway).
MODEL_ENV = "MLRELEASE_MODEL"


def process_spec(folder: Path | None = None) -> ReleaseSpec:
    """The spec of the model this process releases: the one MLRELEASE_MODEL names, else the only one declared.

    Several declared models and no MLRELEASE_MODEL is an error naming them: which one a process releases is never a
    guess. Read once per process and folder (the model's modules resolve their contracts from it at import).
    """
    return _process_spec(folder or SPECS_DIR, os.environ.get(MODEL_ENV, "").strip())


@functools.cache
def _process_spec(folder: Path, named: str) -> ReleaseSpec:
    if named:
        return spec_named(named, folder)
    specs = load_specs(folder)
    if len(specs) != 1:
        raise StepError(
            f"{folder} declares {len(specs)} models ({', '.join(specs)}): set {MODEL_ENV} to the one this process "
            "releases"
        )
    return next(iter(specs.values()))


# One nightly DAG per declared model (dags/nightly_release.py generates them from the specs folder); its id names
# the model, so whatever holds a DAG id (an alert, the report link, the report app) knows the model.
NIGHTLY_DAG_PREFIX = "nightly_release_"


def nightly_dag_id(model: str) -> str:
    """The id of model `model`'s nightly release DAG, e.g. `nightly_release_parcel_eta`."""
    return f"{NIGHTLY_DAG_PREFIX}{model}"


def model_of_nightly_dag(dag_id: str) -> str | None:
    """The model whose nightly DAG `dag_id` is, or None for another DAG."""
    return dag_id.removeprefix(NIGHTLY_DAG_PREFIX) if dag_id.startswith(NIGHTLY_DAG_PREFIX) else None


def bind_process_model(name: str, *, named_by: str) -> None:
    """Make `name` this process's model (before any model module loads); another MLRELEASE_MODEL is an error."""
    current = os.environ.get(MODEL_ENV, "").strip()
    if current and current != name:
        raise StepError(f"{named_by} names model {name!r}, but {MODEL_ENV} is {current!r} in this process")
    os.environ[MODEL_ENV] = name

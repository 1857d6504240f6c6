"""Every pipeline step declared once: its arguments, how a DAG run fills them, its pod's resources and placement.

Derived from these declarations (nothing else restates a flag, a default or a bound):
- the `mlrelease step` parser (`mlrelease.cli`, which adds one handler per step),
- the operator catalogue (`plugins/mlrelease_airflow/catalog.py`) and so the rendered pods and local commands,
- the DAG params of the trigger forms (`RunParam`: default, type, bounds, description) and their doc table.

How a DAG run fills an argument is a Jinja template (`Arg.dag`) that the operator renders per run: every step is
keyed on the run's data interval, never on the wall clock, and a retry repeats exactly the same work.
Pure data, imported by DAG files at parse time: nothing heavy may be imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlrelease.release_spec import ReleaseSpec

# Manual rollback, abort or promotion of any declared model's release (one DAG, the model picked in its form).
RELEASE_CONTROL_DAG_ID = "rollback_release"

# How a DAG run fills the arguments many steps share (rendered by Airflow per run).
INTERVAL_START = "{{ data_interval_start.isoformat() }}"
INTERVAL_END = "{{ data_interval_end.isoformat() }}"
MODEL_VERSION = "{{ ti.xcom_pull(task_ids='train')['model_version'] }}"  # train's XCom result

JSON_TYPES: dict[str, Callable[[str], Any]] = {"integer": int, "number": float, "string": str}


@dataclass(frozen=True)
class RunParam:
    """A parameter of a DAG run (a field of the trigger form): its default, JSON-schema type and bounds.

    :param type: a JSON-schema type name, or several (e.g. `("null", "integer")` for an optional number).
    :param description: shown under the form field and in the DAG's parameter table.
    """

    name: str
    default: Any
    type: str | tuple[str, ...]
    description: str
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    enum: tuple[str, ...] | None = None
    min_length: int | None = None

    @property
    def template(self) -> str:
        """The Jinja expression a task argument uses to take this parameter's value."""
        return f"{{{{ params.{self.name} }}}}"

    def schema(self) -> dict[str, Any]:
        """The form field's JSON-schema keywords (what `airflow.sdk.Param` takes besides default and description)."""
        keywords = {
            "type": list(self.type) if isinstance(self.type, tuple) else self.type,
            "minimum": self.minimum,
            "maximum": self.maximum,
            "exclusiveMinimum": self.exclusive_minimum,
            "enum": list(self.enum) if self.enum else None,
            "minLength": self.min_length,
        }
        return {k: v for k, v in keywords.items() if v is not None}


@dataclass(frozen=True)
class Arg:
    """One command-line argument of a step.

    :param type: converts the argument's text (argparse `type`); ints and floats also convert the default.
    :param switch: a flag without a value (`store_true`).
    :param dag: how a DAG run passes it: a Jinja template for the value, or True for a switch that is always given;
        None when a DAG does not pass it, or appends it per task (e.g. `--stage N`).
    """

    flag: str
    help: str | None = None
    type: Callable[[str], Any] = str
    default: Any = None
    required: bool = False
    choices: tuple[str, ...] | None = None
    switch: bool = False
    dag: str | bool | None = None
    metavar: str | None = None

    def __post_init__(self) -> None:
        if self.switch and self.dag not in (None, True):
            raise ValueError(f"{self.flag} is a switch: a DAG either passes it (dag=True) or not")
        if not self.switch and self.dag is True:
            raise ValueError(f"{self.flag} takes a value: dag must be a template")

    def dag_argv(self) -> tuple[str, ...]:
        """The argv a DAG task passes for this argument (templates unrendered); empty when it passes none."""
        if self.dag is None:
            return ()
        return (self.flag,) if self.switch else (self.flag, str(self.dag))

    def argparse_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `ArgumentParser.add_argument` for this argument."""
        if self.switch:
            return {"action": "store_true", "help": self.help}
        kwargs: dict[str, Any] = {"help": self.help}
        if self.required:
            kwargs["required"] = True
        else:
            numeric = self.type in (int, float) and self.default is not None
            kwargs["default"] = self.type(self.default) if numeric else self.default
        if self.type is not str:
            kwargs["type"] = self.type
        if self.choices:
            kwargs["choices"] = self.choices
        if self.metavar:
            kwargs["metavar"] = self.metavar
        return kwargs


def param_arg(flag: str, param: RunParam, help: str | None = None, **overrides: Any) -> Arg:
    """An argument filled from DAG param `param`, with the param's default (unless overridden) and type."""
    kind = JSON_TYPES[param.type] if isinstance(param.type, str) else str
    fields: dict[str, Any] = {"help": help, "type": kind, "default": param.default, "dag": param.template}
    return Arg(flag, **{**fields, **overrides})


@dataclass(frozen=True)
class Resources:
    """CPU and memory requests/limits in Kubernetes quantity notation, plus GPUs."""

    cpu: str = "500m"
    memory: str = "1Gi"
    cpu_limit: str = "2"
    memory_limit: str = "2Gi"
    gpus: int = 0


@dataclass(frozen=True)
class StepDef:
    """One step: `mlrelease step <name> <args…>`, and what its pod needs.

    :param image_env: variable naming a step-specific image (else the cluster's step image).
    :param routes_traffic: reads or moves the rollout's routing (the HTTPRoute router needs the Kubernetes API).
    :param in_dag: a DAG runs it as a task (it has a pod); False for a command people run by hand.
    """

    name: str
    help: str
    args: tuple[Arg, ...] = ()
    resources: Resources = field(default_factory=Resources)
    image_env: str | None = None
    routes_traffic: bool = False
    in_dag: bool = True

    def dag_args(self) -> tuple[str, ...]:
        """The argv a DAG task passes (Jinja templates, rendered per run), before any per-task extra args."""
        return tuple(item for arg in self.args for item in arg.dag_argv())


# ---- the DAG params (trigger forms) ------------------------------------------------------------------------------

MATERIALIZE_OVERLAP_HOURS = RunParam(
    "materialize_overlap_hours",
    2,
    "number",
    "Hours before the interval start to re-materialize, for late-arriving rows.",
    minimum=0,
    maximum=48,
)
REFERENCE_DAYS = RunParam(
    "reference_days",
    7,
    "integer",
    "Days of history the data gates derive their bounds and drift reference from (0 turns those off).",
    minimum=0,
    maximum=60,
)
TRAINING_DAYS = RunParam(
    "training_days",
    7,
    "integer",
    "Days of labelled orders before the interval end to train on.",
    minimum=1,
    maximum=90,
)
MAE_TOLERANCE = RunParam(
    "mae_tolerance",
    0.05,
    "number",
    "How much worse than the champion's holdout MAE a candidate may be (0.05 = 5 %).",
    minimum=0,
    maximum=1,
)
# The model's release spec declares the defaults of these three (its perf limits and rollout plan): each model's
# form shows its own (`nightly_params`); a step run by hand without the flag takes its process model's.
MAX_P99_RATIO = RunParam(
    "max_p99_ratio",
    None,
    "number",
    "Largest challenger/champion p99 latency ratio accepted (default: the release spec's perf.max_p99_ratio).",
    minimum=1,
)
MIN_THROUGHPUT_RATIO = RunParam(
    "min_throughput_ratio",
    None,
    "number",
    "Smallest challenger/champion throughput ratio accepted (default: the release spec's perf.min_throughput_ratio).",
    exclusive_minimum=0,
    maximum=1,
)
ROLLOUT_PROFILE = RunParam(
    "rollout_profile",
    "production",
    "string",
    "Stage durations: production (1 h, 1 h, 24 h) or demo (seconds).",
    enum=("production", "demo"),
)
ROLLOUT_PLAN = RunParam(
    "rollout_plan",
    None,
    "string",
    "The rollout plan YAML, relative to the repository root (stages, guardrails, breach actions; default: the "
    "release spec's rollout_plan).",
    min_length=1,
)
PSI_THRESHOLD = RunParam(
    "psi_threshold",
    0.25,
    "number",
    "Largest Population Stability Index accepted for a key feature.",
    exclusive_minimum=0,
    maximum=5,
)
# A nightly DAG's form, in form order; `nightly_params(spec)` fills in the model's own defaults.
NIGHTLY_FORM = (
    MATERIALIZE_OVERLAP_HOURS,
    REFERENCE_DAYS,
    TRAINING_DAYS,
    MAE_TOLERANCE,
    MAX_P99_RATIO,
    MIN_THROUGHPUT_RATIO,
    ROLLOUT_PROFILE,
    ROLLOUT_PLAN,
    PSI_THRESHOLD,
)


def nightly_params(spec: ReleaseSpec) -> tuple[RunParam, ...]:
    """Model `spec`'s nightly form: its perf limits and rollout plan are the defaults of their fields."""
    from_spec = {
        MAX_P99_RATIO.name: spec.perf.max_p99_ratio,
        MIN_THROUGHPUT_RATIO.name: spec.perf.min_throughput_ratio,
        ROLLOUT_PLAN.name: spec.rollout_plan,
    }
    return tuple(replace(p, default=from_spec.get(p.name, p.default)) for p in NIGHTLY_FORM)


MANUAL_ACTIONS = ("rollback_to_version", "abort_rollout", "promote_paused")
MODEL = RunParam("model", None, "string", "The declared model to act on.")  # the models: release_control_params
ACTION = RunParam("action", MANUAL_ACTIONS[0], "string", "What to do.", enum=MANUAL_ACTIONS)
TARGET_VERSION = RunParam(
    "target_version",
    None,
    ("null", "integer"),
    "For rollback_to_version: the model version to serve and make champion.",
    minimum=1,
)
REASON = RunParam("reason", "manual rollback from the Airflow UI", "string", "Recorded.", min_length=3)
# The rollback_release DAG's form; `release_control_params(models)` offers the declared models.
RELEASE_CONTROL_FORM = (MODEL, ACTION, TARGET_VERSION, REASON)


def release_control_params(models: Iterable[str]) -> tuple[RunParam, ...]:
    """The rollback_release form, its `model` field offering the declared `models` (the first is the default)."""
    names = tuple(models)
    if not names:
        raise ValueError("no model is declared (models/<name>/release.yaml): the rollback form has none to offer")
    model = replace(MODEL, default=names[0], enum=names)
    return tuple(model if p is MODEL else p for p in RELEASE_CONTROL_FORM)


# ---- the steps ---------------------------------------------------------------------------------------------------

START = Arg("--start", "window start, ISO-8601 (the data interval start)", required=True, dag=INTERVAL_START)
END = Arg("--end", "window end, ISO-8601 (the data interval end)", required=True, dag=INTERVAL_END)
WINDOW = (START, END)
VERSION = Arg("--model-version", required=True, dag=MODEL_VERSION)
# Rollout steps are keyed on the candidate and the run's data interval end (one rollout per run).
RELEASE = (
    VERSION,
    Arg("--end", "the run's data interval end, ISO-8601 (keys the rollout)", required=True, dag=INTERVAL_END),
)
STAGE = Arg("--stage", "stage number, from 1", type=int, required=True)  # appended per stage by the DAG
PLAN = param_arg("--plan", ROLLOUT_PLAN, "rollout plan YAML (default: the release spec's rollout_plan)", default="")
OVERRIDE_HELP = "route a version whose export/validation/benchmark/shadow gate failed or never ran (recorded, alerted)"
OVERRIDE = Arg("--override-gates", OVERRIDE_HELP, default="", metavar="REASON")
SMALL = Resources(cpu="250m", memory="512Mi")
DATA = Resources(cpu="1", memory="2Gi", cpu_limit="2", memory_limit="4Gi")

_DECLARED = (
    StepDef("apply-features", "feast apply", resources=SMALL),
    StepDef(
        "materialize",
        "materialize one window into the online store",
        (*WINDOW, param_arg("--overlap-hours", MATERIALIZE_OVERLAP_HOURS, "also reload this much before --start")),
        resources=DATA,
    ),
    StepDef(
        "check-freshness",
        "fail when a feature view is older than its budget",
        (Arg("--end", "reference time, ISO-8601 (the data interval end)", required=True, dag=INTERVAL_END),),
        resources=SMALL,
    ),
    StepDef(
        "validate-data",
        "gate every source partition the run loads or trains on (GX suites, drift, contract)",
        (
            *WINDOW,
            param_arg(
                "--overlap-hours", MATERIALIZE_OVERLAP_HOURS, "materialize's overlap: validate this much before --start"
            ),
            # Run by hand it checks only the interval; the DAG passes train's window so train reads approved data.
            param_arg(
                "--training-days",
                TRAINING_DAYS,
                "also validate not-yet-approved partitions of train's window",
                default=0,
            ),
            param_arg("--reference-days", REFERENCE_DAYS, "days of history to derive bounds and drift from"),
            param_arg("--psi-threshold", PSI_THRESHOLD),
        ),
        resources=DATA,
    ),
    StepDef(
        "train",
        "train a candidate and register it as challenger",
        (
            *WINDOW,
            param_arg("--training-days", TRAINING_DAYS, "days of labelled orders before --end to learn from"),
            param_arg("--mae-tolerance", MAE_TOLERANCE, "allowed holdout MAE excess over the champion"),
        ),
        resources=Resources(cpu="2", memory="4Gi", cpu_limit="4", memory_limit="8Gi"),
    ),
    StepDef(
        "export",
        "export a registered version to ONNX and the Triton repository",
        (VERSION,),
        resources=Resources(cpu="1", memory="2Gi"),
    ),
    StepDef(
        "validate-serving",
        "load a version into Triton and check its answers",
        (VERSION, Arg("--revalidate", "load a version that already failed, again", switch=True)),
        resources=SMALL,
    ),
    StepDef(
        "benchmark",
        "perf_analyzer gate: challenger vs champion",
        (
            VERSION,
            param_arg("--max-p99-ratio", MAX_P99_RATIO, "default: the release spec's perf.max_p99_ratio"),
            param_arg(
                "--min-throughput-ratio", MIN_THROUGHPUT_RATIO, "default: the release spec's perf.min_throughput_ratio"
            ),
            # The load is the release spec's; the measurement's own settings default to PerfSettings'.
            Arg(
                "--peak-concurrency",
                "highest concurrency of the sweep 1, 4, 16, ... (default: the release spec's perf.peak_concurrency)",
                type=int,
            ),
            Arg(
                "--peak-batch",
                "rows per request at the peak, the gateway's batches (default: the release spec's perf.peak_batch)",
                type=int,
            ),
            Arg("--measurement-interval", "milliseconds per measurement window", type=int, default=500),
            Arg("--rounds", "paired rounds over every level; the sign test counts harmed ones", type=int, default=9),
            Arg("--max-false-fail", "declared rate of refusing a candidate at the tolerance", type=float, default=0.02),
        ),
        # perf_analyzer runs on a GPU node next to the GPU Triton it measures, from the Triton SDK image.
        resources=Resources(cpu="2", memory="2Gi", cpu_limit="4", memory_limit="4Gi", gpus=1),
        image_env="MLRELEASE_K8S_PERF_IMAGE",
    ),
    StepDef(
        "shadow",
        "replay the interval's orders through candidate and stable; gate on the differences",
        (*RELEASE, PLAN),
        resources=Resources(cpu="1", memory="1Gi"),
    ),
    StepDef(
        "rollout-stage",
        "open one stage of the rollout (route its cohorts to the candidate)",
        (
            *RELEASE,
            STAGE,
            param_arg("--profile", ROLLOUT_PROFILE, choices=ROLLOUT_PROFILE.enum),
            Arg("--wired-stages", "stages the DAG wires; the plan must match", type=int),  # appended by the DAG
            PLAN,
            OVERRIDE,
        ),
        resources=SMALL,
        routes_traffic=True,
    ),
    # One look per pod (`--tick`): while undecided the operator defers until the step's next_check_at.
    StepDef(
        "analyze",
        "judge one stage's guardrails and act (advance, roll back, pause)",
        (
            *RELEASE,
            STAGE,
            Arg(
                "--tick",
                "look once: exit 0 with decided=false and next_check_at if undecided",
                switch=True,
                dag=True,
            ),
            Arg("--poll-s", "without --tick: seconds between looks (default: the stage's)", type=float),
            Arg(
                "--ask",
                "a pause (or a promotion the plan wants confirmed) is a question for the approval task that follows: "
                "exit 0 with it in the result (without: a pause exits skipped)",
                switch=True,
                dag=True,
            ),
        ),
        resources=Resources(cpu="500m", memory="1Gi"),
        routes_traffic=True,
    ),
    # After the approval task of a stage that asked (the DAG appends --stage N and --answer from its XCom).
    StepDef(
        "answer",
        "carry out a human's answer to a stage's question: promote past it, roll back, or extend it",
        (
            *RELEASE,
            STAGE,
            Arg("--answer", "the approval task's answer (JSON: stage, question, choice, at, by)", required=True),
            Arg("--tick", "extend: look once per call, as analyze --tick", switch=True, dag=True),
            Arg("--poll-s", "extend, without --tick: seconds between looks (default: the stage's)", type=float),
        ),
        resources=Resources(cpu="500m", memory="1Gi"),
        routes_traffic=True,
    ),
    StepDef(
        "promote",
        "make the candidate champion once every stage passed",
        (*RELEASE, OVERRIDE),
        resources=SMALL,
        routes_traffic=True,
    ),
    StepDef(
        "retire",
        "unload the previous champion after the keep window",
        RELEASE,
        resources=SMALL,
        routes_traffic=True,
    ),
    # The rollback_release DAG: a human's rollback, abort or promotion, with the trigger form's params.
    StepDef(
        "manual-release",
        "a human's rollback to a version, abort, or paused promotion",
        (
            param_arg("--action", ACTION, required=True, choices=MANUAL_ACTIONS, default=None),
            param_arg("--model", MODEL, required=True, default=None),
            param_arg(
                "--to-version",
                TARGET_VERSION,
                "for rollback_to_version",
                default="",
                dag="{{ params.target_version or '' }}",
            ),
            param_arg(
                "--reason",
                REASON,
                "recorded on the versions and in the rollout history",
                default="manual",
                dag="{{ params.reason }} (rollback_release run {{ run_id }})",
            ),
        ),
        resources=SMALL,
        routes_traffic=True,
    ),
    StepDef(
        "rollback",
        "take traffic off the candidate (everything or one cohort)",
        (
            Arg("--end", "only the rollout of this run (data interval end)", default="", dag=INTERVAL_END),
            Arg("--cohort", "roll back this cohort only"),
            Arg("--to-version", "make this version champion and route everything to it", default=""),
            Arg(
                "--reason",
                "recorded on the version and in the alert",
                default="manual rollback",
                dag="{{ dag.dag_id }} run {{ run_id }} failed",
            ),
        ),
        resources=SMALL,
        routes_traffic=True,
    ),
    StepDef(
        "diagnose",
        "rank a cohort's features by shift against training data",
        (
            Arg("--cohort", required=True),
            Arg("--hours", "recent traffic to look at", type=float, default=1.0),
            Arg("--end", "data interval end: training data is the days before it", required=True),
        ),
        in_dag=False,
    ),
    # The release report of the run, whatever its outcome (a teardown: it never changes the run's verdict).
    StepDef(
        "report",
        "the run's release report: one HTML page with plots, logged to MLflow",
        (
            Arg("--end", "data interval end of the run", required=True, dag=INTERVAL_END),
            Arg("--no-mlflow", "do not log the report to the MLflow run", switch=True),
        ),
        resources=SMALL,
    ),
)
STEPS: dict[str, StepDef] = {step.name: step for step in _DECLARED}
"""Every `mlrelease step` command by name, in `--help` order."""

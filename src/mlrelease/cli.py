"""The `mlrelease` command line: data generation, pipeline steps, serving, gateway and deploy commands.

The `step` commands' arguments are declared in `mlrelease.stepdefs` (one declaration, shared with the operator
catalogue and the DAG params); this module adds one handler per step. Heavy libraries are imported inside each
command so `mlrelease --help` stays instant.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from mlrelease.deploy.cli import register as add_deploy_commands
from mlrelease.errors import GateFailed, Skipped, StepError
from mlrelease.exit_codes import (  # the CLI's contract, importable from here too
    EXIT_CRASH,
    EXIT_GATE_FAILED,
    EXIT_OK,
    EXIT_SKIPPED,
    EXIT_STEP_ERROR,
    STATUS_FAILED,
    STATUS_SKIPPED,
    STATUS_SUCCESS,
)
from mlrelease.gateway.cli import add_commands as add_gateway_commands
from mlrelease.models_cli import add_commands as add_models_commands
from mlrelease.outcome import StepRun
from mlrelease.settings import Settings
from mlrelease.stepdefs import STEPS, StepDef
from mlrelease.timewindow import Window, parse_date, parse_timestamp

Handler = Callable[[argparse.Namespace, Settings], dict[str, Any]]


def _cmd_generate(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.data.generate import generate

    totals = generate(
        settings.offline_dir,
        parse_date(args.start, name="--start"),
        parse_date(args.end, name="--end"),
        rows_per_day=args.rows_per_day,
        seed=args.seed,
        inject=args.inject,
    )
    return {"offline_dir": str(settings.offline_dir), "rows": totals, "inject": args.inject}


def _step_apply_features(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.apply_features import apply_features

    return apply_features(settings)


def _step_materialize(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.materialize import materialize

    if args.overlap_hours < 0:
        raise ValueError(f"--overlap-hours must not be negative, got {args.overlap_hours}")
    return materialize(settings, Window.parse(args.start, args.end), timedelta(hours=args.overlap_hours))


def _step_check_freshness(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.check_freshness import check_freshness

    return check_freshness(settings, parse_timestamp(args.end, name="--end"))


def _step_validate_data(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.validate_data import validate_data

    for flag, value in (("--reference-days", args.reference_days), ("--training-days", args.training_days)):
        if value < 0:
            raise ValueError(f"{flag} must not be negative, got {value}")
    if args.overlap_hours < 0:
        raise ValueError(f"--overlap-hours must not be negative, got {args.overlap_hours}")
    return validate_data(
        settings,
        Window.parse(args.start, args.end),
        overlap=timedelta(hours=args.overlap_hours),
        training_days=args.training_days,
        reference_days=args.reference_days,
        psi_threshold=args.psi_threshold,
    )


def _step_train(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.train import train

    if args.training_days < 1:
        raise ValueError(f"--training-days must be at least 1, got {args.training_days}")
    return train(
        settings, Window.parse(args.start, args.end), training_days=args.training_days, mae_tolerance=args.mae_tolerance
    )


def _model_version(value: str) -> int:
    try:
        version = int(value)
    except ValueError:
        raise ValueError(f"--model-version must be a positive integer, got {value!r}") from None
    if version < 1:
        raise ValueError(f"--model-version must be a positive integer, got {value!r}")
    return version


def _step_export(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.export import export

    return export(settings, _model_version(args.model_version))


def _step_validate_serving(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.validate_serving import validate_serving

    return validate_serving(settings, _model_version(args.model_version), revalidate=args.revalidate)


def _step_benchmark(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.release_spec import process_spec
    from mlrelease.serving.perf import PerfSettings
    from mlrelease.steps.benchmark import benchmark

    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
    declared = process_spec().perf  # the model's own limits and peak load, where a flag does not override them
    perf = PerfSettings(  # refuses a sweep or a test that cannot work (e.g. too few rounds for --max-false-fail)
        measurement_interval_ms=args.measurement_interval,
        rounds=args.rounds,
        peak_concurrency=_given(args.peak_concurrency, declared.peak_concurrency),
        peak_batch=_given(args.peak_batch, declared.peak_batch),
        max_false_fail=args.max_false_fail,
    )
    return benchmark(
        settings,
        _model_version(args.model_version),
        max_p99_ratio=_given(args.max_p99_ratio, declared.max_p99_ratio),
        min_throughput_ratio=_given(args.min_throughput_ratio, declared.min_throughput_ratio),
        perf=perf,
    )


def _given(flag: Any, declared: Any) -> Any:
    """A flag's value when it was given, else the release spec's."""
    return declared if flag is None else flag


def _plan_path(args: argparse.Namespace) -> Any:
    from pathlib import Path

    from mlrelease.settings import REPO_ROOT

    if not args.plan:
        return None
    path = Path(args.plan)
    return path if path.is_absolute() else REPO_ROOT / path


def _run_key(args: argparse.Namespace) -> str:
    from mlrelease.timewindow import run_key

    return run_key(parse_timestamp(args.end, name="--end"))


def _stage(args: argparse.Namespace) -> int:
    if args.stage < 1:
        raise ValueError(f"--stage counts from 1, got {args.stage}")
    return int(args.stage)


def _step_shadow(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.shadow import shadow

    end = parse_timestamp(args.end, name="--end")
    return shadow(settings, _model_version(args.model_version), end, plan_path=_plan_path(args))


def _step_rollout_stage(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.rollout import rollout_stage

    version = _model_version(args.model_version)
    return rollout_stage(
        settings,
        _stage(args),
        version,
        _run_key(args),
        profile=args.profile,
        plan_path=_plan_path(args),
        wired_stages=args.wired_stages,
        override_gates=args.override_gates or None,
    )


def _step_analyze(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.rollout import analyze

    return analyze(
        settings,
        _stage(args),
        _model_version(args.model_version),
        _run_key(args),
        tick=args.tick,
        poll_s=args.poll_s,
        ask=args.ask,
    )


def _step_answer(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.rollout import answer

    version, stage = _model_version(args.model_version), _stage(args)
    return answer(settings, stage, version, _run_key(args), args.answer, tick=args.tick, poll_s=args.poll_s)


def _step_promote(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.rollout import promote

    return promote(
        settings, _model_version(args.model_version), _run_key(args), override_gates=args.override_gates or None
    )


def _step_manual_release(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.registry import MODEL_NAME
    from mlrelease.steps.rollout import promote_paused, rollback, rollback_to

    if args.model != MODEL_NAME:
        raise StepError(f"--model {args.model!r} is not released by this pipeline; it releases {MODEL_NAME!r}")
    if args.action == "rollback_to_version":
        if not args.to_version:
            raise StepError("action rollback_to_version needs a target version")
        return rollback_to(settings, _model_version(args.to_version), reason=args.reason)
    if args.action == "abort_rollout":
        return rollback(settings, None, reason=args.reason)
    return promote_paused(settings)


def _step_rollback(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.rollout import rollback, rollback_to

    if args.to_version:
        return rollback_to(settings, _model_version(args.to_version), reason=args.reason)
    run_key = _run_key(args) if args.end else None
    return rollback(settings, run_key, cohort=args.cohort, reason=args.reason)


def _step_retire(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.rollout import retire

    return retire(settings, _model_version(args.model_version), _run_key(args))


def _step_diagnose(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.diagnose import diagnose_recent

    end = parse_timestamp(args.end, name="--end")
    return diagnose_recent(settings, args.cohort, hours=args.hours, data_end=end)


def _step_report(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.report import build_report

    return build_report(settings, parse_timestamp(args.end, name="--end"), log_to_mlflow=not args.no_mlflow)


def _cmd_rollout_status(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.rollout import status

    return status(settings)


def _cmd_triton(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.serving import local_triton

    action = {"up": local_triton.up, "down": local_triton.down, "status": local_triton.status}[args.action]
    return action(settings)


def _cmd_summary(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.summary import format_summary

    print(format_summary(settings, parse_timestamp(args.end, name="--end")))
    return {}


# The handler of every `mlrelease step` command; their arguments come from mlrelease.stepdefs.STEPS.
STEP_HANDLERS: dict[str, Handler] = {
    "apply-features": _step_apply_features,
    "materialize": _step_materialize,
    "check-freshness": _step_check_freshness,
    "validate-data": _step_validate_data,
    "train": _step_train,
    "export": _step_export,
    "validate-serving": _step_validate_serving,
    "benchmark": _step_benchmark,
    "shadow": _step_shadow,
    "rollout-stage": _step_rollout_stage,
    "analyze": _step_analyze,
    "answer": _step_answer,
    "promote": _step_promote,
    "retire": _step_retire,
    "manual-release": _step_manual_release,
    "rollback": _step_rollback,
    "diagnose": _step_diagnose,
    "report": _step_report,
}


def _add_step(steps: Any, step: StepDef, handler: Handler) -> None:
    """One `mlrelease step <name>` parser, from the step's declaration."""
    parser = steps.add_parser(step.name, help=step.help)
    for arg in step.args:
        parser.add_argument(arg.flag, **arg.argparse_kwargs())
    parser.set_defaults(handler=handler)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every `mlrelease` command."""
    parser = argparse.ArgumentParser(prog="mlrelease", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    data = sub.add_parser("data", help="synthetic data").add_subparsers(dest="data_command", required=True)
    gen = data.add_parser("generate", help="write date-partitioned parquet for [--start, --end]")
    gen.add_argument("--start", required=True, help="first day, YYYY-MM-DD")
    gen.add_argument("--end", required=True, help="last day (inclusive), YYYY-MM-DD")
    gen.add_argument("--rows-per-day", type=int, default=2_000)
    gen.add_argument("--seed", type=int, default=7)
    # Equal to mlrelease.data.generate.INJECT_MODES (a test checks it); a literal so --help needs no pandas.
    gen.add_argument(
        "--inject",
        choices=(
            "nulls",
            "drift",
            "schema",
            "stale",
            "duplicates",
            "late_events",
            "empty_partition",
            "stuck_column",
            "republished",
            "orphans",
            "naive_timestamps",
            "units",
            "negative_values",
            "republished_new_ids",
            "appended_twice",
            "packages_after_orders",
            "feed_outage",
        ),
    )
    gen.set_defaults(handler=_cmd_generate, result_to_xcom=False)

    steps = sub.add_parser("step", help="run one pipeline step").add_subparsers(dest="step", required=True)
    if set(STEPS) != set(STEP_HANDLERS):
        raise RuntimeError(f"steps without a handler or a declaration: {sorted(set(STEPS) ^ set(STEP_HANDLERS))}")
    for step in STEPS.values():
        _add_step(steps, step, STEP_HANDLERS[step.name])

    rollout = sub.add_parser("rollout", help="the staged rollout").add_subparsers(dest="rollout_command", required=True)
    rollout.add_parser("status", help="the current rollout, its stages, verdicts and routing").set_defaults(
        handler=_cmd_rollout_status, result_to_xcom=False
    )

    add_models_commands(sub)

    triton = sub.add_parser("triton", help="the local CPU Triton server (embedded default)")
    triton.add_argument("action", choices=["up", "down", "status"])
    triton.set_defaults(handler=_cmd_triton, result_to_xcom=False)

    summary = sub.add_parser("summary", help="print what a run did and where its artifacts are")
    summary.add_argument("--end", required=True, help="the run's data interval end, ISO-8601")
    summary.set_defaults(handler=_cmd_summary, result_to_xcom=False, quiet=True)
    add_gateway_commands(sub)
    add_deploy_commands(sub)
    return parser


TERMINATION_LOG = "/dev/termination-log"  # Kubernetes' default terminationMessagePath


def _fail(line: str, code: int) -> int:
    """Print the one-line error; in a pod also leave it as the termination message, which the KPO reports."""
    print(line, file=sys.stderr)
    if os.path.exists(TERMINATION_LOG):
        try:
            with open(TERMINATION_LOG, "w", encoding="utf-8") as fh:
                fh.write(line[:4000])  # Kubernetes keeps at most 4 KiB
        except OSError:
            pass
    return code


Outcome = tuple[int, dict[str, Any]]  # exit code, and the outcome: status with result, error or reason


def _execute(handler: Handler, args: argparse.Namespace, label: str) -> Outcome:
    """Run the handler and write its result to the XCom path; map the errors a step raises to exit codes.

    Anything else (a bug) propagates: the caller records it and Python exits 1 with the traceback.
    """
    try:
        settings = Settings.from_env()
        result = handler(args, settings)
        if getattr(args, "result_to_xcom", True):
            from mlrelease.xcom import write_result

            write_result(settings.xcom_path, result)
    except GateFailed as exc:
        return EXIT_GATE_FAILED, {"status": STATUS_FAILED, "error": f"{label}: error: {exc}"}
    except Skipped as exc:
        return EXIT_SKIPPED, {"status": STATUS_SKIPPED, "reason": f"{label}: skipped: {exc}"}
    except (StepError, ValueError, OSError) as exc:
        return EXIT_STEP_ERROR, {"status": STATUS_FAILED, "error": f"{label}: error: {exc}"}
    except Exception as exc:
        mlflow_errors = sys.modules.get("mlflow.exceptions")  # only if a step imported MLflow
        if mlflow_errors is None or not isinstance(exc, mlflow_errors.MlflowException):
            raise
        return EXIT_STEP_ERROR, {"status": STATUS_FAILED, "error": f"{label}: error: MLflow: {exc.message}"}
    return EXIT_OK, {"status": STATUS_SUCCESS, "result": result}


def _record(step_run: StepRun | None, args: argparse.Namespace, label: str, code: int, outcome: dict[str, Any]) -> None:
    """Record a step's outcome under the run's artifacts (for the summary, the report and the alerts).

    Never changes the step's exit code: a step that did its work (moved an alias, routed traffic) must not turn
    into a failure, and so a rollback, because its record could not be written; the problem is printed instead.
    """
    if step_run is None:
        return
    try:
        step_run.record(Settings.from_env(), args.step, outcome, exit_code=code)
    except (OSError, ValueError) as exc:
        print(f"{label}: warning: outcome of task {step_run.task_id} not recorded: {exc}", file=sys.stderr)


def run(handler: Handler, args: argparse.Namespace) -> int:
    """Run one command: print its JSON result (steps: also to the XCom path) or its one-line error; the exit code.

    A step run by a DAG task (`StepRun.from_env`) also records its outcome, whatever it is, even a crash.
    """
    import json

    label = f"mlrelease step {args.step}" if args.command == "step" else f"mlrelease {args.command}"
    try:
        step_run = StepRun.from_env() if args.command == "step" else None
    except ValueError as exc:  # the runner passed a malformed identity: nowhere to record, so say so and stop
        return _fail(f"{label}: error: {exc}", EXIT_STEP_ERROR)
    try:
        code, outcome = _execute(handler, args, label)
    except Exception as exc:
        line = f"{label}: error: unexpected {type(exc).__name__}: {exc}"
        _record(step_run, args, label, EXIT_CRASH, {"status": STATUS_FAILED, "error": line})
        _fail(line, EXIT_CRASH)  # the one line first (the runners report it), then Python's traceback and exit 1
        raise
    _record(step_run, args, label, code, outcome)
    if code != EXIT_OK:
        return _fail(str(outcome.get("error") or outcome.get("reason")), code)
    if not getattr(args, "quiet", False):
        print(json.dumps(outcome["result"], indent=2, default=str))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `mlrelease` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    return run(args.handler, args)


if __name__ == "__main__":
    sys.exit(main())

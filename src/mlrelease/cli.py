"""The `mlrelease` command line: data generation, pipeline steps, pod rendering.

Heavy libraries are imported inside each command so `mlrelease --help` stays instant.
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
from mlrelease.gateway.cli import add_commands as add_gateway_commands
from mlrelease.settings import Settings
from mlrelease.timewindow import Window, parse_date, parse_timestamp

EXIT_STEP_ERROR = 2  # something to fix or retry
EXIT_GATE_FAILED = 3  # a gate's verdict: retrying the same inputs gives the same answer
EXIT_SKIPPED = 4  # nothing to do (bootstrap, a paused rollout): the task ends as skipped, downstream too


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
    from mlrelease.serving.perf import PerfSettings
    from mlrelease.steps.benchmark import benchmark

    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
    perf = PerfSettings(
        concurrency_range=args.concurrency_range, measurement_interval_ms=args.measurement_interval, rounds=args.rounds
    )
    return benchmark(
        settings,
        _model_version(args.model_version),
        max_p99_ratio=args.max_p99_ratio,
        min_throughput_ratio=args.min_throughput_ratio,
        perf=perf,
    )


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
    return int(args.stage) - 1


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
        settings, _stage(args), _model_version(args.model_version), _run_key(args), tick=args.tick, poll_s=args.poll_s
    )


def _step_promote(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.steps.rollout import promote

    return promote(
        settings, _model_version(args.model_version), _run_key(args), override_gates=args.override_gates or None
    )


OVERRIDE_HELP = "route a version whose export/validation/benchmark/shadow gate failed or never ran (recorded, alerted)"
MANUAL_ACTIONS = ("rollback_to_version", "abort_rollout", "promote_paused")


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


def _add_rollout_steps(steps: Any) -> None:
    """The rollout steps: shadow, rollout-stage, analyze, promote, rollback, retire, diagnose."""

    def release(name: str, text: str, handler: Any) -> argparse.ArgumentParser:
        sp = steps.add_parser(name, help=text)
        sp.add_argument("--model-version", required=True)
        sp.add_argument("--end", required=True, help="the run's data interval end, ISO-8601 (keys the rollout)")
        sp.set_defaults(handler=handler)
        return sp

    sh = release(
        "shadow", "replay the interval's orders through candidate and stable; gate on the differences", _step_shadow
    )
    sh.add_argument("--plan", default="", help="rollout plan YAML (default config/rollout_plan.yaml)")
    st = release(
        "rollout-stage", "open one stage of the rollout (route its cohorts to the candidate)", _step_rollout_stage
    )
    st.add_argument("--stage", type=int, required=True, help="stage number, from 1")
    st.add_argument("--profile", choices=["production", "demo"], default="production")
    st.add_argument("--wired-stages", type=int, default=None, help="stages the DAG wires; the plan must match")
    st.add_argument("--plan", default="", help="rollout plan YAML (default config/rollout_plan.yaml)")
    st.add_argument("--override-gates", default="", metavar="REASON", help=OVERRIDE_HELP)
    an = release("analyze", "judge one stage's guardrails and act (advance, roll back, pause)", _step_analyze)
    an.add_argument("--stage", type=int, required=True, help="stage number, from 1")
    an.add_argument(
        "--tick", action="store_true", help="look once: exit 0 with decided=false and next_check_at if undecided"
    )
    an.add_argument(
        "--poll-s", type=float, default=None, help="without --tick: seconds between looks (default: the stage's)"
    )
    pr = release("promote", "make the candidate champion once every stage passed", _step_promote)
    pr.add_argument("--override-gates", default="", metavar="REASON", help=OVERRIDE_HELP)
    release("retire", "unload the previous champion after the keep window", _step_retire)
    hand = steps.add_parser("manual-release", help="a human's rollback to a version, abort, or paused promotion")
    hand.add_argument("--action", choices=MANUAL_ACTIONS, required=True)
    hand.add_argument("--model", required=True)
    hand.add_argument("--to-version", default="", help="for rollback_to_version")
    hand.add_argument("--reason", default="manual", help="recorded on the versions and in the rollout history")
    hand.set_defaults(handler=_step_manual_release)
    rb = steps.add_parser("rollback", help="take traffic off the candidate (everything or one cohort)")
    rb.add_argument("--end", default="", help="only the rollout of this run (data interval end)")
    rb.add_argument("--cohort", default=None, help="roll back this cohort only")
    rb.add_argument("--to-version", default="", help="make this version champion and route everything to it")
    rb.add_argument("--reason", default="manual rollback", help="recorded on the version and in the alert")
    rb.set_defaults(handler=_step_rollback)
    dg = steps.add_parser("diagnose", help="rank a cohort's features by shift against training data")
    dg.add_argument("--cohort", required=True)
    dg.add_argument("--hours", type=float, default=1.0, help="recent traffic to look at")
    dg.add_argument("--end", required=True, help="data interval end: training data is the days before it")
    dg.set_defaults(handler=_step_diagnose)
    rep = steps.add_parser("report", help="the run's release report: one HTML page with plots, logged to MLflow")
    rep.add_argument("--end", required=True, help="data interval end of the run")
    rep.add_argument("--no-mlflow", action="store_true", help="do not log the report to the MLflow run")
    rep.set_defaults(handler=_step_report)


def _cmd_triton(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.serving import local_triton

    action = {"up": local_triton.up, "down": local_triton.down, "status": local_triton.status}[args.action]
    return action(settings)


def _cmd_render_pods(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.render import render_pods

    return render_pods(args.out, kubernetes_version=args.kubernetes_version)


def _cmd_summary(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.summary import format_summary

    print(format_summary(settings, parse_timestamp(args.end, name="--end")))
    return {}


def _window_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--start", required=True, help="window start, ISO-8601 (the data interval start)")
    parser.add_argument("--end", required=True, help="window end, ISO-8601 (the data interval end)")


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
        ),
    )
    gen.set_defaults(handler=_cmd_generate, result_to_xcom=False)

    steps = sub.add_parser("step", help="run one pipeline step").add_subparsers(dest="step", required=True)
    steps.add_parser("apply-features", help="feast apply").set_defaults(handler=_step_apply_features)
    mat = steps.add_parser("materialize", help="materialize one window into the online store")
    _window_args(mat)
    mat.add_argument("--overlap-hours", type=float, default=2.0, help="also reload this much before --start")
    mat.set_defaults(handler=_step_materialize)
    fresh = steps.add_parser("check-freshness", help="fail when a feature view is older than its budget")
    fresh.add_argument("--end", required=True, help="reference time, ISO-8601 (the data interval end)")
    fresh.set_defaults(handler=_step_check_freshness)
    val = steps.add_parser(
        "validate-data", help="gate every source partition the run loads or trains on (GX suites, drift, contract)"
    )
    _window_args(val)
    val.add_argument(
        "--overlap-hours", type=float, default=2.0, help="materialize's overlap: validate this much before --start"
    )
    val.add_argument(
        "--training-days", type=int, default=0, help="also validate not-yet-approved partitions of train's window"
    )
    val.add_argument("--reference-days", type=int, default=7, help="days of history to derive bounds and drift from")
    val.add_argument("--psi-threshold", type=float, default=0.25)
    val.set_defaults(handler=_step_validate_data)

    tr = steps.add_parser("train", help="train a candidate and register it as challenger")
    _window_args(tr)
    tr.add_argument("--training-days", type=int, default=7, help="days of labelled orders before --end to learn from")
    tr.add_argument("--mae-tolerance", type=float, default=0.05, help="allowed holdout MAE excess over the champion")
    tr.set_defaults(handler=_step_train)
    for name, handler, text in (
        ("export", _step_export, "export a registered version to ONNX and the Triton repository"),
        ("validate-serving", _step_validate_serving, "load a version into Triton and check its answers"),
    ):
        sp = steps.add_parser(name, help=text)
        sp.add_argument("--model-version", required=True)
        sp.set_defaults(handler=handler)
        if name == "validate-serving":
            sp.add_argument("--revalidate", action="store_true", help="load a version that already failed, again")
    bench = steps.add_parser("benchmark", help="perf_analyzer gate: challenger vs champion")
    bench.add_argument("--model-version", required=True)
    bench.add_argument("--max-p99-ratio", type=float, default=1.10)
    bench.add_argument("--min-throughput-ratio", type=float, default=0.90)
    bench.add_argument("--concurrency-range", default="1:4:3")
    bench.add_argument("--measurement-interval", type=int, default=1000, help="milliseconds per measurement window")
    bench.add_argument("--rounds", type=int, default=3, help="interleaved rounds per version; medians are compared")
    bench.set_defaults(handler=_step_benchmark)

    _add_rollout_steps(steps)
    rollout = sub.add_parser("rollout", help="the staged rollout").add_subparsers(dest="rollout_command", required=True)
    rollout.add_parser("status", help="the current rollout, its stages, verdicts and routing").set_defaults(
        handler=_cmd_rollout_status, result_to_xcom=False
    )

    triton = sub.add_parser("triton", help="the local CPU Triton server (embedded default)")
    triton.add_argument("action", choices=["up", "down", "status"])
    triton.set_defaults(handler=_cmd_triton, result_to_xcom=False)

    render = sub.add_parser("render-pods", help="write and validate every step's Kubernetes pod manifest")
    render.add_argument("--out", required=True)
    render.add_argument("--kubernetes-version", default="1.37.0")
    render.set_defaults(handler=_cmd_render_pods, result_to_xcom=False)
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


def run(handler: Callable[[argparse.Namespace, Settings], dict[str, Any]], args: argparse.Namespace) -> int:
    """Run one command; print its JSON result, write it to the XCom path for steps; map errors to exit 2."""
    import json

    label = f"mlrelease step {args.step}" if args.command == "step" else f"mlrelease {args.command}"
    try:
        settings = Settings.from_env()
        result = handler(args, settings)
    except GateFailed as exc:
        return _fail(f"{label}: error: {exc}", EXIT_GATE_FAILED)
    except Skipped as exc:
        return _fail(f"{label}: skipped: {exc}", EXIT_SKIPPED)
    except (StepError, ValueError, OSError) as exc:
        return _fail(f"{label}: error: {exc}", EXIT_STEP_ERROR)
    except Exception as exc:
        mlflow_errors = sys.modules.get("mlflow.exceptions")  # only if a step imported MLflow
        if mlflow_errors is None or not isinstance(exc, mlflow_errors.MlflowException):
            raise
        return _fail(f"{label}: error: MLflow: {exc.message}", EXIT_STEP_ERROR)
    if getattr(args, "result_to_xcom", True):
        from mlrelease.xcom import write_result

        write_result(settings.xcom_path, result)
    if not getattr(args, "quiet", False):
        print(json.dumps(result, indent=2, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `mlrelease` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    return run(args.handler, args)


if __name__ == "__main__":
    sys.exit(main())

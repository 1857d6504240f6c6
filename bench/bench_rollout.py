"""Benchmark: fault injected during a rollout stage -> 100 % of the affected traffic back on stable.

Everything is real: Feast SQLite, a CPU tritonserver with good and faulty versions, `mlrelease gateway`,
MLflow (SQLite), and 200 req/s of `mlrelease traffic` through the gateway. Each run opens one stage for a
faulty candidate with the real `rollout-stage` step, then runs the real `analyze` step once the stage's
duration has passed (as the DAG's deferrable wait does), and reads the gateway's decision log:

- fast guard: a hard failure (errors; NaN on a few % of long-tail requests) trips the gateway's breaker.
  Measured: first candidate call -> last candidate call (after it, every request is served by stable).
- statistical guard: low confidence on the long tail, which no single request reveals. Measured the same
  way; it ends when `analyze` rolls the cohort back, i.e. stage duration + analysis time.

    python bench/bench_rollout.py [--repeats 5] [--stage-seconds 5]

Target (issue 5): fault -> 100 % on stable within seconds for hard failures; the statistical guard within
the stage's duration plus seconds. Comparison anchor: Flagger's documented analysis, interval 1 min x
threshold 10 = 600 s before it rolls back.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_gateway_config, print_table, serving_home  # noqa: E402

WINDOW = ("2026-11-28T02:00:00+00:00", "2026-11-29T02:00:00+00:00")
FLAGGER_SECONDS = 600.0
RATE = 200.0
GUARDRAILS = [
    {"metric": "error_rate", "bad": "higher", "tolerance": 0.02, "min_samples": 100},
    {"metric": "nan_rate", "bad": "higher", "tolerance": 0.0, "limit": 0.0},
    {"metric": "low_confidence_share", "bad": "higher", "tolerance": 0.0, "limit": 0.15, "min_samples": 50},
]


def plan(stage_seconds: float, cohorts: dict[str, float], on_breach: str) -> dict[str, Any]:
    """A one-stage plan (the stage under test): decisions from its first look, at most `stage_seconds` x 3."""
    stage = {
        "name": "under_test",
        "candidate_percent": {c: min(p, 50.0) for c, p in cohorts.items()},  # the rest is the control slice
        "min_exposure_s": {"production": 3600, "demo": stage_seconds},
        "max_exposure_s": {"production": 7200, "demo": 3 * stage_seconds},
        "check_every_s": {"production": 300, "demo": 0.5},
        "on_breach": on_breach,
        "guardrails": GUARDRAILS,
    }
    return {"stages": [stage]}


def candidate_calls(decisions: Path, version: int, since: datetime) -> list[float]:
    """Times of the candidate's calls (any outcome) since `since`, from the gateway's decision log."""
    from mlrelease.gateway.decision_log import DecisionReader

    return sorted(r["t"] for r in DecisionReader(decisions).read(since) if r["version"] == version)


def one_run(world: dict[str, Any], version: int, plan_file: Path, n: int) -> dict[str, float]:
    """Open the stage, analyse after its duration, roll back; seconds from first to last candidate call."""
    from mlrelease.errors import GateFailed, Skipped
    from mlrelease.steps import rollout as steps
    from mlrelease.timewindow import run_key

    settings = world["settings"]
    end = datetime(2030, 1, 1) + timedelta(days=n)  # a run key per repetition
    key = run_key(end.astimezone())
    opened = steps.rollout_stage(settings, 1, version, key, profile="demo", plan_path=plan_file)
    analyze_at = datetime.fromisoformat(opened["analyze_at"])
    time.sleep(max(0.0, analyze_at.timestamp() - time.time()))
    try:
        steps.analyze(settings, 1, version, key)
    except (GateFailed, Skipped):
        pass
    steps.rollback(settings, key, reason="bench run over")
    time.sleep(1.0)  # the decision log is flushed every 0.2 s
    start = datetime.fromisoformat(opened["opened_at"])
    calls = candidate_calls(world["decisions"], version, start - timedelta(seconds=1))
    if not calls:
        raise SystemExit(f"v{version} never received traffic in run {n}")
    return {"on_candidate_s": calls[-1] - calls[0], "calls": len(calls)}


def reset(world: dict[str, Any]) -> None:
    """Stable v1 only, every version loaded, champion v1, no rollout record."""
    import shutil

    from mlrelease.registry import CHAMPION, MODEL_NAME

    world["registry"].client().set_registered_model_alias(MODEL_NAME, CHAMPION, "1")
    shutil.rmtree(world["settings"].home / "rollout", ignore_errors=True)
    world["serve"]([1, *world["faulty"]])


def main() -> None:
    """Build the world, run each scenario `--repeats` times under load, print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stage-seconds", type=float, default=5.0, help="demo duration of the stage under test")
    args = parser.parse_args()

    from mlrelease.gateway.config import load_config
    from mlrelease.gateway.routing_store_factory import open_routing_store
    from mlrelease.gateway.traffic import build_requests, order_pool
    from mlrelease.registry import MODEL_NAME, Registry
    from mlrelease.rollout.context import RolloutContext
    from mlrelease.rollout.gates import REQUIRED_GATES
    from mlrelease.serving import local_triton
    from mlrelease.serving.triton_repo import versions_present
    from mlrelease.settings import Settings
    from mlrelease.timewindow import Window, parse_timestamp
    from mlrelease_drills import devkit
    from mlrelease_drills.devkit import ERRORS, LOW_CONFIDENCE_LONG_TAIL, NAN_FEW_LONG_TAIL, free_port

    scenarios = [
        ("fast guard: errors on every call", ERRORS, {"*": 100}, "rollback_all"),
        ("fast guard: NaN on ~5 % of long-tail calls", NAN_FEW_LONG_TAIL, {"long_tail": 100}, "rollback_cohort"),
        (
            "statistical guard: low confidence on the long tail",
            LOW_CONFIDENCE_LONG_TAIL,
            {"long_tail": 100},
            "rollback_cohort",
        ),
    ]
    results: dict[str, list[dict[str, float]]] = {}
    with serving_home("mlrelease-bench-rollout-") as home:
        settings = Settings.from_env()
        try:
            triton_url = devkit.start_serving_world(settings, Window.parse(*WINDOW))
            config, key, state_url = bench_gateway_config(home, triton_url, WINDOW[1])
            os.environ["MLRELEASE_GATEWAY_CONFIG"] = str(config)  # the gateway's and the step processes'
            settings = dataclasses.replace(settings, gateway_config=config)  # the in-process steps'
            registry = Registry.from_settings(settings)
            client = registry.client()
            client.create_registered_model(MODEL_NAME)
            for version in versions_present(home / "model_repository", MODEL_NAME):  # MLflow numbers them 1, 2, …
                client.create_model_version(MODEL_NAME, source=str(home), run_id=None)
                # a real candidate passed export, validation, benchmark and shadow before any rollout-stage
                for tag, passed in REQUIRED_GATES.items():
                    client.set_model_version_tag(MODEL_NAME, str(version), tag, passed)
            ctx = RolloutContext.open(settings)
            world = {
                "settings": settings,
                "registry": registry,
                "decisions": load_config().decision_dir(settings),
                "faulty": [s[1] for s in scenarios],
                "serve": ctx.serve_only,
            }
            from mlrelease.gateway.routing_state import RoutingState

            open_routing_store(state_url, MODEL_NAME).update(
                lambda _: RoutingState(model=MODEL_NAME, stable_version=1), by="bench"
            )
            as_of = parse_timestamp(WINDOW[1], name="end")
            bodies = build_requests(
                order_pool(settings.offline_dir, as_of, load_config().cohorts), 5_000, None, supply_features=False
            )
            with devkit.gateway_process(config, free_port()) as gateway:
                with devkit.background_traffic(gateway, bodies, key, RATE) as report:
                    time.sleep(5)  # stable's own traffic first
                    for n, (label, version, cohorts, on_breach) in enumerate(scenarios):
                        plan_file = home / f"plan-{version}.yaml"
                        plan_file.write_text(yaml.safe_dump(plan(args.stage_seconds, cohorts, on_breach)))
                        results[label] = []
                        for r in range(args.repeats):
                            reset(world)
                            time.sleep(2)
                            results[label].append(one_run(world, version, plan_file, n * 100 + r))
                if report.errors:
                    print(f"WARNING: {report.errors} client errors during the benchmark: {report.statuses}")
        finally:
            local_triton.down(settings)

    print(f"\nfault injected at stage open under {RATE:.0f} req/s -> the affected traffic 100 % on stable")
    print(
        f"(stage duration {args.stage_seconds:g} s, demo profile; {args.repeats} runs each; "
        f"client errors: {report.errors})"
    )
    rows = []
    for label, samples in results.items():
        seconds = np.array([s["on_candidate_s"] for s in samples])
        rows.append(
            [
                label,
                f"{np.percentile(seconds, 50):.2f}",
                f"{np.percentile(seconds, 99):.2f}",
                f"{int(np.median([s['calls'] for s in samples]))}",
                f"{FLAGGER_SECONDS:.0f}",
            ]
        )
    print_table(["fault", "p50 s", "p99 s", "candidate calls", "Flagger anchor s"], rows)


if __name__ == "__main__":
    main()

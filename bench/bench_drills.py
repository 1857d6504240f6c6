"""Benchmark: fault drills during a live rollout at 200 req/s. What clients see, and whether the system heals.

Everything is real (see bench_rollout): Feast, a CPU tritonserver under the `mlrelease triton up` supervisor,
MLflow, `mlrelease gateway` with two uvicorn workers, and 200 req/s of `mlrelease traffic` (a process of its
own) on 127.0.0.1. Each drill starts from champion v1, opens stage 1 (high_value half on the candidate) for a
*healthy* candidate (devkit v2) with the real `rollout-stage` step, injects one fault 2 s into the stage, and
runs the stage's analysis the way the DAG does (one `analyze --tick` per check, a failed step retried, and
after a gate verdict the DAG's `rollback` task), with the retry delay compressed from 5 min to 1 s. Drills:

- none: no fault (the control row: what this box costs by itself).
- triton: `kill -9` tritonserver; its supervisor restarts it and reloads the declared versions.
- worker: `kill -9` one of the gateway's two workers; uvicorn starts a replacement.
- step: `kill -9` the `mlrelease step analyze` process mid-stage, then rerun it (it resumes from the record);
  this drill's stage lasts 30 s, since the step process alone takes seconds to start on a busy box.
- burst: a closed-loop burst at concurrency 64 (its own API key) during a manual `rollback`.
- redis: the production configuration (Feast online store and routing state on one Redis): `kill -9` Redis,
  start it again 4 s later (its append-only file brings the data back).
- store: the file routing store unreadable for 4 s mid-stage (the gateway keeps its last routing, the analysis
  fails and is retried); then unreadable again when `rollout-stage` opens stage 2 (it must fail before
  touching traffic), and that step rerun once the store is back.

Figures per drill: requests sent, client errors (non-2xx answers and transport errors seen by the traffic
generator), rule-fallback answers (`source: fallback_rule`), the time from the fault until the model answers
again (from the gateway's decision log of successful model calls: the end of a silence of over 0.5 s that began
within 1 s of the fault; "no pause" when none did), the longest such silence anywhere in the drill (a stall of
the box shows there too), the rollout's phase at the end, and whether the record, routing, MLflow aliases and
Triton's loaded versions agree at the end (`mlrelease rollout status`).

    python bench/bench_drills.py [--drills none,triton,worker,step,burst,redis,store] [--repeats 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, redirect_stdout
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    BIN,
    WINDOW,
    RestartableRedis,
    RolloutWorld,
    print_table,
    rollout_world,
    traffic_process,
)

from mlrelease_drills.devkit import (
    decision_log_writers,
    established_connections,
    unreadable,
    uvicorn_workers,
)  # noqa: E402

RATE = 200.0
CANDIDATE = 2  # devkit.HEALTHY_CANDIDATE: the drills measure recovery, not a bad model
WARM_S = 3.0  # traffic on stable before the stage opens
FAULT_AFTER_S = 2.0  # the fault comes this long into the stage
OUTAGE_S = 4.0  # how long Redis / the routing store stays away
BURST_S, BURST_CONCURRENCY = 5.0, 64
RETRY_S = 1.0  # the DAG's retry delay (5 min in nightly_release), compressed
SILENCE_S = 0.5  # a gap between successful model calls longer than this is a pause in model answers
NEAR_FAULT_S = 1.0  # a pause that begins this soon after the fault is the fault's
MIN_EXPOSURE_S, MAX_EXPOSURE_S, CHECK_EVERY_S, MAX_GAP_S = 10.0, 25.0, 0.5, 2.0
STEP_MIN_EXPOSURE_S, STEP_MAX_EXPOSURE_S = 30.0, 45.0  # the step drill: its process starts slowly
GATEWAY_WORKERS = 2

DRILLS = {
    "none": "no fault (control)",
    "triton": "kill -9 tritonserver",
    "worker": "kill -9 one gateway worker (of 2)",
    "step": "kill -9 the analyze step, rerun it",
    "burst": f"burst (concurrency {BURST_CONCURRENCY}) during a rollback",
    "redis": f"Redis down {OUTAGE_S:g} s (features + routing)",
    "store": f"routing store unreadable {OUTAGE_S:g} s",
}
ON_REDIS = {"redis"}  # drills that need the gateway configured for Redis


def drill_plan(min_exposure_s: float = MIN_EXPOSURE_S, max_exposure_s: float = MAX_EXPOSURE_S) -> dict[str, Any]:
    """Two stages of the repo's plan shape, compressed: decisions from the first look, a pass after 10 s."""
    # a fail acts at once; a pass needs evidence (an error rate within 2 pp is shown in a few hundred requests)
    shown = {"min_samples": 40}
    contracts = [
        {"metric": "error_rate", "bad": "higher", "tolerance": 0.02, **shown},
        {"metric": "nan_rate", "bad": "higher", "tolerance": 0.0, "limit": 0.0, **shown},
        {"metric": "latency", "bad": "higher", "tolerance": 0.3, "cohorts": ["*"], **shown},
    ]

    def stage(name: str, shares: dict[str, float], on_breach: str) -> dict[str, Any]:
        return {
            "name": name,
            "candidate_percent": shares,
            "min_exposure_s": {"production": 1800, "demo": min_exposure_s},
            "max_exposure_s": {"production": 7200, "demo": max_exposure_s},
            "check_every_s": {"production": 300, "demo": CHECK_EVERY_S},
            "on_breach": on_breach,
            "guardrails": contracts,
        }

    return {
        "max_gap_s": {"production": 30, "demo": MAX_GAP_S},
        "keep_previous_s": {"production": 86400, "demo": 1},
        "stages": [
            stage("high_value", {"high_value": 50}, "rollback_all"),
            stage("long_tail", {"high_value": 50, "long_tail": 50}, "rollback_cohort"),
        ],
    }


# --- the DAG's analysis, emulated --------------------------------------------------------------------------


@dataclass
class DagRun:
    """What the emulated DAG did for one stage: its outcome, and the step failures it retried."""

    outcome: str = "undecided"
    reason: str = ""
    failures: list[str] = field(default_factory=list)
    rollback_task: str = ""

    def describe(self) -> str:
        """One line for the notes."""
        text = f"DAG: {self.outcome}"
        if self.failures:
            text += f"; {len(self.failures)} failed step run(s) retried (first: {_short(self.failures[0])})"
        if self.rollback_task:
            text += f"; rollback task: {self.rollback_task}"
        return text


def _short(text: str, limit: int = 160) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def dag_analysis(settings: Any, stage: int, key: str) -> DagRun:
    """`analyze --tick` until decided, deferring to each next check; a StepError is retried after RETRY_S; a
    gate verdict (rolled back) runs the DAG's `rollback` task (ONE_FAILED), itself retried. Bounded."""
    from mlrelease.errors import GateFailed, Skipped, StepError
    from mlrelease.steps import rollout as steps

    run = DagRun()
    deadline = time.monotonic() + STEP_MAX_EXPOSURE_S + 60
    while time.monotonic() < deadline:
        try:
            result = steps.analyze(settings, stage, CANDIDATE, key, tick=True)
        except GateFailed as exc:
            run.outcome, run.reason = "rolled back", str(exc)
            run.rollback_task = dag_rollback(settings, key, deadline)
            return run
        except StepError as exc:
            run.failures.append(str(exc))
            time.sleep(RETRY_S)
            continue
        except Skipped as exc:
            run.outcome, run.reason = "paused", str(exc)
            return run
        if result["decided"]:
            run.outcome, run.reason = str(result["action"]), str(result.get("reason", ""))
            return run
        next_check = datetime.fromisoformat(result["next_check_at"]).timestamp()
        time.sleep(min(max(0.05, next_check - time.time()), 5.0))
    run.outcome = "undecided at the drill's deadline"
    return run


def dag_rollback(settings: Any, key: str, deadline: float) -> str:
    """The DAG's `rollback` task after a failed rollout task, with its retries (compressed)."""
    from mlrelease.errors import Skipped, StepError
    from mlrelease.steps import rollout as steps

    tries = 0
    while time.monotonic() < deadline:
        tries += 1
        try:
            steps.rollback(settings, key, reason="nightly_release rollback task: an upstream rollout task failed")
            return f"succeeded (try {tries})"
        except Skipped as exc:
            return f"skipped: {_short(str(exc), 80)}"
        except StepError as exc:
            if time.monotonic() + RETRY_S >= deadline:
                return f"failed {tries}x: {_short(str(exc))}"
            time.sleep(RETRY_S)
    return f"gave up after {tries} tries"


def in_background(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run `fn(*args)` in a thread; its future."""
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future


# --- one drill ------------------------------------------------------------------------------------------------


@dataclass
class Drill:
    """One drill's handles and findings."""

    name: str
    world: RolloutWorld
    url: str
    n: int
    plans: dict[str, Path]
    burst_key: str
    opened_at: float | None = None
    fault_at: float | None = None
    notes: list[str] = field(default_factory=list)
    extra: list[dict[str, Any]] = field(default_factory=list)  # traffic reports besides the background one

    @property
    def port(self) -> int:
        """The gateway's port."""
        return int(self.url.rsplit(":", 1)[1])

    @property
    def end(self) -> datetime:
        """The run's data-interval end: a run key of its own per drill and repetition."""
        return datetime(2030, 1, 1, 2, tzinfo=UTC) + timedelta(days=self.n)

    @property
    def key(self) -> str:
        """The run key."""
        from mlrelease.timewindow import run_key

        return run_key(self.end)

    def open_stage(self, stage: int = 1) -> dict[str, Any]:
        """The real `rollout-stage` step."""
        from mlrelease.steps import rollout as steps

        plan = self.plans.get(self.name, self.plans["default"])
        opened = steps.rollout_stage(self.world.settings, stage, CANDIDATE, self.key, profile="demo", plan_path=plan)
        if self.opened_at is None:
            self.opened_at = datetime.fromisoformat(opened["opened_at"]).timestamp()
        return opened

    def record(self) -> Any:
        """The stored rollout record."""
        from mlrelease.registry import MODEL_NAME
        from mlrelease.rollout.store import RolloutStore

        return RolloutStore.from_settings(self.world.settings, MODEL_NAME).read()

    def fault(self) -> None:
        """Mark the fault's moment."""
        self.fault_at = time.time()

    def wait_dag(self, future: Future[DagRun]) -> DagRun:
        """The emulated DAG's outcome, noted."""
        run = future.result(timeout=STEP_MAX_EXPOSURE_S + 150)
        self.notes.append(run.describe())
        return run


def drill_none(d: Drill) -> None:
    """No fault: the stage and its analysis under the same traffic (the control row)."""
    d.open_stage()
    analysis = in_background(dag_analysis, d.world.settings, 1, d.key)
    time.sleep(FAULT_AFTER_S)
    d.fault()  # the moment a fault would come
    d.wait_dag(analysis)


def drill_triton(d: Drill) -> None:
    """kill -9 tritonserver mid-stage; the supervisor restarts it and reloads the declared versions."""
    from mlrelease.serving import local_triton

    paths = local_triton.TritonPaths.from_settings(d.world.settings)
    restarts = local_triton.supervisor_state(paths).get("restarts", 0)
    d.open_stage()
    analysis = in_background(dag_analysis, d.world.settings, 1, d.key)
    time.sleep(FAULT_AFTER_S)
    victim = local_triton.running_pid(paths)
    if victim is None:
        raise SystemExit("no tritonserver to kill: `mlrelease triton up` is not serving")
    os.kill(victim, signal.SIGKILL)
    d.fault()
    assert d.fault_at is not None
    serving_s = None
    while time.time() - d.fault_at < 90:  # the supervisor's own record: a new server, ready, reconciled
        state = local_triton.supervisor_state(paths)
        if state.get("phase") == "serving" and state.get("server_pid") not in (None, victim):
            serving_s = time.time() - d.fault_at
            break
        time.sleep(0.1)
    state = local_triton.supervisor_state(paths)
    d.notes.append(
        f"supervisor: restarts {restarts} -> {state.get('restarts')} ({state.get('last_restart_reason')}); "
        + (f"serving the declared versions again {serving_s:.1f} s after the kill" if serving_s else "not serving")
    )
    run = d.wait_dag(analysis)
    if "fast_guard" in run.reason:
        d.notes.append(
            "the gateway's fast guard tripped the healthy candidate on the outage's connection errors; the "
            "analysis turned the trip into a fail and rolled back (on_breach: rollback_all)"
        )


def _gateway_master(config: Path) -> Any:
    import psutil

    found = [p for p in psutil.Process().children() if {"gateway", str(config)} <= set(p.cmdline())]
    if len(found) != 1:
        raise SystemExit(f"expected one gateway process for {config}, found {len(found)}")
    return found[0]


def _fresh_predict(d: Drill) -> None:
    """One request on a new connection (a pooled one stays with the worker that accepted it)."""
    import requests

    headers = {"X-API-Key": d.world.api_key, "Connection": "close"}
    try:
        requests.post(f"{d.url}/v1/predict", json=d.world.bodies[0], headers=headers, timeout=5)
    except requests.RequestException:
        pass


def wait_serving(d: Drill, pids: set[int], timeout_s: float = 60.0) -> float | None:
    """Seconds until every worker in `pids` has answered a request (fresh connections nudge the kernel's choice);
    None if one did not within `timeout_s`."""
    began = time.monotonic()
    while not pids <= decision_log_writers(d.world.decisions()):
        if time.monotonic() - began > timeout_s:
            return None
        _fresh_predict(d)
        time.sleep(0.1)
    return time.monotonic() - began


def gateway_rejections(url: str, workers: int = GATEWAY_WORKERS) -> Counter[str]:
    """Refusals by reason, summed over the gateway's workers (each /metrics answer is one worker's; fresh
    connections until `workers` distinct answers were seen, told apart by their request counters)."""
    import requests

    from mlrelease.gateway.metrics import PREFIX

    seen: dict[str, Counter[str]] = {}
    for _ in range(40):
        try:
            text = requests.get(f"{url}/metrics", headers={"Connection": "close"}, timeout=5).text
        except requests.RequestException:
            continue
        lines = text.splitlines()
        fingerprint = "\n".join(line for line in lines if line.startswith(f"{PREFIX}_requests_total"))
        refused: Counter[str] = Counter()
        for line in lines:
            if line.startswith(f"{PREFIX}_rejections_total{{"):
                reason = line.split('reason="', 1)[1].split('"', 1)[0]
                refused[reason] += int(float(line.rsplit(" ", 1)[1]))
        seen[fingerprint] = refused
        if len(seen) >= workers:
            break
    return sum(seen.values(), Counter())


def drill_worker(d: Drill) -> None:
    """kill -9 the gateway worker holding most of the traffic's connections; uvicorn replaces it."""
    import psutil

    master = _gateway_master(Path(os.environ["MLRELEASE_GATEWAY_CONFIG"]))
    before = uvicorn_workers(master)
    if len(before) != GATEWAY_WORKERS:
        raise SystemExit(f"expected {GATEWAY_WORKERS} gateway workers, found {sorted(before)}")
    d.open_stage()
    analysis = in_background(dag_analysis, d.world.settings, 1, d.key)
    time.sleep(FAULT_AFTER_S)
    victim = max(before, key=lambda pid: established_connections(pid, d.port))
    held = established_connections(victim, d.port)
    os.kill(victim, signal.SIGKILL)
    d.fault()
    assert d.fault_at is not None
    replacement = None
    while time.time() - d.fault_at < 30 and replacement is None:
        now = uvicorn_workers(master)
        replacement = next(iter(now - before), None) if len(now) == GATEWAY_WORKERS else None
        time.sleep(0.05)
    if replacement is None:
        d.notes.append(f"killed worker {victim} (it held {held} client connections); no replacement within 30 s")
    else:
        started = psutil.Process(replacement).create_time() - d.fault_at  # the process's own start, not our poll
        waited = wait_serving(d, {replacement}, timeout_s=30)
        serving = f"{time.time() - d.fault_at:.1f} s" if waited is not None else "not within 30 s"
        d.notes.append(
            f"killed worker {victim} (it held {held} client connections); uvicorn started a replacement "
            f"{max(started, 0.0):.1f} s later, which answered its first request {serving} after the kill"
        )
    d.wait_dag(analysis)


def drill_step(d: Drill) -> None:
    """kill -9 `mlrelease step analyze` mid-stage (after it has looked twice), then rerun it to a decision."""
    from mlrelease.registry import MODEL_NAME
    from mlrelease.rollout.store import RolloutStore

    opened = datetime.fromisoformat(d.open_stage()["opened_at"])
    argv = [str(BIN / "mlrelease"), "step", "analyze", "--stage", "1", "--model-version", str(CANDIDATE)]
    argv += ["--end", d.end.isoformat()]
    log = d.world.home / f"analyze-{d.n}.log"
    store = RolloutStore.from_settings(d.world.settings, MODEL_NAME)
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen([*argv, "--poll-s", "0.2"], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while len(store.read_evidence(d.record())) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    d.fault()
    assert d.fault_at is not None
    age = d.fault_at - opened.timestamp()
    looks = len(store.read_evidence(d.record()))
    history = [e.kind for e in d.record().history]
    d.notes.append(
        f"killed the analyze process {age:.1f} s into the stage (minimum exposure {STEP_MIN_EXPOSURE_S:g} s) after "
        f"{looks} look(s); history then: {history}"
    )
    began = time.monotonic()
    rerun = subprocess.run(
        [*argv, "--poll-s", str(CHECK_EVERY_S)], capture_output=True, text=True, timeout=STEP_MAX_EXPOSURE_S + 120
    )
    try:
        decided = json.loads(rerun.stdout)
        outcome = f"{decided.get('action')} ({decided.get('status')})"
    except ValueError:
        outcome = _short(rerun.stderr or rerun.stdout)
    history = [e.kind for e in d.record().history]
    d.notes.append(
        f"rerun: exit {rerun.returncode} after {time.monotonic() - began:.1f} s, {outcome}; history: {history}"
        + (" (no duplicate)" if history.count("analysis") <= 1 else " (DUPLICATE analysis events)")
    )


def drill_burst(d: Drill) -> None:
    """A closed-loop burst at concurrency 64 (its own API key) while a manual rollback runs."""
    from mlrelease.steps import rollout as steps

    d.open_stage()
    time.sleep(FAULT_AFTER_S)
    config = Path(os.environ["MLRELEASE_GATEWAY_CONFIG"])
    burst = traffic_process(
        d.url, d.burst_key, rate=0, config=config, duration_s=BURST_S, concurrency=BURST_CONCURRENCY
    )
    with burst as run:
        run.wait_sending(d.port, connections=BURST_CONCURRENCY // 2)
        d.fault()
        time.sleep(1.0)  # the burst in full swing
        began = time.monotonic()
        result = steps.rollback(d.world.settings, d.key, reason="drill: manual rollback during a burst")
        took = time.monotonic() - began
        run.proc.wait(timeout=BURST_S + 60)  # it stops by itself after BURST_S
    d.extra.append(run.summary)
    burst_summary = run.summary
    d.notes.append(
        f"manual rollback took {took:.1f} s ({result['status']}, serving {result.get('serving_versions')}); "
        f"burst: {burst_summary.get('sent')} requests at {burst_summary.get('achieved_rate')} req/s, "
        f"{burst_summary.get('errors')} errors, p99 {burst_summary.get('latency_ms', {}).get('p99')} ms"
    )


def _gateway_routing(d: Drill) -> str:
    """What one gateway worker serves with right now, and its store error (GET /v1/routing)."""
    import requests

    try:
        view = requests.get(f"{d.url}/v1/routing", headers={"X-API-Key": d.world.api_key}, timeout=2).json()
    except (requests.RequestException, ValueError) as exc:
        return f"/v1/routing failed: {exc}"
    state = view.get("state") or {}
    return (
        f"a worker kept routing revision {state.get('revision')} (stable v{state.get('stable_version')}, "
        f"candidate v{state.get('candidate_version')} {state.get('candidate_percent')}), store_error: "
        f"{_short(str(view.get('store_error')), 90)}"
    )


def drill_redis(d: Drill, redis: RestartableRedis) -> None:
    """kill -9 the Redis that holds the online features and the routing state; start it again after a while."""
    d.open_stage()
    analysis = in_background(dag_analysis, d.world.settings, 1, d.key)
    time.sleep(FAULT_AFTER_S)
    redis.kill()
    d.fault()
    time.sleep(OUTAGE_S / 2)
    seen = _gateway_routing(d)
    time.sleep(OUTAGE_S / 2)
    redis.start()
    d.notes.append(f"Redis started again after {OUTAGE_S:g} s (data from its append-only file); meanwhile {seen}")
    d.wait_dag(analysis)


def drill_store(d: Drill) -> None:
    """The file routing store unreadable mid-stage (gateway keeps its routing, analysis retried), then again
    when the next stage opens (the step fails before touching traffic, and succeeds once the store is back)."""
    from mlrelease.errors import StepError
    from mlrelease.gateway.decision_log import DecisionReader

    path: Path = d.world.routing_store().path  # the file store (this drill runs on the default config)
    d.open_stage()
    analysis = in_background(dag_analysis, d.world.settings, 1, d.key)
    time.sleep(FAULT_AFTER_S)
    with unreadable(path):
        d.fault()
        assert d.fault_at is not None
        time.sleep(OUTAGE_S / 2)
        seen = _gateway_routing(d)
        time.sleep(OUTAGE_S / 2)
        time.sleep(0.5)  # the decision log is flushed every 0.2 s
        calls = DecisionReader(d.world.decisions()).read(_utc(d.fault_at))
    on_candidate = sum(r["version"] == CANDIDATE and r["outcome"] == "ok" for r in calls)
    d.notes.append(f"during the outage {seen}; {on_candidate} candidate answers meanwhile")
    run = d.wait_dag(analysis)
    if run.outcome != "advance":
        return
    revision = json.loads(path.read_text())["revision"]
    with unreadable(path):
        try:
            d.open_stage(2)
            refused = "stage 2 opened although the store was unreadable"
        except StepError as exc:
            refused = f"rollout-stage 2 refused: {_short(str(exc), 120)}"
    record = d.record()
    untouched = json.loads(path.read_text())["revision"] == revision and record.stage_opened_at is None
    opened = d.open_stage(2)["status"]
    d.notes.append(f"{refused}; routing and record untouched: {untouched}; rerun after recovery: stage 2 {opened}")


# --- measuring ---------------------------------------------------------------------------------------------------


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def model_answers(decisions: Path, since: float, until: float) -> list[float]:
    """Times of the successful model calls in [since, until), from every replica's decision log."""
    from mlrelease.gateway.decision_log import DecisionReader

    return sorted(r["t"] for r in DecisionReader(decisions).read(_utc(since), _utc(until)) if r["outcome"] == "ok")


def model_answers_again(oks: list[float], fault_at: float, until: float) -> float | None:
    """Seconds from the fault to the end of the silence (over SILENCE_S without a successful model call) that began
    within NEAR_FAULT_S of it; 0.0 when none did; None when that silence lasted until `until`."""
    last = fault_at
    for t in (t for t in oks if t >= fault_at):
        if last - fault_at > NEAR_FAULT_S:
            return 0.0
        if t - last > SILENCE_S:
            return t - fault_at
        last = t
    return None if until - last > SILENCE_S and last - fault_at <= NEAR_FAULT_S else 0.0


def longest_silence(oks: list[float], since: float, until: float) -> tuple[float, float]:
    """The longest stretch without a successful model call in [since, until): its length and start."""
    edges = [since, *oks, until]
    gap, start = max((b - a, a) for a, b in zip(edges, edges[1:], strict=False))
    return gap, start


def settled_status(settings: Any, wait_s: float = 15.0) -> tuple[bool, list[str], int]:
    """`mlrelease rollout status` until it agrees (bounded): consistent?, its disagreements, and the looks taken."""
    from mlrelease.errors import StepError
    from mlrelease.steps import rollout as steps

    began, looks = time.monotonic(), 0
    while True:
        looks += 1
        try:
            view = steps.status(settings)
            consistent, problems = bool(view["consistent"]), list(view["disagreements"])
        except StepError as exc:
            consistent, problems = False, [f"status failed: {exc}"]
        if consistent or time.monotonic() - began > wait_s:
            return consistent, problems, looks
        time.sleep(1.0)


def end_phase(record: Any) -> str:
    """The rollout's phase, and for an active one the stage it is at."""
    from mlrelease.rollout.machine import Phase

    if record is None:
        return "no record"
    if record.phase is Phase.STAGE:
        return f"stage {record.stage} {'open' if record.stage_opened_at else 'next'}"
    return str(record.phase)


@dataclass
class Row:
    """One drill's figures."""

    label: str
    sent: int
    errors: Counter[str]
    rule: int
    model_back_s: float | None
    silence: tuple[float, float]  # longest silence: seconds, and its start relative to the fault
    phase: str
    consistent: bool
    problems: list[str]
    notes: list[str]

    def cells(self) -> list[object]:
        """The table's cells."""
        back = "no pause" if self.model_back_s == 0.0 else "not resumed"
        if self.model_back_s:
            back = f"{self.model_back_s:.1f} s"
        return [
            self.label,
            self.sent,
            sum(self.errors.values()),
            self.rule,
            back,
            f"{self.silence[0]:.1f} s at {self.silence[1]:+.1f} s",
            self.phase,
            "yes" if self.consistent else "NO",
        ]


def run_drill(drill: Drill, action: Callable[[Drill], None]) -> Row:
    """Traffic on, both gateway workers serving, warm up, the drill, a short settle, then the figures."""
    config = Path(os.environ["MLRELEASE_GATEWAY_CONFIG"])
    with traffic_process(drill.url, drill.world.api_key, rate=RATE, config=config) as traffic:
        traffic.wait_sending(drill.port)
        if wait_serving(drill, uvicorn_workers(_gateway_master(config))) is None:
            raise SystemExit("the gateway's workers did not all answer within 60 s")
        time.sleep(WARM_S)
        action(drill)
        time.sleep(1.0)
    until = time.time()
    time.sleep(0.5)  # the decision log is flushed every 0.2 s
    reports = [traffic.summary, *drill.extra]
    errors: Counter[str] = Counter()
    for r in reports:
        errors.update({s: n for s, n in r.get("statuses", {}).items() if s != "200"})
    rule = sum(n for r in reports for k, n in r.get("served", {}).items() if k.endswith("/fallback_rule"))
    assert drill.fault_at is not None and drill.opened_at is not None
    oks = model_answers(drill.world.decisions(), drill.opened_at, until)
    back = model_answers_again(oks, drill.fault_at, until)
    gap, start = longest_silence(oks, drill.opened_at, until)
    record = drill.record()
    if record is not None and record.reason:
        drill.notes.append(f"record reason: {_short(record.reason)}")
    consistent, problems, looks = settled_status(drill.world.settings)
    if consistent and looks > 1:
        drill.notes.append(f"consistent only at the {looks}th look of `rollout status` (1 s apart)")
    if errors:
        refused = gateway_rejections(drill.url)  # a gateway of its own per drill: its counters are the drill's
        drill.notes.append(
            f"client errors by kind: {dict(errors)}; the gateway's refusals by reason: {dict(refused) or 'none'}"
            + (" (a killed worker's own counters are gone with it)" if drill.name == "worker" else "")
        )
    label = DRILLS[drill.name] + (f" #{drill.n % 100 + 1}" if drill.n % 100 else "")
    return Row(
        label,
        sum(int(r.get("sent", 0)) for r in reports),
        errors,
        rule,
        back,
        (gap, start - drill.fault_at),
        end_phase(record),
        consistent,
        problems,
        drill.notes,
    )


# --- main --------------------------------------------------------------------------------------------------------


@contextmanager
def env_vars(**values: str) -> Iterator[None]:
    """Set environment variables for the block, restoring the old values after it."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def redis_gateway_config(world: RolloutWorld, redis: RestartableRedis) -> Path:
    """Feast's online store materialized into `redis`, and a gateway config with its routing state there too."""
    from mlrelease.settings import Settings
    from mlrelease.steps.materialize import materialize
    from mlrelease.timewindow import Window
    from mlrelease_drills import devkit

    with env_vars(MLRELEASE_ONLINE_STORE="redis", MLRELEASE_REDIS_URL=redis.address), redirect_stdout(sys.stderr):
        materialize(Settings.from_env(), Window.parse(*WINDOW), timedelta(hours=2))
    return devkit.write_gateway_config(
        world.home / "gateway-redis.yaml",
        replay_as_of=WINDOW[1],
        triton_url=world.triton_url,
        routing={"state_url": f"redis://{redis.address}/0"},
        auth={"keys_file": str(world.home / "keys.yaml")},
    )


def main() -> None:
    """Build the world once, run the chosen drills `--repeats` times each, print the table and the notes."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drills", default=",".join(DRILLS), help=f"comma-separated, from {','.join(DRILLS)}")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    chosen = [d.strip() for d in args.drills.split(",") if d.strip()]
    unknown = sorted(set(chosen) - set(DRILLS))
    if unknown or not chosen or not 1 <= args.repeats <= 10:
        parser.error(f"--drills from {list(DRILLS)} (unknown: {unknown}); --repeats 1..10")

    from mlrelease.gateway.auth import add_client
    from mlrelease.gateway.config import RateLimit
    from mlrelease.gateway.traffic import require_loopback
    from mlrelease_drills import devkit

    began = time.monotonic()
    actions: dict[str, Callable[[Drill], None]] = {
        "none": drill_none,
        "triton": drill_triton,
        "worker": drill_worker,
        "step": drill_step,
        "burst": drill_burst,
        "store": drill_store,
    }
    rows: dict[str, list[Row]] = {}
    with rollout_world("mlrelease-bench-drills-") as world:
        plans = {"default": world.home / "drill-plan.yaml", "step": world.home / "drill-plan-step.yaml"}
        plans["default"].write_text(yaml.safe_dump(drill_plan()), encoding="utf-8")
        plans["step"].write_text(yaml.safe_dump(drill_plan(STEP_MIN_EXPOSURE_S, STEP_MAX_EXPOSURE_S)), encoding="utf-8")
        # The burst is another client with a limit of its own: it measures serving, not the rate limiter.
        burst_key = add_client(world.home / "keys.yaml", "burst", RateLimit(per_second=20_000, burst=20_000))

        with ExitStack() as stack:
            configs = {name: (world.config, {}) for name in chosen}
            if ON_REDIS & set(chosen):
                redis = stack.enter_context(RestartableRedis(world.home / "redis"))
                actions["redis"] = functools.partial(drill_redis, redis=redis)
                redis_env = {"MLRELEASE_ONLINE_STORE": "redis", "MLRELEASE_REDIS_URL": redis.address}
                on_redis = (redis_gateway_config(world, redis), redis_env)
                configs.update({name: on_redis for name in ON_REDIS & set(chosen)})
            for name in chosen:
                config, env = configs[name]
                for r in range(args.repeats):
                    print(f"[{time.monotonic() - began:6.1f} s] drill {name} #{r + 1}", file=sys.stderr, flush=True)
                    with env_vars(MLRELEASE_GATEWAY_CONFIG=str(config)):
                        world.settings = dataclasses.replace(world.settings, gateway_config=config)  # in-process steps
                        world.reset(CANDIDATE)  # before the gateway starts: it reads the routing first
                        # A gateway per drill: fresh breakers, trips and counters in every worker.
                        with devkit.gateway_process(config, devkit.free_port(), env, workers=GATEWAY_WORKERS) as url:
                            require_loopback(url)
                            drill = Drill(name, world, url, list(DRILLS).index(name) * 100 + r, plans, burst_key)
                            rows.setdefault(name, []).append(run_drill(drill, actions[name]))
    wall = time.monotonic() - began

    print(
        f"\nfault drills during stage 1 of a healthy candidate's rollout (v{CANDIDATE}; high_value 50 %), "
        f"{RATE:.0f} req/s through a {GATEWAY_WORKERS}-worker gateway; fault {FAULT_AFTER_S:g} s into the stage; "
        f"DAG retries compressed to {RETRY_S:g} s; {args.repeats} run(s) each; wall {wall:.0f} s"
    )
    ordered = [row for name in DRILLS for row in rows.get(name, [])]
    print_table(
        [
            "drill",
            "requests",
            "client errors",
            "rule answers",
            "model answers again",
            "longest model silence (vs fault)",
            "rollout end",
            "consistent",
        ],
        [row.cells() for row in ordered],
    )
    print()
    for row in ordered:
        print(f"- {row.label}:")
        for note in row.notes:
            print(f"  - {note}")
        for problem in row.problems:
            print(f"  - DISAGREEMENT: {problem}")


if __name__ == "__main__":
    main()

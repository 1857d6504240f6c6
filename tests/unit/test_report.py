"""The release report: collected from small hand-written run artifacts, rendered, published, served and linked."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from PIL import Image

from mlrelease.registry import MODEL_NAME
from mlrelease.report.collect import collect
from mlrelease.report.inputs import ReportInputError
from mlrelease.report.links import report_dir
from mlrelease.rollout.plan import Guardrail, RolloutPlan, Stage
from mlrelease.rollout.store import Event, RolloutRecord, RolloutStore
from mlrelease.settings import Settings
from mlrelease.steps.report import build_report
from mlrelease.storage import write_json_atomic, write_text_atomic

END = datetime(2026, 11, 30, 2, tzinfo=UTC)
KEY = "20261130T020000Z"
NIGHTLY = "nightly_release_parcel_eta"  # the parcel model's nightly DAG, whose runs have these reports
RUN = "manual__2026-11-30T10:19:36+00:00"
T0 = datetime(2026, 11, 30, 10, 22, tzinfo=UTC)  # when the rollout started

CANDIDATE_METRICS = {"mae": 2.0424, "p90_abs_error": 3.8667, "low_confidence_share": 0.0032, "nan_share": 0.0}
CHAMPION_METRICS = {"mae": 2.0599, "p90_abs_error": 4.1133, "low_confidence_share": 0.0039, "nan_share": 0.0}


# ---- fixture writers: the files a run leaves, in the shapes the steps write them ----------------------------


def outcome(home: Path, task: str, status: str = "success", **extra: object) -> None:
    """One step outcome as the local runner records it."""
    body = {"task_id": task, "step": task.replace("_", "-"), "run_id": RUN, "status": status, **extra}
    write_json_atomic(home / "artifacts" / "parcel_eta" / KEY / "steps" / f"{task}.json", body)


def write_data_checks(home: Path, *, ok: bool) -> None:
    """check_freshness + validate_data outcomes, freshness.prom and validation.json (drift failing unless ok)."""
    run_dir = home / "artifacts" / "parcel_eta" / KEY
    write_text_atomic(
        run_dir / "freshness.prom",
        "# TYPE mlrelease_feature_freshness_lag_seconds gauge\n"
        'mlrelease_feature_freshness_lag_seconds{feature_view="route_features"} 5400.0\n'
        'mlrelease_feature_freshness_lag_seconds{feature_view="user_features"} 1800.0\n'
        "# TYPE mlrelease_feature_freshness_budget_seconds gauge\n"
        'mlrelease_feature_freshness_budget_seconds{feature_view="route_features"} 32400.0\n'
        'mlrelease_feature_freshness_budget_seconds{feature_view="user_features"} 129600.0\n',
    )
    views = {"route_features": {"lag_s": 5400.0, "budget_s": 32400.0}}
    outcome(home, "check_freshness", result={"views": views})
    psi = 0.0123 if ok else 0.4321
    failures = [] if ok else [f"routes.distance_km: drift PSI {psi:.3f} > 0.25", "routes.route_id: not null (2.0%)"]
    exps = [
        {"type": "expect_column_values_to_not_be_null", "column": "route_id", "success": ok, "observed": "2.0"},
        {"type": "expect_table_row_count_to_be_between", "column": None, "success": True, "observed": "800"},
    ]
    validation = {
        "success": ok,
        "failures": failures,
        "tables": {
            "routes": {
                "rows": 800,
                "expectations": exps,
                "drift": {"distance_km": {"psi": psi, "threshold": 0.25, "ok": ok}},
            }
        },
    }
    write_json_atomic(run_dir / "data_quality" / "validation.json", validation)
    if ok:
        outcome(home, "validate_data", result={"success": True, "tables": {"routes": {"rows": 800}}})
    else:
        outcome(home, "validate_data", "failed", error=f"mlrelease step validate-data: error: {failures[0]}")


def write_pipeline(home: Path, *, champion: int | None) -> None:
    """Every task up to the benchmark, successful; without a champion, a bootstrap run."""
    outcome(home, "apply_features", result={"feature_views": ["route_features"], "online_store": "sqlite"})
    outcome(home, "materialize", result={"rows_written": 10, "views": {}, "duration_s": 1.0})
    write_data_checks(home, ok=True)
    train = {"model_version": 2, "status": "registered as challenger", "run_id": "abc123", "metrics": CANDIDATE_METRICS}
    train |= {"champion_version": champion, "champion_metrics": CHAMPION_METRICS if champion else None}
    outcome(home, "train", result=train)
    outcome(home, "export", result={"model_version": 2, "status": "exported", "sha256": "f" * 64})
    outcome(home, "validate_serving", result={"model_version": 2, "max_abs_diff": {"eta": 1e-6}, "triton": "x"})
    levels = [
        {"concurrency": 1, "throughput": 756.0, "p50_us": 1236.0, "p99_us": 2693.0},
        {"concurrency": 4, "throughput": 2463.0, "p50_us": 1577.0, "p99_us": 2802.0},
    ]
    if champion is None:
        bench = {
            "status": "bootstrap: no champion yet; this version becomes champion",
            "levels": {"challenger v2": levels},
        }
    else:
        slower = [{**lv, "throughput": lv["throughput"] * 1.05} for lv in levels]
        bench = {"status": "passed", "verdict": "worst p99 ratio 1.23", "p99_ratio": 1.2274, "throughput_ratio": 0.9535}
        bench["levels"] = {"challenger v2": levels, f"champion v{champion}": slower}
    outcome(home, "benchmark", result={"model_version": 2, "champion_version": champion, "rounds": 3, **bench})


def write_shadow(home: Path) -> None:
    """A passed shadow gate (its report under rollout/ and the step outcome)."""
    report = {
        "rows": 1000,
        "disagreement_share": 0.021,
        "disagreement_by_cohort": {"core": 0.01, "high_value": 0.0, "long_tail": 0.065},
        "latency_tail_quantile": 0.95,
        "latency_tail_tolerance": 0.05,
        "latency_tail_diff": 0.0033,
        "latency_tail_band": [-0.021, 0.028],
        "latency_tail_verdict": "pass",
        "latency_ratio": 0.991,
        "latency_ratio_band": [0.952, 1.031],
        "latency_tolerance": 0.1,
        "latency_pairs": 600,
        "latency_verdict": "pass",
        "median_latency_ms": {"1": 1.629, "2": 1.599},
        "non_finite": 0,
        "status": "passed",
    }
    write_json_atomic(home / "artifacts" / "parcel_eta" / KEY / "rollout" / "shadow.json", report)
    outcome(home, "shadow", result=report)


def plan() -> RolloutPlan:
    """Three stages like the shipped plan: high_value, then long_tail (cohort rollback), then everyone."""
    rail = (
        Guardrail(metric="low_confidence_share", bad="higher", tolerance=0.0, limit=0.15, alpha=0.01),
        Guardrail(metric="error_rate", bad="higher", tolerance=0.001, alpha=0.01),
    )
    spans = {
        "min_exposure_s": {"production": 1800.0, "demo": 20.0},
        "max_exposure_s": {"production": 3600.0, "demo": 60.0},
    }
    return RolloutPlan(
        stages=(
            Stage(name="high_value", candidate_percent={"high_value": 50.0}, guardrails=rail, **spans),
            Stage(
                name="long_tail",
                candidate_percent={"high_value": 50.0, "long_tail": 50.0},
                guardrails=rail,
                on_breach="rollback_cohort",
                **spans,
            ),
            Stage(name="everyone", candidate_percent={"*": 95.0}, guardrails=rail, **spans),
        )
    )


def analysis(stage: int, action: str, verdicts: dict[str, str], share: float) -> dict[str, object]:
    """An analysis event's detail with one low_confidence_share result per judged cohort."""
    results = [
        {
            "cohort": c,
            "metric": "low_confidence_share",
            "verdict": v,
            "candidate": share if v == "fail" else 0.0123,
            "stable": 0.0301,
            "threshold": 0.15,
            "reason": f"{c} low_confidence_share",
        }
        for c, v in verdicts.items()
    ]
    return {
        "action": action,
        "reason": f"stage {stage}: {action}",
        "cohorts": [],
        "verdicts": verdicts,
        "results": results,
    }


def record(events: list[Event], *, phase: str, excluded: tuple[str, ...] = (), reason: str = "") -> RolloutRecord:
    """The rollout record of run KEY for candidate v2 against stable v1."""
    return RolloutRecord(
        model=MODEL_NAME,
        run_key=KEY,
        candidate_version=2,
        stable_version=1,
        profile="demo",
        plan=plan(),
        phase=phase,  # type: ignore[arg-type]
        stage=3,
        excluded_cohorts=excluded,
        reason=reason,
        started_at=T0,
        finished_at=events[-1].at if phase in ("promoted", "rolled_back") else None,
        history=tuple(events),
    )


def save_record(home: Path, rec: RolloutRecord, *, archived: bool) -> None:
    """Where the store keeps it: the current record, or archived under history/ (a later run took over)."""
    folder = home / "rollout"
    path = folder / "history" / f"{MODEL_NAME}-v2-{KEY}.json" if archived else folder / f"{MODEL_NAME}.json"
    write_text_atomic(path, rec.model_dump_json(indent=2))


def at(seconds: float) -> datetime:
    """A moment `seconds` into the rollout."""
    return T0 + timedelta(seconds=seconds)


def write_promoted_run(home: Path) -> None:
    """A run that passed every gate and stage and promoted v2 over v1, with gateway decisions logged."""
    write_pipeline(home, champion=1)
    write_shadow(home)
    everyone = {"high_value": "pass", "long_tail": "pass", "core": "pass"}
    events = [
        Event(at=at(0), kind="stage_opened", stage=1, detail={"candidate_percent": {"high_value": 100.0}}),
        Event(at=at(20), kind="analysis", stage=1, detail=analysis(1, "advance", {"high_value": "pass"}, 0)),
        Event(
            at=at(21), kind="stage_opened", stage=2, detail={"candidate_percent": {"high_value": 100, "long_tail": 100}}
        ),
        Event(at=at(41), kind="analysis", stage=2, detail=analysis(2, "advance", {"long_tail": "pass"}, 0)),
        Event(at=at(42), kind="stage_opened", stage=3, detail={"candidate_percent": {"*": 95.0}}),
        Event(at=at(62), kind="analysis", stage=3, detail=analysis(3, "promote", everyone, 0)),
        Event(at=at(63), kind="promoted", stage=3, detail={"previous_version": 1}),
    ]
    save_record(home, record(events, phase="promoted", reason="promoted"), archived=True)
    for n, name in enumerate(("high_value", "long_tail", "everyone"), start=1):
        outcome(home, f"rollout_stage_{n}", result={"stage": n, "stage_name": name, "candidate_percent": {}})
        outcome(home, f"analyze_{n}", result={"stage": n, "action": "advance", "verdicts": {}, "results": []})
    outcome(home, "promote", result={"status": "promoted", "model_version": 2, "previous_version": 1})
    # The gateway's decision log: high_value calls go to v2 from the first stage on, core only at the end.
    lines = []
    for second in range(0, 63):
        moment = at(second).timestamp()
        lines.append({"t": moment, "cohort": "high_value", "version": 2, "role": "candidate", "outcome": "ok"})
        core = 2 if second >= 43 else 1
        lines.append({"t": moment + 0.5, "cohort": "core", "version": core, "role": "x", "outcome": "ok"})
    hour = T0.strftime("%Y%m%dT%H")
    text = "\n".join(json.dumps(line) for line in lines) + "\n"
    write_text_atomic(home / "gateway" / "parcel_eta" / "decisions" / f"{hour}-test-1.jsonl", text)
    # The analysis trail: each tick's estimate and band per contract (what the evidence plot draws).
    store = RolloutStore(home / "rollout", MODEL_NAME)
    rec = record(events, phase="promoted", reason="promoted")
    for tick in range(1, 7):
        width = 0.3 / tick
        store.append_evidence(
            rec,
            {
                "at": at(3 * tick).isoformat(),
                "stage": 1,
                "elapsed_s": 3.0 * tick,
                "results": [
                    [
                        "*",
                        "latency",
                        "continue" if tick < 6 else "pass",
                        0.02,
                        0.02 - width,
                        0.02 + width,
                        0.2231,
                        "latency +25% vs stable at α=0.01",
                    ]
                ],
            },
        )


def write_cohort_rollback_run(home: Path) -> None:
    """A run whose long_tail cohort breached in stage 2 and went back to stable; the rest passed, then paused."""
    write_pipeline(home, champion=1)
    write_shadow(home)
    breach = analysis(2, "rollback_cohort", {"high_value": "pass", "long_tail": "fail"}, 0.2345)
    events = [
        Event(at=at(0), kind="stage_opened", stage=1, detail={"candidate_percent": {"high_value": 100.0}}),
        Event(at=at(20), kind="analysis", stage=1, detail=analysis(1, "advance", {"high_value": "pass"}, 0)),
        Event(
            at=at(21), kind="stage_opened", stage=2, detail={"candidate_percent": {"high_value": 100, "long_tail": 100}}
        ),
        Event(at=at(41), kind="analysis", stage=2, detail=breach),
        Event(at=at(41.5), kind="cohort_rolled_back", stage=2, detail={"cohorts": ["long_tail"], "reason": "x"}),
        Event(at=at(42), kind="stage_opened", stage=3, detail={"candidate_percent": {"*": 95.0, "long_tail": 0.0}}),
        Event(
            at=at(62), kind="analysis", stage=3, detail=analysis(3, "pause", {"high_value": "pass", "core": "pass"}, 0)
        ),
    ]
    reason = "passed, but long_tail was rolled back: promote by hand"
    save_record(home, record(events, phase="paused", excluded=("long_tail",), reason=reason), archived=False)
    outcome(home, "analyze_2", result={"stage": 2, "action": "rollback_cohort", "status": "rollback_cohort"})
    outcome(home, "analyze_3", "skipped", reason=f"mlrelease step analyze: skipped: rollout of v2 paused: {reason}")


def write_stopped_at_validate_data(home: Path) -> None:
    """A run whose data-quality gate failed: nothing after validate_data ran."""
    outcome(home, "apply_features", result={"feature_views": ["route_features"], "online_store": "sqlite"})
    outcome(home, "materialize", result={"rows_written": 10, "views": {}, "duration_s": 1.0})
    write_data_checks(home, ok=False)


def write_bootstrap_run(home: Path) -> None:
    """The first release: no champion, the benchmark makes v2 champion, shadow and rollout skip."""
    write_pipeline(home, champion=None)
    reason = "mlrelease step shadow: skipped: v2 is the champion already (first release or promoted)"
    outcome(home, "shadow", "skipped", reason=reason)


# ---- helpers -----------------------------------------------------------------------------------------------


def build(home: Path) -> tuple[dict, str]:
    """Build without MLflow; the result and the page's HTML."""
    result = build_report(Settings.from_env(), END, log_to_mlflow=False)
    return result, (Path(result["report"]) / "index.html").read_text(encoding="utf-8")


def states(result: dict) -> dict[str, str]:
    """Section name → state from the step's result."""
    return {s["name"]: s["state"] for s in result["sections"]}


def assert_valid_pngs(folder: Path, names: list[str]) -> None:
    """Each file is a decodable PNG with a real size."""
    for name in names:
        with Image.open(folder / name) as image:
            assert image.format == "PNG", name
            assert image.width > 300 and image.height > 150, (name, image.size)
            image.verify()


# ---- collect + render --------------------------------------------------------------------------------------


def test_promoted_run_has_every_section_its_numbers_and_plots(home: Path) -> None:
    write_promoted_run(home)
    result, html = build(home)
    assert result["verdict"] == "Promoted"
    assert states(result) == dict.fromkeys(("data_quality", "model_metrics", "benchmark", "shadow", "rollout"), "ok")
    assert result["report"] == str(report_dir(Settings.from_env(), KEY))
    assert result["url"].endswith(f"/{KEY}/report/index.html")
    for text in (
        "Promoted",
        "v2 is champion (was v1)",
        "2.0424",  # candidate MAE
        "2.0599",  # champion MAE
        "-0.8%",  # MAE change
        "0.0123",  # routes.distance_km PSI
        "1.5 h",  # route_features lag (5400 s)
        "9.0 h",  # its budget
        "2463",  # throughput at concurrency 4
        "6.5 %",  # shadow: long_tail differing rows
        "stage 3 everyone",
        "promoted",
    ):
        assert text in html, text
    pngs = [f for f in result["files"] if f.endswith(".png")]
    assert set(pngs) == {
        "data_quality_drift.png",
        "data_quality_freshness.png",
        "model_metrics.png",
        "benchmark.png",
        "shadow.png",
        "rollout.png",
        "evidence.png",
    }
    assert all(f'src="{name}"' in html for name in pngs)  # relative, next to index.html
    assert_valid_pngs(Path(result["report"]), pngs)
    assert "http://" not in html and "https://" not in html  # nothing to fetch: renders offline


def test_promoted_run_timeline_and_served_share_from_the_decision_log(home: Path) -> None:
    write_promoted_run(home)
    report = collect(Settings.from_env(), KEY)
    rollout = report.rollout
    assert rollout.cohorts[:2] == ("high_value", "long_tail") and "core" in rollout.cohorts
    final = rollout.shares[-1].shares
    assert final == {c: 100.0 for c in rollout.cohorts}  # promoted: everyone on the candidate
    before_everyone = next(p for p in rollout.shares if p.at == at(21)).shares
    assert before_everyone == {"high_value": 100.0, "long_tail": 100.0, "core": 0.0}
    assert [m.kind for m in rollout.markers][-1] == "promoted"
    # Served: every high_value call went to v2; core only after 43 s (the decision log is the truth).
    assert {p.share for p in rollout.served["high_value"]} == {100.0}
    core = rollout.served["core"]
    assert core[0].share == 0.0 and core[-1].share == 100.0
    assert [s.number for s in rollout.stages] == [1, 2, 3]
    assert rollout.stages[2].verdicts["core"] == "pass"


def test_cohort_rollback_is_the_verdict_and_marked_on_the_timeline(home: Path) -> None:
    write_cohort_rollback_run(home)
    result, html = build(home)
    assert result["verdict"] == "Rolled back (cohort long_tail)"
    assert states(result)["rollout"] == "failed"
    assert "rollback long_tail" in html and "paused for a human" in html
    assert "0.2345" in html  # the breaching long_tail low_confidence_share, from the record's analysis
    report = collect(Settings.from_env(), KEY)
    after = next(p for p in report.rollout.shares if p.at == at(41.5)).shares
    assert after["long_tail"] == 0.0 and after["high_value"] == 100.0
    last_stage = next(p for p in report.rollout.shares if p.at == at(42)).shares
    assert last_stage == {"high_value": 95.0, "long_tail": 0.0, "core": 95.0}
    assert ("cohort_rolled_back", "rollback long_tail") in [(m.kind, m.label) for m in report.rollout.markers]
    assert_valid_pngs(Path(result["report"]), ["rollout.png"])


def test_run_stopped_at_validate_data_renders_with_sections_not_reached(home: Path) -> None:
    write_stopped_at_validate_data(home)
    result, html = build(home)
    assert result["verdict"] == "Stopped at validate_data"
    assert states(result) == {
        "data_quality": "failed",
        "model_metrics": "not reached",
        "benchmark": "not reached",
        "shadow": "not reached",
        "rollout": "not reached",
    }
    assert "routes.distance_km: drift PSI 0.432 &gt; 0.25" in html  # the gate's error, escaped
    assert "0.4321" in html and "DRIFT" in html
    assert html.count(">not reached</span>") == 4
    assert sorted(f for f in result["files"] if f.endswith(".png")) == [
        "data_quality_drift.png",
        "data_quality_freshness.png",
    ]
    assert_valid_pngs(Path(result["report"]), ["data_quality_drift.png", "data_quality_freshness.png"])


def test_bootstrap_run_has_no_rollout_but_its_own_numbers(home: Path) -> None:
    write_bootstrap_run(home)
    result, html = build(home)
    assert result["verdict"] == "Bootstrap"
    assert "v2 became the first champion; no rollout" in html
    assert states(result)["shadow"] == "skipped" and states(result)["rollout"] == "skipped"
    assert states(result)["model_metrics"] == "ok" and "2.0424" in html
    assert "model_metrics.png" in result["files"] and "rollout.png" not in result["files"]


def test_an_empty_run_still_renders(home: Path) -> None:
    result, html = build(home)
    assert result["verdict"] == "Not run"
    assert set(states(result).values()) == {"not reached"}
    assert result["files"] == ["index.html"]


def test_run_data_is_escaped_in_the_page(home: Path) -> None:
    write_stopped_at_validate_data(home)
    outcome(home, "validate_data", "failed", error="bad <script>alert(1)</script> value")
    _, html = build(home)
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


@pytest.mark.parametrize("relative", ["steps/train.json", "data_quality/validation.json", "rollout/shadow.json"])
def test_a_corrupt_input_is_an_error_naming_the_file(home: Path, relative: str) -> None:
    write_promoted_run(home)
    path = home / "artifacts" / "parcel_eta" / KEY / relative
    path.write_text('{"status": "success", "result": {', encoding="utf-8")
    with pytest.raises(ReportInputError, match=str(path)):
        build(home)


def test_a_corrupt_rollout_record_is_an_error_naming_the_file(home: Path) -> None:
    write_promoted_run(home)
    path = home / "rollout" / "history" / f"{MODEL_NAME}-v2-{KEY}.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ReportInputError, match=str(path)):
        build(home)


# ---- publishing --------------------------------------------------------------------------------------------


def test_a_rerun_replaces_the_report_as_a_whole(home: Path) -> None:
    write_stopped_at_validate_data(home)
    first, _ = build(home)
    folder = Path(first["report"])
    (folder / "stale.png").write_bytes(b"left over")
    write_promoted_run(home)  # the interval was rerun and went all the way
    second, html = build(home)
    assert second["report"] == first["report"] and "Promoted" in html
    assert not (folder / "stale.png").exists()
    assert sorted(p.name for p in folder.iterdir()) == sorted(second["files"])
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".")] == [".report.lock"]


def test_a_failed_build_keeps_the_previous_report(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_bootstrap_run(home)
    first, html_before = build(home)

    def broken(report: object, folder: Path) -> list[str]:
        (folder / "index.html").write_text("half", encoding="utf-8")
        raise RuntimeError("disk full")

    monkeypatch.setattr("mlrelease.steps.report.write_page", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        build(home)
    folder = Path(first["report"])
    assert (folder / "index.html").read_text(encoding="utf-8") == html_before
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".staging")]


def test_unreachable_mlflow_still_writes_the_report(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlrelease_drills.devkit import free_port

    write_bootstrap_run(home)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    result = build_report(Settings.from_env(), END)
    assert result["mlflow_artifact_uri"] is None
    assert "abc123" in result["mlflow_error"] or "Connection" in result["mlflow_error"]
    html = (Path(result["report"]) / "index.html").read_text(encoding="utf-8")
    assert "Bootstrap" in html and "abc123" in html  # the run id is still named on the page


def test_the_report_is_attached_to_the_training_run(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    from mlrelease.registry import Registry

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    registry = Registry.from_settings(Settings.from_env())
    registry.client()
    with mlflow.start_run(experiment_id=registry.experiment_id()) as run:
        mlflow.log_metrics({"mae": 2.5, "champion_mae": 2.6})
    write_bootstrap_run(home)
    outcome(home, "train", result={"model_version": 2, "run_id": run.info.run_id, "status": "already trained"})
    result = build_report(Settings.from_env(), END)
    assert "mlflow_error" not in result
    assert result["mlflow_artifact_uri"].endswith(f"{run.info.run_id}/artifacts/release_report")
    logged = {a.path for a in registry.client().list_artifacts(run.info.run_id, "release_report")}
    assert {f"release_report/{name}" for name in result["files"]} == logged
    html = (Path(result["report"]) / "index.html").read_text(encoding="utf-8")
    assert "2.5000" in html and "2.6000" in html  # a rerun of train: metrics come from the MLflow run


# ---- Airflow plugin: the served report and the task link ---------------------------------------------------


@pytest.fixture(scope="module")
def served_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One promoted run's report, built once for the plugin tests."""
    home = tmp_path_factory.mktemp("served")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLRELEASE_HOME", str(home))
        write_promoted_run(home)
        build(home)
    return home


@pytest.fixture
def client(served_home: Path, monkeypatch: pytest.MonkeyPatch):
    """A TestClient on the plugin's app as Airflow mounts it (under /mlrelease), with auth admitted."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from mlrelease_airflow.report_plugin import URL_PREFIX, create_app

    monkeypatch.setenv("MLRELEASE_HOME", str(served_home))
    root = FastAPI()
    root.mount(URL_PREFIX, create_app(authorize=lambda: None))
    with TestClient(root) as test_client:
        yield test_client


def test_plugin_serves_the_report_and_its_plots(served_home: Path, client) -> None:
    page = client.get(f"/mlrelease/reports/{NIGHTLY}/{KEY}/index.html")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "Promoted" in page.text
    png = client.get(f"/mlrelease/reports/{NIGHTLY}/{KEY}/rollout.png")
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content == (served_home / "artifacts" / "parcel_eta" / KEY / "report" / "rollout.png").read_bytes()
    redirect = client.get(f"/mlrelease/reports/{NIGHTLY}/{KEY}", follow_redirects=False)
    assert redirect.status_code == 307 and redirect.headers["location"] == f"{KEY}/index.html"


def test_plugin_404s_what_is_not_a_report_file(served_home: Path, client) -> None:
    unknown = client.get(f"/mlrelease/reports/{NIGHTLY}/20261201T020000Z/index.html")
    assert unknown.status_code == 404 and "has no report yet" in unknown.json()["detail"]
    assert client.get(f"/mlrelease/reports/{NIGHTLY}/{KEY}/missing.png").status_code == 404
    assert client.get(f"/mlrelease/reports/{NIGHTLY}/not-a-key/index.html").status_code == 404
    assert (
        client.get(f"/mlrelease/reports/{NIGHTLY}/2026113T2Z/index.html").status_code == 404
    )  # parses, but not canonical
    # Only a nightly release DAG's runs have reports; another model's DAG has its own (none here).
    other = client.get(f"/mlrelease/reports/rollback_release/{KEY}/index.html")
    assert other.status_code == 404 and "not a nightly release DAG" in other.json()["detail"]
    assert client.get(f"/mlrelease/reports/nightly_release_late_delivery/{KEY}/index.html").status_code == 404
    notes = served_home / "artifacts" / "parcel_eta" / KEY / "report" / "notes.txt"
    write_text_atomic(notes, "x")
    assert client.get(f"/mlrelease/reports/{NIGHTLY}/{KEY}/notes.txt").status_code == 404  # only .html and .png
    notes.unlink()


@pytest.mark.parametrize(
    "path",
    [
        f"/mlrelease/reports/{NIGHTLY}/{KEY}/..%2Fsteps%2Ftrain.json",
        f"/mlrelease/reports/{NIGHTLY}/{KEY}/%2E%2E%2F%2E%2E%2Fsteps%2Ftrain.json",
        f"/mlrelease/reports/{NIGHTLY}/{KEY}/..",
        "/mlrelease/reports/..%2F..%2F..%2Fetc/passwd",
        f"/mlrelease/reports/nightly_release_..%2Fparcel_eta/{KEY}/index.html",
        f"/mlrelease/reports/nightly_release_parcel_eta%2F..%2Fparcel_eta/{KEY}/index.html",
        f"/mlrelease/reports/{NIGHTLY}/{KEY}/.staging-report-x",
    ],
)
def test_plugin_refuses_paths_out_of_the_report(client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404, response.text
    assert "task_id" not in response.text  # train.json's content never leaks


def test_plugin_app_requires_airflow_credentials(served_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from mlrelease_airflow.report_plugin import create_app

    monkeypatch.setenv("MLRELEASE_HOME", str(served_home))
    with TestClient(create_app()) as anonymous:
        assert anonymous.get(f"/reports/{NIGHTLY}/{KEY}/index.html").status_code == 401


def test_release_report_link_points_at_the_runs_report(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.models.taskinstancekey import TaskInstanceKey

    from mlrelease_airflow import report_plugin

    runs = {(NIGHTLY, RUN): END, ("nightly_release_late_delivery", RUN): END}
    monkeypatch.setattr(report_plugin, "data_interval_end", lambda dag_id, run_id: runs.get((dag_id, run_id)))
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/")
    link = report_plugin.ReleaseReportLink()
    key = TaskInstanceKey(dag_id=NIGHTLY, task_id="train", run_id=RUN, try_number=1)
    assert (
        link.get_link(None, ti_key=key) == f"https://airflow.example.com/mlrelease/reports/{NIGHTLY}/{KEY}/index.html"
    )
    other_model = key._replace(dag_id="nightly_release_late_delivery")
    assert link.get_link(None, ti_key=other_model).endswith(f"/reports/nightly_release_late_delivery/{KEY}/index.html")
    assert link.get_link(None, ti_key=key._replace(run_id="manual__other")) == ""
    assert link.get_link(None, ti_key=key._replace(dag_id="rollback_release")) == ""
    monkeypatch.delenv("AIRFLOW__API__BASE_URL")
    assert link.get_link(None, ti_key=key) == f"/mlrelease/reports/{NIGHTLY}/{KEY}/index.html"  # relative to the UI


def test_airflow_loads_the_plugin_from_the_plugins_folder() -> None:
    from airflow._shared.plugins_manager.plugins_manager import _load_plugins_from_plugin_directory

    folder = Path(__file__).resolve().parents[2] / "plugins"
    plugins, errors = _load_plugins_from_plugin_directory(str(folder))
    assert not [path for path in errors if path.endswith("report_plugin.py")], errors
    ours = next(p for p in plugins if p.name == "mlrelease_reports")
    assert [link.name for link in ours.global_operator_extra_links] == ["Release report"]
    assert [(a["url_prefix"], type(a["app"]).__name__) for a in ours.fastapi_apps] == [("/mlrelease", "FastAPI")]

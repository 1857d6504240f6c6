from datetime import UTC, datetime

from mlrelease.settings import Settings
from mlrelease.storage import write_json_atomic
from mlrelease.summary import format_summary, step_detail

END = datetime(2026, 11, 29, 2, tzinfo=UTC)


def _record(home, task, run_id, status, **extra):
    path = home / "artifacts/parcel_eta/20261129T020000Z/steps" / f"{task}.json"
    write_json_atomic(path, {"task_id": task, "step": task, "run_id": run_id, "status": status, **extra})


def test_summary_shows_only_the_latest_run_of_the_interval(home):
    _record(home, "validate_data", "run1", "success", result={"tables": {"orders": {"rows": 5}}})
    _record(home, "apply_features", "run2", "success", result={"feature_views": ["a"], "online_store": "sqlite"})
    _record(home, "materialize", "run2", "failed", error="mlrelease step materialize: error: partition missing")
    text = format_summary(Settings.from_env(), END)
    assert "apply_features   ok      1 feature views" in text
    assert "materialize      FAILED  mlrelease step materialize: error: partition missing" in text
    assert "validate_data    not run" in text  # run1's success does not belong to run2
    assert "result: FAILED" in text


def test_summary_of_a_run_that_never_happened(home):
    text = format_summary(Settings.from_env(), END)
    assert "result: FAILED" in text and "apply_features   not run" in text


def test_the_train_line_says_what_the_models_own_gate_judged():
    regression = {"model_version": 2, "status": "registered as challenger", "metrics": {"mae": 2.06}}
    regression["champion_metrics"] = {"mae": 2.048}
    assert step_detail("train", regression) == "v2 registered as challenger: holdout MAE 2.060 h (champion 2.048 h)"
    decision = "holdout log loss 0.2689, AUC 0.932 vs champion log loss 0.2692, AUC 0.932"
    classifier = {"model_version": 2, "status": "registered as challenger", "metrics": {"auc": 0.93}}
    assert step_detail("train", {**classifier, "decision": decision}) == f"v2 registered as challenger: {decision}"

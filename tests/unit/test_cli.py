"""The CLI's error contract: one line naming the problem on stderr; exit 2 to fix or retry, 3 for a gate verdict."""

from __future__ import annotations

import json

import pytest

from mlrelease.cli import EXIT_CRASH, EXIT_GATE_FAILED, EXIT_SKIPPED, EXIT_STEP_ERROR, main
from mlrelease.errors import GateFailed, Skipped, StepError


def test_bad_timestamp_exits_2_with_one_line_naming_the_argument(home, capsys):
    assert main(["step", "materialize", "--start", "yesterday", "--end", "2026-11-29"]) == EXIT_STEP_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "mlrelease step materialize: error: bad --start 'yesterday': expected ISO-8601 like 2026-11-29 "
        "or 2026-11-29T02:00:00+00:00"
    ]


def test_gate_failures_exit_3_and_step_errors_exit_2(home, monkeypatch, capsys):
    import mlrelease.steps.check_freshness as freshness

    monkeypatch.setattr(freshness, "check_freshness", lambda settings, end: (_ for _ in ()).throw(GateFailed("stale")))
    assert main(["step", "check-freshness", "--end", "2026-11-29"]) == EXIT_GATE_FAILED
    monkeypatch.setattr(freshness, "check_freshness", lambda settings, end: (_ for _ in ()).throw(StepError("gone")))
    assert main(["step", "check-freshness", "--end", "2026-11-29"]) == EXIT_STEP_ERROR
    assert capsys.readouterr().err.splitlines()[-1] == "mlrelease step check-freshness: error: gone"


def test_success_writes_the_result_to_the_xcom_path(home, monkeypatch):
    import mlrelease.steps.check_freshness as freshness

    monkeypatch.setattr(freshness, "check_freshness", lambda settings, end: {"end": end.isoformat()})
    assert main(["step", "check-freshness", "--end", "2026-11-29T02:00:00Z"]) == 0
    assert json.loads((home / "xcom/return.json").read_text()) == {"end": "2026-11-29T02:00:00+00:00"}


IDENTITY = {
    "MLRELEASE_TASK_ID": "check_freshness",
    "MLRELEASE_RUN_ID": "scheduled__2026-11-29T02:00:00+00:00",
    "MLRELEASE_TRY_NUMBER": "2",
    "MLRELEASE_DATA_INTERVAL_END": "2026-11-29T02:00:00+00:00",
}
OUTCOME = "artifacts/parcel_eta/20261129T020000Z/steps/check_freshness.json"


def test_a_step_run_by_a_task_records_its_outcome_next_to_its_result(home, monkeypatch):
    import mlrelease.steps.check_freshness as freshness

    monkeypatch.setattr(freshness, "check_freshness", lambda settings, end: {"views": {}})
    assert main(["step", "check-freshness", "--end", "2026-11-29T02:00:00Z"]) == 0
    assert not (home / "artifacts").exists()  # by hand (no task identity): nothing recorded
    for name, value in IDENTITY.items():
        monkeypatch.setenv(name, value)
    assert main(["step", "check-freshness", "--end", "2026-11-29T02:00:00Z"]) == 0
    assert json.loads((home / OUTCOME).read_text()) == {
        "task_id": "check_freshness",
        "step": "check-freshness",
        "run_id": "scheduled__2026-11-29T02:00:00+00:00",
        "try_number": 2,
        "exit_code": 0,
        "recorded_by": "step",
        "status": "success",
        "result": {"views": {}},
    }
    monkeypatch.setattr(freshness, "check_freshness", lambda settings, end: (_ for _ in ()).throw(Skipped("idle")))
    assert main(["step", "check-freshness", "--end", "2026-11-29T02:00:00Z"]) == EXIT_SKIPPED
    recorded = json.loads((home / OUTCOME).read_text())
    assert recorded["status"] == "skipped" and recorded["reason"] == "mlrelease step check-freshness: skipped: idle"


def test_a_crash_is_recorded_then_raised_and_a_lost_record_never_fails_a_step(home, monkeypatch, capsys):
    import mlrelease.steps.check_freshness as freshness

    for name, value in IDENTITY.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(freshness, "check_freshness", lambda settings, end: {}["missing"])
    with pytest.raises(KeyError):
        main(["step", "check-freshness", "--end", "2026-11-29T02:00:00Z"])
    recorded = json.loads((home / OUTCOME).read_text())
    assert recorded["status"] == "failed" and recorded["exit_code"] == EXIT_CRASH
    assert recorded["error"] == "mlrelease step check-freshness: error: unexpected KeyError: 'missing'"
    assert capsys.readouterr().err.strip() == recorded["error"]  # the one line, ahead of the traceback
    # The record cannot be written (its folder is a file): the step's work stands (exit 0), with a warning.
    steps = (home / OUTCOME).parent
    (home / OUTCOME).unlink()
    steps.rmdir()
    steps.write_text("not a folder")
    monkeypatch.setattr(freshness, "check_freshness", lambda settings, end: {"views": {}})
    assert main(["step", "check-freshness", "--end", "2026-11-29T02:00:00Z"]) == 0
    assert "warning: outcome of task check_freshness not recorded" in capsys.readouterr().err


def test_a_malformed_task_identity_is_an_error_naming_the_variable(home, monkeypatch, capsys):
    monkeypatch.setenv("MLRELEASE_TASK_ID", "check_freshness")
    monkeypatch.setenv("MLRELEASE_DATA_INTERVAL_END", "{{ data_interval_end }}")  # never rendered
    assert main(["step", "check-freshness", "--end", "2026-11-29T02:00:00Z"]) == EXIT_STEP_ERROR
    assert "bad MLRELEASE_DATA_INTERVAL_END" in capsys.readouterr().err


def test_a_result_with_nan_or_infinite_numbers_is_written_as_strict_json(tmp_path):
    import json
    import math

    from mlrelease.xcom import write_result

    path = tmp_path / "return.json"
    write_result(path, {"band": {"estimate": math.nan, "lower": -math.inf, "upper": math.inf}, "rows": [1.5, math.nan]})

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    assert json.loads(path.read_text(), parse_constant=refuse) == {
        "band": {"estimate": None, "lower": None, "upper": None},
        "rows": [1.5, None],
    }

"""The CLI's error contract: one line naming the problem on stderr; exit 2 to fix or retry, 3 for a gate verdict."""

from __future__ import annotations

import json

from mlrelease.cli import EXIT_GATE_FAILED, EXIT_STEP_ERROR, main
from mlrelease.errors import GateFailed, StepError


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

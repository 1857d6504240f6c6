"""Alert composition: what each channel says for each event, where the numbers come from, and config parsing."""

from __future__ import annotations

import email
import email.policy
import json
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from mlrelease_airflow.notifiers import release_alerts
from mlrelease_airflow.notify_alert import AlertDeliveryError, alert_from_context, check_event, subscribed
from mlrelease_airflow.notify_email import addresses, email_message, settings_from_connection
from mlrelease_airflow.notify_slack import slack_message
from mlrelease_airflow.notify_webhook import alert_payload, connection_url

KEY = "20261129T020000Z"
END = datetime(2026, 11, 29, 2, tzinfo=UTC)
BASE = "https://reports.example.org/mlrelease/reports"


class FakeTI:
    """The task-instance attributes a callback reads, with an XCom result (or a failing XCom lookup)."""

    def __init__(self, task_id: str = "rollback", result=None, xcom_error: Exception | None = None):
        self.dag_id = "nightly_release_parcel_eta"
        self.task_id = task_id
        self.run_id = "scheduled__2026-11-29T02:00:00+00:00"
        self.try_number = 1
        self.log_url = f"http://airflow.local/dags/nightly_release_parcel_eta/runs/x/tasks/{task_id}?try_number=1"
        self._result = result
        self._xcom_error = xcom_error
        self.pulled: list[str] = []

    def xcom_pull(self, task_ids: str):
        self.pulled.append(task_ids)
        if self._xcom_error is not None:
            raise self._xcom_error
        return self._result


def context(ti: FakeTI, *, exception: Exception | None = None, end=END) -> dict:
    return {"ti": ti, "dag_run": SimpleNamespace(run_id=ti.run_id), "exception": exception, "data_interval_end": end}


@pytest.fixture
def rollout_record(home):
    """Write a real rollout record (the store's own model and path) for run KEY: v7 rolled back at stage 2."""
    from mlrelease.registry import MODEL_NAME
    from mlrelease.rollout.machine import Phase
    from mlrelease.rollout.plan import load_plan
    from mlrelease.rollout.store import RolloutRecord, RolloutStore
    from mlrelease.settings import Settings

    def write(run_key: str = KEY, phase: Phase = Phase.ROLLED_BACK, excluded: tuple[str, ...] = ()) -> None:
        record = RolloutRecord(
            model=MODEL_NAME,
            run_key=run_key,
            candidate_version=7,
            stable_version=6,
            profile="demo",
            plan=load_plan(),
            phase=phase,
            stage=2,
            excluded_cohorts=excluded,
            reason="stage long_tail: guardrails failed for long_tail: p99_latency_ratio 2.3 > 2",
            started_at=END,
        )
        RolloutStore.from_settings(Settings.from_env(), MODEL_NAME).update(lambda _: record)

    return write


def test_unknown_event_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown alert event 'deployed'.*task_failed, rolled_back, promoted"):
        check_event("deployed")
    with pytest.raises(ValueError, match="deployed"):
        release_alerts("deployed")


def test_release_alerts_gives_one_notifier_per_channel_for_the_event():
    notifiers = release_alerts("promoted")
    assert [type(n).__name__ for n in notifiers] == ["WebhookAlertNotifier", "SlackAlertNotifier", "EmailAlertNotifier"]
    assert {n.event for n in notifiers} == {"promoted"}


def test_report_link_uses_the_run_key_and_the_base_url(home, monkeypatch):
    monkeypatch.setenv("MLRELEASE_REPORT_BASE_URL", BASE + "/")
    alert = alert_from_context(
        context(FakeTI("validate_data"), exception=RuntimeError("2 checks failed")), "task_failed"
    )
    assert alert.run_key == KEY
    assert alert.report_url == f"{BASE}/nightly_release_parcel_eta/{KEY}/index.html"
    # A string end (as some callers pass) gives the same key.
    assert alert_from_context(context(FakeTI(), end="2026-11-29T02:00:00+00:00"), "task_failed").run_key == KEY


def test_report_link_without_base_url_is_the_file_under_the_run_artifacts(home, monkeypatch):
    monkeypatch.delenv("MLRELEASE_REPORT_BASE_URL", raising=False)
    alert = alert_from_context(context(FakeTI()), "task_failed")
    assert alert.report_url == (home / "artifacts" / "parcel_eta" / KEY / "report" / "index.html").as_uri()


def test_a_run_without_data_interval_has_no_report_link(home):
    alert = alert_from_context(context(FakeTI(), end=None), "task_failed")
    assert alert.run_key is None and alert.report_url is None
    assert "no release report" in slack_message(alert)["blocks"][-1]["elements"][0]["text"]


def test_rolled_back_numbers_come_from_the_record_and_the_task_result(home, rollout_record):
    rollout_record()
    result = {"status": "rolled back", "model_version": 7, "stable_version": 6, "reason": "guardrails failed (xcom)"}
    ti = FakeTI("rollback", result=result)
    alert = alert_from_context(context(ti), "rolled_back")
    assert ti.pulled == ["rollback"]
    assert alert.rollout == {
        "candidate_version": 7,
        "stable_version": 6,
        "stage": 2,
        "stages": 3,
        "stage_name": "long_tail",
        "phase": "rolled_back",
        "reason": "guardrails failed (xcom)",  # the task's own result wins over the record
    }
    assert alert.headline() == "nightly_release_parcel_eta rolled back v7"
    assert (
        alert.subject()
        == "[mlrelease] nightly_release_parcel_eta rolled back v7 (run scheduled__2026-11-29T02:00:00+00:00)"
    )
    assert ("Stage", "2 of 3 (long_tail)") in alert.rollout_fields()


def test_another_runs_record_is_not_quoted(home, rollout_record):
    rollout_record(run_key="20261128T020000Z")
    alert = alert_from_context(context(FakeTI("analyze_2")), "task_skipped")
    assert alert.rollout == {}
    assert alert.headline() == "nightly_release_parcel_eta paused the rollout of the candidate for a human"


def test_paused_rollout_quotes_stage_reason_and_excluded_cohorts(home, rollout_record):
    from mlrelease.rollout.machine import Phase

    rollout_record(phase=Phase.PAUSED, excluded=("long_tail",))
    alert = alert_from_context(context(FakeTI("analyze_2")), "task_skipped")
    assert alert.headline() == "nightly_release_parcel_eta paused the rollout of v7 for a human"
    fields = dict(alert.rollout_fields())
    assert fields["Phase"] == "paused" and fields["Cohorts rolled back"] == "long_tail"
    assert fields["Reason"].startswith("stage long_tail: guardrails failed")


def test_promoted_uses_the_promote_result(home):
    result = {"status": "promoted", "model_version": 8, "previous_version": 7, "previous_unload_after": "2026-11-29T03"}
    alert = alert_from_context(context(FakeTI("promote", result=result)), "promoted")
    assert alert.headline() == "nightly_release_parcel_eta promoted v8"
    assert dict(alert.rollout_fields()) == {
        "Candidate": "v8",
        "Previous champion": "v7",
        "Previous champion unloaded after": "2026-11-29T03",
    }


def test_failing_lookups_never_stop_the_alert(home, rollout_record, caplog):
    rollout_record()
    (home / "rollout" / "parcel_eta.json").write_text("{not json")  # a corrupt record
    ti = FakeTI("rollback", xcom_error=ConnectionError("API server unreachable"))
    alert = alert_from_context(context(ti), "rolled_back")
    assert (
        alert.rollout == {}
        and alert.report_url
        and alert.headline() == "nightly_release_parcel_eta rolled back the candidate"
    )
    assert "API server unreachable" in caplog.text and "rollout record" in caplog.text


def test_slack_blocks_for_a_failure(home, monkeypatch):
    monkeypatch.setenv("MLRELEASE_REPORT_BASE_URL", BASE)
    ti = FakeTI("validate_data")
    message = slack_message(
        alert_from_context(context(ti, exception=RuntimeError("drift PSI 0.4 > 0.25 <x>")), "task_failed")
    )
    header, fields, error, actions, footer = message["blocks"]
    assert header == {
        "type": "header",
        "text": {"type": "plain_text", "text": ":rotating_light: nightly_release_parcel_eta.validate_data failed"},
    }
    assert [f["text"].split("\n")[0] for f in fields["fields"]] == ["*DAG*", "*Task*", "*Run*", "*Try*"]
    assert error["text"]["text"] == "*Error*\n```drift PSI 0.4 &gt; 0.25 &lt;x&gt;```"  # mrkdwn-escaped
    assert [(b["text"]["text"], b["url"]) for b in actions["elements"]] == [
        ("Release report", f"{BASE}/nightly_release_parcel_eta/{KEY}/index.html"),
        ("Task log", ti.log_url),
    ]
    assert "event `task_failed`" in footer["elements"][0]["text"]
    assert message["text"].startswith("nightly_release_parcel_eta.validate_data failed (run ")


def test_slack_shows_a_file_report_as_text_not_a_button(home, monkeypatch):
    monkeypatch.delenv("MLRELEASE_REPORT_BASE_URL", raising=False)
    message = slack_message(alert_from_context(context(FakeTI()), "task_failed"))
    actions = [b for b in message["blocks"] if b["type"] == "actions"]
    assert [e["text"]["text"] for e in actions[0]["elements"]] == ["Task log"]
    assert "file://" in message["blocks"][-1]["elements"][0]["text"]


def test_slack_header_is_clipped_to_the_block_kit_limit(home):
    ti = FakeTI("x" * 300)
    header = slack_message(alert_from_context(context(ti), "task_failed"))["blocks"][0]["text"]["text"]
    assert len(header) == 150 and header.endswith("…")


def test_slack_clips_a_long_error_inside_its_code_fence(home):
    alert = alert_from_context(context(FakeTI(), exception=RuntimeError("e" * 5000)), "task_failed")
    (error,) = [b for b in slack_message(alert)["blocks"] if b["type"] == "section" and "text" in b]
    assert len(error["text"]["text"]) <= 3000 and error["text"]["text"].endswith("…```")


def test_email_is_text_and_html_with_the_report_link_in_both(home, rollout_record, monkeypatch):
    monkeypatch.setenv("MLRELEASE_REPORT_BASE_URL", BASE)
    rollout_record()
    alert = alert_from_context(context(FakeTI("analyze_2"), exception=RuntimeError("rolled back <v7>")), "task_failed")
    raw = email_message(alert, "mlrelease@example.org", ("a@example.org", "b@example.org")).as_bytes()
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    assert (
        msg["Subject"]
        == "[mlrelease] nightly_release_parcel_eta.analyze_2 failed (run scheduled__2026-11-29T02:00:00+00:00)"
    )
    assert msg["To"] == "a@example.org, b@example.org" and msg["X-Mlrelease-Event"] == "task_failed"
    assert msg.get_content_type() == "multipart/alternative"
    text = msg.get_body(("plain",)).get_content()
    page = msg.get_body(("html",)).get_content()
    report = f"{BASE}/nightly_release_parcel_eta/{KEY}/index.html"
    assert f"Release report: {report}" in text and f"href='{report}'" in page
    assert "Candidate: v7" in text and "<th align='left'>Stage</th><td>2 of 3 (long_tail)</td>" in page
    assert "rolled back &lt;v7&gt;" in page and "<v7>" not in page  # the error is escaped in HTML


def test_json_payload_carries_report_link_and_numbers(home, monkeypatch):
    monkeypatch.setenv("MLRELEASE_REPORT_BASE_URL", BASE)
    result = {"status": "promoted", "model_version": 8, "previous_version": 7}
    body = alert_payload(context(FakeTI("promote", result=result)), "json", "promoted")
    assert body["event"] == "promoted" and body["report_url"] == f"{BASE}/nightly_release_parcel_eta/{KEY}/index.html"
    assert body["rollout"] == {"candidate_version": 8, "stable_version": 7}
    json.dumps(body)  # serializable as sent


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (
            "smtp://alerts:p%40ss@mail.example.org?disable_ssl=true",
            ("mail.example.org", 587, "starttls", "alerts", "p@ss"),
        ),
        ("smtp://mail.example.org", ("mail.example.org", 465, "ssl", None, None)),
        ("smtp://127.0.0.1:2525?disable_ssl=true&disable_tls=true", ("127.0.0.1", 2525, "none", None, None)),
    ],
)
def test_smtp_connection_uri_forms(uri, expected):
    """AIRFLOW_CONN_MLRELEASE_SMTP as a URI: the SMTP provider's fields, recipients and sender in the query."""
    from airflow.sdk import Connection

    query = "to=a%40example.org%3B+b%40example.org&from_email=mlrelease%40example.org"
    uri += ("&" if "?" in uri else "?") + query
    settings = settings_from_connection(Connection.from_uri(uri, conn_id="mlrelease_smtp"))
    assert (settings.host, settings.port, settings.security, settings.login, settings.password) == expected
    assert settings.recipients == ("a@example.org", "b@example.org") and settings.sender == "mlrelease@example.org"
    assert settings.where.endswith("connection mlrelease_smtp)")


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("smtp://u:secret@mail.example.org:25?timeout=soon", "bad port or timeout"),
        ("smtp://u:secret@", "has no host"),
    ],
)
def test_bad_smtp_connection_names_the_problem_not_the_password(uri, problem):
    from airflow.sdk import Connection

    with pytest.raises(AlertDeliveryError, match=f"SMTP connection 'mlrelease_smtp'.*{problem}") as err:
        settings_from_connection(Connection.from_uri(uri, conn_id="mlrelease_smtp"))
    assert "secret" not in str(err.value)


def test_webhook_connection_forms():
    from airflow.sdk import Connection

    def conn(**fields):
        return Connection(conn_id="mlrelease_alerts", **fields)

    assert connection_url(conn(conn_type="http", extra=json.dumps({"url": "https://h.example.org/x"}))) == (
        "https://h.example.org/x"
    )
    assert connection_url(conn(conn_type="https", host="h.example.org", schema="hooks/a")) == (
        "https://h.example.org/hooks/a"
    )
    uri = Connection.from_uri("http://127.0.0.1:9999/hooks%2Falerts?format=slack", conn_id="mlrelease_alerts")
    assert connection_url(uri) == "http://127.0.0.1:9999/hooks/alerts" and uri.extra_dejson["format"] == "slack"


def test_smtp_connection_follows_the_provider_fields():
    from airflow.sdk import Connection

    def conn(**extra):
        return Connection(conn_id="mlrelease_smtp", conn_type="smtp", host="mail", port=None, extra=json.dumps(extra))

    assert (settings_from_connection(conn()).security, settings_from_connection(conn()).port) == ("ssl", 465)
    starttls = settings_from_connection(conn(disable_ssl=True, to="ops@example.org", from_email="ml@example.org"))
    assert (starttls.security, starttls.port, starttls.recipients, starttls.sender) == (
        "starttls",
        587,
        ("ops@example.org",),
        "ml@example.org",
    )
    assert settings_from_connection(conn(disable_ssl="true", disable_tls="true")).security == "none"
    with pytest.raises(AlertDeliveryError, match="SMTP connection 'mlrelease_smtp': bad port or timeout"):
        settings_from_connection(conn(timeout="soon"))


def test_event_filters():
    from airflow.sdk import Connection

    from mlrelease_airflow.notify_alert import events_filter

    assert subscribed(None, "promoted", source="X") and subscribed(" ", "promoted", source="X")
    assert subscribed("task_failed, rolled_back", "rolled_back", source="X")
    assert not subscribed("task_failed,rolled_back", "promoted", source="X")
    source = "connection mlrelease_slack extra events"
    with pytest.raises(AlertDeliveryError, match=f"{source}: unknown event.*rollback"):
        subscribed("rollback", "promoted", source=source)
    # The filter is the channel connection's `events` extra, a string or a list.
    listed = Connection(conn_id="c", conn_type="http", extra=json.dumps({"events": ["task_failed", "promoted"]}))
    assert events_filter(listed) == "task_failed,promoted" and subscribed(events_filter(listed), "promoted", source="c")
    assert events_filter(Connection(conn_id="c", conn_type="http")) is None


def test_addresses_split_on_commas_and_semicolons():
    assert addresses(" a@x.org, b@x.org;c@x.org ,") == ("a@x.org", "b@x.org", "c@x.org")
    assert addresses(["a@x.org", " "]) == ("a@x.org",)

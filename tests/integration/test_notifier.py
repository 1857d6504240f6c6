"""The alert notifiers talk to real local receivers: an HTTP server for the webhook and Slack, a real SMTP
server (aiosmtpd) for e-mail, with STARTTLS, implicit TLS and AUTH against a throwaway certificate. Every channel
is configured as Airflow configures connections from the environment (`AIRFLOW_CONN_<ID>`), and only so."""

from __future__ import annotations

import email
import email.policy
import http.server
import json
import ssl
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlrelease_airflow.notifiers import release_alerts
from mlrelease_airflow.notify_alert import EVENTS, AlertDeliveryError
from mlrelease_airflow.notify_email import EmailAlertNotifier
from mlrelease_airflow.notify_slack import SlackAlertNotifier
from mlrelease_airflow.notify_webhook import WebhookAlertNotifier, webhook_url
from tests.conftest import free_port

pytestmark = pytest.mark.integration

KEY = "20261129T020000Z"
BASE = "https://reports.example.org/mlrelease/reports"
REPORT = f"{BASE}/nightly_release_parcel_eta/{KEY}/index.html"
LOG = "http://airflow.local/log?x=1"
SENDER = "mlrelease@example.org"
TO = ("oncall@example.org", "ml-team@example.org")
RESULTS = {  # what the promote/rollback steps return (XCom)
    "rolled_back": {"status": "rolled back", "model_version": 7, "stable_version": 6, "reason": "p99 2.3 > 2"},
    "promoted": {"status": "promoted", "model_version": 7, "previous_version": 6},
}
TASKS = {
    "task_failed": "validate_data",
    "rolled_back": "rollback",
    "promoted": "promote",
    "task_skipped": "analyze_2",
    "approval_needed": "approve_2",
}


def _context(event: str = "task_failed"):
    result = RESULTS.get(event)
    ti = SimpleNamespace(
        dag_id="nightly_release_parcel_eta",
        task_id=TASKS[event],
        run_id="scheduled__2026-11-29",
        try_number=2,
        log_url=LOG,
        xcom_pull=lambda task_ids: result,
    )
    return {
        "ti": ti,
        "dag_run": SimpleNamespace(run_id="scheduled__2026-11-29"),
        "exception": RuntimeError("data quality failed (2 checks)") if event == "task_failed" else None,
        "data_interval_end": "2026-11-29T02:00:00+00:00",
    }


@pytest.fixture
def alert_env(home, monkeypatch):
    """An isolated MLRELEASE_HOME, a web report base URL, and no alert channel configured."""
    monkeypatch.setenv("MLRELEASE_REPORT_BASE_URL", BASE)
    for name in (
        "AIRFLOW_CONN_MLRELEASE_ALERTS",
        "AIRFLOW_CONN_MLRELEASE_SLACK",
        "AIRFLOW_CONN_MLRELEASE_SMTP",
    ):
        monkeypatch.delenv(name, raising=False)
    return home


# --- the generic webhook -------------------------------------------------------------------------------


def _webhook(monkeypatch, url: str, **extra) -> None:
    """The generic webhook channel: an `http` connection with the URL in its extra."""
    conn = {"conn_type": "http", "extra": {"url": url, **extra}}
    monkeypatch.setenv("AIRFLOW_CONN_MLRELEASE_ALERTS", json.dumps(conn))


def _slack(monkeypatch, url: str, **extra) -> None:
    """The Slack channel: a Slack Incoming Webhook connection, the webhook URL as its password."""
    conn = {"conn_type": "slackwebhook", "password": url, "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_MLRELEASE_SLACK", json.dumps(conn))


def test_json_alert_from_the_webhook_connection(receiver, alert_env, monkeypatch):
    _webhook(monkeypatch, receiver.url)
    WebhookAlertNotifier().notify(_context())
    assert len(receiver.bodies) == 1
    body = receiver.bodies[0]["body"]
    assert receiver.bodies[0]["path"] == "/hooks/alerts"
    assert body == {
        "event": "task_failed",
        "dag_id": "nightly_release_parcel_eta",
        "task_id": "validate_data",
        "run_id": "scheduled__2026-11-29",
        "try_number": 2,
        "data_interval_end": "2026-11-29T02:00:00+00:00",
        "error": "data quality failed (2 checks)",
        "log_url": LOG,
        "run_key": KEY,
        "report_url": REPORT,
        "rollout": {},
    }


def test_slack_payload_from_an_airflow_connection(receiver, alert_env, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_MLRELEASE_ALERTS", json.dumps({"conn_type": "http", "extra": {"url": receiver.url}})
    )
    assert webhook_url("mlrelease_alerts") == receiver.url
    WebhookAlertNotifier(payload_format="slack").notify(_context())
    body = receiver.bodies[0]["body"]
    assert body["text"].startswith(":rotating_light: *nightly_release_parcel_eta.validate_data* failed")
    assert "data quality failed" in body["text"] and f"<{LOG}|logs>" in body["text"]
    assert f"<{REPORT}|release report>" in body["text"]
    assert body["blocks"][0]["text"]["type"] == "mrkdwn"


def test_connection_given_as_uri(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_MLRELEASE_ALERTS", "http://127.0.0.1:9999/hooks%2Falerts")
    assert webhook_url("mlrelease_alerts") == "http://127.0.0.1:9999/hooks/alerts"


def test_receiver_error_is_raised_not_swallowed(alert_env, monkeypatch):
    _webhook(monkeypatch, f"http://127.0.0.1:{free_port()}/nothing-listens")
    import requests

    with pytest.raises(requests.ConnectionError):
        WebhookAlertNotifier(timeout=2).notify(_context())


def test_webhook_format_and_events_from_the_connection(receiver, alert_env, monkeypatch, capsys):
    WebhookAlertNotifier().notify(_context())  # no connection: skipped, no request
    assert "webhook alert skipped: no connection mlrelease_alerts" in capsys.readouterr().out
    _webhook(monkeypatch, receiver.url, format="slack", events="task_failed,rolled_back")
    WebhookAlertNotifier(event="promoted").notify(_context("promoted"))
    assert receiver.bodies == []
    WebhookAlertNotifier(event="rolled_back").notify(_context("rolled_back"))
    (request,) = receiver.bodies
    assert request["body"]["text"].startswith(
        ":rotating_light: *nightly_release_parcel_eta.rollback* rolled the candidate back"
    )
    _webhook(monkeypatch, receiver.url, format="xml")
    with pytest.raises(AlertDeliveryError, match="connection mlrelease_alerts: format must be one of json, slack"):
        WebhookAlertNotifier().notify(_context())


# --- Slack ---------------------------------------------------------------------------------------------


class FailingReceiver:
    """A real HTTP server that answers every POST with HTTP 500, as Slack does for an invalid payload."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(500)
                self.end_headers()
                self.wfile.write(b"invalid_blocks")

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T000/B000/SECRETTOKEN"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def failing_receiver():
    rec = FailingReceiver()
    yield rec
    rec.server.shutdown()
    rec.server.server_close()


def _blocks(body: dict, kind: str) -> list[dict]:
    return [b for b in body["blocks"] if b["type"] == kind]


@pytest.mark.parametrize("event", EVENTS)
def test_slack_alert_for_each_event(event, receiver, alert_env, monkeypatch):
    _slack(monkeypatch, receiver.url)
    SlackAlertNotifier(event=event)(_context(event))  # called as Airflow calls a callback (renders, then notifies)
    (request,) = receiver.bodies
    body = request["body"]
    assert request["path"] == "/hooks/alerts"
    header = _blocks(body, "header")[0]["text"]["text"]
    expected = {
        "task_failed": ":rotating_light: nightly_release_parcel_eta.validate_data failed",
        "rolled_back": ":rewind: nightly_release_parcel_eta rolled back v7",
        "promoted": ":rocket: nightly_release_parcel_eta promoted v7",
        "task_skipped": ":pause_button: nightly_release_parcel_eta paused the rollout of the candidate for a human",
        "approval_needed": ":raising_hand: nightly_release_parcel_eta asks a human about the candidate: promote, roll "
        "back or extend (Required Actions)",
    }
    assert header == expected[event]
    (actions,) = _blocks(body, "actions")
    assert {b["text"]["text"]: b["url"] for b in actions["elements"]} == {"Release report": REPORT, "Task log": LOG}
    assert f"event `{event}`" in _blocks(body, "context")[0]["elements"][0]["text"]
    fields = [f["text"] for section in _blocks(body, "section") for f in section.get("fields", [])]
    assert "*Run*\nscheduled__2026-11-29" in fields and "*Try*\n2" in fields
    if event in RESULTS:
        stable = "Previous champion" if event == "promoted" else "Stable"
        assert "*Candidate*\nv7" in fields and f"*{stable}*\nv6" in fields


def test_slack_webhook_from_the_connection_url_or_host_and_token(receiver, alert_env, monkeypatch):
    conn = {"conn_type": "slackwebhook", "password": receiver.url}
    monkeypatch.setenv("AIRFLOW_CONN_MLRELEASE_SLACK", json.dumps(conn))
    SlackAlertNotifier(event="promoted").notify(_context("promoted"))
    # The provider's other form: host = base URL, password = the token path.
    base = receiver.url.rsplit("/", 1)[0]
    conn = {"conn_type": "slackwebhook", "host": base, "password": "T000/B000/token"}
    monkeypatch.setenv("AIRFLOW_CONN_MLRELEASE_SLACK", json.dumps(conn))
    SlackAlertNotifier(event="promoted").notify(_context("promoted"))
    assert [r["path"] for r in receiver.bodies] == ["/hooks/alerts", "/hooks/T000/B000/token"]


def test_slack_receiver_error_raises_without_leaking_the_webhook_secret(failing_receiver, alert_env, monkeypatch):
    _slack(monkeypatch, failing_receiver.url)
    # The provider's check of the answer (status and body), prefixed with where it went (host only).
    with pytest.raises(
        AlertDeliveryError,
        match=r"Slack alert to http://127\.0\.0\.1:\d+/… \(connection mlrelease_slack\) was refused: "
        r".*Status Code: 500",
    ) as err:
        SlackAlertNotifier().notify(_context())
    assert "invalid_blocks" in str(err.value) and "SECRETTOKEN" not in str(err.value)


def test_slack_nothing_listening_raises(alert_env, monkeypatch):
    _slack(monkeypatch, f"http://127.0.0.1:{free_port()}/services/x")
    with pytest.raises(AlertDeliveryError, match="Slack alert to .* failed: .*Connection refused"):
        SlackAlertNotifier(timeout=2).notify(_context())


def test_slack_connection_without_webhook_is_a_clear_error(alert_env, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_MLRELEASE_SLACK", json.dumps({"conn_type": "slackwebhook"}))
    with pytest.raises(AlertDeliveryError, match="Slack connection 'mlrelease_slack' is not usable.*password"):
        SlackAlertNotifier().notify(_context())


def test_unconfigured_or_unsubscribed_slack_is_skipped(receiver, alert_env, monkeypatch, capsys):
    SlackAlertNotifier().notify(_context())  # nothing configured: no request, no error
    # The notifier logs through Airflow's structlog (to stdout), not the stdlib logging that caplog sees.
    assert "Slack alert skipped: no connection mlrelease_slack" in capsys.readouterr().out
    _slack(monkeypatch, receiver.url, events="task_failed,rolled_back")
    SlackAlertNotifier(event="promoted").notify(_context("promoted"))
    assert receiver.bodies == []
    assert "Slack alert skipped: promoted is not in the events of connection mlrelease_slack" in capsys.readouterr().out
    SlackAlertNotifier(event="rolled_back").notify(_context("rolled_back"))
    assert len(receiver.bodies) == 1


# --- e-mail --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A throwaway self-signed certificate for 127.0.0.1 (cert.pem doubles as the client's CA file)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return folder / "cert.pem", folder / "key.pem"


class Mailbox:
    """An aiosmtpd handler that keeps every delivered message, and refuses the recipients in `refuse`."""

    def __init__(self, refuse: tuple[str, ...] = ()) -> None:
        self.refuse = refuse
        self.messages: list[dict] = []

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # noqa: N802 - aiosmtpd hook
        if address in self.refuse:
            return "550 5.7.1 relaying denied"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd hook
        self.messages.append(
            {
                "from": envelope.mail_from,
                "to": list(envelope.rcpt_tos),
                "message": email.message_from_bytes(envelope.content, policy=email.policy.default),
                "authenticated_as": session.auth_data.login if session.authenticated else None,
                "tls": server.transport.get_extra_info("ssl_object") is not None,  # STARTTLS or implicit TLS
            }
        )
        return "250 Message accepted"


def _authenticator(server, session, envelope, mechanism, auth_data):
    from aiosmtpd.smtp import AuthResult

    ok = auth_data.login == b"alerts" and auth_data.password == b"s3cret"
    return AuthResult(success=ok, handled=False, auth_data=auth_data if ok else None)


@pytest.fixture
def smtp_server():
    """Start real aiosmtpd servers on free ports: `start(mailbox, **smtp_options)` returns the port."""
    from aiosmtpd.controller import Controller

    started = []

    def start(mailbox: Mailbox, **options) -> int:
        port = free_port()
        controller = Controller(mailbox, hostname="127.0.0.1", port=port, **options)
        controller.start()
        started.append(controller)
        return port

    yield start
    for controller in started:
        controller.stop()


def _server_tls(certificate) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    return context


def _mail_env(monkeypatch, port: int, security: str = "none", **extra) -> None:
    """The e-mail channel: an SMTP connection with the provider's fields (`security`: none, starttls or ssl)."""
    flags = {"none": {"disable_ssl": True, "disable_tls": True}, "starttls": {"disable_ssl": True}, "ssl": {}}
    conn = {
        "conn_type": "smtp",
        "host": "127.0.0.1",
        "port": port,
        "extra": {**flags[security], "from_email": SENDER, "to": ", ".join(TO), **extra},
    }
    monkeypatch.setenv("AIRFLOW_CONN_MLRELEASE_SMTP", json.dumps(conn))


@pytest.mark.parametrize("event", EVENTS)
def test_email_alert_for_each_event(event, smtp_server, alert_env, monkeypatch):
    box = Mailbox()
    _mail_env(monkeypatch, smtp_server(box))
    EmailAlertNotifier(event=event)(_context(event))
    (got,) = box.messages
    assert got["from"] == SENDER and got["to"] == list(TO)
    msg = got["message"]
    subjects = {
        "task_failed": "nightly_release_parcel_eta.validate_data failed",
        "rolled_back": "nightly_release_parcel_eta rolled back v7",
        "promoted": "nightly_release_parcel_eta promoted v7",
        "task_skipped": "nightly_release_parcel_eta paused the rollout of the candidate for a human",
        "approval_needed": "nightly_release_parcel_eta asks a human about the candidate: promote, roll back or extend "
        "(Required Actions)",
    }
    assert msg["Subject"] == f"[mlrelease] {subjects[event]} (run scheduled__2026-11-29)"
    assert msg["From"] == SENDER and msg["To"] == ", ".join(TO)
    assert msg.get_content_type() == "multipart/alternative"
    text, page = msg.get_body(("plain",)).get_content(), msg.get_body(("html",)).get_content()
    assert f"Release report: {REPORT}" in text and f"href='{REPORT}'" in page
    assert f"Task log: {LOG}" in text and f"href='{LOG}'" in page
    if event == "task_failed":
        assert "data quality failed (2 checks)" in text and "data quality failed (2 checks)" in page
    if event in RESULTS:
        assert "Candidate: v7" in text and "<td>v7</td>" in page


def test_email_over_starttls_with_login_from_the_airflow_connection(smtp_server, certificate, alert_env, monkeypatch):
    box = Mailbox()
    port = smtp_server(
        box,
        tls_context=_server_tls(certificate),
        require_starttls=True,
        authenticator=_authenticator,
        auth_required=True,
    )
    conn = {
        "conn_type": "smtp",
        "host": "127.0.0.1",
        "port": port,
        "login": "alerts",
        "password": "s3cret",
        "extra": {
            "disable_ssl": True,
            "from_email": SENDER,
            "to": "oncall@example.org",
            "ca_file": str(certificate[0]),
        },
    }
    monkeypatch.setenv("AIRFLOW_CONN_MLRELEASE_SMTP", json.dumps(conn))
    EmailAlertNotifier(event="rolled_back").notify(_context("rolled_back"))
    (got,) = box.messages
    assert got["tls"] and got["authenticated_as"] == b"alerts" and got["to"] == ["oncall@example.org"]

    conn["password"] = "wrong"
    monkeypatch.setenv("AIRFLOW_CONN_MLRELEASE_SMTP", json.dumps(conn))
    with pytest.raises(AlertDeliveryError, match=r"via 127\.0\.0\.1:\d+ \(starttls, connection mlrelease_smtp\) .*535"):
        EmailAlertNotifier().notify(_context())
    assert len(box.messages) == 1


def test_email_over_implicit_tls_checks_the_certificate(smtp_server, certificate, alert_env, monkeypatch):
    box = Mailbox()
    port = smtp_server(box, ssl_context=_server_tls(certificate))
    _mail_env(monkeypatch, port, "ssl")  # the system CAs do not know the throwaway certificate
    with pytest.raises(AlertDeliveryError, match="ssl, connection mlrelease_smtp.*CERTIFICATE_VERIFY_FAILED"):
        EmailAlertNotifier().notify(_context())
    _mail_env(monkeypatch, port, "ssl", ca_file=str(certificate[0]))
    EmailAlertNotifier().notify(_context())
    (got,) = box.messages
    assert got["tls"] and got["message"]["Subject"].startswith(
        "[mlrelease] nightly_release_parcel_eta.validate_data failed"
    )


def test_email_refused_by_the_server_raises(smtp_server, alert_env, monkeypatch):
    box = Mailbox(refuse=TO)
    _mail_env(monkeypatch, smtp_server(box))
    with pytest.raises(AlertDeliveryError, match="e-mail alert via .* failed: .*550.*relaying denied"):
        EmailAlertNotifier().notify(_context())
    box.refuse = TO[1:]  # one recipient accepted, one refused: delivered, and still an error
    with pytest.raises(AlertDeliveryError, match="recipients refused: .*ml-team@example.org.*550"):
        EmailAlertNotifier().notify(_context())
    assert [m["to"] for m in box.messages] == [[TO[0]]]


def test_email_nothing_listening_raises(alert_env, monkeypatch):
    _mail_env(monkeypatch, free_port(), "starttls")
    with pytest.raises(AlertDeliveryError, match=r"via 127\.0\.0\.1:\d+ \(starttls.*Connection refused"):
        EmailAlertNotifier().notify(_context())


def test_email_unconfigured_is_skipped_and_half_configured_is_an_error(alert_env, monkeypatch, capsys):
    EmailAlertNotifier().notify(_context())
    assert "e-mail alert skipped: no connection mlrelease_smtp" in capsys.readouterr().out
    _mail_env(monkeypatch, free_port(), to="")
    with pytest.raises(AlertDeliveryError, match=r"no recipients \(extra to\)"):
        EmailAlertNotifier().notify(_context())
    _mail_env(monkeypatch, free_port(), from_email="")
    with pytest.raises(AlertDeliveryError, match=r"no sender \(extra from_email\)"):
        EmailAlertNotifier().notify(_context())


def test_email_events_from_the_connection(smtp_server, alert_env, monkeypatch, capsys):
    box = Mailbox()
    _mail_env(monkeypatch, smtp_server(box), events="rolled_back")
    EmailAlertNotifier(event="promoted").notify(_context("promoted"))
    assert box.messages == []
    assert "e-mail alert skipped: promoted is not in the events of connection mlrelease_smtp" in capsys.readouterr().out
    EmailAlertNotifier(event="rolled_back").notify(_context("rolled_back"))
    assert len(box.messages) == 1


# --- all channels together -----------------------------------------------------------------------------


def test_release_alerts_reach_every_configured_channel(receiver, smtp_server, alert_env, monkeypatch):
    box = Mailbox()
    _webhook(monkeypatch, receiver.url)
    _slack(monkeypatch, receiver.url.replace("/alerts", "/slack"))
    _mail_env(monkeypatch, smtp_server(box))
    for notifier in release_alerts("rolled_back"):
        notifier(_context("rolled_back"))
    by_path = {r["path"]: r["body"] for r in receiver.bodies}
    assert by_path["/hooks/alerts"]["event"] == "rolled_back" and by_path["/hooks/alerts"]["report_url"] == REPORT
    assert by_path["/hooks/alerts"]["rollout"]["candidate_version"] == 7
    assert _blocks(by_path["/hooks/slack"], "header")[0]["text"]["text"].endswith("rolled back v7")
    assert box.messages[0]["message"]["Subject"].startswith("[mlrelease] nightly_release_parcel_eta rolled back v7")

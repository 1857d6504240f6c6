"""E-mail alerts over SMTP: a multipart text + HTML message with the task, the rollout numbers and links to the
release report and the task log.

The server is the Airflow connection `mlrelease_smtp` (type *SMTP*, the SMTP provider's fields: host, port,
login, password; extras `from_email`, `disable_ssl`, `disable_tls`, `timeout`) plus extras `to` (recipients,
comma- or semicolon-separated, or a list), `ca_file` (a CA bundle to verify the server with) and `events` (the
comma-separated events the channel receives). No connection: the channel is skipped. As a URI (STARTTLS on 587):
`AIRFLOW_CONN_MLRELEASE_SMTP='smtp://user:pass@mail.example.org:587?disable_ssl=true&from_email=ml%40example.org&to=…'`.

Sent with the standard library (`smtplib`, `email.message`): the SMTP provider's notifier and hook only build a
single HTML part, cannot verify against a private CA (`ssl_context` is `default` or `none`), and retry a refused
send five times."""

from __future__ import annotations

import email.policy
import html
import re
import smtplib
import ssl
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import Any

from airflow.sdk import BaseNotifier

from mlrelease_airflow.notify_alert import (
    Alert,
    AlertDeliveryError,
    alert_from_context,
    check_event,
    connection_or_none,
    subscribed_connection,
)

SMTP_CONN_ID = "mlrelease_smtp"
DEFAULT_PORTS = {"ssl": 465, "starttls": 587, "none": 25}  # by security mode
TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class SmtpSettings:
    """Where and how to send: `security` is `ssl` (implicit TLS), `starttls` or `none`."""

    host: str
    port: int
    security: str
    login: str | None
    password: str | None
    sender: str | None
    recipients: tuple[str, ...]
    timeout: float
    ca_file: str | None
    source: str

    @property
    def where(self) -> str:
        """host:port, the security and where it was configured (never the password)."""
        return f"{self.host}:{self.port} ({self.security}, {self.source})"


def addresses(value: str | list[str] | None) -> tuple[str, ...]:
    """E-mail addresses from a comma/semicolon-separated string or a list."""
    if value is None:
        return ()
    items = value if isinstance(value, list) else re.split(r"[,;]", value)
    return tuple(a.strip() for a in items if a and a.strip())


def _flag(value: Any) -> bool:
    return str(value).strip().lower() in TRUE


def settings_from_connection(conn: Any) -> SmtpSettings:
    """Read an SMTP connection with the SMTP provider's semantics: implicit TLS unless `disable_ssl`,
    else STARTTLS unless `disable_tls`."""
    extra = conn.extra_dejson
    if not conn.host:
        raise AlertDeliveryError(f"SMTP connection {conn.conn_id!r} has no host")
    if _flag(extra.get("disable_ssl", False)):
        security = "none" if _flag(extra.get("disable_tls", False)) else "starttls"
    else:
        security = "ssl"
    try:
        port = int(conn.port or DEFAULT_PORTS[security])
        timeout = float(extra.get("timeout", 30))
    except ValueError as exc:
        raise AlertDeliveryError(f"SMTP connection {conn.conn_id!r}: bad port or timeout ({exc})") from None
    return SmtpSettings(
        host=conn.host,
        port=port,
        security=security,
        login=conn.login or None,
        password=conn.password or None,
        sender=extra.get("from_email") or None,
        recipients=addresses(extra.get("to")),
        timeout=timeout,
        ca_file=extra.get("ca_file"),
        source=f"connection {conn.conn_id}",
    )


def smtp_settings(conn_id: str) -> SmtpSettings | None:
    """The SMTP settings of Airflow connection `conn_id`; None when there is no such connection."""
    conn = connection_or_none(conn_id)
    return settings_from_connection(conn) if conn is not None else None


def _html(alert: Alert) -> str:
    def rows(pairs: list[tuple[str, str]]) -> str:
        return "".join(f"<tr><th align='left'>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in pairs)

    links = []
    if alert.report_url:
        links.append(f"<a href='{html.escape(alert.report_url, quote=True)}'>Release report</a>")
    if alert.log_url:
        links.append(f"<a href='{html.escape(alert.log_url, quote=True)}'>Task log</a>")
    parts = [
        f"<h2>{html.escape(alert.headline())}</h2>",
        f"<p>{' · '.join(links) if links else 'No release report for this run (no data interval).'}</p>",
        f"<table>{rows(alert.task_fields())}</table>",
    ]
    if alert.error:
        parts.append(f"<h3>Error</h3><pre>{html.escape(alert.error)}</pre>")
    if alert.rollout_fields():
        parts.append(f"<h3>Rollout</h3><table>{rows(alert.rollout_fields())}</table>")
    parts.append(
        f"<p style='color:#666'>event {html.escape(alert.event)} · run key {html.escape(str(alert.run_key))}</p>"
    )
    return "<!doctype html><html><body>" + "".join(parts) + "</body></html>"


def _text(alert: Alert) -> str:
    lines = [alert.headline(), ""]
    lines.append(f"Release report: {alert.report_url or 'none (the run has no data interval)'}")
    if alert.log_url:
        lines.append(f"Task log: {alert.log_url}")
    lines.append("")
    lines += [f"{k}: {v}" for k, v in alert.task_fields()]
    if alert.error:
        lines += ["", "Error:", alert.error]
    if alert.rollout_fields():
        lines += ["", "Rollout:"] + [f"  {k}: {v}" for k, v in alert.rollout_fields()]
    lines += ["", f"event {alert.event} · run key {alert.run_key}"]
    return "\n".join(lines) + "\n"


def email_message(alert: Alert, sender: str, recipients: tuple[str, ...]) -> EmailMessage:
    """The alert as multipart/alternative: a plain-text part, then the HTML part."""
    # Headers fold at the RFC's hard limit, not 78: Python's default folding moves a ~75-character subject whole onto
    # a continuation line, which its own parser (and some clients) then read with a leading space.
    msg = EmailMessage(policy=email.policy.SMTP.clone(max_line_length=998))
    msg["Subject"] = alert.subject()
    msg["From"] = sender
    msg["To"] = ", ".join(recipients)
    msg["Date"] = formatdate(localtime=False)
    msg["Message-ID"] = make_msgid(domain="mlrelease")
    msg["X-Mlrelease-Event"] = alert.event
    msg.set_content(_text(alert))
    msg.add_alternative(_html(alert), subtype="html")
    return msg


def send_email(settings: SmtpSettings, msg: EmailMessage) -> None:
    """Deliver `msg` to every recipient; raise AlertDeliveryError naming the server on any failure or refusal."""
    tls = ssl.create_default_context(cafile=settings.ca_file)
    try:
        client: smtplib.SMTP
        if settings.security == "ssl":
            client = smtplib.SMTP_SSL(settings.host, settings.port, timeout=settings.timeout, context=tls)
        else:
            client = smtplib.SMTP(settings.host, settings.port, timeout=settings.timeout)
        with client:
            if settings.security == "starttls":
                client.starttls(context=tls)
            if settings.login:
                client.login(settings.login, settings.password or "")
            refused = client.send_message(msg)
    except (smtplib.SMTPException, OSError) as exc:
        raise AlertDeliveryError(f"e-mail alert via {settings.where} failed: {exc}") from exc
    if refused:  # some recipients accepted, these not
        raise AlertDeliveryError(f"e-mail alert via {settings.where}: recipients refused: {refused}")


class EmailAlertNotifier(BaseNotifier):
    """E-mail an alert over SMTP (connection `mlrelease_smtp`).

    :param event: task_failed (default), rolled_back, promoted, task_skipped or approval_needed.
    :param conn_id: Airflow connection of type *SMTP*.
    """

    template_fields = ("conn_id",)

    def __init__(self, event: str = "task_failed", conn_id: str = SMTP_CONN_ID):
        super().__init__()
        self.event = check_event(event)
        self.conn_id = conn_id

    def notify(self, context: Any) -> None:
        """Send the e-mail; skip (logged) when unconfigured or not subscribed; raise when delivery fails."""
        conn = subscribed_connection(self.conn_id, self.event, "e-mail", self.log)
        if conn is None:
            return
        settings = settings_from_connection(conn)
        if not settings.sender:
            raise AlertDeliveryError(f"e-mail alert via {settings.where}: no sender (extra from_email)")
        if not settings.recipients:
            raise AlertDeliveryError(f"e-mail alert via {settings.where}: no recipients (extra to)")
        msg = email_message(alert_from_context(context, self.event), settings.sender, settings.recipients)
        send_email(settings, msg)
        self.log.info("e-mail alert sent (%s) to %s via %s", self.event, ", ".join(settings.recipients), settings.where)

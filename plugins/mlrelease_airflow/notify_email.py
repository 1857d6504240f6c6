"""E-mail alerts over SMTP: a multipart text + HTML message with the task, the rollout numbers and links to the
release report and the task log.

The server comes from the Airflow connection `mlrelease_smtp` (type *SMTP*, the SMTP provider's fields: host,
port, login, password; extras `from_email`, `to`, `disable_ssl`, `disable_tls`, `timeout`, `ca_file`), else
from MLRELEASE_SMTP_URL (`smtp://user:pass@host:587` with STARTTLS, `smtps://…:465` with implicit TLS,
`smtp://host:25?starttls=false` for a plain local relay). Recipients and sender: the connection's `to` /
`from_email`, else MLRELEASE_ALERT_EMAIL_TO / MLRELEASE_ALERT_EMAIL_FROM.

Sent with the standard library (`smtplib`, `email.message`): the SMTP provider's notifier and hook only build a
single HTML part, and its hook retries a refused send five times.
"""

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
from urllib.parse import parse_qs, unquote, urlsplit

from airflow.sdk import BaseNotifier

from mlrelease_airflow.notify_alert import (
    Alert,
    AlertDeliveryError,
    alert_from_context,
    check_event,
    env_or_none,
    subscribed,
)

SMTP_CONN_ID = "mlrelease_smtp"
DEFAULT_PORTS = {"ssl": 465, "starttls": 587, "none": 25}  # by security mode
SMTP_URL_ENV = "MLRELEASE_SMTP_URL"
EMAIL_TO_ENV = "MLRELEASE_ALERT_EMAIL_TO"
EMAIL_FROM_ENV = "MLRELEASE_ALERT_EMAIL_FROM"
EMAIL_EVENTS_ENV = "MLRELEASE_ALERT_EMAIL_EVENTS"
URL_OPTIONS = ("starttls", "timeout", "ca_file")
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


def settings_from_url(url: str, *, source: str = SMTP_URL_ENV) -> SmtpSettings:
    """Parse MLRELEASE_SMTP_URL; errors name the variable and what is wrong (never echo the password)."""
    parts = urlsplit(url)
    if parts.scheme not in ("smtp", "smtps"):
        raise AlertDeliveryError(f"{source} must start with smtp:// or smtps://, got scheme {parts.scheme!r}")
    if not parts.hostname:
        raise AlertDeliveryError(f"{source} has no host (expected smtp://[user:password@]host[:port])")
    options = parse_qs(parts.query)
    unknown = sorted(set(options) - set(URL_OPTIONS))
    if unknown:
        raise AlertDeliveryError(f"{source}: unknown option(s) {', '.join(unknown)}; known: {', '.join(URL_OPTIONS)}")
    if parts.scheme == "smtps":
        security = "ssl"
    else:
        security = "starttls" if _flag(options.get("starttls", ["true"])[0]) else "none"
    try:
        port = parts.port or DEFAULT_PORTS[security]
        timeout = float(options.get("timeout", ["30"])[0])
    except ValueError as exc:
        raise AlertDeliveryError(f"{source}: bad port or timeout ({exc})") from None
    return SmtpSettings(
        host=parts.hostname,
        port=port,
        security=security,
        login=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        sender=env_or_none(EMAIL_FROM_ENV),
        recipients=addresses(env_or_none(EMAIL_TO_ENV)),
        timeout=timeout,
        ca_file=options.get("ca_file", [None])[0],
        source=source,
    )


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
        sender=extra.get("from_email") or env_or_none(EMAIL_FROM_ENV),
        recipients=addresses(extra.get("to")) or addresses(env_or_none(EMAIL_TO_ENV)),
        timeout=timeout,
        ca_file=extra.get("ca_file"),
        source=f"connection {conn.conn_id}",
    )


def smtp_settings(conn_id: str) -> SmtpSettings | None:
    """The SMTP settings from Airflow connection `conn_id`, else MLRELEASE_SMTP_URL; None when neither is set."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        url = env_or_none(SMTP_URL_ENV)
        return settings_from_url(url) if url else None
    return settings_from_connection(conn)


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
    """E-mail an alert over SMTP (connection `mlrelease_smtp` or MLRELEASE_SMTP_URL).

    :param event: task_failed (default), rolled_back, promoted or task_skipped.
    :param conn_id: Airflow connection of type *SMTP*.
    """

    template_fields = ("conn_id",)

    def __init__(self, event: str = "task_failed", conn_id: str = SMTP_CONN_ID):
        super().__init__()
        self.event = check_event(event)
        self.conn_id = conn_id

    def notify(self, context: Any) -> None:
        """Send the e-mail; skip (logged) when unconfigured or not subscribed; raise when delivery fails."""
        settings = smtp_settings(self.conn_id)
        if settings is None:
            self.log.info("e-mail alert skipped: no connection %s and no %s", self.conn_id, SMTP_URL_ENV)
            return
        if not subscribed(env_or_none(EMAIL_EVENTS_ENV), self.event, source=EMAIL_EVENTS_ENV):
            self.log.info("e-mail alert skipped: %s is not in %s", self.event, EMAIL_EVENTS_ENV)
            return
        if not settings.sender:
            raise AlertDeliveryError(
                f"e-mail alert via {settings.where}: no sender (extra from_email or {EMAIL_FROM_ENV})"
            )
        if not settings.recipients:
            raise AlertDeliveryError(f"e-mail alert via {settings.where}: no recipients (extra to or {EMAIL_TO_ENV})")
        msg = email_message(alert_from_context(context, self.event), settings.sender, settings.recipients)
        send_email(settings, msg)
        self.log.info("e-mail alert sent (%s) to %s via %s", self.event, ", ".join(settings.recipients), settings.where)

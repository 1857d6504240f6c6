"""The generic webhook alert channel: a JSON or Slack-compatible POST to the URL of the Airflow connection
`mlrelease_alerts`. No connection: the channel is skipped with a log line. `release_alerts` (notifiers.py)
builds it with the other channels.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseNotifier

from mlrelease_airflow.notify_alert import (
    AlertDeliveryError,
    alert_from_context,
    check_event,
    connection_or_none,
    subscribed_connection,
)

DEFAULT_CONN_ID = "mlrelease_alerts"
FORMATS = ("json", "slack")


def connection_url(conn: Any) -> str:
    """The webhook URL of an `http`/`https` connection: extra `url`, else scheme://host[:port][/schema as path]."""
    if conn.extra_dejson.get("url"):
        return str(conn.extra_dejson["url"])
    scheme = "https" if conn.conn_type == "https" else "http"
    port = f":{conn.port}" if conn.port else ""
    path = f"/{conn.schema}" if conn.schema else ""
    return f"{scheme}://{conn.host}{port}{path}"


def webhook_url(conn_id: str) -> str | None:
    """The webhook of Airflow connection `conn_id`; None when there is no such connection."""
    conn = connection_or_none(conn_id)
    return connection_url(conn) if conn is not None else None


VERBS = {
    "task_failed": "failed",
    "rolled_back": "rolled the candidate back",
    "promoted": "promoted the candidate",
    "task_skipped": "stopped for a human",
    "approval_needed": "asks a human",
}


def alert_payload(context: dict[str, Any], fmt: str, event: str = "task_failed") -> dict[str, Any]:
    """The alert body: plain JSON fields, or Slack's `{"text": …, "blocks": …}` shape when fmt is `slack`."""
    alert = alert_from_context(context, event)
    fields = {
        "dag_id": alert.dag_id,
        "task_id": alert.task_id,
        "run_id": alert.run_id,
        "try_number": alert.try_number,
        "data_interval_end": alert.data_interval_end,
        "error": alert.error,
        "log_url": alert.log_url,
        "run_key": alert.run_key,
        "report_url": alert.report_url,
        "rollout": alert.rollout,
    }
    if fmt != "slack":
        return {"event": event, **fields}
    text = (
        f":rotating_light: *{fields['dag_id']}.{fields['task_id']}* {VERBS[event]} "
        f"(run `{fields['run_id']}`, try {fields['try_number']}): {fields['error']}"
    )
    if fields["log_url"]:
        text += f" <{fields['log_url']}|logs>"
    if fields["report_url"]:
        text += f" <{fields['report_url']}|release report>"
    return {"text": text, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]}


class WebhookAlertNotifier(BaseNotifier):
    """POST an alert (failure, rollback, promotion, pause) to the webhook of an Airflow connection.

    The connection (type `http` or `https`): extra `url`, or host/port/schema (the path); optional extras
    `format` (`json`, the default, or `slack` for a Slack-compatible incoming webhook) and `events` (the
    comma-separated events it receives; default every event).

    :param conn_id: Airflow connection holding the webhook.
    :param payload_format: ``json`` or ``slack``; overrides the connection's `format` extra when given.
    :param timeout: seconds to wait for the receiver.
    :param event: the alert's `event` field: task_failed (default), rolled_back, promoted, task_skipped,
        approval_needed.
    """

    template_fields = ("conn_id",)

    def __init__(
        self,
        conn_id: str = DEFAULT_CONN_ID,
        payload_format: str | None = None,
        timeout: float = 10.0,
        event: str = "task_failed",
    ):
        super().__init__()
        self.event = check_event(event)
        self.conn_id = conn_id
        self.payload_format = payload_format
        self.timeout = timeout

    def notify(self, context: Any) -> None:
        """Send the alert; no connection means log and return (alerts must never mask the failure)."""
        import requests

        conn = subscribed_connection(self.conn_id, self.event, "webhook", self.log)
        if conn is None:
            return
        fmt = self.payload_format or conn.extra_dejson.get("format") or "json"
        if fmt not in FORMATS:
            raise AlertDeliveryError(
                f"connection {self.conn_id}: format must be one of {', '.join(FORMATS)}; got {fmt!r}"
            )
        response = requests.post(
            connection_url(conn), json=alert_payload(context, fmt, self.event), timeout=self.timeout
        )
        response.raise_for_status()

"""Release alerts from task callbacks: the generic webhook (JSON or Slack-compatible POST) and `release_alerts`,
which gives a callback list with one notifier per channel (webhook, Slack, e-mail; see notify_*.py)."""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import BaseNotifier

from mlrelease_airflow.notify_alert import alert_from_context, check_event
from mlrelease_airflow.notify_email import EmailAlertNotifier
from mlrelease_airflow.notify_slack import SlackAlertNotifier

DEFAULT_CONN_ID = "mlrelease_alerts"


def webhook_url(conn_id: str) -> str | None:
    """The webhook from Airflow connection `conn_id` (extra `url`, or host/port/path), else MLRELEASE_ALERT_WEBHOOK."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return os.environ.get("MLRELEASE_ALERT_WEBHOOK") or None
    if conn.extra_dejson.get("url"):
        return str(conn.extra_dejson["url"])
    scheme = "https" if conn.conn_type == "https" else "http"
    port = f":{conn.port}" if conn.port else ""
    path = f"/{conn.schema}" if conn.schema else ""
    return f"{scheme}://{conn.host}{port}{path}"


VERBS = {
    "task_failed": "failed",
    "rolled_back": "rolled the candidate back",
    "promoted": "promoted the candidate",
    "task_skipped": "stopped for a human",
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
    """POST an alert (failure, rollback, pause) to a webhook from an Airflow connection or MLRELEASE_ALERT_WEBHOOK.

    :param conn_id: Airflow connection holding the webhook URL.
    :param payload_format: ``json`` (default) or ``slack`` (incoming-webhook compatible). Falls back to
        MLRELEASE_ALERT_FORMAT when not given.
    :param timeout: seconds to wait for the receiver.
    :param event: the alert's `event` field: task_failed (default), rolled_back, promoted, task_skipped.
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
        """Send the alert; no webhook configured means log and return (alerts must never mask the failure)."""
        import requests

        url = webhook_url(self.conn_id)
        if not url:
            self.log.warning("no alert webhook configured (connection %s or MLRELEASE_ALERT_WEBHOOK)", self.conn_id)
            return
        fmt = self.payload_format or os.environ.get("MLRELEASE_ALERT_FORMAT", "json")
        response = requests.post(url, json=alert_payload(context, fmt, self.event), timeout=self.timeout)
        response.raise_for_status()


def release_alerts(event: str) -> list[BaseNotifier]:
    """A callback list for `event`: the generic webhook, Slack and e-mail notifiers.

    Each one looks its configuration up when it fires (never at DAG parse time, which must not touch
    connections) and skips itself with a log line when its channel is not configured.
    """
    check_event(event)
    return [WebhookAlertNotifier(event=event), SlackAlertNotifier(event=event), EmailAlertNotifier(event=event)]

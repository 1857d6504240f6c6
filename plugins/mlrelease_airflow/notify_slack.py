"""Slack alerts through an incoming webhook: a Block Kit message with the task, the rollout numbers and links
to the release report and the task log, sent by the Slack provider's `SlackWebhookNotifier`.

The webhook is the Airflow connection `mlrelease_slack` (type *Slack Incoming Webhook*, read by the provider's
hook: password = the webhook URL, or host = base URL and password = the token; extras `timeout`, `proxy`), with
an optional extra `events` (the comma-separated events the channel receives). No connection: the channel is
skipped.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseNotifier

from mlrelease_airflow.notify_alert import (
    EMOJI,
    Alert,
    AlertDeliveryError,
    alert_from_context,
    check_event,
    subscribed_connection,
)

SLACK_CONN_ID = "mlrelease_slack"
# Block Kit limits (https://docs.slack.dev/reference/block-kit/blocks): header text 150, section text 3000,
# a section field 2000 and at most 10 fields.
HEADER_MAX, TEXT_MAX, FIELD_MAX, FIELDS_MAX = 150, 3000, 2000, 10


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _escape(text: str) -> str:
    """Slack mrkdwn needs &, < and > escaped (they delimit links and mentions)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _fields(pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    shown = pairs[:FIELDS_MAX]
    return [{"type": "mrkdwn", "text": _clip(f"*{label}*\n{_escape(value)}", FIELD_MAX)} for label, value in shown]


def _is_web_link(url: str | None) -> bool:
    return bool(url) and urlsplit(url or "").scheme in ("http", "https")


def slack_message(alert: Alert) -> dict[str, Any]:
    """The incoming-webhook body: fallback `text` plus Block Kit `blocks` (header, fields, numbers, links)."""
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {"type": "plain_text", "text": _clip(f"{EMOJI[alert.event]} {alert.headline()}", HEADER_MAX)},
        },
        {"type": "section", "fields": _fields(alert.task_fields())},
    ]
    if alert.error:
        blocks.append(
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": f"*Error*\n```{_clip(_escape(alert.error), TEXT_MAX - 20)}```"},
            }
        )
    numbers = [pair for pair in alert.rollout_fields() if pair[0] != "Reason"]
    if numbers:
        blocks.append({"type": "section", "fields": _fields(numbers)})
    reason = dict(alert.rollout_fields()).get("Reason")
    if reason and reason != alert.error:
        blocks.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": _clip(f"*Reason*\n{_escape(reason)}", TEXT_MAX)}}
        )
    buttons = []
    # Link buttons only open web URLs; a file:// report (no MLRELEASE_REPORT_BASE_URL) is shown as text instead.
    if _is_web_link(alert.report_url):
        buttons.append(_button("Release report", alert.report_url, "mlrelease_report", primary=True))
    if _is_web_link(alert.log_url):
        buttons.append(_button("Task log", alert.log_url, "mlrelease_log"))
    if buttons:
        blocks.append({"type": "actions", "elements": buttons})
    context = [f"event `{alert.event}`", f"run key `{alert.run_key}`"]
    if alert.report_url and not _is_web_link(alert.report_url):
        context.append(f"release report: `{_escape(alert.report_url)}`")
    elif not alert.report_url:
        context.append("no release report (the run has no data interval)")
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(context)}]})
    text = f"{alert.headline()} (run {alert.run_id})"
    if alert.report_url:
        text += f" report: {alert.report_url}"
    return {"text": _clip(text, TEXT_MAX), "blocks": blocks}


def _button(label: str, url: str | None, action_id: str, *, primary: bool = False) -> dict[str, Any]:
    button: dict[str, Any] = {
        "type": "button",
        "text": {"type": "plain_text", "text": label},
        "url": url,
        "action_id": action_id,
    }
    if primary:
        button["style"] = "primary"
    return button


def webhook_where(url: str, source: str) -> str:
    """The webhook's scheme and host only, for messages: the path of a Slack webhook URL is its secret."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/… ({source})"


class SlackAlertNotifier(BaseNotifier):
    """Post an alert to the Slack incoming webhook of connection `mlrelease_slack`, with the provider's notifier.

    :param event: task_failed (default), rolled_back, promoted, task_skipped or approval_needed.
    :param conn_id: Airflow connection of type *Slack Incoming Webhook*.
    :param timeout: seconds to wait for Slack.
    """

    template_fields = ("conn_id",)

    def __init__(self, event: str = "task_failed", conn_id: str = SLACK_CONN_ID, timeout: float = 10.0):
        super().__init__()
        self.event = check_event(event)
        self.conn_id = conn_id
        self.timeout = timeout

    def notify(self, context: Any) -> None:
        """Send the message; skip (logged) when unconfigured or not subscribed; raise when delivery fails."""
        conn = subscribed_connection(self.conn_id, self.event, "Slack", self.log)
        if conn is None:
            return
        message = slack_message(alert_from_context(context, self.event))
        # Imported here: the provider loads slack_sdk, which DAG parsing must not pay for.
        from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier
        from airflow.sdk.exceptions import AirflowException

        sender = SlackWebhookNotifier(
            slack_webhook_conn_id=self.conn_id,
            text=message["text"],
            blocks=message["blocks"],
            timeout=int(self.timeout),
        )
        try:
            # The provider's hook reads the connection and builds slack_sdk's WebhookClient; no webhook raises here.
            where = webhook_where(sender.hook.client.url, f"connection {self.conn_id}")
        except Exception as exc:
            raise AlertDeliveryError(f"Slack connection {self.conn_id!r} is not usable: {exc}") from exc
        try:
            # notify(), not the notifier's __call__: the message is final, Jinja must not render an error text.
            sender.notify(context)
        except AirflowException as exc:  # the provider's check of the webhook's answer (not HTTP 200)
            raise AlertDeliveryError(f"Slack alert to {where} was refused: {exc}") from exc
        except Exception as exc:
            raise AlertDeliveryError(f"Slack alert to {where} failed: {exc}") from exc
        self.log.info("Slack alert sent (%s) to %s", self.event, where)

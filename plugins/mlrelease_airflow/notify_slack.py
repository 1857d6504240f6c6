"""Slack alerts through an incoming webhook: a Block Kit message with the task, the rollout numbers and links
to the release report and the task log.

The webhook comes from the Airflow connection `mlrelease_slack` (type *Slack Incoming Webhook*, read by the
official Slack provider's hook), else from MLRELEASE_SLACK_WEBHOOK; neither means the channel is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseNotifier

from mlrelease_airflow.notify_alert import (
    EMOJI,
    Alert,
    AlertDeliveryError,
    alert_from_context,
    check_event,
    env_or_none,
    subscribed,
)

SLACK_CONN_ID = "mlrelease_slack"
SLACK_WEBHOOK_ENV = "MLRELEASE_SLACK_WEBHOOK"
SLACK_EVENTS_ENV = "MLRELEASE_SLACK_EVENTS"
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


@dataclass(frozen=True)
class SlackTarget:
    """A configured webhook: the client to post with, and where it was configured (for messages)."""

    client: Any  # slack_sdk.WebhookClient
    source: str

    @property
    def where(self) -> str:
        """The webhook's scheme and host only: the path of a Slack webhook URL is its secret."""
        parts = urlsplit(self.client.url)
        return f"{parts.scheme}://{parts.netloc}/… ({self.source})"


def _has_connection(conn_id: str) -> bool:
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return False
    return True


def slack_target(conn_id: str, timeout: float) -> SlackTarget | None:
    """The webhook from Airflow connection `conn_id`, else MLRELEASE_SLACK_WEBHOOK; None when neither is set."""
    if _has_connection(conn_id):
        from airflow.providers.slack.hooks.slack_webhook import SlackWebhookHook

        # The provider's hook reads the connection (password = webhook URL or token, host = base URL, extras
        # timeout/proxy) and builds slack_sdk's WebhookClient; a connection without a webhook raises here.
        try:
            client = SlackWebhookHook(slack_webhook_conn_id=conn_id, timeout=int(timeout)).get_conn()
        except Exception as exc:
            raise AlertDeliveryError(f"Slack connection {conn_id!r} is not usable: {exc}") from exc
        return SlackTarget(client, f"connection {conn_id}")
    url = env_or_none(SLACK_WEBHOOK_ENV)
    if url is None:
        return None
    if urlsplit(url).scheme not in ("http", "https"):
        raise AlertDeliveryError(f"{SLACK_WEBHOOK_ENV} must be an http(s) URL, got one starting {url[:8]!r}")
    from slack_sdk import WebhookClient

    return SlackTarget(WebhookClient(url=url, timeout=int(timeout)), SLACK_WEBHOOK_ENV)


class SlackAlertNotifier(BaseNotifier):
    """Post an alert to a Slack incoming webhook (connection `mlrelease_slack` or MLRELEASE_SLACK_WEBHOOK).

    :param event: task_failed (default), rolled_back, promoted or task_skipped.
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
        target = slack_target(self.conn_id, self.timeout)
        if target is None:
            self.log.info("Slack alert skipped: no connection %s and no %s", self.conn_id, SLACK_WEBHOOK_ENV)
            return
        if not subscribed(env_or_none(SLACK_EVENTS_ENV), self.event, source=SLACK_EVENTS_ENV):
            self.log.info("Slack alert skipped: %s is not in %s", self.event, SLACK_EVENTS_ENV)
            return
        message = slack_message(alert_from_context(context, self.event))
        try:
            response = target.client.send_dict(message)
        except Exception as exc:
            raise AlertDeliveryError(f"Slack alert to {target.where} failed: {exc}") from exc
        if response.status_code != 200:
            raise AlertDeliveryError(
                f"Slack alert to {target.where} was refused: HTTP {response.status_code} {str(response.body)[:300]!r}"
            )
        self.log.info("Slack alert sent (%s) to %s", self.event, target.where)

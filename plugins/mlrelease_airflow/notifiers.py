"""Release alerts from task callbacks: `release_alerts`, the factory of a callback list with one notifier per
channel, each implemented in its own file (notify_webhook.py: JSON or Slack-compatible POST; notify_slack.py;
notify_email.py; what every alert says: notify_alert.py).

Every channel is configured only by its Airflow connection (any secrets backend, e.g. `AIRFLOW_CONN_<ID>`):
`mlrelease_alerts` (the generic webhook), `mlrelease_slack` (Slack incoming webhook), `mlrelease_smtp` (e-mail). A
channel without its connection is skipped with a log line.
"""

from __future__ import annotations

from airflow.sdk import BaseNotifier

from mlrelease_airflow.notify_alert import check_event
from mlrelease_airflow.notify_email import EmailAlertNotifier
from mlrelease_airflow.notify_slack import SlackAlertNotifier
from mlrelease_airflow.notify_webhook import WebhookAlertNotifier


def release_alerts(event: str) -> list[BaseNotifier]:
    """A callback list for `event`: the generic webhook, Slack and e-mail notifiers.

    Each one looks its configuration up when it fires (never at DAG parse time, which must not touch
    connections) and skips itself with a log line when its channel is not configured.
    """
    check_event(event)
    return [WebhookAlertNotifier(event=event), SlackAlertNotifier(event=event), EmailAlertNotifier(event=event)]

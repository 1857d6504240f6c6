"""Airflow glue for mlrelease: the step-operator factory, the local pod runner and the alert notifier."""

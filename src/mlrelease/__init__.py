"""mlrelease: a nightly retrain-and-release pipeline for ML models (Airflow, Feast, GX, MLflow, Triton)."""

__version__ = "0.1.0"

-- Run once by the postgres image on a fresh data volume, as POSTGRES_USER, after it has created POSTGRES_DB
-- (Airflow's metadata database). The MLflow tracking server keeps its own database on the same server.
CREATE DATABASE mlflow;

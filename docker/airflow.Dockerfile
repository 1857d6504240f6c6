# syntax=docker/dockerfile:1
# The Airflow image for the official Helm chart (deploy/airflow/values.yaml): the official image, the
# providers the DAGs use, this repo's plugins, and the mlrelease package WITHOUT its dependencies.
# Why no dependencies: with MLRELEASE_RUNNER=kubernetes every step runs in its own pod (the step image);
# the scheduler, API server and workers only import mlrelease's light modules (settings, run keys, report
# links), which need nothing beyond the standard library. DAG files arrive by git-sync.
# Provider pins equal requirements.lock (tests/unit/test_docker.py checks it).
FROM apache/airflow:3.3.2-python3.11

USER 50000
RUN pip install --no-cache-dir \
      "apache-airflow==3.3.2" \
      "apache-airflow-providers-cncf-kubernetes==10.25.0" \
      "apache-airflow-providers-slack==9.11.1" \
      "apache-airflow-providers-standard==1.21.0"

COPY --chown=50000:0 pyproject.toml /opt/mlrelease/pyproject.toml
COPY --chown=50000:0 src/ /opt/mlrelease/src/
RUN pip install --no-cache-dir --no-deps /opt/mlrelease
# The release specs (models/<name>/release.yaml): the DAGs and plugins read each model's name from them. The
# package is installed away from its checkout here, so the specs' folder is named explicitly.
COPY --chown=50000:0 models/ /opt/mlrelease/models/
ENV MLRELEASE_SPECS_DIR=/opt/mlrelease/models
# The model this Airflow releases while the nightly DAG is one (not yet one DAG per spec): its step processes get it.
ENV MLRELEASE_MODEL=parcel_eta
COPY --chown=50000:0 plugins/ /opt/airflow/plugins/

# syntax=docker/dockerfile:1
# The step image: the container every KubernetesPodOperator runs (`mlrelease step <name> …`), and the image
# that docker/compose.yaml runs Airflow and the MLflow server from. Build it from the repository root:
#
#   docker build -f docker/step.Dockerfile -t ghcr.io/mlrelease/step:0.1.0 .
#
# The tag is ClusterSettings' default image (plugins/mlrelease_airflow/pod_spec.py, MLRELEASE_K8S_IMAGE).
# Run-time contract (plugins/mlrelease_airflow/kubernetes.py): UID/GID 10001, read-only root filesystem,
# state on a volume at /var/lib/mlrelease (MLRELEASE_HOME), HOME=/tmp on an emptyDir, XCom written to
# /airflow/xcom/return.json. Nothing here writes outside those paths at run time: the bytecode is compiled
# at build time (PYTHONDONTWRITEBYTECODE stays unset so Python uses it).
#
# Dependencies come from docker/requirements-step.lock: the runtime subset of requirements.lock (no dev or
# test packages), regenerated with the command at the top of docker/requirements-step.in.

# Both stages must use the same interpreter: the venv's python is a symlink into this image's /usr/local.
ARG PYTHON_IMAGE=python:3.11.15-slim-bookworm
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.9

FROM ${UV_IMAGE} AS uv

FROM ${PYTHON_IMAGE} AS builder
COPY --from=uv /uv /usr/local/bin/uv
# Copy (not hardlink) out of the cache mount, and never let uv fetch another interpreter.
ENV UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never
WORKDIR /app
COPY docker/install-venv.sh docker/requirements-step.lock docker/
RUN --mount=type=cache,target=/root/.cache/uv docker/install-venv.sh deps
COPY pyproject.toml airflow.cfg ./
COPY src/ src/
COPY plugins/ plugins/
COPY dags/ dags/
COPY config/ config/
COPY models/ models/
COPY feature_repo/ feature_repo/
RUN --mount=type=cache,target=/root/.cache/uv docker/install-venv.sh project

FROM ${PYTHON_IMAGE} AS step
ARG GIT_COMMIT=unknown
# One numeric identity for every mlrelease container (the pod's runAsUser/fsGroup), so volumes shared between
# them stay writable; the directories a fresh named volume is seeded from belong to it.
RUN groupadd --system --gid 10001 mlrelease \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin mlrelease \
    && install -d -o 10001 -g 10001 /var/lib/mlrelease /airflow/xcom /models
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /app /app
# HOME=/tmp: Feast, GX and matplotlib keep small caches under HOME, and /tmp is the writable mount under a
# read-only root (the pod sets the same; an arbitrary UID without a passwd entry gets it too).
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    MLRELEASE_HOME=/var/lib/mlrelease \
    MLRELEASE_REPO=/app \
    MLRELEASE_GIT_COMMIT=${GIT_COMMIT}
LABEL org.opencontainers.image.title="mlrelease step" \
      org.opencontainers.image.source="https://github.com/mlrelease/mlrelease" \
      org.opencontainers.image.revision="${GIT_COMMIT}"
# A writable working directory: nothing should write to the cwd, but a stray relative path must not fail.
WORKDIR /tmp
USER 10001:10001
# No ENTRYPOINT: the pod's command is `mlrelease step …`, and compose runs `airflow …` / `mlflow …` from here.
CMD ["mlrelease", "--help"]

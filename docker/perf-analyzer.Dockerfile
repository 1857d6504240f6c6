# syntax=docker/dockerfile:1
# The benchmark step's image (`mlrelease step benchmark`, a GPU pod): Triton's SDK image, which ships
# perf_analyzer, plus the mlrelease package. Build it from the repository root:
#
#   docker build -f docker/perf-analyzer.Dockerfile -t ghcr.io/mlrelease/perf:0.1.0 .
#
# The tag is DEFAULT_IMAGES["MLRELEASE_K8S_PERF_IMAGE"] in plugins/mlrelease_airflow/pod_spec.py. The pod
# contract is the step image's (UID 10001, read-only root, MLRELEASE_HOME volume, HOME=/tmp). It carries the
# whole step venv (Airflow included), so docker/compose.yaml runs its Airflow scheduler, which executes every
# step as a local process, benchmark included, from this image.
# TRITON_RELEASE must equal triton.Dockerfile's (see there how 26.09 was chosen): perf_analyzer and the server
# it measures then come from the same Triton release.
#
# mlrelease needs Python 3.11 (requires-python <3.12) and the SDK image's Ubuntu interpreter is another
# version, so uv installs a standalone CPython 3.11 under /opt/python and the venv is built on it, with the
# same recipe and lock as the step image (docker/install-venv.sh).
ARG TRITON_RELEASE=26.09
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.9

FROM ${UV_IMAGE} AS uv

FROM nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-py3-sdk AS builder
COPY --from=uv /uv /usr/local/bin/uv
# The minor version is pinned here; the patch is whatever the pinned uv release resolves 3.11 to.
ENV UV_LINK_MODE=copy \
    UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_PYTHON_PREFERENCE=only-managed \
    PYTHON=3.11
WORKDIR /app
RUN uv python install "$PYTHON"
COPY docker/install-venv.sh docker/requirements-step.lock docker/
RUN --mount=type=cache,target=/root/.cache/uv docker/install-venv.sh deps
COPY pyproject.toml airflow.cfg ./
COPY src/ src/
COPY plugins/ plugins/
COPY dags/ dags/
COPY config/ config/
COPY feature_repo/ feature_repo/
RUN --mount=type=cache,target=/root/.cache/uv docker/install-venv.sh project

FROM nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-py3-sdk AS perf
ARG GIT_COMMIT=unknown
RUN groupadd --system --gid 10001 mlrelease \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin mlrelease \
    && install -d -o 10001 -g 10001 /var/lib/mlrelease /airflow/xcom /models
# The venv's python links into /opt/python: both keep their build-stage paths.
COPY --from=builder /opt/python /opt/python
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /app /app
# mlrelease runs MLRELEASE_PERF_ANALYZER when set (src/mlrelease/serving/local_triton.py). Pin it to the SDK's
# binary at a fixed path, so the venv's bin/ (first on PATH) can never shadow it; fail the build without it.
RUN found="$(command -v perf_analyzer)" \
    || { echo "perf_analyzer is not on the SDK image's PATH" >&2; exit 1; }; \
    if [ "$found" != /usr/local/bin/perf_analyzer ]; then ln -s "$found" /usr/local/bin/perf_analyzer; fi
# PYTHONPATH emptied: whatever the SDK points its own (newer) Python at must not leak into the 3.11 venv.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH="" \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    MLRELEASE_HOME=/var/lib/mlrelease \
    MLRELEASE_REPO=/app \
    MLRELEASE_PERF_ANALYZER=/usr/local/bin/perf_analyzer \
    MLRELEASE_GIT_COMMIT=${GIT_COMMIT}
LABEL org.opencontainers.image.title="mlrelease perf" \
      org.opencontainers.image.source="https://github.com/mlrelease/mlrelease" \
      org.opencontainers.image.revision="${GIT_COMMIT}"
WORKDIR /tmp
USER 10001:10001
# The NGC entrypoint stays; the pod's command is `mlrelease step benchmark …`.
CMD ["mlrelease", "--help"]

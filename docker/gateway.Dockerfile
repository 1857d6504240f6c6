# syntax=docker/dockerfile:1
# The prediction gateway (`mlrelease gateway`, src/mlrelease/gateway/cli.py): the step image with the
# gateway as its entrypoint, so both ship the same venv, source and UID and only one recipe builds them.
# Build the step image first, then this one, from the repository root:
#
#   docker build -f docker/step.Dockerfile    -t ghcr.io/mlrelease/step:0.1.0 .
#   docker build -f docker/gateway.Dockerfile -t ghcr.io/mlrelease/gateway:0.1.0 .
#
# (STEP_IMAGE selects another step image; docker/compose.yaml feeds the step image it just built.)
# It needs an API client in $MLRELEASE_HOME/gateway/api_keys.yaml (`mlrelease gateway-key add NAME`) and
# reads its config from MLRELEASE_GATEWAY_CONFIG (default: /app/config/gateway.yaml).

ARG STEP_IMAGE=ghcr.io/mlrelease/step:0.1.0
FROM ${STEP_IMAGE}

# The step image's user, restated so this image's own metadata says it runs unprivileged.
USER 10001:10001
EXPOSE 8080
# /healthz is liveness (the process answers). /readyz also needs a routing state and Triton serving the
# stable version, which a fresh stack only has after its first release: that is the orchestrator's readiness
# probe (deploy/), not a reason to mark the container unhealthy and restart it.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request as r; r.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
ENTRYPOINT ["mlrelease", "gateway"]
CMD ["--host", "0.0.0.0", "--port", "8080"]

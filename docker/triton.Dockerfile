# syntax=docker/dockerfile:1
# NVIDIA Triton serving the production model repository (platform "onnxruntime_onnx", KIND_GPU instances;
# src/mlrelease/serving/triton_repo.py) under explicit model control: the release steps load and unload
# versions over HTTP (POST /v2/repository/models/<model>/load|unload), nothing is loaded at start.
#
#   docker build -f docker/triton.Dockerfile -t ghcr.io/mlrelease/triton:0.1.0 .
#   docker run --gpus all -v <model repository>:/models:ro -p 8000-8002:8000-8002 ghcr.io/mlrelease/triton:0.1.0
#
# Release choice: our client pins tritonclient==2.73.0 (pyproject.toml), and NGC release 26.09 is the one
# that ships Triton Inference Server 2.73.0 (NGC numbering runs one Triton minor per monthly release:
# 26.05 shipped 2.69.0, and 26.09-py3 is documented as Triton 2.73.0), so client and server speak the
# same release. 26.x images are CUDA 13 on Ubuntu 24.04: the GPU node needs an R580+ driver.
# perf-analyzer.Dockerfile uses the same release's SDK image: keep the two TRITON_RELEASE values equal.
ARG TRITON_RELEASE=26.09
FROM nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-py3

# /models is where the repository is mounted. It belongs to UID 10001 (the step image's user), so that a fresh
# named volume seeded from this image stays writable for the steps that publish versions into it; Triton only
# reads it (mode 0755).
RUN install -d -o 10001 -g 10001 -m 0755 /models

# triton-server (1000:1000): the unprivileged user the NGC image creates for running the server.
USER 1000:1000
# HTTP/REST, gRPC, Prometheus metrics.
EXPOSE 8000 8001 8002
# Liveness, not readiness: with --strict-readiness a candidate that failed to load makes the server "not
# ready" while it keeps serving the stable version; that is the rollout's business, not a reason to restart it.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["curl", "--fail", "--silent", "--show-error", "--output", "/dev/null", "http://127.0.0.1:8000/v2/health/live"]
# The NGC entrypoint (/opt/nvidia/nvidia_entrypoint.sh, CUDA compatibility set-up) stays; this is its command.
# --exit-on-error=false: a bad candidate version must fail alone, never stop the server (platform notes).
CMD ["tritonserver", \
     "--model-repository=/models", \
     "--model-control-mode=explicit", \
     "--exit-on-error=false", \
     "--strict-readiness=true", \
     "--http-port=8000", \
     "--grpc-port=8001", \
     "--metrics-port=8002", \
     "--allow-metrics=true"]

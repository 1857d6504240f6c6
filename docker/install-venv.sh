#!/bin/sh
# Build /opt/venv for an mlrelease image, in the build stage of step.Dockerfile and perf-analyzer.Dockerfile
# (one install recipe for both images). Run from the source root (/app) with uv on PATH.
#
#   install-venv.sh deps      the pinned runtime lock only: this layer stays cached while the source changes
#   install-venv.sh project   the mlrelease package itself, then bytecode for the source tree
#
# The package is installed editable on purpose: mlrelease.settings.REPO_ROOT is then /app, so the defaults
# that live beside the code (config/, feature_repo/, plugins/, dags/) resolve inside the image exactly as
# in a checkout. Bytecode is compiled here because the root filesystem is read-only at run time.
# PYTHON names the interpreter for `uv venv` (default: python3.11 on PATH).
set -eu

VENV=${VENV:-/opt/venv}  # overridable only to dry-run the recipe outside an image
LOCK=docker/requirements-step.lock

case "${1:-}" in
deps)
    uv venv --python "${PYTHON:-python3.11}" "$VENV"
    # --no-build: every pin must come as a wheel, so no compiler is ever needed in any stage.
    uv pip sync --python "$VENV/bin/python" --no-build --compile-bytecode "$LOCK"
    ;;
project)
    uv pip install --python "$VENV/bin/python" --no-deps --editable .
    # unchecked-hash: the source never changes inside an image, and timestamps may not survive COPY.
    "$VENV/bin/python" -m compileall -q -j 0 --invalidation-mode unchecked-hash src plugins dags feature_repo
    "$VENV/bin/mlrelease" --help >/dev/null
    # Feast's typeguard instrumentation, compiled here once (the venv is read-only at run time): every pod's
    # Feast import then loads it instead of spending ~8 s of CPU (src/mlrelease_typeguard_cache).
    "$VENV/bin/python" -m mlrelease_typeguard_cache >/dev/null
    "$VENV/bin/python" -c "import feast"
    ;;
*)
    echo "usage: $0 deps|project" >&2
    exit 2
    ;;
esac

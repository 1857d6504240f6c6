#!/usr/bin/env bash
# The Debian packages `make run` (run) and `make test` (test) need, installed when missing.
# As root they are installed with apt-get (once; a no-op afterwards); otherwise this stops at once,
# before any other work, with the one command to run.
set -euo pipefail
purpose="${1:-run}"
need=()
# ldconfig lives in /sbin, which a non-login or minimal PATH may not hold: without it every run would "need" libb64.
export PATH="$PATH:/usr/sbin:/sbin"
# redis-server: the Redis online store and routing store; libb64-0d: the real perf_analyzer links against it.
command -v redis-server > /dev/null 2>&1 || need+=(redis-server)
ldconfig -p 2> /dev/null | grep -q libb64.so.0d || need+=(libb64-0d)
# uv builds the venvs; without one on PATH the Makefile installs it with the machine's pip (SYSTEM_PYTHON: not the
# venv's python, which make puts first on PATH), which Debian ships separately.
command -v uv > /dev/null 2>&1 || "${SYSTEM_PYTHON:-python3}" -m pip --version > /dev/null 2>&1 || need+=(python3-pip)
if [ "$purpose" = test ]; then
  # chromium: the release report and Airflow's trigger form are looked at in a real headless browser;
  # prometheus: promtool checks the alert rules; nodejs/npm: the Gateway API schema validator (tests/tools).
  command -v chromium > /dev/null 2>&1 || need+=(chromium)
  command -v promtool > /dev/null 2>&1 || need+=(prometheus)
  command -v npm > /dev/null 2>&1 || need+=(nodejs npm)
  # Java 17: the local Spark cluster (master, workers, executors and the driver are JVMs; Spark 4 needs 17+).
  compgen -G "/usr/lib/jvm/java-17-openjdk-*/bin/java" > /dev/null || need+=(openjdk-17-jre-headless)
fi
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "mlrelease needs system packages that are missing; run: sudo apt-get update && sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
echo "==> installing system packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" > /dev/null

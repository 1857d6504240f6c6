#!/usr/bin/env bash
# `make run`, after set-up: the nightly release of RUN_END of every model in MODELS, on the embedded default, with
# real traffic.
#
# A first run on a fresh machine has no champion, so the night before (PREV_END) runs first for each model and its
# model becomes champion (bootstrap: nothing to roll out). Then, one model after the other (they share 2 cores
# here; on a cluster their DAGs run side by side), a gateway serves the model's champion, `mlrelease traffic` sends
# its requests through it at TRAFFIC_RATE req/s, and tonight's run of the model's DAG trains a candidate and rolls
# it out stage by stage (demo durations) while that traffic flows.
set -euo pipefail
: "${RUN_END:?}" "${PREV_END:?}" "${MLRELEASE_HOME:?}" "${MODELS:?}"
GATEWAY_PORT="${GATEWAY_PORT:-8080}"
# Two gateway workers (uvicorn processes on one port, one routing state): a killed one costs only the requests it
# had in flight, and uvicorn starts its replacement while the other keeps answering.
GATEWAY_WORKERS="${GATEWAY_WORKERS:-2}"
TRAFFIC_RATE="${TRAFFIC_RATE:-200}"
LOGS="$MLRELEASE_HOME/logs"
# The run's params, as the UI trigger form would send them: demo stage durations (seconds, not hours),
# and perf gates that allow for this machine, where perf_analyzer, Triton and the gateway share 2 cores
# (the same model measured against itself varies ~1.2-1.5x in p99 here; a GPU node keeps 1.10 / 0.90).
DEMO_CONF='{"rollout_profile": "demo", "max_p99_ratio": 1.5, "min_throughput_ratio": 0.67}'
mkdir -p "$LOGS"

dag_test() {  # dag_test MODEL END LOG [DRILL]: one nightly run of MODEL, its finished tasks listed; returns its success
  local rc=0
  # `airflow dags test` runs no scheduler, so a question to a human would never time out: approvals off, a stage
  # that asks leaves the rollout paused (decide with `mlrelease step manual-release` or the rollback_release DAG).
  MLRELEASE_DRILL_CANDIDATE_FAULT="${4:-}" MLRELEASE_TASK_RETRIES=0 MLRELEASE_APPROVALS=off \
    airflow dags test "nightly_release_$1" "$2" -c "$DEMO_CONF" > "$3" 2>&1 || rc=$?
  grep -oE "\[DAG TEST\] end task task_id=[a-z_0-9]+|DagRun Finished: .*state=[a-z]+" "$3" \
    | sed -E 's/\[DAG TEST\] end task task_id=/  finished /; s/DagRun Finished: .*(state=[a-z]+)/  run \1/' || true
  grep -q "state=success" "$3" && [ "$rc" -eq 0 ]
}

has_champion() {  # has_champion MODEL
  MLRELEASE_MODEL="$1" python - <<'PY'
import sys
from mlrelease.registry import CHAMPION, Registry
from mlrelease.settings import Settings
sys.exit(0 if Registry.from_settings(Settings.from_env()).alias_version(CHAMPION) else 1)
PY
} 2> /dev/null

for model in $MODELS; do
  if ! has_champion "$model"; then
    echo "==> $model: first release: the night ending $PREV_END trains the first champion (log: $LOGS/make-run-bootstrap-$model.log)"
    dag_test "$model" "$PREV_END" "$LOGS/make-run-bootstrap-$model.log" \
      || { echo "bootstrap run of $model failed"; MLRELEASE_MODEL="$model" mlrelease summary --end "$PREV_END"; exit 1; }
  fi
  MLRELEASE_MODEL="$model" mlrelease routing init > /dev/null
done
if [ -n "${INJECT:-}" ]; then  # after the bootstrap nights, so only tonight's window is corrupted
  echo "==> injecting '$INJECT' into the run's window"
  mlrelease data generate --start "$INJECT_START" --end "$DATE" --rows-per-day "$ROWS_PER_DAY" --inject "$INJECT" > /dev/null
fi

KEY_FILE="$MLRELEASE_HOME/gateway/make-run.key"
if [ ! -s "$KEY_FILE" ]; then
  mlrelease gateway-key add "make-run-$(date +%s)" | python -c 'import json,sys; print(json.load(sys.stdin)["api_key"])' > "$KEY_FILE"
  chmod 600 "$KEY_FILE"
fi

# Orders of tonight's interval only reach the online store when a DAG materializes it; do that first (an
# idempotent upsert each model's DAG repeats: the feature views are shared), as intraday materialization would
# have it, and only once the data gate passed: a corrupted window (INJECT) is left for the DAGs' validate_data.
if mlrelease step validate-data --start "$PREV_END" --end "$RUN_END" > /dev/null 2>&1; then
  mlrelease step materialize --start "$PREV_END" --end "$RUN_END" > /dev/null
fi

GATEWAY_PID=""
TRAFFIC_PID=""
cleanup() {
  [ -n "$TRAFFIC_PID" ] && kill "$TRAFFIC_PID" 2> /dev/null || true
  [ -n "$GATEWAY_PID" ] && kill "$GATEWAY_PID" 2> /dev/null || true
  wait 2> /dev/null || true
  TRAFFIC_PID=""
  GATEWAY_PID=""
}
trap cleanup EXIT

release_tonight() {  # release_tonight MODEL: its gateway and traffic, then tonight's run of its DAG; returns its success
  local model="$1" log="$LOGS/make-run-$1.log" traffic="$LOGS/traffic-$1.json" rc=0
  export MLRELEASE_MODEL="$model"
  echo "==> $model: gateway on :$GATEWAY_PORT ($GATEWAY_WORKERS workers); traffic at $TRAFFIC_RATE req/s once the benchmark is done (logs: $LOGS/gateway-$model.log, $traffic)"
  mlrelease gateway --port "$GATEWAY_PORT" --workers "$GATEWAY_WORKERS" --as-of "$RUN_END" > "$LOGS/gateway-$model.log" 2>&1 &
  GATEWAY_PID=$!
  for _ in $(seq 1 120); do
    python -c "import sys, urllib.request as u; u.urlopen('http://127.0.0.1:$GATEWAY_PORT/readyz', timeout=1)" \
      > /dev/null 2>&1 && break
    kill -0 "$GATEWAY_PID" 2> /dev/null || { tail -20 "$LOGS/gateway-$model.log"; return 1; }
    sleep 0.5
  done
  # Traffic starts once the benchmark is done: perf_analyzer measures the same CPU Triton, and live traffic
  # on two cores would be measured as the candidate's slowness (in production it runs on its own GPU node).
  # Shadow evaluation then gives stable ~10 s of traffic of its own before the first stage opens.
  rm -f "$log"
  (
    until grep -qE "end task task_id=benchmark|DagRun Finished" "$log" 2> /dev/null; do sleep 1; done
    MLRELEASE_API_KEY="$(cat "$KEY_FILE")" exec mlrelease traffic --url "http://127.0.0.1:$GATEWAY_PORT" \
      --rate "$TRAFFIC_RATE" --duration 1800 --as-of "$RUN_END" > "$traffic" 2>&1
  ) &
  TRAFFIC_PID=$!
  echo "==> $model: airflow dags test nightly_release_$model $RUN_END  (full log: $log)"
  [ -n "${CANDIDATE_FAULT:-}" ] && echo "==> tonight's $model candidate carries the drill fault '$CANDIDATE_FAULT' (tagged drill_fault in MLflow)"
  dag_test "$model" "$RUN_END" "$log" "${CANDIDATE_FAULT:-}" || rc=$?
  kill -INT "$TRAFFIC_PID" 2> /dev/null || true  # SIGINT: the traffic run writes its report before it exits
  wait "$TRAFFIC_PID" 2> /dev/null || true
  TRAFFIC_PID=""
  cleanup  # the gateway, before the next model's takes the port
  return "$rc"
}

failed=""
for model in $MODELS; do
  release_tonight "$model" || failed="$failed $model"
done

for model in $MODELS; do
  echo
  MLRELEASE_MODEL="$model" mlrelease summary --end "$RUN_END"
  python - "$LOGS/traffic-$model.json" <<'PY' || true
import json, sys
text = open(sys.argv[1]).read()
start = text.find("{")
report = json.loads(text[start:]) if start >= 0 else {}
if report:
    print(f"\ntraffic during the run: {report['sent']} requests at {report['achieved_rate']} req/s, "
          f"p99 {report['latency_ms']['p99']} ms; answers by status {report['statuses']}")
    print(f"  served by {report['served']}")
PY
done
[ -z "$failed" ] || { echo; echo "not released:$failed"; exit 1; }

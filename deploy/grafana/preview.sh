#!/usr/bin/env bash
# preview.sh: draws deploy/grafana/preview.png, the Sluice dashboard's
# queries on real data (make dashboard-preview; ~6 minutes). Grafana is
# not installable here, so this starts Debian's Prometheus server scraping
# a Sluice stack of its own (Temporal dev server, redis-server, the LLM
# simulator, a worker and the API, all on free loopback ports), drives a
# mixed load at it (short questions, long prompts, a burst over the rate
# limit), and then sluice-dashboard preview queries every panel through
# Prometheus's HTTP API and draws the grid. Not a Grafana screenshot.
#
#   LOAD_SECONDS=240 deploy/grafana/preview.sh   # BIN=DIR: the binaries from elsewhere than bin/
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="${BIN:-$ROOT/bin}"
LOAD_SECONDS="${LOAD_SECONDS:-240}"
OUT="${OUT:-$ROOT/deploy/grafana/preview.png}"
WORK="$(mktemp -d)"
command -v prometheus >/dev/null || { echo "!! no prometheus server: apt-get install -y prometheus" >&2; exit 1; }

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { # url name
  for _ in $(seq 1 300); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.2; done
  echo "!! $2 did not answer $1; logs in $WORK" >&2; tail -n 20 "$WORK"/*.log >&2; exit 1
}
TEMPORAL_PORT=$(free_port) REDIS_PORT=$(free_port) SIM_PORT=$(free_port)
API_PORT=$(free_port) WORKER_PORT=$(free_port) PROM_PORT=$(free_port)

echo ">> stack on loopback (logs in $WORK)"
"$BIN/temporal" server start-dev --ip 127.0.0.1 --port "$TEMPORAL_PORT" --headless \
  --log-level error --dynamic-config-value system.enableEagerWorkflowStart=true \
  --dynamic-config-value system.enableActivityEagerExecution=true \
  --search-attribute SluiceTenant=Keyword --search-attribute SluiceRoute=Keyword \
  --search-attribute SluiceOutcome=Keyword >"$WORK/temporal.log" 2>&1 &
pids+=($!)
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no >"$WORK/redis.log" 2>&1 &
pids+=($!)
"$BIN/llmsim" -addr "127.0.0.1:$SIM_PORT" >"$WORK/llmsim.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$SIM_PORT/health" "LLM simulator"
for _ in $(seq 1 300); do (exec 3<>"/dev/tcp/127.0.0.1/$TEMPORAL_PORT") 2>/dev/null && break; sleep 0.2; done

# Few permits, so that the load queues.
export SLUICE_TEMPORAL_HOST_PORT="127.0.0.1:$TEMPORAL_PORT" SLUICE_REDIS_ADDR="127.0.0.1:$REDIS_PORT"
export SLUICE_POOLS_SHORT_ENDPOINTS="http://127.0.0.1:$SIM_PORT" SLUICE_POOLS_LONG_ENDPOINTS="http://127.0.0.1:$SIM_PORT"
export SLUICE_POOLS_SHORT_MAX_CONCURRENCY=4 SLUICE_POOLS_LONG_MAX_CONCURRENCY=2
export SLUICE_METRICS_WORKER_ADDR="127.0.0.1:$WORKER_PORT" SLUICE_API_ADDR="127.0.0.1:$API_PORT"
# A queue of 6 is critical for the healer here (100 by default), so that
# this small load shows its levels and actions.
export SLUICE_HEALING_CRITICAL_QUEUE_DEPTH=6
"$BIN/sluice-worker" >"$WORK/worker.log" 2>&1 &
pids+=($!)
"$BIN/sluice-api" >"$WORK/api.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$API_PORT/readyz" "sluice-api"
wait_http "http://127.0.0.1:$WORKER_PORT/metrics" "sluice-worker"

cat >"$WORK/prometheus.yml" <<YAML
global: {scrape_interval: 2s, evaluation_interval: 2s}
scrape_configs:
  - job_name: sluice
    static_configs: [{targets: ["127.0.0.1:$API_PORT", "127.0.0.1:$WORKER_PORT"]}]
YAML
echo ">> prometheus on 127.0.0.1:$PROM_PORT"
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$PROM_PORT" >"$WORK/prometheus.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$PROM_PORT/-/ready" "prometheus"

API="http://127.0.0.1:$API_PORT"
chat() { curl -sS -N -o /dev/null -m 120 "$API/v1/chat" -H 'Content-Type: application/json' -d "$1" || true; }
# About 700 tokens: over routing.short_threshold_tokens (512), so these go
# to the long pool, and under api.max_query_chars (4,000), which refuses
# longer queries with 413.
LONG_TEXT="$(for _ in $(seq 1 45); do printf 'Explain how admission queues, permits and rate limits interact under load. '; done)"
START=$(date -u +%Y-%m-%dT%H:%M:%SZ)
echo ">> load for ${LOAD_SECONDS}s from $START"
end=$((SECONDS + LOAD_SECONDS))
client() { # kind
  while [ "$SECONDS" -lt "$end" ]; do
    case "$1" in
      short) chat "{\"query\":\"How does a token bucket refill? $RANDOM\",\"max_tokens\":64}" ;;
      long) chat "{\"query\":\"$LONG_TEXT $RANDOM\",\"max_tokens\":200}" ;;
    esac
  done
}
for _ in $(seq 1 10); do client short & done
for _ in $(seq 1 4); do client long & done
# Two bursts over the anonymous tier's rate limits: 429s at the door.
( sleep $((LOAD_SECONDS / 3)); for _ in $(seq 1 300); do chat '{"query":"burst","max_tokens":8}' & done; wait ) &
( sleep $((2 * LOAD_SECONDS / 3)); for _ in $(seq 1 300); do chat '{"query":"burst again","max_tokens":8}' & done; wait ) &
wait_load() { while [ "$SECONDS" -lt "$end" ]; do sleep 5; done; }
wait_load
sleep 10
END=$(date -u +%Y-%m-%dT%H:%M:%SZ)
"$BIN/sluice-dashboard" preview -prometheus "http://127.0.0.1:$PROM_PORT" -start "$START" -end "$END" \
  -step 5s -rate-interval 20s -o "$OUT"

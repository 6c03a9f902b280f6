#!/usr/bin/env bash
# Starts Sluice's local dev stack: Temporal dev server (gRPC :7233, UI :8233),
# Redis, the LLM simulator, a worker and the API. Ctrl-C stops everything.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$ROOT/bin"
DATA="$ROOT/.data"
LOGS="$DATA/logs"
mkdir -p "$LOGS"

REDIS_PORT="${REDIS_PORT:-6379}"
API_ADDR="${SLUICE_API_ADDR:-127.0.0.1:8080}"
SIM_ADDR="${SIM_ADDR:-127.0.0.1:8090}"
export SLUICE_REDIS_ADDR="127.0.0.1:$REDIS_PORT"
export SLUICE_API_ADDR="$API_ADDR"
# With a config of your own (SLUICE_CONFIG=sluice.yaml make run) its pools
# answer; otherwise both pools are the simulator started below.
# The usage ledger, the stored responses and the files are SQLite files
# the API and the worker share.
if [ -z "${SLUICE_CONFIG:-}" ]; then
  export SLUICE_POOLS_SHORT_ENDPOINTS="http://$SIM_ADDR"
  export SLUICE_POOLS_LONG_ENDPOINTS="http://$SIM_ADDR"
  export SLUICE_USAGE_STORE="${SLUICE_USAGE_STORE:-sqlite}"
  if [ "$SLUICE_USAGE_STORE" = sqlite ]; then
    export SLUICE_USAGE_SQLITE_PATH="${SLUICE_USAGE_SQLITE_PATH:-$DATA/usage.db}"
  fi
  export SLUICE_RESPONSES_STORE="${SLUICE_RESPONSES_STORE:-sqlite}"
  if [ "$SLUICE_RESPONSES_STORE" = sqlite ]; then
    export SLUICE_RESPONSES_SQLITE_PATH="${SLUICE_RESPONSES_SQLITE_PATH:-$DATA/responses.db}"
  fi
  export SLUICE_FILES_STORE="${SLUICE_FILES_STORE:-sqlite}"
  if [ "$SLUICE_FILES_STORE" = sqlite ]; then
    export SLUICE_FILES_SQLITE_PATH="${SLUICE_FILES_SQLITE_PATH:-$DATA/files.db}"
  fi
fi
# A fresh admin key each run (or yours): it guards /v1/admin and makes the
# demo keys below. Only the API gets it.
ADMIN_KEY="${SLUICE_AUTH_ADMIN_KEY:-dev-admin-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')}"
unset SLUICE_AUTH_ADMIN_KEY

# The dev stack talks to its own Temporal whatever the user's shell says:
# TEMPORAL_* variables and the temporal CLI's profile would point it (and
# its TLS and API key) at someone else's server.
temporal_vars="$(compgen -e | grep '^TEMPORAL_' || true)"
if [ -n "$temporal_vars" ]; then
  echo ">> ignoring $(echo $temporal_vars | tr '\n' ' ')(the dev stack uses its own Temporal on 127.0.0.1:7233)"
  for v in $temporal_vars; do unset "$v"; done
fi
: >"$DATA/temporal-profile.toml"
export TEMPORAL_CONFIG_FILE="$DATA/temporal-profile.toml"
export SLUICE_TEMPORAL_HOST_PORT="127.0.0.1:7233" SLUICE_TEMPORAL_NAMESPACE="default"

# What the stack needs, named before anything starts.
command -v curl >/dev/null || { echo "!! make run needs curl (apt-get install curl)" >&2; exit 1; }
for p in "127.0.0.1:7233" "127.0.0.1:8233" "$SIM_ADDR" "$API_ADDR"; do
  if (exec 3<>"/dev/tcp/${p%:*}/${p##*:}") 2>/dev/null; then
    echo "!! something already listens on $p; stop it first (or set SLUICE_API_ADDR / SIM_ADDR)" >&2
    exit 1
  fi
done

pids=()
cleanup() {
  trap - EXIT INT TERM
  echo
  echo ">> stopping dev stack"
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'cleanup; exit 0' INT TERM

wait_port() { # host port name
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "!! $3 did not open $1:$2 in 30s; see $LOGS" >&2
  exit 1
}

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

echo ">> Temporal dev server (logs: $LOGS/temporal.log)"
"$BIN/temporal" server start-dev \
  --ip 127.0.0.1 --port 7233 --ui-port 8233 \
  --db-filename "$DATA/temporal.db" --log-level warn \
  --dynamic-config-value system.enableEagerWorkflowStart=true \
  --dynamic-config-value system.enableActivityEagerExecution=true \
  --search-attribute SluiceTenant=Keyword \
  --search-attribute SluiceRoute=Keyword \
  --search-attribute SluiceOutcome=Keyword \
  >"$LOGS/temporal.log" 2>&1 &
pids+=($!)

if port_open 127.0.0.1 "$REDIS_PORT"; then
  echo ">> reusing the Redis already listening on 127.0.0.1:$REDIS_PORT (keys are prefixed sluice:)"
else
  echo ">> redis-server on 127.0.0.1:$REDIS_PORT"
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no --dir "$DATA" \
    >"$LOGS/redis.log" 2>&1 &
  pids+=($!)
fi

echo ">> LLM simulator on $SIM_ADDR"
"$BIN/llmsim" -addr "$SIM_ADDR" >"$LOGS/llmsim.log" 2>&1 &
pids+=($!)

wait_port 127.0.0.1 7233 "Temporal"
wait_port 127.0.0.1 "$REDIS_PORT" "Redis"
wait_port "${SIM_ADDR%:*}" "${SIM_ADDR##*:}" "LLM simulator"

echo ">> sluice-worker"
"$BIN/sluice-worker" >"$LOGS/worker.log" 2>&1 &
pids+=($!)
echo ">> sluice-api on $API_ADDR"
SLUICE_AUTH_ADMIN_KEY="$ADMIN_KEY" "$BIN/sluice-api" >"$LOGS/api.log" 2>&1 &
pids+=($!)

for _ in $(seq 1 300); do
  if curl -fsS "http://$API_ADDR/readyz" >/dev/null 2>&1; then break; fi
  sleep 0.2
done
curl -fsS "http://$API_ADDR/readyz" >/dev/null || { echo "!! API not ready; see $LOGS/api.log" >&2; exit 1; }

# Demo keys, managed ones (hashed in Redis): shown now, never again.
keys() { SLUICE_URL="http://$API_ADDR" SLUICE_ADMIN_KEY="$ADMIN_KEY" "$BIN/sluice-keys" "$@"; }
DEMO_KEY="$(keys create -tenant demo -user alice -scopes chat,ingest -quiet)"
# The first model the pools serve, for the gateway example.
MODEL="$(curl -fsS "http://$API_ADDR/v1/models" -H "Authorization: Bearer $DEMO_KEY" | grep -o '"id":"[^"]*"' | head -1 | cut -d'"' -f4)"
FREE_KEY="$(keys create -tenant smallco -user sam -tier free -scopes chat -quiet)"

# The commands below are printed ready to paste: the exports first, then
# commands that read $SLUICE_KEY (escaped here so they stay literal).
U="http://$API_ADDR"
row() { printf '    %-12s %-30s %s\n' "$@"; }
echo
echo "  Sluice is up."
row "API" "$U" "(OpenAI base URL: $U/v1)"
row "Temporal UI" "http://127.0.0.1:8233" "(search: SluiceTenant=\"demo\")"
row "LLM sim" "http://$SIM_ADDR/metrics" "(vLLM-style metrics; it answers in word salad)"
printf '    %-12s %s\n' "Logs" "$LOGS"
cat <<INFO

  Keys (anonymous access is on too, as tenant "anonymous"):
    admin        $ADMIN_KEY
    demo/alice   $DEMO_KEY   (chat, ingest)
    smallco/sam  $FREE_KEY   (chat, free tier)
    SLUICE_URL=$U SLUICE_ADMIN_KEY=$ADMIN_KEY bin/sluice-keys list
    SLUICE_URL=$U SLUICE_ADMIN_KEY=$ADMIN_KEY bin/sluice-usage -group-by tenant   # the usage ledger

  Try it (paste into a shell):
    export SLUICE_KEY=$DEMO_KEY
    export OPENAI_BASE_URL=$U/v1 OPENAI_API_KEY=$DEMO_KEY   # OpenAI SDKs

    # streaming chat, Sluice's native API (SSE; answers from the shared kb sluice-docs)
    curl -N $U/v1/chat -H "Authorization: Bearer \$SLUICE_KEY" -H 'Content-Type: application/json' \\
      -d '{"query":"How does a token bucket refill?","max_tokens":64}'

    # ingest a document into demo's own kb "notes" (made by its first write)
    curl $U/v1/kb/notes/documents -H "Authorization: Bearer \$SLUICE_KEY" -H 'Content-Type: application/json' \\
      -d '{"id":"refunds","title":"Refund policy","text":"Refunds reach the original card within 14 days of the return arriving."}'

    # ask that kb
    curl -N $U/v1/chat -H "Authorization: Bearer \$SLUICE_KEY" -H 'Content-Type: application/json' \\
      -d '{"query":"How long do refunds take?","kb":"notes","max_tokens":64}'

    # OpenAI endpoint, gateway: the conversation goes to the backend model, no retrieval
    curl $U/v1/chat/completions -H "Authorization: Bearer \$SLUICE_KEY" -H 'Content-Type: application/json' \\
      -d '{"model":"$MODEL","messages":[{"role":"user","content":"Hello"}]}'

    # OpenAI endpoint, RAG: answered from kb notes
    curl $U/v1/chat/completions -H "Authorization: Bearer \$SLUICE_KEY" -H 'Content-Type: application/json' \\
      -d '{"model":"sluice-rag/notes","messages":[{"role":"user","content":"How long do refunds take?"}]}'

  Ctrl-C stops everything.
INFO

wait -n "${pids[@]}" || true
echo "!! a component exited; see $LOGS" >&2

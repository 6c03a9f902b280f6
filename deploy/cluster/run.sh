#!/usr/bin/env bash
# Starts Sluice on real parts, every one on loopback (make run-cluster):
#   PostgreSQL (a data dir of its own under .data/cluster/pg)
#   the Temporal server v1.29.1 on it (history + SQL visibility; the
#     schema set up by temporal-sql-tool), namespace default and the
#     Keyword search attributes SluiceTenant, SluiceRoute, SluiceOutcome
#   the Temporal UI
#   a Redis Cluster: three masters, three replicas
#   two LLM simulators, two sluice-workers, two sluice-apis
# Ports: the usual ones when free, the next free ones otherwise. Logs go
# to .data/cluster/logs. Ctrl-C (or SIGTERM) stops everything, in reverse
# order. The binaries come from `make run-cluster` (make temporal-server,
# temporal-ui, temporal, build).
#
# CLUSTER_REDIS=cluster|single picks how Sluice reaches Redis; by default
# the cluster (redis.addrs), or a standalone redis-server when the
# binaries do not know redis.addrs yet (the cluster is started anyway).
set -euo pipefail
T0=$(date +%s.%N)
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$ROOT/deploy/cluster"
BIN="$ROOT/bin"
DATA="$ROOT/.data/cluster"
LOGS="$DATA/logs"
mkdir -p "$LOGS"

die() { echo "!! $*" >&2; exit 1; }
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# ---------------------------------------------------------------- needs
# Go, redis-server (+ redis-cli) and PostgreSQL the way make run gets
# them: deploy/dev/need.sh installs what is missing with apt-get as root or
# with password-less sudo.
GO="${GO:-go}" "$ROOT/deploy/dev/need.sh" go redis postgres
# initdb and pg_ctl: on PATH, or where Debian keeps them.
pg_bindir() {
  local d
  d="$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/initdb)")"
  [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && { echo "$d"; return; }
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)"
  [ -n "$d" ] && [ -x "$d/initdb" ] && echo "$d"
}
PGBIN="$(pg_bindir)"
command -v redis-cli >/dev/null 2>&1 || die "redis-cli is missing (apt-get install redis-tools)"
command -v curl >/dev/null 2>&1 || die "curl is missing (apt-get install curl)"
for b in temporal temporal-server temporal-sql-tool temporal-ui-server sluice-api sluice-worker sluice-keys llmsim; do
  [ -x "$BIN/$b" ] || die "$BIN/$b is missing: run \`make run-cluster\`, which builds it"
done

# PostgreSQL refuses to run as root: as root, it runs as the postgres user
# (made by Debian's package; need.sh checked it is there) and its data dir
# belongs to that user.
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

# ---------------------------------------------------------------- ports
TAKEN=" "
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# pick VAR PREFERRED [COUNT [BUS_OFFSET]]: the first port from PREFERRED on
# such that it and the COUNT-1 after it are free (and, with BUS_OFFSET,
# each of them + BUS_OFFSET too: the Redis Cluster bus), into VAR.
pick() {
  local var=$1 p=$2 n=${3:-1} bus=${4:-} i q ok
  for ((; p < $2 + 500; p++)); do
    ok=1
    for ((i = 0; i < n; i++)); do
      for q in $((p + i)) ${bus:+$((p + i + bus))}; do
        if [[ "$TAKEN" == *" $q "* ]] || port_open "$q"; then ok=0; break 2; fi
      done
    done
    if [ "$ok" = 1 ]; then
      for ((i = 0; i < n; i++)); do TAKEN+="$((p + i)) ${bus:+$((p + i + bus)) }"; done
      printf -v "$var" '%s' "$p"
      return 0
    fi
  done
  die "no free port range from $2"
}
pick PG_PORT 5432
pick FE_PORT 7233
pick FE_HTTP_PORT 7243
pick HISTORY_PORT 7234
pick MATCHING_PORT 7235
pick TWORKER_PORT 7239
pick FE_MEMBER_PORT 6933
pick HISTORY_MEMBER_PORT 6934
pick MATCHING_MEMBER_PORT 6935
pick TWORKER_MEMBER_PORT 6939
pick UI_PORT 8233
pick REDIS_BASE 7000 6 10000
pick SIM1_PORT 8090
pick SIM2_PORT 8091
pick API1_PORT 8080
pick API2_PORT 8081
pick WMET1_PORT 9091
pick WMET2_PORT 9092
FE="127.0.0.1:$FE_PORT"
REDIS_PORTS=()
for i in 0 1 2 3 4 5; do REDIS_PORTS+=($((REDIS_BASE + i))); done

# ---------------------------------------------------------------- stopping
# Every started part pushes a stop step; they run last-first on exit.
stops=()
alive() { local s; s="$(ps -o stat= -p "$1" 2>/dev/null)"; [ -n "$s" ] && [[ "$s" != Z* ]]; }
stop_pids() { # name pid... : SIGTERM, SIGKILL to what still runs after 20s
  local name=$1 pid i left
  shift
  [ "$#" -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  for ((i = 0; i < 200; i++)); do
    left=0
    for pid in "$@"; do if alive "$pid"; then left=1; fi; done
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  [ "$left" = 1 ] && { echo "   $name did not stop in 20s: SIGKILL"; kill -KILL "$@" 2>/dev/null || true; }
  for pid in "$@"; do wait "$pid" 2>/dev/null || true; done
  echo "   stopped $name"
}
stop_pg() {
  as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w -t 30 stop >/dev/null 2>&1 || true
  echo "   stopped postgres"
}
pids=()
cleanup() {
  trap - EXIT INT TERM
  echo
  echo ">> stopping the cluster stack"
  local i t=$SECONDS
  for ((i = ${#stops[@]} - 1; i >= 0; i--)); do eval "${stops[i]}" || true; done
  echo "   all stopped in $((SECONDS - t))s"
}
trap cleanup EXIT
trap 'cleanup; exit 0' INT TERM
# start NAME LOG CMD...: a part in a session of its own (setsid runs it in
# place: $! is its pid), so that the terminal's Ctrl-C reaches this script
# only and the parts stop in order.
start() {
  local name=$1 log=$2
  shift 2
  setsid "$@" >"$log" 2>&1 </dev/null &
  pids+=($!)
  LAST_PID=$!
}
wait_for() { # what seconds command...
  local what=$1 secs=$2 i
  shift 2
  for ((i = 0; i < secs * 5; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  die "$what not ready in ${secs}s; see $LOGS"
}

# ---------------------------------------------------------------- PostgreSQL
PGDATA="$DATA/pg"
PG_LOG="$LOGS/postgres.log"
PSQL=(psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA)
echo ">> PostgreSQL on 127.0.0.1:$PG_PORT (data: $PGDATA)"
mkdir -p "$PGDATA"
: >"$PG_LOG"
if [ "$(id -u)" -eq 0 ]; then
  chmod o+x "$ROOT/.data" "$DATA"
  chown postgres:postgres "$PGDATA" "$PG_LOG"
fi
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  as_pg "$PGBIN/initdb" -D "$PGDATA" -U postgres --auth=trust -E UTF8 --locale=C -N >"$LOGS/initdb.log" 2>&1 ||
    die "initdb failed; see $LOGS/initdb.log"
fi
# Loopback TCP only (no Unix socket to need a writable /var/run/postgresql).
as_pg setsid "$PGBIN/pg_ctl" -D "$PGDATA" -l "$PG_LOG" -w -t 60 \
  -o "-p $PG_PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=''" start >/dev/null ||
  die "PostgreSQL did not start; see $PG_LOG"
stops+=("stop_pg")
"${PSQL[@]}" -c "SELECT 1 FROM pg_roles WHERE rolname = 'temporal'" | grep -q 1 ||
  "${PSQL[@]}" -c "CREATE ROLE temporal LOGIN PASSWORD 'temporal' CREATEDB"

# ---------------------------------------------------------------- schema
# temporal-sql-tool: create each database once, then bring its schema to
# the newest version the tool embeds (the same files as schema/postgresql/
# v12/{temporal,visibility}/versioned in the server module; a no-op when
# current).
SQLTOOL=("$BIN/temporal-sql-tool" --plugin postgres12 --ep 127.0.0.1 -p "$PG_PORT" -u temporal --pw temporal)
for db in temporal:temporal temporal_visibility:visibility; do
  name=${db%%:*} schema=postgresql/v12/${db##*:}
  if ! "${PSQL[@]}" -c "SELECT 1 FROM pg_database WHERE datname = '$name'" | grep -q 1; then
    echo ">> schema: creating $name"
    "${SQLTOOL[@]}" --db "$name" create-database >>"$LOGS/schema.log" 2>&1 &&
      "${SQLTOOL[@]}" --db "$name" setup-schema -v 0.0 >>"$LOGS/schema.log" 2>&1 ||
      die "temporal-sql-tool could not create $name; see $LOGS/schema.log"
  fi
  "${SQLTOOL[@]}" --db "$name" update-schema --schema-name "$schema" >>"$LOGS/schema.log" 2>&1 ||
    die "temporal-sql-tool could not update $name to $schema; see $LOGS/schema.log"
done

# The usage ledger's own database and role on the same server; Sluice
# migrates its schema when it starts.
"${PSQL[@]}" -c "SELECT 1 FROM pg_roles WHERE rolname = 'sluice_usage'" | grep -q 1 ||
  "${PSQL[@]}" -c "CREATE ROLE sluice_usage LOGIN PASSWORD 'sluice_usage'"
"${PSQL[@]}" -c "SELECT 1 FROM pg_database WHERE datname = 'sluice_usage'" | grep -q 1 ||
  "${PSQL[@]}" -c "CREATE DATABASE sluice_usage OWNER sluice_usage"

# ---------------------------------------------------------------- Temporal
echo ">> Temporal server on $FE (logs: $LOGS/temporal.log)"
# The config is a template (deploy/cluster/temporal/cluster.yaml) the
# server renders from these variables, given to it alone.
start temporal-server "$LOGS/temporal.log" env \
  TS_PG_ADDR="127.0.0.1:$PG_PORT" TS_FRONTEND_PORT="$FE_PORT" TS_FRONTEND_HTTP_PORT="$FE_HTTP_PORT" \
  TS_HISTORY_PORT="$HISTORY_PORT" TS_MATCHING_PORT="$MATCHING_PORT" TS_WORKER_PORT="$TWORKER_PORT" \
  TS_FRONTEND_MEMBERSHIP_PORT="$FE_MEMBER_PORT" TS_HISTORY_MEMBERSHIP_PORT="$HISTORY_MEMBER_PORT" \
  TS_MATCHING_MEMBERSHIP_PORT="$MATCHING_MEMBER_PORT" TS_WORKER_MEMBERSHIP_PORT="$TWORKER_MEMBER_PORT" \
  TS_DYNAMIC_CONFIG="$HERE/temporal/dynamicconfig.yaml" \
  TS_LOG_LEVEL="${TS_LOG_LEVEL:-warn}" \
  "$BIN/temporal-server" --root / --config "$HERE/temporal" --env cluster --allow-no-auth start
stops+=("stop_pids temporal-server $LAST_PID")
tcli() { "$BIN/temporal" "$@" --address "$FE"; }
wait_for "Temporal server" 120 tcli operator cluster health
if ! tcli operator namespace describe --namespace default >/dev/null 2>&1; then
  tcli operator namespace create --namespace default --retention 72h >>"$LOGS/temporal-setup.log" 2>&1 ||
    die "could not create namespace default; see $LOGS/temporal-setup.log"
fi
# SQL visibility keeps custom search attributes per namespace; adding them
# fails until the new namespace has reached the frontend's cache.
has_sa() { tcli operator search-attribute list --namespace default 2>/dev/null | grep -qw "$1"; }
ensure_sa() {
  has_sa "$1" && return 0
  tcli operator search-attribute create --namespace default --name "$1" --type Keyword >>"$LOGS/temporal-setup.log" 2>&1 || true
  has_sa "$1"
}
for sa in SluiceTenant SluiceRoute SluiceOutcome; do
  wait_for "search attribute $sa (see temporal-setup.log)" 60 ensure_sa "$sa"
done
# Usable once the frontend's namespace cache has it (refreshed each second).
wait_for "namespace default" 60 tcli workflow count --namespace default

echo ">> Temporal UI on http://127.0.0.1:$UI_PORT"
start temporal-ui "$LOGS/temporal-ui.log" env TS_FRONTEND_ADDR="$FE" TS_UI_PORT="$UI_PORT" \
  "$BIN/temporal-ui-server" --root / --config "$HERE/ui" --env cluster start
stops+=("stop_pids temporal-ui $LAST_PID")
wait_for "Temporal UI (see temporal-ui.log)" 30 curl -fsS -o /dev/null "http://127.0.0.1:$UI_PORT/"

# ---------------------------------------------------------------- Redis
echo ">> Redis Cluster on 127.0.0.1:${REDIS_PORTS[0]}-${REDIS_PORTS[5]} (3 masters, 3 replicas)"
rm -rf "$DATA/redis"
redis_pids=()
for p in "${REDIS_PORTS[@]}"; do
  mkdir -p "$DATA/redis/$p"
  start "redis $p" "$LOGS/redis-$p.log" redis-server --bind 127.0.0.1 --port "$p" \
    --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000 \
    --save "" --appendonly no --dir "$DATA/redis/$p"
  redis_pids+=("$LAST_PID")
done
stops+=("stop_pids 'redis cluster (6 nodes)' ${redis_pids[*]}")
for p in "${REDIS_PORTS[@]}"; do wait_for "redis-server :$p" 30 redis-cli -p "$p" ping; done
nodes=()
for p in "${REDIS_PORTS[@]}"; do nodes+=("127.0.0.1:$p"); done
redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes \
  >"$LOGS/redis-cluster-create.log" 2>&1 || die "redis-cli --cluster create failed; see $LOGS/redis-cluster-create.log"
cluster_ok() {
  local p
  for p in "${REDIS_PORTS[@]}"; do redis-cli -p "$p" cluster info | grep -q '^cluster_state:ok' || return 1; done
}
wait_for "Redis Cluster" 30 cluster_ok
REDIS_ADDRS="$(printf '127.0.0.1:%s,' "${REDIS_PORTS[@]}")"
REDIS_ADDRS="${REDIS_ADDRS%,}"

# How Sluice reaches Redis: the cluster (redis.addrs) when the binaries
# know the setting, else a standalone redis-server of this stack.
mode="${CLUSTER_REDIS:-auto}"
if [ "$mode" = auto ]; then
  probe="$(SLUICE_REDIS_ADDRS=127.0.0.1:1 SLUICE_LOG_LEVEL=probe timeout 10 "$BIN/sluice-worker" 2>&1 || true)"
  if grep -q 'SLUICE_REDIS_ADDRS: unknown setting' <<<"$probe"; then mode=single; else mode=cluster; fi
fi
unset SLUICE_REDIS_ADDR SLUICE_REDIS_ADDRS SLUICE_REDIS_URL
case "$mode" in
  cluster)
    export SLUICE_REDIS_ADDRS="$REDIS_ADDRS"
    SLUICE_REDIS_SHOWN="cluster $REDIS_ADDRS" ;;
  single)
    pick SINGLE_REDIS_PORT 6390
    if [ "${CLUSTER_REDIS:-auto}" = single ]; then
      echo ">> CLUSTER_REDIS=single: Sluice uses a standalone redis-server on 127.0.0.1:$SINGLE_REDIS_PORT (the cluster runs, unused)"
    else
      echo "!! these binaries do not know redis.addrs: Sluice uses a standalone redis-server on 127.0.0.1:$SINGLE_REDIS_PORT (the cluster runs, unused)" >&2
    fi
    mkdir -p "$DATA/redis/single"
    start redis-single "$LOGS/redis-single.log" redis-server --bind 127.0.0.1 --port "$SINGLE_REDIS_PORT" \
      --save "" --appendonly no --dir "$DATA/redis/single"
    stops+=("stop_pids redis-single $LAST_PID")
    wait_for "redis-server :$SINGLE_REDIS_PORT" 30 redis-cli -p "$SINGLE_REDIS_PORT" ping
    export SLUICE_REDIS_ADDR="127.0.0.1:$SINGLE_REDIS_PORT"
    SLUICE_REDIS_SHOWN="standalone 127.0.0.1:$SINGLE_REDIS_PORT" ;;
  *) die "CLUSTER_REDIS=$mode: want cluster, single or auto" ;;
esac

# ---------------------------------------------------------------- simulators
SIMS=("127.0.0.1:$SIM1_PORT" "127.0.0.1:$SIM2_PORT")
sim_pids=()
for i in 0 1; do
  echo ">> LLM simulator $((i + 1)) on ${SIMS[i]}"
  start "llmsim-$((i + 1))" "$LOGS/llmsim-$((i + 1)).log" "$BIN/llmsim" -addr "${SIMS[i]}"
  sim_pids+=("$LAST_PID")
done
stops+=("stop_pids 'llmsim (2)' ${sim_pids[*]}")
for s in "${SIMS[@]}"; do wait_for "llmsim $s" 30 curl -fsS "http://$s/health"; done

# ---------------------------------------------------------------- Sluice
export SLUICE_TEMPORAL_HOST_PORT="$FE" SLUICE_TEMPORAL_NAMESPACE=default
# With a config of your own (SLUICE_CONFIG=sluice.yaml make run-cluster)
# its pools answer; otherwise both pools are the two simulators.
if [ -z "${SLUICE_CONFIG:-}" ]; then
  export SLUICE_POOLS_SHORT_ENDPOINTS="http://${SIMS[0]},http://${SIMS[1]}"
  export SLUICE_POOLS_LONG_ENDPOINTS="http://${SIMS[0]},http://${SIMS[1]}"
  export SLUICE_USAGE_STORE=postgres
  export SLUICE_USAGE_POSTGRES_DSN="postgres://sluice_usage:sluice_usage@127.0.0.1:$PG_PORT/sluice_usage?sslmode=disable"
fi
ADMIN_KEY="${SLUICE_AUTH_ADMIN_KEY:-dev-admin-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')}"
unset SLUICE_AUTH_ADMIN_KEY SLUICE_API_ADDR SLUICE_METRICS_WORKER_ADDR

worker_pids=()
for i in 1 2; do
  port_var="WMET${i}_PORT"
  echo ">> sluice-worker $i (metrics: 127.0.0.1:${!port_var})"
  start "worker-$i" "$LOGS/worker-$i.log" env SLUICE_METRICS_WORKER_ADDR="127.0.0.1:${!port_var}" "$BIN/sluice-worker"
  worker_pids+=("$LAST_PID")
done
stops+=("stop_pids 'sluice-worker (2)' ${worker_pids[*]}")

APIS=("127.0.0.1:$API1_PORT" "127.0.0.1:$API2_PORT")
api_pids=()
for i in 0 1; do
  echo ">> sluice-api $((i + 1)) on ${APIS[i]}"
  start "api-$((i + 1))" "$LOGS/api-$((i + 1)).log" env SLUICE_API_ADDR="${APIS[i]}" SLUICE_AUTH_ADMIN_KEY="$ADMIN_KEY" \
    "$BIN/sluice-api"
  api_pids+=("$LAST_PID")
done
stops+=("stop_pids 'sluice-api (2)' ${api_pids[*]}")

for i in 0 1; do wait_for "sluice-api ${APIS[i]} (/readyz; see api-$((i + 1)).log)" 60 curl -fsS "http://${APIS[i]}/readyz"; done
for p in "${worker_pids[@]}"; do kill -0 "$p" 2>/dev/null || die "a sluice-worker exited; see $LOGS/worker-*.log"; done
HEALTHY_AFTER="$(elapsed)"

# ---------------------------------------------------------------- keys, URLs
U1="http://${APIS[0]}" U2="http://${APIS[1]}"
keys() { SLUICE_URL="$U1" SLUICE_ADMIN_KEY="$ADMIN_KEY" "$BIN/sluice-keys" "$@"; }
DEMO_KEY="$(keys create -tenant demo -user alice -scopes chat,ingest -quiet)"

row() { printf '    %-14s %s\n' "$@"; }
echo
echo "  Sluice cluster stack is up (healthy ${HEALTHY_AFTER}s after start)."
row "API 1" "$U1   (OpenAI base URL: $U1/v1)"
row "API 2" "$U2   (OpenAI base URL: $U2/v1)"
row "Temporal UI" "http://127.0.0.1:$UI_PORT   (search: SluiceTenant=\"demo\")"
row "Temporal" "$FE   (bin/temporal workflow list --address $FE)"
row "Postgres" "postgres://temporal:temporal@127.0.0.1:$PG_PORT/temporal   (and /temporal_visibility)"
row "Redis nodes" "$REDIS_ADDRS"
row "Sluice Redis" "$SLUICE_REDIS_SHOWN"
row "LLM sims" "http://${SIMS[0]}/metrics http://${SIMS[1]}/metrics"
row "Worker metrics" "http://127.0.0.1:$WMET1_PORT/metrics http://127.0.0.1:$WMET2_PORT/metrics"
row "Logs" "$LOGS"
cat <<INFO

  Keys:
    admin        $ADMIN_KEY
    demo/alice   $DEMO_KEY   (chat, ingest)

  Try it (paste into a shell): the same request through either API
    export SLUICE_KEY=$DEMO_KEY
    curl -N $U1/v1/chat -H "Authorization: Bearer \$SLUICE_KEY" -H 'Content-Type: application/json' \\
      -d '{"query":"How does a token bucket refill?","max_tokens":64}'
    curl -N $U2/v1/chat -H "Authorization: Bearer \$SLUICE_KEY" -H 'Content-Type: application/json' \\
      -d '{"query":"How does a token bucket refill?","max_tokens":64}'
    bin/temporal workflow list --address $FE --query 'SluiceTenant="demo"'

  Ctrl-C stops everything.
INFO

wait -n "${pids[@]}" || true
echo "!! a component exited; see $LOGS" >&2
exit 1

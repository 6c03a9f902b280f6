#!/usr/bin/env bash
# need.sh: makes sure the tools `make run` and `make test` use are here,
# installing what is missing with apt-get when it may (root, or sudo
# without a password), and otherwise saying in one line what to run.
# Silent when everything is present. The one owner of this logic: the
# Makefile and .ci/run both call it.
#
#   deploy/dev/need.sh go redis        # make run, make chaos, make bench-*
#   deploy/dev/need.sh go redis node promtool haproxy   # make test (node/npm: the
#                       # openai SDK tests; promtool: the alert rules; haproxy: the
#                       # reverse proxy of tests/proxy)
#   deploy/dev/need.sh go redis postgres   # make test-cluster, make run-cluster
#                       # (the real Temporal server keeps its data in PostgreSQL)
#
# GO names the go command (the Makefile passes its $(GO)).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
GO="${GO:-go}"

die() { echo "!! $*" >&2; exit 1; }

# apt-get runs directly as root, through sudo if sudo needs no password;
# root_ok=0 when neither works.
root_ok=1 SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo "; else root_ok=0; fi
fi
as_root() { if [ -n "$SUDO" ]; then sudo -n "$@"; else "$@"; fi; }

# apt_install PKG...: quiet apt-get update (once) and install; prints
# "done in Ns", or the tail of apt-get's output when it fails.
updated=0
apt_install() {
  local log t0=$SECONDS
  log="$(mktemp)"
  if { [ "$updated" = 1 ] || as_root apt-get update -qq; } >"$log" 2>&1 &&
     as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >>"$log" 2>&1; then
    updated=1
    rm -f "$log"
    echo "   done in $((SECONDS - t0))s"
  else
    tail -n 15 "$log" >&2
    rm -f "$log"
    die "apt-get install $* failed (output above)"
  fi
}

need_go() {
  command -v "$GO" >/dev/null 2>&1 ||
    die "go is missing: install Go $(want_go) or newer from https://go.dev/dl/, then run make again"
  local want have mode
  want="$(want_go)"
  # The installed toolchain itself, not one go.mod would switch to.
  have="$(cd / && GOTOOLCHAIN=local "$GO" env GOVERSION)"
  have="${have#go}"
  if [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n1)" != "$want" ]; then
    mode="$(cd / && "$GO" env GOTOOLCHAIN)"
    case "$mode" in
      "")
        die "go $have is older than go $want that go.mod needs: install Go $want or newer from https://go.dev/dl/, then run make again" ;;
      local | *+local)
        die "go $have is older than go $want that go.mod needs (and GOTOOLCHAIN=$mode forbids fetching it): install Go $want or newer from https://go.dev/dl/, then run make again" ;;
      *)
        echo ">> go $have is older than go.mod's $want: the go command fetches go$want itself (GOTOOLCHAIN=$mode)" ;;
    esac
  fi
}
want_go() { awk '$1 == "go" { print $2; exit }' "$ROOT/go.mod"; }

need_redis() {
  command -v redis-server >/dev/null 2>&1 && return 0
  if [ "$root_ok" = 1 ] && command -v apt-get >/dev/null 2>&1; then
    echo ">> redis-server is missing: installing it with apt-get (${SUDO}apt-get install -y redis-server)"
    apt_install redis-server
    command -v redis-server >/dev/null 2>&1 || die "apt-get installed redis-server but it is not on PATH ($PATH)"
  elif [ "$root_ok" = 1 ]; then
    die "redis-server is missing and there is no apt-get here: install it (\`brew install redis\` on macOS, or your package manager), then run make again"
  else
    die "redis-server is missing and I cannot install it without root: run \`sudo apt-get install -y redis-server\` (Debian/Ubuntu) or \`brew install redis\` (macOS), then run make again"
  fi
}

need_node() {
  local pkgs=()
  command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
  command -v npm >/dev/null 2>&1 || pkgs+=(npm)
  if [ "${#pkgs[@]}" -gt 0 ]; then
    if [ "$root_ok" = 1 ] && command -v apt-get >/dev/null 2>&1; then
      local names="${pkgs[*]}"
      echo ">> node/npm missing: installing ${names/ / and } with apt-get (${SUDO}apt-get install -y ${pkgs[*]})"
      apt_install "${pkgs[@]}"
      { command -v node && command -v npm; } >/dev/null 2>&1 ||
        die "apt-get installed ${pkgs[*]} but node or npm is not on PATH ($PATH)"
    elif [ "$root_ok" = 1 ]; then
      die "node/npm are missing and there is no apt-get here: install Node.js 18 or newer (\`brew install node\` on macOS), then run make again"
    else
      die "node/npm are missing and I cannot install them without root: run \`sudo apt-get install -y nodejs npm\` (Debian/Ubuntu) or \`brew install node\` (macOS), then run make again"
    fi
  fi
  # The openai npm package wants a maintained Node; say so, do not stop.
  local major
  major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
  if [ "$major" -lt 18 ]; then
    echo ">> warning: node $(node --version 2>/dev/null) is older than 18; the openai SDK tests may fail (https://nodejs.org)" >&2
  fi
}

# promtool checks and unit-tests the Prometheus alert rules (go test
# ./deploy/); Debian ships it in the prometheus package, with the server
# that make dashboard-preview runs.
need_promtool() {
  command -v promtool >/dev/null 2>&1 && return 0
  if [ "$root_ok" = 1 ] && command -v apt-get >/dev/null 2>&1; then
    echo ">> promtool is missing: installing it with apt-get (${SUDO}apt-get install -y prometheus)"
    apt_install prometheus
    command -v promtool >/dev/null 2>&1 || die "apt-get installed prometheus but promtool is not on PATH ($PATH)"
  elif [ "$root_ok" = 1 ]; then
    die "promtool is missing and there is no apt-get here: install Prometheus (\`brew install prometheus\` on macOS), then run make again"
  else
    die "promtool is missing and I cannot install it without root: run \`sudo apt-get install -y prometheus\` (Debian/Ubuntu) or \`brew install prometheus\` (macOS), then run make again"
  fi
}

# haproxy is the reverse proxy tests/proxy puts in front of Sluice; Debian
# installs it in /usr/sbin, which is not on every user's PATH.
need_haproxy() {
  command -v haproxy >/dev/null 2>&1 && return 0
  [ -x /usr/sbin/haproxy ] && return 0
  if [ "$root_ok" = 1 ] && command -v apt-get >/dev/null 2>&1; then
    echo ">> haproxy is missing: installing it with apt-get (${SUDO}apt-get install -y haproxy)"
    apt_install haproxy
    { command -v haproxy || [ -x /usr/sbin/haproxy ]; } >/dev/null 2>&1 || die "apt-get installed haproxy but it is neither on PATH ($PATH) nor in /usr/sbin"
  elif [ "$root_ok" = 1 ]; then
    die "haproxy is missing and there is no apt-get here: install it (\`brew install haproxy\` on macOS), then run make again"
  else
    die "haproxy is missing and I cannot install it without root: run \`sudo apt-get install -y haproxy\` (Debian/Ubuntu) or \`brew install haproxy\` (macOS), then run make again"
  fi
}

# PostgreSQL is the real Temporal server's database (make test-cluster,
# make run-cluster): initdb and pg_ctl start a server of its own, psql sets
# it up. Debian keeps initdb and pg_ctl off PATH, in
# /usr/lib/postgresql/<major>/bin; its package also makes the user postgres,
# which PostgreSQL runs as when we are root (it refuses to run as root).
pg_bindir() {
  local d
  d="$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/initdb)")"
  [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && { echo "$d"; return 0; }
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)"
  [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && echo "$d"
}
have_postgres() {
  pg_bindir >/dev/null && command -v psql >/dev/null 2>&1 &&
    { [ "$(id -u)" -ne 0 ] || id postgres >/dev/null 2>&1; }
}
need_postgres() {
  have_postgres && return 0
  if [ "$root_ok" = 1 ] && command -v apt-get >/dev/null 2>&1; then
    echo ">> PostgreSQL is missing: installing it with apt-get (${SUDO}apt-get install -y postgresql)"
    apt_install postgresql
    have_postgres || die "apt-get installed postgresql but initdb, pg_ctl or psql is not on PATH or in /usr/lib/postgresql/*/bin (or, as root, there is no user postgres)"
  elif [ "$root_ok" = 1 ]; then
    die "PostgreSQL (initdb, pg_ctl, psql) is missing and there is no apt-get here: install it (\`brew install postgresql\` on macOS), then run make again"
  else
    die "PostgreSQL (initdb, pg_ctl, psql) is missing and I cannot install it without root: run \`sudo apt-get install -y postgresql\` (Debian/Ubuntu) or \`brew install postgresql\` (macOS), then run make again"
  fi
}

[ "$#" -gt 0 ] || set -- go redis
for what in "$@"; do
  case "$what" in
    go) need_go ;;
    redis) need_redis ;;
    node) need_node ;;
    promtool) need_promtool ;;
    haproxy) need_haproxy ;;
    postgres) need_postgres ;;
    *) die "need.sh: unknown requirement $what (want go, redis, node, promtool, haproxy or postgres)" ;;
  esac
done

#!/usr/bin/env bash
# Run the official MCP conformance suite (2026-07-28 requirements) through nginx (the cluster
# launcher, with deploy/nginx.conf), in front of replicas of the conformance example that share
# Redis: every request of a scenario, MRTR retries and change triggers included, may land on a
# different replica.
#
#   spec-compat/run-cluster-conformance.sh                       # 3 replicas
#   REPLICAS=5 spec-compat/run-cluster-conformance.sh
#   REDIS_CLUSTER_NODES=6 spec-compat/run-cluster-conformance.sh # on a Redis Cluster of its own
#   spec-compat/run-cluster-conformance.sh --scenario server-stateless   # options of run-conformance.sh
#
# Nothing is built here: run `cargo build --examples` first. Redis comes from REDIS_URL (default
# redis://127.0.0.1:6379), or with REDIS_CLUSTER_NODES=6 from a Redis Cluster this script starts
# (three masters with a replica each, on free ports) and stops; the replicas write under a key
# prefix of their own. The exit code is the suite's (see run-conformance.sh), or 2 when the
# cluster does not start.
set -euo pipefail

readonly STARTUP_TIMEOUT_SECS=60

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd -- "$SCRIPT_DIR/.." && pwd)"
cd "$REPO_ROOT"

REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
REPLICAS="${REPLICAS:-3}"
LAUNCHER="$REPO_ROOT/target/debug/examples/cluster"
FIXTURE="$REPO_ROOT/target/debug/examples/conformance_server"

log() { printf '[run-cluster-conformance] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 2; }

for bin in "$LAUNCHER" "$FIXTURE"; do
    [[ -x "$bin" ]] || die "$bin not found: build the examples first (cargo build --examples)"
done

OUT_DIR="$REPO_ROOT/spec-compat/results/$(date -u +%Y%m%dT%H%M%SZ)-cluster"
mkdir -p "$OUT_DIR"
CLUSTER_LOG="$OUT_DIR/cluster.log"

CLUSTER_PID=""
REDIS_NODE_PORTS=()
# Runs on every exit: stop the launcher, which stops its replicas, and our Redis Cluster.
# shellcheck disable=SC2329  # invoked via trap
stop_cluster() {
    local port
    for port in "${REDIS_NODE_PORTS[@]}"; do
        redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    done
    REDIS_NODE_PORTS=()
    [[ -n "$CLUSTER_PID" ]] || return 0
    if kill -0 "$CLUSTER_PID" 2>/dev/null; then
        log "stopping the cluster (pid $CLUSTER_PID)"
        kill -TERM "$CLUSTER_PID" 2>/dev/null || true
        local i
        for ((i = 0; i < 100; i++)); do
            kill -0 "$CLUSTER_PID" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$CLUSTER_PID" 2>/dev/null; then
            log "the cluster did not stop within 10 s; sending SIGKILL"
            kill -KILL "$CLUSTER_PID" 2>/dev/null || true
        fi
    fi
    wait "$CLUSTER_PID" 2>/dev/null || true
    CLUSTER_PID=""
}
trap stop_cluster EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
    python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}

PORT="$(free_port)"
PREFIX="moviedb-conformance-$$-$RANDOM:"
log "starting $REPLICAS replicas of the conformance example behind a balancer on port $PORT"
log "Redis $REDIS_URL, key prefix $PREFIX (log: $CLUSTER_LOG)"
# A Redis Cluster of our own when asked: nodes on free ports whose bus ports (+10000) are free.
if [[ -n "${REDIS_CLUSTER_NODES:-}" ]]; then
    mapfile -t REDIS_NODE_PORTS < <(python3 - "$REDIS_CLUSTER_NODES" <<'PY'
import socket, sys
found = []
while len(found) < int(sys.argv[1]):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    if port >= 55000 or port in found:
        continue
    try:
        with socket.socket() as bus:
            bus.bind(("127.0.0.1", port + 10000))
    except OSError:
        continue
    found.append(port)
print("\n".join(map(str, found)))
PY
)
    mkdir -p "$OUT_DIR/redis"
    for port in "${REDIS_NODE_PORTS[@]}"; do
        redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
            --cluster-config-file "nodes-$port.conf" --cluster-node-timeout 1000 \
            --save "" --appendonly no --dir "$OUT_DIR/redis" --daemonize yes \
            --logfile "$OUT_DIR/redis/$port.log"
    done
    deadline=$((SECONDS + STARTUP_TIMEOUT_SECS))
    for port in "${REDIS_NODE_PORTS[@]}"; do
        until redis-cli -p "$port" ping >/dev/null 2>&1; do
            ((SECONDS < deadline)) || die "redis-server on port $port did not answer within \
${STARTUP_TIMEOUT_SECS}s (see $OUT_DIR/redis/$port.log)"
            sleep 0.1
        done
    done
    redis-cli --cluster create "${REDIS_NODE_PORTS[@]/#/127.0.0.1:}" --cluster-replicas 1 \
        --cluster-yes >"$OUT_DIR/redis/create.log" 2>&1 || die "redis-cli --cluster create failed"
    until redis-cli -p "${REDIS_NODE_PORTS[0]}" cluster info | grep -q cluster_state:ok; do
        ((SECONDS < deadline)) || die "the Redis Cluster was not ok within ${STARTUP_TIMEOUT_SECS}s"
        sleep 0.2
    done
    REDIS_URL=$(printf 'redis://127.0.0.1:%s,' "${REDIS_NODE_PORTS[@]}")
    REDIS_URL=${REDIS_URL%,}
    log "Redis Cluster of ${#REDIS_NODE_PORTS[@]} nodes: $REDIS_URL"
fi

"$LAUNCHER" --replicas "$REPLICAS" --bin "$FIXTURE" --redis-url "$REDIS_URL" --port "$PORT" \
    -- --redis-prefix "$PREFIX" >"$CLUSTER_LOG" 2>&1 &
CLUSTER_PID=$!

# The launcher announces the balancer once every replica serves.
deadline=$((SECONDS + STARTUP_TIMEOUT_SECS))
until grep -q '^balancer: ' "$CLUSTER_LOG"; do
    if ! kill -0 "$CLUSTER_PID" 2>/dev/null; then
        CLUSTER_PID=""
        tail -n 40 "$CLUSTER_LOG" >&2 || true
        die "the cluster launcher exited before serving"
    fi
    if ((SECONDS >= deadline)); then
        tail -n 40 "$CLUSTER_LOG" >&2 || true
        die "the cluster did not serve within ${STARTUP_TIMEOUT_SECS}s"
    fi
    sleep 0.2
done
grep -E '^(replica|balancer)' "$CLUSTER_LOG" >&2

rc=0
bash "$SCRIPT_DIR/run-conformance.sh" --url "http://127.0.0.1:$PORT/mcp" --requirements 2026-07-28 \
    --out "$OUT_DIR" "$@" || rc=$?

if ! kill -0 "$CLUSTER_PID" 2>/dev/null; then
    log "ERROR: the cluster launcher died during the run"
    rc=1
fi
exit "$rc"

#!/bin/bash
# Start a MemT cluster on this machine: Redis (session ownership), one shared snapshot store, N core+proxy
# pairs, and SMG in front: a request with X-SMG-Routing-Key goes to its key's node (sticky), a header-less
# one to the node that keeps its conversation's state (cache_aware: the longest shared prefix; see
# docs/deployment.md for the figures, scripts/bench/routing.py to measure). Ctrl-C (or SIGTERM) stops
# everything it started.
#
#   bash scripts/start_cluster.sh [N] [CHECKPOINT_DIR]
#
# Clients send a named session as `X-SMG-Routing-Key: <id>` (SMG routes by it and forwards it; the proxies run
# with --cluster and take it as the session), and per-request controls in the body's metadata
# ({"memt_memory": "off"}: SMG drops X-MemT-* headers). Environment:
#   MEMT_PYTHON          the project's .venv/bin/python, else python3
#   MEMT_CLUSTER_DIR     ./memt-cluster: snapshot store, proxy records, per-node state, logs
#   MEMT_CLUSTER_PORT    8800: SMG's port (the OpenAI API is at http://127.0.0.1:$MEMT_CLUSTER_PORT/v1);
#                        its Prometheus metrics on the next port
#   MEMT_CORE_PORT       31000: core i listens on MEMT_CORE_PORT+i, proxy i on MEMT_PROXY_PORT+i
#   MEMT_PROXY_PORT      8100
#   MEMT_REDIS_PORT      6390
#   MEMT_OWNERSHIP_TTL   10: seconds a dead node's sessions stay owned before another node takes them
#   MEMT_TORCH_THREADS   each core's --torch-threads: by default the machine's cores but one, shared among the N
#                        cores (at least 1 each), so that busy nodes do not oversubscribe the CPU
#   MEMT_CORE_ARGS       extra python -m memt_core.launch arguments (e.g. "--device cuda:0"); they come last and win
#   MEMT_PROXY_KEY       an API key the proxies require (SMG is given it too: it lists the workers' models with it)
set -euo pipefail

N=${1:-3}
MODEL=${2:-}
if ! [[ "$N" =~ ^[1-9][0-9]*$ ]]; then echo "the number of nodes must be a positive integer, got '$N'" >&2; exit 2; fi
. "$(dirname -- "$0")/lib/python.sh"
PY=$MEMT_PYTHON
SMG=$(dirname -- "$PY")/smg
[ -x "$SMG" ] || SMG=$(command -v smg || true)
if [ -z "$SMG" ]; then echo "smg is not installed: pip install 'memt-serve[cluster]'" >&2; exit 2; fi
if ! command -v redis-server >/dev/null; then echo "redis-server is not installed: apt-get install redis-server (scripts/setup.sh)" >&2; exit 2; fi

DIR=${MEMT_CLUSTER_DIR:-./memt-cluster}
PORT=${MEMT_CLUSTER_PORT:-8800}
CORE_PORT=${MEMT_CORE_PORT:-31000}
PROXY_PORT=${MEMT_PROXY_PORT:-8100}
REDIS_PORT=${MEMT_REDIS_PORT:-6390}
TTL=${MEMT_OWNERSHIP_TTL:-10}
SHARE=$(( ($(nproc) - 1) / N ))
THREADS=${MEMT_TORCH_THREADS:-$(( SHARE > 0 ? SHARE : 1 ))}
mkdir -p "$DIR/store" "$DIR/records" "$DIR/logs"
MODEL_ARGS=()
[ -n "$MODEL" ] && MODEL_ARGS=(--model-path "$MODEL")
KEY_ARGS=()
[ -n "${MEMT_PROXY_KEY:-}" ] && KEY_ARGS=(--api-key "$MEMT_PROXY_KEY")

PIDS=()
stop() {  # STATUS: stop what was started, last first, and exit with STATUS
    trap - INT TERM EXIT
    echo "stopping the cluster"
    for ((i=${#PIDS[@]}-1; i>=0; i--)); do kill "${PIDS[i]}" 2>/dev/null || true; done
    wait 2>/dev/null || true
    exit "$1"
}
trap 'stop 0' INT TERM
trap 'stop $?' EXIT

wait_for() {  # NAME PID LOG PROBE...: until PROBE succeeds; its process exiting or 300 s passing stops the cluster
    local name=$1 pid=$2 log=$3
    shift 3
    local why="was not ready within 300 s"
    for _ in $(seq 600); do
        "$@" && return 0
        if ! kill -0 "$pid" 2>/dev/null; then why="exited before it was ready"; break; fi
        sleep 0.5
    done
    echo "$name $why; the end of $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
}
answers() { curl -sf --max-time 5 -o /dev/null "$@"; }
lists_models() { curl -sf --max-time 5 "$@" | grep -q '"id"'; }

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" >"$DIR/logs/redis.log" 2>&1 &
PIDS+=($!)
REDIS="redis://127.0.0.1:$REDIS_PORT/0"

WORKERS=()
for ((i=0; i<N; i++)); do
    cport=$((CORE_PORT+i)); pport=$((PROXY_PORT+i))
    # shellcheck disable=SC2086
    "$PY" -m memt_core.launch "${MODEL_ARGS[@]}" --host 127.0.0.1 --port "$cport" \
        --state-directory "$DIR/node$i" --snapshot-store "$DIR/store" \
        --ownership "$REDIS" --ownership-ttl "$TTL" --node-id "node$i" --torch-threads "$THREADS" ${MEMT_CORE_ARGS:-} >"$DIR/logs/core$i.log" 2>&1 &
    PIDS+=($!)
    wait_for "core $i" $! "$DIR/logs/core$i.log" answers "http://127.0.0.1:$cport/health"
    "$PY" -m memt_proxy "${MODEL_ARGS[@]}" --upstream "http://127.0.0.1:$cport" --host 127.0.0.1 --port "$pport" \
        --state-directory "$DIR/node$i-proxy" --records-directory "$DIR/records" --cluster "${KEY_ARGS[@]}" >"$DIR/logs/proxy$i.log" 2>&1 &
    PIDS+=($!)
    wait_for "proxy $i" $! "$DIR/logs/proxy$i.log" answers "http://127.0.0.1:$pport/health/ready"
    WORKERS+=("http://127.0.0.1:$pport")
done

# the routing (memt_proxy.http.cluster.SMG_ROUTING): keys pinned, header-less requests by prefix, no cache hit
# diverted to a node the router thinks thin (it would move a live conversation off its state)
ROUTING=(--policy cache_aware --routing-key-override --assignment-mode min_group --worker-warmup-divert-every 0)
"$SMG" launch --host 127.0.0.1 --port "$PORT" --prometheus-host 127.0.0.1 --prometheus-port $((PORT+1)) \
    "${ROUTING[@]}" --worker-urls "${WORKERS[@]}" "${KEY_ARGS[@]}" \
    --health-check-endpoint /health/ready --health-check-interval-secs 2 --health-failure-threshold 2 \
    --shutdown-grace-period-secs 5 --log-level warn >"$DIR/logs/smg.log" 2>&1 &
PIDS+=($!)
AUTH=()
[ -n "${MEMT_PROXY_KEY:-}" ] && AUTH=(-H "Authorization: Bearer $MEMT_PROXY_KEY")
# until SMG has registered the workers and lists their model
wait_for "SMG" $! "$DIR/logs/smg.log" lists_models "${AUTH[@]}" "http://127.0.0.1:$PORT/v1/models"
echo "MemT cluster: $N nodes behind SMG at http://127.0.0.1:$PORT/v1 (a named session: X-SMG-Routing-Key: <session>); Ctrl-C stops it"
wait || true
echo "a process of the cluster exited; see $DIR/logs" >&2
exit 1

#!/usr/bin/env bash
# A soak: three `slidegate serve` instances sharing a Redis Cluster (3
# masters, 3 replicas) with quota leases on, under mixed load for MINUTES,
# while each instance is reloaded every few seconds, one master fails over
# (a manual CLUSTER FAILOVER), one master stalls (DEBUG SLEEP 3) and, with
# SOAK_KILL=1, the master holding the hot key is killed (SIGKILL: its replica
# is promoted after the node timeout, then the killed node is started again
# and rejoins as a replica). Loopback only; every process is spawned here and
# stopped on exit (Ctrl-C included).
#
# Load (scripts/soak-driver.py): one API key hammering one rule, 20 keys near
# their limit, keys drawn from 100,000 (each seen rarely), HTTP/2 clients
# (curl, prior knowledge) and WebSocket clients, ~250 requests/s in all, to
# an upstream answering 200 at once and echoing WebSocket frames
# (scripts/soak-upstream.py).
#
# Reported: RSS and open fds of the 3 `serve` and 6 `redis-server`
# processes every 5 s (first, after warm-up, last, max), answers and errors
# by client kind with p50/p99, reloads, and the oracle: per identity and
# window of the checked rules, the admissions across the three instances
# against docs/serve.md's bounds. Exits 1 if the oracle finds more, a
# process died, a reload failed, or RSS or fds grew beyond the tolerance
# (after warm-up: RSS 1.5x + 32 MB, fds + 64; with SOAK_FLAT_MB=M, serve's RSS
# at the end of each fault cycle after the first within M MB of the first's),
# or an instance still decides by its fallback 30 s after every fault.
# Needs: redis-server and redis-cli (7.x), curl with HTTP/2, python3.
# Usage: scripts/soak.sh MINUTES [JSON_OUT]   (SOAK_KEEP=1 keeps the temp dir: logs, samples;
#        SOAK_FAULTS=N runs N fault cycles, one by default; SOAK_KILL=1 adds
#        the kill of the hot key's master to each cycle)
set -euo pipefail
cd "$(dirname "$0")/.."

MINUTES="${1:?usage: soak.sh MINUTES [JSON_OUT]}"
JSON_OUT="${2:-}"
. scripts/lib.sh
needs soak redis-server redis-cli curl python3
curl -V | grep -qw HTTP2 || { echo "soak: curl lacks HTTP/2" >&2; exit 1; }
SECS=$(python3 -c "print(int(float('$MINUTES') * 60))")

cargo build --release -q -p slidegate-cli --bin slidegate
BIN="${CARGO_TARGET_DIR:-target}/release/slidegate"

WORK="$(mktemp -d -t slidegate-soak-XXXXXX)"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ -n "${SOAK_KEEP:-}" ]; then echo "soak: kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Six node ports whose cluster bus ports (+10000) are free too, all below the
# kernel's ephemeral range (32768 on): a killed node's port in that range can
# be handed to an outgoing connection meanwhile — to a client reconnecting
# to it, which then connects to itself (TCP self-connect) and reads its own
# commands back as replies — and the node cannot bind it again.
NODE_BASE=$(python3 -c '
import random, socket
def free(p):
    s = socket.socket()
    try: s.bind(("127.0.0.1", p)); return True
    except OSError: return False
    finally: s.close()
while True:
    b = random.randrange(20000, 22762)
    if all(free(b + i) and free(b + i + 10000) for i in range(6)): print(b); break')
NODES=($(seq "$NODE_BASE" $((NODE_BASE + 5))))

# The cluster: node-timeout above the 3 s stall, so the stall is not a failover.
# Each node's pid is kept in its directory: a killed node is started again.
start_node() {
    local port="$1"
    mkdir -p "$WORK/redis-$port"
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK/redis-$port" \
        --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000 \
        --enable-debug-command local --logfile "$WORK/redis-$port/log" & PIDS+=($!)
    echo $! > "$WORK/redis-$port/pid"
}
for port in "${NODES[@]}"; do start_node "$port"; done
for port in "${NODES[@]}"; do
    for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${NODES[@]}") --cluster-replicas 1 --cluster-yes >"$WORK/cluster-create.log" 2>&1 \
    || { cat "$WORK/cluster-create.log" >&2; exit 1; }
for port in "${NODES[@]}"; do
    for _ in $(seq 200); do redis-cli -p "$port" cluster info | grep -q 'cluster_state:ok' && break; sleep 0.1; done
done
# Replicas must have synced before a manual failover can be asked for.
for port in "${NODES[@]}"; do
    for _ in $(seq 200); do
        redis-cli -p "$port" info replication | grep -Eq 'role:master|master_link_status:up' && break; sleep 0.1
    done
done
# Picked with the nodes and their bus ports bound, so none is picked again.
UPSTREAM=$(free_port)
SERVE_PORTS=($(free_port) $(free_port) $(free_port))
ADMIN_PORTS=($(free_port) $(free_port) $(free_port))

python3 scripts/soak-upstream.py "$UPSTREAM" & PIDS+=($!)
SEEDS=$(printf '"redis://127.0.0.1:%s", ' "${NODES[@]:0:3}")
for i in 0 1 2; do
    cat > "$WORK/serve-$i.toml" <<EOF
[server]
listen = "127.0.0.1:${SERVE_PORTS[$i]}"
upstream = "http://127.0.0.1:$UPSTREAM"
admin_listen = "127.0.0.1:${ADMIN_PORTS[$i]}"
max_upstream_connections_per_client = 512
websocket_idle_timeout = "30s"

[store]
cluster = [${SEEDS%, }]
instances = 3
lease = { max = 64, horizon = "50ms" }

[identity]
api_key_header = "x-api-key"
ip_hash_secret_env = "SLIDEGATE_SOAK_SECRET"

$(python3 scripts/soak-driver.py rules)
EOF
    # A rule that each reload changes (its limit toggles), so every reload swaps rules.
    printf '\n[[rules]]\nname = "reloaded"\npath = "/reloaded"\nlimits = [{ limit = 1, window = "1s" }]\n' >> "$WORK/serve-$i.toml"
done
export SLIDEGATE_SOAK_SECRET=soak SLIDEGATE_LOG=warn
SERVE_PIDS=()
for i in 0 1 2; do
    "$BIN" serve --config "$WORK/serve-$i.toml" 2>"$WORK/serve-$i.log" & PIDS+=($!); SERVE_PIDS+=($!)
    echo $! > "$WORK/serve-$i.pid"
done
for i in 0 1 2; do
    for _ in $(seq 200); do curl -sf -o /dev/null "http://127.0.0.1:${ADMIN_PORTS[$i]}/healthz" && break; sleep 0.05; done
    curl -sf -o /dev/null "http://127.0.0.1:${ADMIN_PORTS[$i]}/healthz" || { cat "$WORK/serve-$i.log" >&2; exit 1; }
done
echo "soak: cluster on 127.0.0.1:${NODES[0]}..${NODES[5]}, serve on ${SERVE_PORTS[*]}, ${SECS}s of load" >&2

# Every 5 s: each process's RSS and fds; each instance's fallback decisions per rule.
sample() {
    local now line kind name pidfile pid rss fds fallback metrics
    now=$(date +%s.%N)
    while read -r kind name pidfile; do
        pid=$(cat "$pidfile")
        if [ -r "/proc/$pid/status" ]; then
            rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$pid/status")
            fds=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)
            fallback='{}'
            if [ "$kind" = serve ]; then
                # 'null' when /metrics cannot be read: the report leaves the sample out.
                fallback=null
                if metrics=$(curl -sf --max-time 2 "http://127.0.0.1:${ADMIN_PORTS[$name]}/metrics"); then
                    fallback=$(awk -F'[{}"= ]+' '/^slidegate_requests_fallback_total\{/ { for (i = 2; i < NF; i++) if ($i == "rule") r = $(i + 1); n[r] += $NF }
                        END { printf "{"; s = ""; for (r in n) { printf "%s\"%s\": %d", s, r, n[r]; s = ", " } printf "}" }' <<< "$metrics")
                fi
            fi
            echo "$now $kind $name $pid $rss $fds $fallback"
        else
            echo "$now $kind $name $pid dead"
        fi
    done <<< "$PROCS"
}
PROCS=$(for i in 0 1 2; do echo "serve $i $WORK/serve-$i.pid"; done; for port in "${NODES[@]}"; do echo "redis $port $WORK/redis-$port/pid"; done)
: > "$WORK/samples"; : > "$WORK/faults"; : > "$WORK/reloads"
python3 scripts/soak-driver.py load --ports "$(IFS=,; echo "${SERVE_PORTS[*]}")" --secs "$SECS" --out "$WORK/load.json" &
DRIVER=$!; PIDS+=($DRIVER)
START=$(date +%s)

( while :; do sample >> "$WORK/samples"; sleep 5; done ) & PIDS+=($!)
# A reload of one instance every 2 s, in turn: each every 6 s.
(
    n=0
    while :; do
        sleep 2
        i=$((n % 3)); n=$((n + 1))
        sed -i "s/limits = \[{ limit = [0-9]*, window = \"1s\" }\]$/limits = [{ limit = $((n % 2 + 1)), window = \"1s\" }]/" "$WORK/serve-$i.toml"
        if curl -s --max-time 10 -X POST "http://127.0.0.1:${ADMIN_PORTS[$i]}/admin/reload" | grep -q '"reloaded":true'; then
            echo "$i ok"
        else
            echo "$i error"
        fi
    done >> "$WORK/reloads"
) & PIDS+=($!)

# A sleep that a signal interrupts (a foreground `sleep` would delay the trap).
pause() { sleep "$1" & local sleeping=$!; wait "$sleeping"; }
role() { redis-cli -p "$1" info replication | awk -F: '/^role/ { print $2 }' | tr -d '\r'; }
# The master holding the hot key (the hot rule's limit is unique: fw:300:5000).
hot_master() {
    local port
    for port in "${NODES[@]}"; do
        [ "$(role "$port")" = master ] || continue
        [ -n "$(redis-cli -p "$port" --scan --pattern 'slidegate:*:fw:300:5000' | head -1)" ] && { echo "$port"; return; }
    done
    echo "soak: the hot key is on no master" >&2; return 1
}

# A replica of the master on $1 whose link is up (empty if none).
synced_replica() {
    local port
    for port in $(redis-cli -p "$1" info replication | awk -F'[=,]' '/^slave[0-9]+:/ { print $4 }'); do
        redis-cli -p "$port" info replication | grep -q 'master_link_status:up' && { echo "$port"; return; }
    done
}

# SOAK_FAULTS cycles (default 1), each a failover at 35% of its share of
# the run and a stall at 65% (with SOAK_KILL=1: at 25%, 50%, and a kill at
# 75%): repeated, they tell memory kept once per kind of fault from memory
# kept per fault. The end of each cycle goes to $WORK/cycles, for the
# report's RSS after each.
CYCLES="${SOAK_FAULTS:-1}"
if [ -n "${SOAK_KILL:-}" ]; then STEPS=(25 50 75); else STEPS=(35 65); fi
at() { local wait_for=$((START + $1 - $(date +%s))); [ "$wait_for" -le 0 ] || pause "$wait_for"; }
: > "$WORK/cycles"
for ((c = 0; c < CYCLES; c++)); do
    at $((SECS * (100 * c + STEPS[0]) / (100 * CYCLES)))
    MASTER=$(hot_master)
    for _ in $(seq 200); do REPLICA=$(synced_replica "$MASTER"); [ -n "$REPLICA" ] && break; sleep 0.1; done
    [ -n "$REPLICA" ] || { echo "soak: master $MASTER has no synced replica to fail over to" >&2; exit 1; }
    t0=$(date +%s.%N)
    redis-cli -p "$REPLICA" cluster failover >/dev/null
    for _ in $(seq 100); do [ "$(role "$REPLICA")" = master ] && break; sleep 0.1; done
    [ "$(role "$REPLICA")" = master ] || { echo "soak: $REPLICA was not promoted" >&2; exit 1; }
    echo "$t0 $(date +%s.%N) failover: $REPLICA (replica of $MASTER, holding the hot key) promoted" >> "$WORK/faults"

    at $((SECS * (100 * c + STEPS[1]) / (100 * CYCLES)))
    MASTER=$(hot_master)
    t0=$(date +%s.%N)
    redis-cli -p "$MASTER" debug sleep 3 >/dev/null
    echo "$t0 $(date +%s.%N) stall: master $MASTER (holding the hot key) DEBUG SLEEP 3" >> "$WORK/faults"

    if [ -n "${SOAK_KILL:-}" ]; then
        # The master dies with what it acknowledged but had not yet
        # replicated; its replica is promoted after the node timeout. The
        # node is then started again: empty (nothing is saved), it rejoins
        # as the new master's replica. The fault lasts until it has synced.
        at $((SECS * (100 * c + STEPS[2]) / (100 * CYCLES)))
        MASTER=$(hot_master)
        REPLICA=$(synced_replica "$MASTER")
        t0=$(date +%s.%N)
        victim=$(cat "$WORK/redis-$MASTER/pid")
        # Reaped here, so that the shell does not report the kill as a failure.
        { kill -9 "$victim"; wait "$victim"; } 2>/dev/null || true
        for _ in $(seq 300); do [ "$(role "$REPLICA")" = master ] && break; sleep 0.1; done
        [ "$(role "$REPLICA")" = master ] || { echo "soak: $REPLICA was not promoted after $MASTER was killed" >&2; exit 1; }
        start_node "$MASTER"
        for _ in $(seq 300); do
            redis-cli -p "$MASTER" info replication 2>/dev/null | grep -q 'master_link_status:up' && break; sleep 0.1
        done
        echo "$t0 $(date +%s.%N) kill: master $MASTER (holding the hot key) SIGKILL, $REPLICA promoted, $MASTER back as its replica" >> "$WORK/faults"
    fi
    date +%s.%N >> "$WORK/cycles"
done

wait "$DRIVER"
sample >> "$WORK/samples"
python3 scripts/soak-driver.py report --load "$WORK/load.json" --samples "$WORK/samples" \
    --faults "$WORK/faults" --reloads "$WORK/reloads" --cycles "$WORK/cycles" ${SOAK_FLAT_MB:+--flat-mb "$SOAK_FLAT_MB"} \
    ${JSON_OUT:+--json "$JSON_OUT"} || {
    status=$?
    for i in 0 1 2; do echo "--- serve $i log (last 20 lines)"; tail -20 "$WORK/serve-$i.log"; done >&2
    exit "$status"
}

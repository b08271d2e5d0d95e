#!/usr/bin/env bash
# slidegate serve vs nginx limit_req, side by side in one run, loopback only.
#
# One upstream (a separate nginx answering "ok"), four ways to reach it:
#   direct         wrk -> upstream
#   nginx          wrk -> nginx limit_req (one zone keyed by client address) -> upstream
#   slidegate      wrk -> slidegate serve, embedded store -> upstream
#   slidegate+redis wrk -> slidegate serve, Redis store (own redis-server) -> upstream
#   proxy-only     wrk -> slidegate serve with no rule matching: the cost of the proxy alone
# Each limiter admits everything (the limit is far above what is sent), so
# what is measured is the cost of deciding and proxying. Two passes:
#   throughput: wrk -t2 -c32, requests/s (saturating the machine)
#   latency:    wrk -t1 -c1, one request at a time: p50/p99 per request, and the
#               proxy overhead = p99 through a proxy - p99 direct.
# Needs: nginx, wrk, redis-server (apt-get install nginx wrk redis-server).
# Usage: scripts/bench-http.sh [seconds per run, default 10]
set -euo pipefail
cd "$(dirname "$0")/.."

SECS="${1:-10}"
for tool in nginx wrk redis-server; do
    command -v "$tool" >/dev/null || { echo "bench-http: $tool is not installed" >&2; exit 1; }
done

cargo build --release -q -p slidegate-cli
BIN="${CARGO_TARGET_DIR:-target}/release/slidegate"

WORK="$(mktemp -d -t slidegate-bench-XXXXXX)"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# Other work on the machine skews tail latencies: as root, every process of
# the benchmark (servers and load generator alike) runs at the highest priority.
NICE=()
[ "$(id -u)" = 0 ] && NICE=(nice -n -19)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UPSTREAM=$(free_port); NGINX=$(free_port); SG=$(free_port); SGR=$(free_port); SGP=$(free_port); REDIS=$(free_port)

nginx_conf() { # name, workers, server block
    mkdir -p "$WORK/$1"
    cat > "$WORK/$1/nginx.conf" <<EOF
daemon off;
worker_processes $2;
pid $WORK/$1/nginx.pid;
error_log $WORK/$1/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $WORK/$1;
    proxy_temp_path $WORK/$1;
    fastcgi_temp_path $WORK/$1;
    uwsgi_temp_path $WORK/$1;
    scgi_temp_path $WORK/$1;
    $3
}
EOF
}

nginx_conf upstream 1 "server { listen 127.0.0.1:$UPSTREAM; keepalive_requests 1000000; location / { return 200 \"ok\n\"; } }"
nginx_conf limiter auto "
    limit_req_zone \$binary_remote_addr zone=api:10m rate=1000000r/s;
    upstream backend { server 127.0.0.1:$UPSTREAM; keepalive 64; }
    server {
        listen 127.0.0.1:$NGINX;
        keepalive_requests 1000000;
        location / {
            limit_req zone=api burst=1000000 nodelay;
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
        }
    }"

sg_conf() { # port, store section, path pattern
    cat <<EOF
[server]
listen = "127.0.0.1:$1"
upstream = "http://127.0.0.1:$UPSTREAM"

$2

[identity]
ip_hash_secret_env = "SLIDEGATE_BENCH_SECRET"

[[rules]]
name = "all"
path = "${3:-/*}"
limits = [{ limit = 1000000000, window = "1s" }]
EOF
}
sg_conf "$SG" "" > "$WORK/sg.toml"
sg_conf "$SGR" "[store]
url = \"redis://127.0.0.1:$REDIS/\"" > "$WORK/sgr.toml"
sg_conf "$SGP" "" "/never-requested" > "$WORK/sgp.toml"

"${NICE[@]}" nginx -c "$WORK/upstream/nginx.conf" & PIDS+=($!); UPSTREAM_PID=$!
"${NICE[@]}" nginx -c "$WORK/limiter/nginx.conf" & PIDS+=($!); NGINX_PID=$!
"${NICE[@]}" redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no --logfile "$WORK/redis.log" & PIDS+=($!); REDIS_PID=$!
sleep 0.5
export SLIDEGATE_BENCH_SECRET=bench SLIDEGATE_LOG=warn
"${NICE[@]}" "$BIN" serve --config "$WORK/sg.toml" 2>"$WORK/sg.log" & PIDS+=($!); SG_PID=$!
"${NICE[@]}" "$BIN" serve --config "$WORK/sgr.toml" 2>"$WORK/sgr.log" & PIDS+=($!); SGR_PID=$!
"${NICE[@]}" "$BIN" serve --config "$WORK/sgp.toml" 2>"$WORK/sgp.log" & PIDS+=($!); SGP_PID=$!

for port in $UPSTREAM $NGINX $SG $SGR $SGP; do
    for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.05; done
done
# Every path admits: a limiter that rejected would skew the figures.
curl -sf -D - -o /dev/null "http://127.0.0.1:$SGR/" | grep -qi '^ratelimit:' || { echo "slidegate+redis is not limiting" >&2; exit 1; }

declare -A RPS P50 P99 ERRORS CPU
# CPU time (user + system, clock ticks) of processes and their children.
ticks() {
    local total=0 pid
    for pid in "$@" $(for p in "$@"; do pgrep -P "$p"; done); do
        total=$((total + $(awk '{ print $14 + $15 }' "/proc/$pid/stat")))
    done
    echo "$total"
}
warm_up() { # port, threads, connections
    "${NICE[@]}" wrk -t"$2" -c"$3" -d2s "http://127.0.0.1:$1/" >/dev/null
}
run() { # label, port, threads, connections -> the file holding wrk's report
    local out="$WORK/wrk-$1-$4.txt"
    "${NICE[@]}" wrk -t"$3" -c"$4" -d"${SECS}s" --latency "http://127.0.0.1:$2/" > "$out"
    echo "$out"
}
to_us() { # wrk latency like 85.00us, 1.20ms, 2.00s -> microseconds
    awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else if (v ~ /s$/) print n * 1000000; else print n }'
}
LABELS=(direct nginx slidegate slidegate+redis proxy-only)
PORTS=($UPSTREAM $NGINX $SG $SGR $SGP)
OWNERS=("$UPSTREAM_PID" "$NGINX_PID" "$SG_PID" "$SGR_PID" "$SGP_PID")
HZ=$(getconf CLK_TCK)
for i in "${!LABELS[@]}"; do
    warm_up "${PORTS[$i]}" 2 32
    before=$(ticks ${OWNERS[$i]})
    out=$(run "${LABELS[$i]}" "${PORTS[$i]}" 2 32)
    after=$(ticks ${OWNERS[$i]})
    requests=$(awk '/requests in/ { print $1 }' "$out")
    CPU[${LABELS[$i]}]=$(awk -v t=$((after - before)) -v hz="$HZ" -v r="$requests" 'BEGIN { printf "%.1f", t / hz * 1e6 / r }')
    RPS[${LABELS[$i]}]=$(awk '/^Requests\/sec:/ { printf "%.0f", $2 }' "$out")
    ERRORS[${LABELS[$i]}]=$(awk '/Non-2xx/ { print $NF } END { }' "$out")
    warm_up "${PORTS[$i]}" 1 1
    out=$(run "${LABELS[$i]}" "${PORTS[$i]}" 1 1)
    P50[${LABELS[$i]}]=$(to_us "$(awk '$1 == "50%" { print $2 }' "$out")")
    P99[${LABELS[$i]}]=$(to_us "$(awk '$1 == "99%" { print $2 }' "$out")")
done

echo "| path | req/s, 32 connections | CPU µs per request (that server) | p50 µs, 1 connection | p99 µs, 1 connection | p99 overhead vs direct µs | non-2xx |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for label in "${LABELS[@]}"; do
    overhead=$(awk -v a="${P99[$label]}" -v b="${P99[direct]}" 'BEGIN { printf "%.0f", a - b }')
    [ "$label" = direct ] && overhead="–"
    echo "| $label | ${RPS[$label]} | ${CPU[$label]} | ${P50[$label]} | ${P99[$label]} | $overhead | ${ERRORS[$label]:-0} |"
done
echo
echo "nginx $(nginx -v 2>&1 | sed 's/.*nginx\///'), $(redis-server --version | awk '{print $3}'), wrk $(wrk -v 2>&1 | head -1 | awk '{print $2}'), $(nproc) cores, ${SECS} s per run"

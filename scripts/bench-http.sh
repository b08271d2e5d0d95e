#!/usr/bin/env bash
# slidegate serve vs nginx limit_req, side by side in one run, loopback only.
#
# One upstream (a separate nginx answering "ok"), four ways to reach it:
#   direct         wrk -> upstream
#   nginx          wrk -> nginx limit_req (one zone keyed by client address) -> upstream
#   slidegate      wrk -> slidegate serve, embedded store -> upstream
#   slidegate+redis wrk -> slidegate serve, Redis store (own redis-server) -> upstream
#   proxy-only     wrk -> slidegate serve with no rule matching: the cost of the proxy alone
#   hyper          wrk -> a minimal hyper server answering by itself (no upstream):
#                  what the machine, tokio and hyper cost, beside "direct" (nginx)
# Each limiter admits everything (the limit is far above what is sent), so
# what is measured is the cost of deciding and proxying. Two passes:
#   throughput: wrk -t2 -c32, requests/s (saturating the machine), and the CPU
#               time the server under test spent per request
#   latency:    wrk -t1 -c1, one request at a time: p50/p99 per request, and the
#               proxy overhead = p99 through a proxy - p99 direct.
# Then the decision service, POST /v1/check on slidegate's admin listener
# (embedded store), under wrk -t1 -c64 with scripts/check-100k.lua spreading
# the requests over 100,000 identities; beside it, the minimal hyper server
# answering the same requests with a fixed JSON body. Both also with one
# server thread (threads = 1; minimal_hyper ADDR 1): wrk takes a core of the
# two, and a second server thread then competes with it for the other.
# When throttlecrab-server is on PATH (cargo install throttlecrab-server;
# its build needs protoc: apt-get install protobuf-compiler), the same load
# with a limit of 100 per 60 s goes to its POST /throttle (in-memory store)
# and to /v1/check with a rule of 100 per 60 s: the decision service
# against a peer made for the job.
# Paths are measured in interleaved rounds; medians and ranges are reported.
# Needs: nginx, wrk, redis-server (apt-get install nginx wrk redis-server).
# Usage: scripts/bench-http.sh [seconds per run, default 3] [rounds, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."

SECS="${1:-3}"
ROUNDS="${2:-5}"
. scripts/lib.sh
needs bench-http nginx wrk redis-server

cargo build --release -q -p slidegate-cli --bin slidegate --example minimal_hyper
BIN="${CARGO_TARGET_DIR:-target}/release/slidegate"
HYPER="${CARGO_TARGET_DIR:-target}/release/examples/minimal_hyper"

scratch slidegate-bench
# Every process of the benchmark at the highest priority (scripts/lib.sh says why).
top_priority

# Ports: free ones the kernel picks, or consecutive ones from
# SLIDEGATE_BENCH_PORTS (e.g. 17450) on a machine where ports are assigned.
ports UPSTREAM NGINX SG SGR SGP REDIS HYP SGC SGCA SGCH HYP1 SGC1 SGCA1 TC

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
# The decision service: /v1/check on the admin listener, one rule whose
# window outlasts the run, so the store holds all 100,000 identities.
# With an auth port, the forward-auth hook too (nginx's requests sent to it
# directly: one decision per request, as /v1/check's).
check_conf() { # port, admin port, threads, auth port
    local auth=""
    if [ -n "${4:-}" ]; then auth="auth_listen = \"127.0.0.1:$4\""; fi
    cat <<EOF
[server]
listen = "127.0.0.1:$1"
upstream = "http://127.0.0.1:$UPSTREAM"
admin_listen = "127.0.0.1:$2"
${3:+threads = $3}
$auth

[identity]
api_key_header = "x-api-key"
trusted_proxies = ["127.0.0.1/32"]

[[rules]]
name = "check"
path = "/*"
limits = [{ limit = 1000000000, window = "1h" }]

# throttlecrab-server's load: 100 per 60 s an identity.
[[rules]]
name = "per-minute"
path = "/never-requested"
limits = [{ limit = 100, window = "60s" }]
EOF
}
check_conf "$SGC" "$SGCA" "" "$SGCH" > "$WORK/sgc.toml"
check_conf "$SGC1" "$SGCA1" 1 > "$WORK/sgc1.toml"

"${NICE[@]}" nginx -c "$WORK/upstream/nginx.conf" & PIDS+=($!); UPSTREAM_PID=$!
"${NICE[@]}" nginx -c "$WORK/limiter/nginx.conf" & PIDS+=($!); NGINX_PID=$!
"${NICE[@]}" redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no --logfile "$WORK/redis.log" & PIDS+=($!); REDIS_PID=$!
sleep 0.5
export SLIDEGATE_BENCH_SECRET=bench SLIDEGATE_LOG=warn
"${NICE[@]}" "$BIN" serve --config "$WORK/sg.toml" 2>"$WORK/sg.log" & PIDS+=($!); SG_PID=$!
"${NICE[@]}" "$BIN" serve --config "$WORK/sgr.toml" 2>"$WORK/sgr.log" & PIDS+=($!); SGR_PID=$!
"${NICE[@]}" "$BIN" serve --config "$WORK/sgp.toml" 2>"$WORK/sgp.log" & PIDS+=($!); SGP_PID=$!
"${NICE[@]}" "$BIN" serve --config "$WORK/sgc.toml" 2>"$WORK/sgc.log" & PIDS+=($!); SGC_PID=$!
"${NICE[@]}" "$BIN" serve --config "$WORK/sgc1.toml" 2>"$WORK/sgc1.log" & PIDS+=($!); SGC1_PID=$!
"${NICE[@]}" "$HYPER" "127.0.0.1:$HYP" & PIDS+=($!); HYPER_PID=$!
"${NICE[@]}" "$HYPER" "127.0.0.1:$HYP1" 1 & PIDS+=($!); HYPER1_PID=$!

for port in $UPSTREAM $NGINX $SG $SGR $SGP $HYP $SGCA $HYP1 $SGCA1; do
    for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.05; done
done
# Every path admits: a limiter that rejected would skew the figures.
curl -sf -D - -o /dev/null "http://127.0.0.1:$SGR/" | grep -qi '^ratelimit:' || { echo "slidegate+redis is not limiting" >&2; exit 1; }
curl -sf -d '{"rule":"check","key":"probe"}' "http://127.0.0.1:$SGCA/v1/check" | grep -q '"allowed":true' || { echo "/v1/check does not answer" >&2; exit 1; }
curl -sf -o /dev/null -H 'X-Original-Method: GET' -H 'X-Original-URI: /' -H 'X-Api-Key: probe' "http://127.0.0.1:$SGCH/nginx" || { echo "the forward-auth hook does not admit" >&2; exit 1; }

# CPU time (user + system, clock ticks) of processes and their children.
ticks() {
    local total=0 pid
    for pid in "$@" $(for p in "$@"; do pgrep -P "$p"; done); do
        # A child that ended since pgrep saw it counts for nothing.
        total=$((total + $(awk '{ print $14 + $15 }' "/proc/$pid/stat" 2>/dev/null || echo 0)))
    done
    echo "$total"
}
run() { # port, threads, connections -> the file holding wrk's report
    local out="$WORK/wrk-$1-$3.txt"
    "${NICE[@]}" wrk -t"$2" -c"$3" -d"${SECS}s" --latency "http://127.0.0.1:$1/" > "$out"
    echo "$out"
}
to_us() { # wrk latency like 85.00us, 1.20ms, 2.00s -> microseconds
    awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else if (v ~ /s$/) print n * 1000000; else print n }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
range() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s–%s", lo, hi }'; }

LABELS=(direct hyper nginx slidegate slidegate+redis proxy-only)
PORTS=($UPSTREAM $HYP $NGINX $SG $SGR $SGP)
OWNERS=("$UPSTREAM_PID" "$HYPER_PID" "$NGINX_PID" "$SG_PID" "$SGR_PID" "$SGP_PID")
CHECK_LABELS=(check hyper-check check-1-thread hyper-check-1-thread auth-hook)
CHECK_URLS=("http://127.0.0.1:$SGCA/v1/check" "http://127.0.0.1:$HYP/v1/check"
    "http://127.0.0.1:$SGCA1/v1/check" "http://127.0.0.1:$HYP1/v1/check" "http://127.0.0.1:$SGCH/nginx")
CHECK_OWNERS=("$SGC_PID" "$HYPER_PID" "$SGC1_PID" "$HYPER1_PID" "$SGC_PID")
CHECK_SHAPES=(slidegate slidegate slidegate slidegate nginx-hook)
CHECK_RULES=(check check check check check)
if command -v throttlecrab-server >/dev/null; then
    "${NICE[@]}" throttlecrab-server --http --http-host 127.0.0.1 --http-port "$TC" --log-level warn \
        >"$WORK/tc.log" 2>&1 & PIDS+=($!); TC_PID=$!
    for _ in $(seq 100); do
        curl -sf -d '{"key":"probe","max_burst":100,"count_per_period":100,"period":60}' \
            "http://127.0.0.1:$TC/throttle" | grep -q '"allowed":true' && break
        sleep 0.05
    done
    # With one server thread too: threads = cores − 1, as a machine the
    # load generator shares wants (BENCHMARKS.md, the p99 at 64 connections).
    CHECK_LABELS+=(check-100-per-60s check-100-per-60s-1-thread throttlecrab)
    CHECK_URLS+=("http://127.0.0.1:$SGCA/v1/check" "http://127.0.0.1:$SGCA1/v1/check" "http://127.0.0.1:$TC/throttle")
    CHECK_OWNERS+=("$SGC_PID" "$SGC1_PID" "$TC_PID")
    CHECK_SHAPES+=(slidegate slidegate throttlecrab)
    CHECK_RULES+=(per-minute per-minute check)
else
    echo "bench-http: throttlecrab-server is not on PATH: no peer for /v1/check (cargo install throttlecrab-server)" >&2
fi
HZ=$(getconf CLK_TCK)
RES="$WORK/results"   # one line per round and path: label rps cpu_us p50_us p99_us non2xx
for i in "${!LABELS[@]}"; do
    "${NICE[@]}" wrk -t2 -c32 -d2s "http://127.0.0.1:${PORTS[$i]}/" >/dev/null   # warm up
done
# A lap over the 100,000 identities fills the store before any round.
for i in "${!CHECK_URLS[@]}"; do
    CHECK_SHAPE=${CHECK_SHAPES[$i]} CHECK_RULE=${CHECK_RULES[$i]} \
        "${NICE[@]}" wrk -t1 -c64 -d3s -s scripts/check-100k.lua "${CHECK_URLS[$i]}" >/dev/null
done
check() { # index into CHECK_* -> the file holding wrk's report
    local out="$WORK/wrk-check.txt"
    CHECK_SHAPE=${CHECK_SHAPES[$1]} CHECK_RULE=${CHECK_RULES[$1]} \
        "${NICE[@]}" wrk -t1 -c64 -d"${SECS}s" --latency -s scripts/check-100k.lua "${CHECK_URLS[$1]}" > "$out"
    echo "$out"
}
# The machine may be shared: paths are measured round by round, interleaved,
# so each round compares them under the same conditions; medians are reported.
for round in $(seq "$ROUNDS"); do
    for i in "${!LABELS[@]}"; do
        before=$(ticks ${OWNERS[$i]})
        out=$(run "${PORTS[$i]}" 2 32)
        after=$(ticks ${OWNERS[$i]})
        requests=$(awk '/requests in/ { print $1 }' "$out")
        cpu=$(awk -v t=$((after - before)) -v hz="$HZ" -v r="$requests" 'BEGIN { printf "%.1f", t / hz * 1e6 / r }')
        rps=$(awk '/^Requests\/sec:/ { printf "%.0f", $2 }' "$out")
        errors=$(awk '/Non-2xx/ { n = $NF } END { print n + 0 }' "$out")
        out=$(run "${PORTS[$i]}" 1 1)
        p50=$(to_us "$(awk '$1 == "50%" { print $2 }' "$out")")
        p99=$(to_us "$(awk '$1 == "99%" { print $2 }' "$out")")
        echo "${LABELS[$i]} $rps $cpu $p50 $p99 $errors" >> "$RES"
    done
    for i in "${!CHECK_LABELS[@]}"; do
        before=$(ticks ${CHECK_OWNERS[$i]})
        out=$(check "$i")
        after=$(ticks ${CHECK_OWNERS[$i]})
        requests=$(awk '/requests in/ { print $1 }' "$out")
        cpu=$(awk -v t=$((after - before)) -v hz="$HZ" -v r="$requests" 'BEGIN { printf "%.1f", t / hz * 1e6 / r }')
        rps=$(awk '/^Requests\/sec:/ { printf "%.0f", $2 }' "$out")
        errors=$(awk '/Non-2xx/ { n = $NF } END { print n + 0 }' "$out")
        p50=$(to_us "$(awk '$1 == "50%" { print $2 }' "$out")")
        p99=$(to_us "$(awk '$1 == "99%" { print $2 }' "$out")")
        echo "${CHECK_LABELS[$i]} $rps $cpu $p50 $p99 $errors" >> "$RES"
    done
done

col() { awk -v l="$1" -v c="$2" '$1 == l { print $c }' "$RES"; }
ratio() { # per-round ratio of column c: label a / label b
    paste <(col "$1" "$3") <(col "$2" "$3") | awk '{ printf "%.2f\n", $1 / $2 }'
}
echo "| path | req/s, 32 connections | CPU µs per request (that server) | p50 µs, 1 connection | p99 µs, 1 connection | non-2xx |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
for label in "${LABELS[@]}"; do
    printf '| %s | %s (%s) | %s (%s) | %s (%s) | %s (%s) | %s |\n' "$label" \
        "$(col "$label" 2 | median)" "$(col "$label" 2 | range)" \
        "$(col "$label" 3 | median)" "$(col "$label" 3 | range)" \
        "$(col "$label" 4 | median)" "$(col "$label" 4 | range)" \
        "$(col "$label" 5 | median)" "$(col "$label" 5 | range)" \
        "$(col "$label" 6 | awk '{ s += $1 } END { print s + 0 }')"
done
echo
echo "| POST /v1/check, 64 connections, 100,000 identities | req/s | CPU µs per request (that server) | p50 µs | p99 µs | non-2xx |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
for label in "${CHECK_LABELS[@]}"; do
    printf '| %s | %s (%s) | %s (%s) | %s (%s) | %s (%s) | %s |\n' "$label" \
        "$(col "$label" 2 | median)" "$(col "$label" 2 | range)" \
        "$(col "$label" 3 | median)" "$(col "$label" 3 | range)" \
        "$(col "$label" 4 | median)" "$(col "$label" 4 | range)" \
        "$(col "$label" 5 | median)" "$(col "$label" 5 | range)" \
        "$(col "$label" 6 | awk '{ s += $1 } END { print s + 0 }')"
done
echo
echo "medians (ranges) over $ROUNDS interleaved rounds of ${SECS} s per path and mode"
echo "slidegate / nginx throughput, per round: median $(ratio slidegate nginx 2 | median) (range $(ratio slidegate nginx 2 | range))"
echo "slidegate p99 - direct p99, per round: median $(paste <(col slidegate 5) <(col direct 5) | awk '{ print $1 - $2 }' | median) µs (range $(paste <(col slidegate 5) <(col direct 5) | awk '{ print $1 - $2 }' | range))"
echo "nginx p99 - direct p99, per round: median $(paste <(col nginx 5) <(col direct 5) | awk '{ print $1 - $2 }' | median) µs (range $(paste <(col nginx 5) <(col direct 5) | awk '{ print $1 - $2 }' | range))"
for t in "" -1-thread; do
    echo "/v1/check$t p99 / minimal hyper's, per round: median $(ratio check$t hyper-check$t 5 | median) (range $(ratio check$t hyper-check$t 5 | range)); throughput $(ratio check$t hyper-check$t 2 | median)× (range $(ratio check$t hyper-check$t 2 | range))"
done
echo "forward-auth hook (nginx's requests) / /v1/check, CPU per decision, per round: median $(ratio auth-hook check 3 | median) (range $(ratio auth-hook check 3 | range)); throughput $(ratio auth-hook check 2 | median)×"
if [ -n "$(col throttlecrab 2)" ]; then
    for t in "" -1-thread; do
        echo "/v1/check$t (100 per 60 s) / throttlecrab-server, per round: throughput $(ratio check-100-per-60s$t throttlecrab 2 | median)× (range $(ratio check-100-per-60s$t throttlecrab 2 | range)), p99 $(ratio check-100-per-60s$t throttlecrab 5 | median)× (range $(ratio check-100-per-60s$t throttlecrab 5 | range)), CPU per request $(ratio check-100-per-60s$t throttlecrab 3 | median)× (range $(ratio check-100-per-60s$t throttlecrab 3 | range))"
    done
fi
echo "nginx $(nginx -v 2>&1 | sed 's/.*nginx\///'), redis $(redis-server --version | awk '{print $3}' | sed 's/v=//'), wrk $(wrk -v 2>&1 | head -1 | awk '{print $2}'), $(nproc) cores"

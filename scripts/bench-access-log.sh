#!/usr/bin/env bash
# What the access log costs a proxied request: one `slidegate serve` binary
# run three ways side by side, loopback only: without [access_log], with it
# sampling 1% of allowed requests, and logging every request (to a file in
# a temporary directory). Each serves one rule admitting everything (so
# every request is an allowed one, the sampled case) in front of one nginx
# upstream answering "ok", with one worker thread; wrk -t1 -c16 measures
# each in turn, round after round. Reported: requests/s and the CPU time the
# server spent per request (all its threads: the log writer's too), medians
# and ranges, and each against "off".
# Needs: nginx, wrk (apt-get install nginx wrk).
# Usage: scripts/bench-access-log.sh [seconds per run, default 3] [rounds, default 3]
set -euo pipefail
cd "$(dirname "$0")/.."

SECS="${1:-3}"
ROUNDS="${2:-3}"
. scripts/lib.sh
needs bench-access-log nginx wrk
cargo build --release -q -p slidegate-cli --bin slidegate
BIN="${CARGO_TARGET_DIR:-target}/release/slidegate"

scratch slidegate-access-log
ports UPSTREAM
nginx_conf upstream 1 "server { listen 127.0.0.1:$UPSTREAM; keepalive_requests 1000000; location / { return 200 \"ok\n\"; } }"
sg_conf() { # port, [access_log] table or ""
    cat <<EOF
[server]
listen = "127.0.0.1:$1"
upstream = "http://127.0.0.1:$UPSTREAM"
threads = 1
admin_on_public = true
admin_prefix = "/_slidegate"

[identity]
ip_hash_secret_env = "SLIDEGATE_BENCH_SECRET"

$2

[[rules]]
name = "all"
path = "/*"
limits = [{ limit = 1000000000, window = "1s" }]
EOF
}
nginx -c "$WORK/upstream/nginx.conf" & PIDS+=($!)
export SLIDEGATE_BENCH_SECRET=bench SLIDEGATE_LOG=warn
declare -A PID PORT
for label in off sample-0.01 sample-1; do
    case $label in
        off) table="" ;;
        sample-0.01) table=$(printf '[access_log]\npath = "%s/s001.jsonl"\nsample_allowed = 0.01' "$WORK") ;;
        sample-1) table=$(printf '[access_log]\npath = "%s/s1.jsonl"\nsample_allowed = 1' "$WORK") ;;
    esac
    ports "PORT[$label]"
    sg_conf "${PORT[$label]}" "$table" > "$WORK/$label.toml"
    "$BIN" serve --config "$WORK/$label.toml" 2>"$WORK/$label.log" & PIDS+=($!); PID[$label]=$!
done
for port in $UPSTREAM "${PORT[@]}"; do
    for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.05; done
    curl -sf -o /dev/null "http://127.0.0.1:$port/" || { echo "nothing answers on $port" >&2; tail -n 5 "$WORK"/*.log >&2; exit 1; }
done

ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }   # user + system, clock ticks
HZ=$(getconf CLK_TCK)
measure() { # label -> "label rps cpu_us"
    local before after out="$WORK/wrk.txt"
    before=$(ticks "${PID[$1]}")
    wrk -t1 -c16 -d"${SECS}s" "http://127.0.0.1:${PORT[$1]}/api/x?token=secret" > "$out"
    after=$(ticks "${PID[$1]}")
    awk -v l="$1" -v t=$((after - before)) -v hz="$HZ" '
        /requests in/ { n = $1 } /^Requests\/sec:/ { rps = $2 } /Non-2xx/ { bad = $NF }
        END { if (bad) { print "non-2xx answers" > "/dev/stderr"; exit 1 }
              printf "%s %.0f %.2f\n", l, rps, t / hz * 1e6 / n }' "$out"
}
for label in off sample-0.01 sample-1; do
    wrk -t1 -c16 -d1s "http://127.0.0.1:${PORT[$label]}/" >/dev/null   # warm up
done
RES="$WORK/results"
ORDERS=("off sample-0.01 sample-1" "sample-1 off sample-0.01" "sample-0.01 sample-1 off")
for round in $(seq "$ROUNDS"); do
    # Rotate the order, so none always runs on a warmer machine.
    for label in ${ORDERS[$(((round - 1) % 3))]}; do measure "$label" >> "$RES"; done
done

col() { awk -v l="$1" -v c="$2" '$1 == l { print $c }' "$RES"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
range() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s–%s", lo, hi }'; }
echo "$ROUNDS rounds of ${SECS}s, wrk -t1 -c16, serve threads = 1, rotated order"
echo
echo "| access log | req/s | CPU µs per request | req/s vs off | CPU vs off |"
echo "| --- | ---: | ---: | ---: | ---: |"
OFF_RPS=$(col off 2 | median); OFF_CPU=$(col off 3 | median)
for l in off sample-0.01 sample-1; do
    rps=$(col $l 2 | median); cpu=$(col $l 3 | median)
    printf '| %s | %s (%s) | %s (%s) | %.3f | %.3f |\n' "$l" "$rps" "$(col $l 2 | range)" "$cpu" "$(col $l 3 | range)" \
        "$(echo "$rps / $OFF_RPS" | bc -l)" "$(echo "$cpu / $OFF_CPU" | bc -l)"
done
echo
echo "lines written: sample-0.01 $(wc -l < "$WORK/s001.jsonl"), sample-1 $(wc -l < "$WORK/s1.jsonl"); dropped (sample-1): $(curl -s "http://127.0.0.1:${PORT[sample-1]}/_slidegate/metrics" | awk '/^slidegate_access_log_dropped_total/ { print $2 }')"

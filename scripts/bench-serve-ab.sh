#!/usr/bin/env bash
# Two `slidegate` binaries' `serve`, side by side in one run, loopback only:
# what a change to the binary costs or saves a proxied request. Each serves
# the same configuration (embedded store, one rule admitting everything) in
# front of one nginx upstream answering "ok"; wrk -t2 -c32 measures each in
# turn, round after round, so every round compares them under the same
# conditions. Reported: requests/s and the CPU time the server spent per
# request, medians and ranges, and the per-round ratio B/A.
# Needs: nginx, wrk (apt-get install nginx wrk).
# Usage: scripts/bench-serve-ab.sh BINARY_A BINARY_B [seconds per run, default 5] [rounds, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."

A="${1:?usage: bench-serve-ab.sh BINARY_A BINARY_B [secs] [rounds]}"
B="${2:?usage: bench-serve-ab.sh BINARY_A BINARY_B [secs] [rounds]}"
SECS="${3:-5}"
ROUNDS="${4:-5}"
. scripts/lib.sh
needs bench-serve-ab nginx wrk
scratch slidegate-ab
ports UPSTREAM PORT_A PORT_B
nginx_conf upstream 1 "server { listen 127.0.0.1:$UPSTREAM; keepalive_requests 1000000; location / { return 200 \"ok\n\"; } }"
sg_conf() { # port
    cat <<EOF
[server]
listen = "127.0.0.1:$1"
upstream = "http://127.0.0.1:$UPSTREAM"

[identity]
ip_hash_secret_env = "SLIDEGATE_BENCH_SECRET"

[[rules]]
name = "all"
path = "/*"
limits = [{ limit = 1000000000, window = "1s" }]
EOF
}
sg_conf "$PORT_A" > "$WORK/a.toml"
sg_conf "$PORT_B" > "$WORK/b.toml"

nginx -c "$WORK/upstream/nginx.conf" & PIDS+=($!)
export SLIDEGATE_BENCH_SECRET=bench SLIDEGATE_LOG=warn
"$A" serve --config "$WORK/a.toml" 2>"$WORK/a.log" & PIDS+=($!); PID_A=$!
"$B" serve --config "$WORK/b.toml" 2>"$WORK/b.log" & PIDS+=($!); PID_B=$!
for port in $UPSTREAM $PORT_A $PORT_B; do
    for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.05; done
    curl -sf -o /dev/null "http://127.0.0.1:$port/" || { echo "nothing answers on $port" >&2; exit 1; }
done

ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }   # user + system, clock ticks
HZ=$(getconf CLK_TCK)
measure() { # label pid port -> "label rps cpu_us"
    local before after out="$WORK/wrk.txt"
    before=$(ticks "$2")
    wrk -t2 -c32 -d"${SECS}s" "http://127.0.0.1:$3/" > "$out"
    after=$(ticks "$2")
    awk -v l="$1" -v t=$((after - before)) -v hz="$HZ" '
        /requests in/ { n = $1 } /^Requests\/sec:/ { rps = $2 } /Non-2xx/ { bad = $NF }
        END { if (bad) { print "non-2xx answers" > "/dev/stderr"; exit 1 }
              printf "%s %.0f %.2f\n", l, rps, t / hz * 1e6 / n }' "$out"
}
wrk -t2 -c32 -d2s "http://127.0.0.1:$PORT_A/" >/dev/null   # warm up
wrk -t2 -c32 -d2s "http://127.0.0.1:$PORT_B/" >/dev/null
RES="$WORK/results"
for round in $(seq "$ROUNDS"); do
    # Alternate which goes first, so neither always runs on a warmer machine.
    if [ $((round % 2)) = 1 ]; then
        measure A "$PID_A" "$PORT_A" >> "$RES"; measure B "$PID_B" "$PORT_B" >> "$RES"
    else
        measure B "$PID_B" "$PORT_B" >> "$RES"; measure A "$PID_A" "$PORT_A" >> "$RES"
    fi
done

col() { awk -v l="$1" -v c="$2" '$1 == l { print $c }' "$RES"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
range() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s–%s", lo, hi }'; }
ratio() { paste <(col B "$1") <(col A "$1") | awk '{ printf "%.3f\n", $1 / $2 }'; }
echo "A = $A"
echo "B = $B"
echo "$ROUNDS rounds of ${SECS}s, wrk -t2 -c32, interleaved"
echo
echo "| | req/s | CPU µs per request |"
echo "| --- | ---: | ---: |"
for l in A B; do
    printf '| %s | %s (%s) | %s (%s) |\n' "$l" "$(col $l 2 | median)" "$(col $l 2 | range)" "$(col $l 3 | median)" "$(col $l 3 | range)"
done
printf '| B/A, per round | %s (%s) | %s (%s) |\n' "$(ratio 2 | median)" "$(ratio 2 | range)" "$(ratio 3 | median)" "$(ratio 3 | range)"

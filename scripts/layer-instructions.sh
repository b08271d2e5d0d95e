#!/usr/bin/env bash
# Instructions per allowed request of the tower layer's bench server, counted
# by callgrind: a figure the machine's load does not move, for before/after
# comparisons that wall-clock CPU time on a shared 2-core box cannot settle.
#
# The server is crates/slidegate-http/examples/layer_bench.rs (the one
# scripts/bench-layer.sh times), one limiter per run, under valgrind's
# callgrind. wrk -t1 -c8 warms it up for 3 s with one API key, callgrind's
# counters are zeroed, wrk sends requests for 6 s more, and the count is
# dumped: user-space instructions (the kernel's are not counted) divided by
# the requests wrk completed. Loopback only; bounded to about 15 s a run.
# Needs: valgrind, wrk (apt-get install valgrind wrk).
# Usage: scripts/layer-instructions.sh [LIMITER ...]   (default: slidegate governor)
#   LAYER_BENCH=path/to/layer_bench   count that binary (one built from another
#                                     commit, for a before/after) instead of building
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib.sh
needs layer-instructions valgrind callgrind_control wrk curl python3
if [ $# -eq 0 ]; then set -- slidegate governor; fi
BIN="${LAYER_BENCH:-}"
if [ -z "$BIN" ]; then
    cargo build --release -q -p slidegate-http --example layer_bench
    BIN="${CARGO_TARGET_DIR:-target}/release/examples/layer_bench"
fi

WORK="$(mktemp -d -t slidegate-layer-ir-XXXXXX)"
VPID=""
cleanup() {
    if [ -n "$VPID" ]; then kill "$VPID" 2>/dev/null || true; fi
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT


for limiter in "$@"; do
    port=$(free_port)
    valgrind --tool=callgrind --callgrind-out-file="$WORK/out.%p" \
        "$BIN" --limiter "$limiter" --limit 1000000000 "127.0.0.1:$port" 2>"$WORK/valgrind.log" &
    VPID=$!
    for _ in $(seq 300); do
        curl -s -o /dev/null -H 'x-api-key: probe' "http://127.0.0.1:$port/" && break
        sleep 0.1
    done
    wrk -t1 -c8 -d3s -H 'x-api-key: k1' "http://127.0.0.1:$port/" >/dev/null
    callgrind_control -z "$VPID" >/dev/null 2>&1
    report=$(wrk -t1 -c8 -d6s -H 'x-api-key: k1' "http://127.0.0.1:$port/")
    callgrind_control -d "$VPID" >/dev/null 2>&1
    sleep 1
    requests=$(echo "$report" | awk '/requests in/ { print $1 }')
    if [ -z "$requests" ] || [ "$requests" -eq 0 ]; then
        echo "layer-instructions: wrk completed no request against $limiter:" >&2
        echo "$report" >&2
        exit 1
    fi
    dump=$(ls -t "$WORK"/out.*.* | head -1)
    instructions=$(awk '/^summary:/ { print $2; exit }' "$dump")
    kill "$VPID" 2>/dev/null || true
    wait "$VPID" 2>/dev/null || true
    VPID=""
    rm -f "$WORK"/out.*
    echo "$limiter: $((instructions / requests)) instructions per allowed request ($requests requests, $instructions instructions)"
done

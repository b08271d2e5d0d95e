#!/usr/bin/env bash
# slidegate's tower layer against tower_governor, in the same axum app, side
# by side in one run, loopback only.
#
# The server is crates/slidegate-http/examples/layer_bench.rs: axum 0.8, one
# route answering "ok", a single-threaded tokio runtime, limited by
#   slidegate         RateLimitLayer, embedded MemoryStore, keyed by x-api-key,
#                     the peer read from axum's ConnectInfo (peer_from); headers on
#   governor          tower_governor 0.8, a header key extractor, its defaults
#                     (no headers on allowed responses; a 429 carries retry-after)
# and, when BENCH_LAYER_VARIANTS names them, for reference:
#   slidegate-map-request  slidegate set up as examples/axum.rs (a map_request copying
#                     ConnectInfo into PeerAddr)
#   slidegate-bare    slidegate reading no peer at all
#   slidegate-no-legacy  slidegate with headers.legacy = false (2 header lines, not 5)
#   governor-headers  tower_governor with use_headers() (x-ratelimit-limit/remaining)
# Scenarios, each with wrk -t1 -c32 (one core for wrk, one for the server):
#   one    every request with the same API key, limit far above what is sent
#   100k   a key picked at random among 100,000 (scripts/layer-keys.lua), same limit
#   over   one key whose limit (1 per hour) was spent in the warm-up: every request denied
# Each (variant, limit) is its own server process, so the CPU time read from
# /proc/PID/stat (utime + stime, all threads) before and after a run is that
# run's alone. Rounds are interleaved (the order of the variants rotates each
# round); per-round ratios slidegate / governor are reported as medians with
# ranges. Bounded: warm-up + rounds x scenarios x variants x SECS.
# Needs: wrk (apt-get install wrk), python3.
# Usage: scripts/bench-layer.sh [seconds per run, default 3] [rounds, default 5]
#   BENCH_LAYER_VARIANTS="slidegate governor slidegate-map-request slidegate-bare slidegate-no-legacy governor-headers"
#   BENCH_LAYER_JSON=path   also write every run and the summary as JSON there
#   BENCH_LAYER_BASELINE=path/to/layer_bench   adds the variant "baseline": slidegate
#                     as that binary (built from another commit) runs it, for before/after
#                     figures in the same rounds
set -euo pipefail
cd "$(dirname "$0")/.."

SECS="${1:-3}"
ROUNDS="${2:-5}"
read -r -a VARIANTS <<< "${BENCH_LAYER_VARIANTS:-slidegate governor}"
if [ -n "${BENCH_LAYER_BASELINE:-}" ]; then
    [ -x "$BENCH_LAYER_BASELINE" ] || { echo "bench-layer: $BENCH_LAYER_BASELINE is not an executable" >&2; exit 1; }
    VARIANTS+=(baseline)
fi
SCENARIOS=(one 100k over)
. scripts/lib.sh
needs bench-layer wrk python3

cargo build --release -q -p slidegate-http --example layer_bench
BIN="${CARGO_TARGET_DIR:-target}/release/examples/layer_bench"

scratch slidegate-bench-layer
# The highest priority, its session's autogroup too (scripts/lib.sh says why both).
top_priority

# One server per variant and limit: "allowed" (far above what is sent) and "over" (1 per hour).
declare -A PORT PID
for variant in "${VARIANTS[@]}"; do
    for kind in allowed over; do
        limit=1000000000
        [ "$kind" = over ] && limit=1
        port=$(free_port)
        if [ "$variant" = baseline ]; then
            "${NICE[@]}" "$BENCH_LAYER_BASELINE" --limiter slidegate --limit "$limit" "127.0.0.1:$port" 2>"$WORK/$variant-$kind.log" &
        else
            "${NICE[@]}" "$BIN" --limiter "$variant" --limit "$limit" "127.0.0.1:$port" 2>"$WORK/$variant-$kind.log" &
        fi
        PIDS+=($!)
        PORT[$variant-$kind]=$port
        PID[$variant-$kind]=$!
    done
done
for key in "${!PORT[@]}"; do
    for _ in $(seq 100); do curl -s -o /dev/null -H 'x-api-key: probe' "http://127.0.0.1:${PORT[$key]}/" && break; sleep 0.05; done
done
# Each limiter limits: the over-the-limit server denies the second request of a key.
for variant in "${VARIANTS[@]}"; do
    url="http://127.0.0.1:${PORT[$variant-over]}/"
    curl -s -o /dev/null -H 'x-api-key: over' "$url"
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'x-api-key: over' "$url")
    [ "$code" = 429 ] || { echo "bench-layer: $variant does not limit (got $code)" >&2; exit 1; }
done

server_of() { # variant, scenario -> the server's key in PORT / PID
    if [ "$2" = over ]; then echo "$1-over"; else echo "$1-allowed"; fi
}
wrk_run() { # variant, scenario, seconds, [--latency] -> wrk's report on stdout
    local url="http://127.0.0.1:${PORT[$(server_of "$1" "$2")]}/"
    case "$2" in
        one) "${NICE[@]}" wrk -t1 -c32 -d"$3s" ${4:-} -H 'x-api-key: one' "$url" ;;
        100k) IDENTITIES=100000 "${NICE[@]}" wrk -t1 -c32 -d"$3s" ${4:-} -s scripts/layer-keys.lua "$url" ;;
        over) "${NICE[@]}" wrk -t1 -c32 -d"$3s" ${4:-} -H 'x-api-key: over' "$url" ;;
    esac
}
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
to_us() { # wrk latency like 85.00us, 1.20ms, 2.00s -> microseconds
    awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else if (v ~ /s$/) print n * 1000000; else print n }'
}

# Warm-up: code paths, connections, and 100,000 identities in each store.
for variant in "${VARIANTS[@]}"; do
    wrk_run "$variant" one 1 >/dev/null
    wrk_run "$variant" 100k 3 >/dev/null
    wrk_run "$variant" over 1 >/dev/null
done

HZ=$(getconf CLK_TCK)
RES="$WORK/results"   # one line per round, scenario and variant: round scenario variant rps cpu_us p99_us requests non2xx
for round in $(seq "$ROUNDS"); do
    for scenario in "${SCENARIOS[@]}"; do
        n=${#VARIANTS[@]}
        for j in $(seq 0 $((n - 1))); do
            variant=${VARIANTS[$(((j + round) % n))]}
            pid=${PID[$(server_of "$variant" "$scenario")]}
            before=$(ticks "$pid")
            wrk_run "$variant" "$scenario" "$SECS" --latency > "$WORK/wrk.txt"
            after=$(ticks "$pid")
            requests=$(awk '/requests in/ { print $1 }' "$WORK/wrk.txt")
            cpu=$(awk -v t=$((after - before)) -v hz="$HZ" -v r="$requests" 'BEGIN { printf "%.2f", t / hz * 1e6 / r }')
            rps=$(awk '/^Requests\/sec:/ { printf "%.0f", $2 }' "$WORK/wrk.txt")
            non2xx=$(awk '/Non-2xx/ { n = $NF } END { print n + 0 }' "$WORK/wrk.txt")
            p99=$(to_us "$(awk '$1 == "99%" { print $2 }' "$WORK/wrk.txt")")
            echo "$round $scenario $variant $rps $cpu $p99 $requests $non2xx" >> "$RES"
        done
    done
done

SECS="$SECS" ROUNDS="$ROUNDS" VARIANTS="${VARIANTS[*]}" JSON="${BENCH_LAYER_JSON:-}" python3 - "$RES" <<'EOF'
import json, os, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
runs = [dict(round=int(r), scenario=s, variant=v, rps=float(rps), cpu_us=float(cpu), p99_us=float(p99),
             requests=int(n), non2xx=int(e)) for r, s, v, rps, cpu, p99, n, e in rows]
variants = os.environ["VARIANTS"].split()
scenarios = ["one", "100k", "over"]
names = {"one": "one identity", "100k": "100,000 identities", "over": "one identity far over its limit"}
def med(xs): return statistics.median(xs)
def fmt(x): return f"{x:,.0f}" if x >= 100 else f"{x:.2f}"
def cell(xs): return f"{fmt(med(xs))} ({fmt(min(xs))}–{fmt(max(xs))})"
def of(s, v, k): return [r[k] for r in runs if r["scenario"] == s and r["variant"] == v]
summary = {"secs": int(os.environ["SECS"]), "rounds": int(os.environ["ROUNDS"]), "scenarios": {}}
print("| scenario | limiter | req/s | server CPU µs per request | p99 µs | non-2xx |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for s in scenarios:
    summary["scenarios"][s] = {}
    for v in variants:
        print(f"| {names[s]} | {v} | {cell(of(s, v, 'rps'))} | {cell(of(s, v, 'cpu_us'))} | {cell(of(s, v, 'p99_us'))} | {sum(of(s, v, 'non2xx')):,} of {sum(of(s, v, 'requests')):,} |")
        summary["scenarios"][s][v] = {k: med(of(s, v, k)) for k in ("rps", "cpu_us", "p99_us")}
print()
others = [v for v in variants if v != "governor"] if "governor" in variants else []
if others:
    print("| scenario | ratio to governor, per round | throughput | server CPU per request | p99 |")
    print("| --- | --- | ---: | ---: | ---: |")
    for s in scenarios:
        for v in others:
            ratio = {k: [a / b for a, b in zip(of(s, v, k), of(s, "governor", k))] for k in ("rps", "cpu_us", "p99_us")}
            summary["scenarios"][s][v + "/governor"] = {k: med(x) for k, x in ratio.items()}
            print(f"| {names[s]} | {v} / governor | " + " | ".join(
                f"**{med(ratio[k]):.2f}×** ({min(ratio[k]):.2f}–{max(ratio[k]):.2f})" for k in ("rps", "cpu_us", "p99_us")) + " |")
print()
print(f"medians (ranges) over {summary['rounds']} interleaved rounds of {summary['secs']} s per scenario and limiter; "
      f"wrk -t1 -c32; one server thread (tokio current_thread); {os.cpu_count()} cores")
if os.environ.get("JSON"):
    json.dump({"runs": runs, "summary": summary}, open(os.environ["JSON"], "w"), indent=1)
    print(f"JSON: {os.environ['JSON']}")
EOF

#!/usr/bin/env bash
# Before/after check of a refactor, side by side in one run: is the current
# tree slower than BASE_REV at what the issue names?
#   side_by_side   the criterion bench of crates/slidegate (its own interleaved
#                  rounds), run alternately from each build
#   bench redis    `slidegate bench redis` (Lua engine) against one loopback
#                  redis-server, alternately from each build
#   http           the `slidegate` and `/v1/check` paths of scripts/bench-http.sh,
#                  same configurations: one upstream nginx, each build's
#                  `slidegate serve` beside the other's, interleaved wrk rounds
# BASE_REV is built in a temporary git worktree (removed on exit); NEW_REV
# likewise if given, else the working tree as it is (uncommitted changes
# included). Both builds share this tree's target directory, so dependencies
# compile once; each build's binaries are copied out before the next.
# Every figure is reported as new / base per pair of runs taken back to back
# (the order alternates), median and range: > 1 is slower for times, < 1
# slower for throughputs. Bounded: about (side_by_side + 6 x AB_SECS + 3 x
# AB_SECS) x AB_ROUNDS x 2, plus the builds.
# Needs: git, redis-server, nginx, wrk, python3.
# Usage: scripts/ab-refactor.sh BASE_REV [NEW_REV]
#   AB_ROUNDS (default 3)  pairs of runs per phase
#   AB_SECS (default 2)    seconds per load run (bench redis: per algorithm)
#   AB_SBS_ROUNDS (default 7)  --rounds of each side_by_side run
#   AB_PHASES (default "side_by_side redis http")
#   AB_JSON=path           also write every run and the summary as JSON
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

BASE_REV="${1:?usage: scripts/ab-refactor.sh BASE_REV [NEW_REV]}"
NEW_REV="${2:-}"
ROUNDS="${AB_ROUNDS:-3}"
SECS="${AB_SECS:-2}"
SBS_ROUNDS="${AB_SBS_ROUNDS:-7}"
read -r -a PHASES <<< "${AB_PHASES:-side_by_side redis http}"
. scripts/lib.sh
needs ab-refactor git redis-server nginx wrk python3
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"

WORK="$(mktemp -d -t slidegate-ab-XXXXXX)"
PIDS=()
TREES=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for tree in "${TREES[@]}"; do git -C "$ROOT" worktree remove --force "$tree" 2>/dev/null || true; done
    rm -rf "$WORK"
    git -C "$ROOT" worktree prune
}
trap cleanup EXIT

# Builds the tree at $2 into $WORK/bin/$1: the CLI and the side_by_side bench.
build() {
    local name="$1" tree="$2" bench
    mkdir -p "$WORK/bin/$name"
    echo "ab-refactor: building $name ($(git -C "$tree" rev-parse --short HEAD)$( [ -n "$(git -C "$tree" status --porcelain)" ] && echo ', with uncommitted changes'))" >&2
    (cd "$tree" && cargo build --release -q -p slidegate-cli --bin slidegate)
    cp "$CARGO_TARGET_DIR/release/slidegate" "$WORK/bin/$name/slidegate"
    bench=$(cd "$tree" && cargo bench -q -p slidegate --bench side_by_side --no-run --message-format=json \
        | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "side_by_side": print(m["executable"])')
    cp "$bench" "$WORK/bin/$name/side_by_side"
}
worktree() { # rev -> path of a temporary worktree at rev
    local path
    path="$WORK/tree-$(git rev-parse --short "$1")-$RANDOM"
    git -C "$ROOT" worktree add -q --detach "$path" "$1" >&2
    TREES+=("$path")
    echo "$path"
}
build base "$(worktree "$BASE_REV")"
if [ -n "$NEW_REV" ]; then build new "$(worktree "$NEW_REV")"; else build new "$ROOT"; fi

order() { # round -> the two builds, alternating which goes first
    if [ $(($1 % 2)) = 1 ]; then echo "base new"; else echo "new base"; fi
}
RES="$WORK/results"   # one line per measurement: phase build round metric value

for phase in "${PHASES[@]}"; do case "$phase" in
side_by_side)
    for round in $(seq "$ROUNDS"); do
        for b in $(order "$round"); do
            "$WORK/bin/$b/side_by_side" --rounds "$SBS_ROUNDS" > "$WORK/sbs.txt"
            # "scenario" lines, then "  contender   123.4 ns/decision   1.00× the first":
            # the time, and each governor contender's time over slidegate's in the
            # same run ("x_first": the machine's load cancels out of it; new / base
            # below 1 there means slidegate got slower against the same governor).
            awk -v b="$b" -v r="$round" '/^[^ ]/ { s = $1 } / ns\/decision/ {
                n = ""; for (i = 1; $(i + 1) != "ns/decision"; i++) n = n (n ? "_" : "") $i
                print "side_by_side", b, r, s "/" n, $(i)
                if ($(i + 2) + 0 != 1) print "side_by_side", b, r, s "/" n "/x_first", $(i + 2) + 0 }' "$WORK/sbs.txt" >> "$RES"
        done
    done ;;
redis)
    REDIS=$(free_port)
    redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no --logfile "$WORK/redis.log" & PIDS+=($!)
    for _ in $(seq 100); do redis-cli -p "$REDIS" ping >/dev/null 2>&1 && break; sleep 0.05; done
    for round in $(seq "$ROUNDS"); do
        for b in $(order "$round"); do
            redis-cli -p "$REDIS" flushall >/dev/null
            "$WORK/bin/$b/slidegate" bench redis --redis-url "redis://127.0.0.1:$REDIS/" --engine lua \
                --seconds "$SECS" --no-redis-benchmark --memory-identities 20000 --json > "$WORK/redis.json"
            python3 - "$b" "$round" "$WORK/redis.json" >> "$RES" <<'EOF'
import json, sys
b, r, report = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
rows = dict(report["algorithms"])
if report.get("reference_script"): rows["reference_script"] = report["reference_script"]
for name, f in rows.items():
    print("redis", b, r, f"{name}/server_us_per_decision", f["server_us_per_decision"])
    print("redis", b, r, f"{name}/decisions_per_sec", f["decisions_per_sec"])
    print("redis", b, r, f"{name}/p99_us", f["p99_us"])
for name, f in report.get("ratios_vs_reference", {}).items():
    print("redis", b, r, f"{name}/server_us_vs_reference_script", f["server_us_per_decision"])
EOF
        done
    done ;;
http)
    # The configurations of scripts/bench-http.sh's "slidegate" and "check" paths.
    UPSTREAM=$(free_port)
    mkdir -p "$WORK/upstream"
    cat > "$WORK/upstream/nginx.conf" <<EOF
daemon off;
worker_processes 1;
pid $WORK/upstream/nginx.pid;
error_log $WORK/upstream/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $WORK/upstream;
    proxy_temp_path $WORK/upstream;
    fastcgi_temp_path $WORK/upstream;
    uwsgi_temp_path $WORK/upstream;
    scgi_temp_path $WORK/upstream;
    server { listen 127.0.0.1:$UPSTREAM; keepalive_requests 1000000; location / { return 200 "ok\n"; } }
}
EOF
    nginx -c "$WORK/upstream/nginx.conf" & PIDS+=($!)
    export SLIDEGATE_BENCH_SECRET=bench SLIDEGATE_LOG=warn
    declare -A SG SGCA SG_PID SGC_PID
    for b in base new; do
        SG[$b]=$(free_port); SGC=$(free_port); SGCA[$b]=$(free_port)
        cat > "$WORK/sg-$b.toml" <<EOF
[server]
listen = "127.0.0.1:${SG[$b]}"
upstream = "http://127.0.0.1:$UPSTREAM"

[identity]
ip_hash_secret_env = "SLIDEGATE_BENCH_SECRET"

[[rules]]
name = "all"
path = "/*"
limits = [{ limit = 1000000000, window = "1s" }]
EOF
        cat > "$WORK/sgc-$b.toml" <<EOF
[server]
listen = "127.0.0.1:$SGC"
upstream = "http://127.0.0.1:$UPSTREAM"
admin_listen = "127.0.0.1:${SGCA[$b]}"

[[rules]]
name = "check"
path = "/*"
limits = [{ limit = 1000000000, window = "1h" }]
EOF
        "$WORK/bin/$b/slidegate" serve --config "$WORK/sg-$b.toml" 2>"$WORK/sg-$b.log" & PIDS+=($!); SG_PID[$b]=$!
        "$WORK/bin/$b/slidegate" serve --config "$WORK/sgc-$b.toml" 2>"$WORK/sgc-$b.log" & PIDS+=($!); SGC_PID[$b]=$!
    done
    for port in "$UPSTREAM" "${SG[@]}" "${SGCA[@]}"; do
        for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.05; done
    done
    ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
    to_us() { awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else if (v ~ /s$/) print n * 1000000; else print n }'; }
    HZ=$(getconf CLK_TCK)
    for b in base new; do   # warm-up; a lap over the 100,000 identities
        wrk -t2 -c32 -d1s "http://127.0.0.1:${SG[$b]}/" >/dev/null
        wrk -t1 -c64 -d3s -s scripts/check-100k.lua "http://127.0.0.1:${SGCA[$b]}/v1/check" >/dev/null
    done
    for round in $(seq "$ROUNDS"); do
        for b in $(order "$round"); do
            before=$(ticks "${SG_PID[$b]}")
            wrk -t2 -c32 -d"${SECS}s" "http://127.0.0.1:${SG[$b]}/" > "$WORK/wrk.txt"
            after=$(ticks "${SG_PID[$b]}")
            awk -v b="$b" -v r="$round" -v t=$((after - before)) -v hz="$HZ" '
                /requests in/ { n = $1 } /^Requests\/sec:/ { rps = $2 }
                END { print "http", b, r, "proxy/req_per_sec", rps; print "http", b, r, "proxy/cpu_us_per_request", t / hz * 1e6 / n }' "$WORK/wrk.txt" >> "$RES"
            wrk -t1 -c1 -d"${SECS}s" --latency "http://127.0.0.1:${SG[$b]}/" > "$WORK/wrk.txt"
            echo "http $b $round proxy/p99_us_1_connection $(to_us "$(awk '$1 == "99%" { print $2 }' "$WORK/wrk.txt")")" >> "$RES"
            before=$(ticks "${SGC_PID[$b]}")
            wrk -t1 -c64 -d"${SECS}s" --latency -s scripts/check-100k.lua "http://127.0.0.1:${SGCA[$b]}/v1/check" > "$WORK/wrk.txt"
            after=$(ticks "${SGC_PID[$b]}")
            awk -v b="$b" -v r="$round" -v t=$((after - before)) -v hz="$HZ" '
                /requests in/ { n = $1 } /^Requests\/sec:/ { rps = $2 }
                END { print "http", b, r, "check/req_per_sec", rps; print "http", b, r, "check/cpu_us_per_request", t / hz * 1e6 / n }' "$WORK/wrk.txt" >> "$RES"
            echo "http $b $round check/p99_us $(to_us "$(awk '$1 == "99%" { print $2 }' "$WORK/wrk.txt")")" >> "$RES"
        done
    done ;;
*) echo "ab-refactor: unknown phase $phase (side_by_side, redis, http)" >&2; exit 64 ;;
esac; done

JSON="${AB_JSON:-}" BASE_REV="$BASE_REV" NEW_REV="${NEW_REV:-working tree}" python3 - "$RES" <<'EOF'
import collections, json, os, statistics, sys
runs = collections.defaultdict(dict)   # (phase, metric) -> {(build, round): value}
for line in open(sys.argv[1]):
    phase, build, rnd, metric, value = line.split()
    runs[(phase, metric)][(build, int(rnd))] = float(value)
print(f"new = {os.environ['NEW_REV']}, base = {os.environ['BASE_REV']}; new / base per pair of runs taken back to back")
print("| phase | measure | base | new | new / base |")
print("| --- | --- | ---: | ---: | ---: |")
summary = {}
for (phase, metric), values in runs.items():
    rounds = sorted({r for _, r in values if ("base", r) in values and ("new", r) in values})
    if not rounds:
        continue
    base = [values[("base", r)] for r in rounds]
    new = [values[("new", r)] for r in rounds]
    ratio = [n / b for n, b in zip(new, base) if b]
    med = statistics.median
    summary[f"{phase}/{metric}"] = {"base": med(base), "new": med(new), "new_over_base": med(ratio),
                                    "range": [min(ratio), max(ratio)]}
    print(f"| {phase} | {metric} | {med(base):,.2f} | {med(new):,.2f} | **{med(ratio):.3f}** ({min(ratio):.3f}–{max(ratio):.3f}) |")
print("higher is better for req_per_sec and decisions_per_sec; lower is better for the rest")
if os.environ.get("JSON"):
    json.dump({"runs": {f"{p}/{m}": {f"{b}/{r}": v for (b, r), v in vals.items()} for (p, m), vals in runs.items()},
               "summary": summary}, open(os.environ["JSON"], "w"), indent=1)
EOF

#!/usr/bin/env bash
# slidegate's Lua scripts against rate-limiter-flexible, the most used Node
# limiter, on one Redis in the same run: Redis server CPU per decision.
#
#   rate-limiter-flexible 11   RateLimiterRedis (ioredis 5), its default fixed
#                              window, 100 points per 60 s (scripts/bench-lua/rlf.js)
#   slidegate                  `bench redis --only …`: the fixed window and the
#                              sliding window counter, a key per identity and packed
# Both: 100,000 identities cycled, 128 requests in flight, every identity
# decided once before the timed load, CONFIG RESETSTAT, SECONDS of load, then
# INFO commandstats (all decisions allowed). Rounds alternate the two; the
# per-round ratios slidegate / rate-limiter-flexible are summarised as
# medians with ranges.
# Needs: node and npm (the packages go to ~/.cache/slidegate-rlf, once),
# redis-server, python3. Loopback only: a redis-server of its own on a free port.
# Usage: scripts/bench-lua.sh [ROUNDS, default 3] [SECONDS, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${1:-3}"
SECS="${2:-5}"
for tool in node npm redis-server python3; do
    command -v "$tool" >/dev/null || { echo "bench-lua: $tool is not installed" >&2; exit 1; }
done

# The packages, outside the source tree, pinned to their major versions.
MODULES="$HOME/.cache/slidegate-rlf"
if [ ! -d "$MODULES/node_modules/rate-limiter-flexible" ] || [ ! -d "$MODULES/node_modules/ioredis" ]; then
    mkdir -p "$MODULES"
    npm install --silent --prefix "$MODULES" rate-limiter-flexible@11 ioredis@5 >/dev/null
fi
export NODE_PATH="$MODULES/node_modules"

cargo build --release -q -p slidegate-cli
BIN="${CARGO_TARGET_DIR:-target}/release/slidegate"

WORK="$(mktemp -d -t slidegate-bench-lua-XXXXXX)"
PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
cleanup() {
    redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" \
    --daemonize yes --logfile "$WORK/redis.log" >/dev/null
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
echo "Redis $(redis-server --version | grep -o 'v=[^ ]*') on 127.0.0.1:$PORT; $ROUNDS rounds of $SECS s"

CANDIDATES=fixed_window,sliding_window_counter,fixed_window_packed,sliding_window_counter_packed
for round in $(seq "$ROUNDS"); do
    timeout $((SECS * 4 + 120)) node scripts/bench-lua/rlf.js "$PORT" "$SECS" > "$WORK/rlf-$round.json"
    redis-cli -p "$PORT" flushall >/dev/null
    timeout $((SECS * 8 + 600)) "$BIN" bench redis --redis-url "redis://127.0.0.1:$PORT/" --seconds "$SECS" \
        --memory-identities 10000 --no-redis-benchmark --json --only "$CANDIDATES" > "$WORK/sg-$round.json"
    redis-cli -p "$PORT" flushall >/dev/null
done

python3 - "$WORK" "$ROUNDS" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
names = ["fixed_window", "sliding_window_counter", "fixed_window_packed", "sliding_window_counter_packed"]
ratios = {n: [] for n in names}
for r in range(1, rounds + 1):
    rlf = json.load(open(f"{work}/rlf-{r}.json"))
    sg = json.load(open(f"{work}/sg-{r}.json"))
    us = {n: sg["algorithms"][n]["server_us_per_decision"] for n in names[:2]}
    us.update({n + "_packed": sg["packed"][n]["server_us_per_decision"] for n in names[:2]})
    base = rlf["server_us_per_consume"]
    cmds = ", ".join(f"{c} {v['usec_per_call']} µs × {v['calls'] / rlf['consumes']:.2f}" for c, v in rlf["commands"].items())
    print(f"round {r}: rate-limiter-flexible {rlf['version']} {base:.2f} µs per consume ({cmds})")
    for n in names:
        ratios[n].append(us[n] / base)
        print(f"  slidegate {n:<30} {us[n]:.2f} µs  {us[n] / base:.2f}×")
print("slidegate / rate-limiter-flexible, server CPU per decision, median (range):")
for n in names:
    xs = ratios[n]
    print(f"  {n:<30} {statistics.median(xs):.2f}× ({min(xs):.2f}–{max(xs):.2f})")
PY

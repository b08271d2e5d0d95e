#!/usr/bin/env bash
# Redis server CPU per rate-limit decision: the Node.js library
# rate-limiter-flexible (v11, RateLimiterRedis over ioredis, 100 points per
# 60 s: its default fixed window) against slidegate's own Lua scripts, on ONE
# loopback redis-server in the same run.
#
#   scripts/bench-lua.sh [ROUNDS] [SECONDS]      (defaults: 3 rounds, 5 s of load)
#
# The figure is what INFO commandstats charges: usec of the commands the
# client sent (for the library, EVALSHA of its Lua script) / decisions. It is
# the time Redis spends executing them, not parsing or networking, and it does
# not depend on how fast the client is, so the two clients compare fairly
# even though one is Node and one is Rust.
#
# Each round runs, one after the other on the same server:
#   rlf        scripts/bench-lua/rlf.js: 100,000 keys cycled round-robin,
#              4 connections × 32 in flight, a warm-up touching every key
#              once, CONFIG RESETSTAT, SECONDS of consume(key)
#   slidegate  slidegate bench redis --engine lua --json, same shape (its
#              defaults: 100,000 identities, 4 × 32 in flight, 100 per 60 s),
#              for fixed_window, sliding_window_counter and both packed
# Rounds alternate rlf, slidegate, rlf, slidegate, ... so drift on a busy
# machine lands on both. Ratios are slidegate / rlf within a round.
#
# Needs redis-server, redis-cli, node + npm, jq, python3 (for a free port).
# npm packages go to $SLIDEGATE_RLF_CACHE (default ~/.cache/slidegate-rlf),
# outside the tree, installed once. Never touches port 6379.
set -euo pipefail

ROUNDS=${1:-3}
SECONDS_LOAD=${2:-5}
[[ $ROUNDS =~ ^[1-9][0-9]*$ && $SECONDS_LOAD =~ ^[1-9][0-9]*$ ]] ||
  { echo "usage: $0 [ROUNDS] [SECONDS]  (positive integers)" >&2; exit 64; }

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
BIN=$ROOT/target/release/slidegate
CACHE=${SLIDEGATE_RLF_CACHE:-$HOME/.cache/slidegate-rlf}
for tool in redis-server redis-cli node npm jq python3; do
  command -v "$tool" >/dev/null || { echo "$0: $tool not found" >&2; exit 69; }
done

# --- slidegate's binary (built once if missing) -----------------------------
if [ ! -x "$BIN" ]; then
  echo "building $BIN ..." >&2
  (cd "$ROOT" && timeout 1800 cargo build --release -p slidegate-cli)
fi

# --- rate-limiter-flexible, pinned to major 11 (ioredis 5) -----------------
installed() { NODE_PATH=$CACHE/node_modules node -p "require('rate-limiter-flexible/package.json').version" 2>/dev/null; }
if [[ $(installed) != 11.* ]]; then
  echo "installing rate-limiter-flexible@11 ioredis@5 into $CACHE ..." >&2
  mkdir -p "$CACHE"
  cp "$HERE/bench-lua/package.json" "$CACHE/package.json"
  (cd "$CACHE" && timeout 300 npm install --no-audit --no-fund --loglevel=error)
fi
RLF_VERSION=$(installed)

# --- our own redis-server on a free loopback port ---------------------------
OUT=$(mktemp -d "${TMPDIR:-/tmp}/bench-lua.XXXXXX")
# The kernel picks a free port (never 6379: that is outside its ephemeral
# range, and checked anyway); a race with another process is possible but
# redis-server would then fail to start and the ping loop below would stop us.
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
[ "$PORT" != 6379 ] || { echo "$0: refusing port 6379" >&2; exit 70; }
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$OUT" --logfile "$OUT/redis.log" &
REDIS_PID=$!
cleanup() {
  kill "$REDIS_PID" 2>/dev/null || true
  wait "$REDIS_PID" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
for _ in $(seq 50); do
  redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
  kill -0 "$REDIS_PID" 2>/dev/null || { echo "$0: redis-server did not start (see $OUT/redis.log)" >&2; exit 1; }
  sleep 0.2
done
redis-cli -p "$PORT" ping >/dev/null

echo "redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on 127.0.0.1:$PORT;" \
  "rate-limiter-flexible $RLF_VERSION; $ROUNDS rounds × $SECONDS_LOAD s; raw JSON in $OUT"

# Every phase has a deadline: the load itself plus generous room for the
# warm-up, settles and (for slidegate) its memory phases, on a loaded machine.
RLF_LIMIT=$((SECONDS_LOAD + 120))
SG_LIMIT=$((4 * (SECONDS_LOAD + 60)))
SG_ONLY=fixed_window,sliding_window_counter,fixed_window_packed,sliding_window_counter_packed

printf '%-5s %9s | %-14s %-14s %-14s %-14s  (server µs/decision, ×rlf)\n' \
  round rlf fixed_window sw_counter fw_packed swc_packed
ratios=$OUT/ratios.tsv
: >"$ratios"
for round in $(seq "$ROUNDS"); do
  r=$(printf 'r%02d' "$round")
  NODE_PATH=$CACHE/node_modules timeout "$RLF_LIMIT" \
    node "$HERE/bench-lua/rlf.js" "$PORT" "$SECONDS_LOAD" >"$OUT/$r-rlf.json"
  # --engine lua: the scripts, even were a native module loaded; --only: the
  # four candidates compared here (all eight take ~2 min a round at 5 s).
  timeout "$SG_LIMIT" "$BIN" bench redis --redis-url "redis://127.0.0.1:$PORT/" \
    --seconds "$SECONDS_LOAD" --json --no-redis-benchmark --engine lua --only "$SG_ONLY" \
    >"$OUT/$r-slidegate.json"
  rlf=$(jq -r .server_us_per_consume "$OUT/$r-rlf.json")
  read -r fw swc fwp swcp < <(jq -r '[.algorithms.fixed_window, .algorithms.sliding_window_counter,
      .packed.fixed_window, .packed.sliding_window_counter] | map(.server_us_per_decision) | @tsv' \
    "$OUT/$r-slidegate.json")
  awk -v r="$round" -v b="$rlf" -v a="$fw" -v c="$swc" -v d="$fwp" -v e="$swcp" 'BEGIN {
    printf "%-5s %9.2f | %5.2f (%5.3f) %5.2f (%5.3f) %5.2f (%5.3f) %5.2f (%5.3f)\n",
      r, b, a, a / b, c, c / b, d, d / b, e, e / b
    printf "%.4f\t%.4f\t%.4f\t%.4f\n", a / b, c / b, d / b, e / b >> "'"$ratios"'"
  }'
done

# Median and range of each ratio over the rounds.
echo "slidegate / rlf over $ROUNDS rounds: median (min–max)"
col=1
for name in fixed_window sliding_window_counter fixed_window_packed sliding_window_counter_packed; do
  cut -f"$col" "$ratios" | sort -g | awk -v n="$name" '{ v[NR] = $1 } END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "  %-30s %.3f (%.3f–%.3f)\n", n, m, v[1], v[NR]
  }'
  col=$((col + 1))
done
echo "rate-limiter-flexible $RLF_VERSION sends per consume (last round; usec_per_call):"
jq -r '.consumes as $n | (.sent | to_entries[] |
    "  \(.key): \(.value.calls / $n * 1000 | round / 1000) per consume, \(.value.usec_per_call) µs/call"),
  "  inside its script (already in the above): " +
    ([.inside_script | to_entries[] | "\(.key) \(.value.usec_per_call) µs"] | join(", "))' \
  "$OUT/r$(printf %02d "$ROUNDS")-rlf.json"
echo "raw JSON: $OUT"

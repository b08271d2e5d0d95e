#!/usr/bin/env bash
# Every figure README.md's "Measured" section and BENCHMARKS.md's opening
# tables state, re-measured in one run, one after the other, loopback only.
#
#   side_by_side        embedded store against governor (ns per decision)
#   bytes_per_identity  embedded store, bytes per identity at 1,000,000
#   bench redis         Lua and module engines on one throwaway redis-server
#                       (the module loaded): server CPU per decision against
#                       the article's script in the same run, bytes per
#                       identity, client throughput against redis-benchmark
#   accuracy            20,000,000 requests, 50,000 sources, against the exact log
#   bench-http          serve against nginx limit_req, and POST /v1/check
#
# Every tool's own output is kept in OUT (default: a new temporary
# directory, printed at the end); the summary at the end is read from it.
# Needs: redis-server, nginx, wrk (apt-get install redis-server nginx wrk).
# Usage: scripts/figures.sh [OUT]
#   FIGURES_PHASES="embedded redis accuracy http"   the phases to run (default: all)
# Bounded: about 15 minutes on 2 cores after the builds.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${1:-$(mktemp -d -t slidegate-figures-XXXXXX)}"
mkdir -p "$OUT"
TARGET="${CARGO_TARGET_DIR:-target}"
for tool in redis-server redis-cli nginx wrk python3; do
    command -v "$tool" >/dev/null || { echo "figures: $tool is not installed" >&2; exit 1; }
done

stamp() { echo "== $(date -u +%FT%TZ) $*" | tee -a "$OUT/log"; }
PHASES=" ${FIGURES_PHASES:-embedded redis accuracy http} "
phase() { [[ "$PHASES" == *" $1 "* ]]; }

stamp "build"
cargo build --release -q -p slidegate-cli -p slidegate-redis-module
BIN="$TARGET/release/slidegate"
MODULE="$(pwd)/$TARGET/release/libslidegate_redis_module.so"
git rev-parse --short HEAD >"$OUT/commit"

if phase embedded; then
    stamp "side_by_side"
    cargo bench -q -p slidegate --bench side_by_side 2>&1 | tee "$OUT/side_by_side.txt" | tail -20
    stamp "bytes_per_identity"
    cargo bench -q -p slidegate --bench bytes_per_identity 2>&1 | tee "$OUT/bytes_per_identity.txt" | tail -12
fi

if phase redis; then
# A throwaway Redis on a free loopback port (never 6379), module loaded.
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
mkdir -p "$OUT/redis"
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$OUT/redis" --loadmodule "$MODULE" --daemonize yes \
    --logfile "$OUT/redis/log" --pidfile "$OUT/redis/pid"
trap 'redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true' EXIT
until redis-cli -p "$PORT" ping >/dev/null 2>&1; do sleep 0.1; done
URL="redis://127.0.0.1:$PORT/"
for engine in lua module; do
    for run in 1 2 3; do
        stamp "bench redis --engine $engine ($run of 3)"
        redis-cli -p "$PORT" flushall >/dev/null
        "$BIN" bench redis --redis-url "$URL" --seconds 2 --engine "$engine" --json \
            >"$OUT/redis-$engine-$run.json"
    done
done
redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
trap - EXIT
fi

if phase accuracy; then
    stamp "accuracy"
    "$BIN" accuracy --requests 20000000 --sources 50000 --json >"$OUT/accuracy.json"
fi

if phase http; then
    stamp "bench-http"
    scripts/bench-http.sh 3 3 2>&1 | tee "$OUT/bench-http.txt" | tail -40
fi

stamp "summary"
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
def med(xs):
    xs = [x for x in xs if x is not None]
    return f"{statistics.median(xs):.3g} ({min(xs):.3g}-{max(xs):.3g})" if xs else "-"
print(f"commit {(out / 'commit').read_text().strip()}")
for engine in ("lua", "module"):
    runs = [json.loads(p.read_text()) for p in sorted(out.glob(f"redis-{engine}-*.json"))]
    print(f"bench redis --engine {engine}, median (range) of {len(runs)} runs:")
    for alg in ("sliding_window_counter", "fixed_window"):
        r = [run["ratios_vs_reference"][alg] for run in runs]
        a = [run["algorithms"][alg] for run in runs]
        print(f"  {alg}: server CPU / article's script {med([x['server_us_per_decision'] for x in r])}, "
              f"server us {med([x['server_us_per_decision'] for x in a])}, "
              f"bytes/identity {med([x['bytes_per_identity'] for x in a])} "
              f"(article's layout {med([run['reference_script']['bytes_per_identity'] for run in runs])}), "
              f"decisions/s / redis-benchmark -P 16 {med([x['of_redis_benchmark_p16'] for x in r])}")
acc = json.loads((out / "accuracy.json").read_text())["algorithms"] if (out / "accuracy.json").exists() else {}
for alg, v in sorted(acc.items()):
    print(f"accuracy {alg}: average rate difference {v['avg_rate_diff_pct']:.2f}%, "
          f"wrongly allowed {v['wrongly_allowed_pct']:.4f}%, wrongly denied {v['wrongly_denied_pct']:.4f}%, "
          f"steady wrongly decided {v['classes']['steady']['wrongly_allowed_pct'] + v['classes']['steady']['wrongly_denied_pct']:.4f}%")
PY
echo "figures: everything is in $OUT"

#!/usr/bin/env bash
# What reloads cost: `check-config` on 7,500 / 15,000 / 30,000 rules, one
# reload of 30,000 rules through the endpoint, and a serve's RSS across
# rounds of 50 parallel reloads of a 2,000-rule file (with how many
# reloads ran for them). BENCHMARKS.md "Reloads under abuse" has the figures.
#
#   scripts/bench-reload.sh [ROUNDS]     (default 3; release binary)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
cargo build --release -q -p slidegate-cli
bin="${CARGO_TARGET_DIR:-target}/release/slidegate"
dir="$(mktemp -d)"
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT

# A free loopback port.
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# rules N PORT > FILE: N rules, each its own path and quota.
rules() {
    printf '[server]\nlisten = "127.0.0.1:%s"\nupstream = "http://127.0.0.1:9"\nadmin_on_public = true\n' "$2"
    for ((i = 0; i < $1; i++)); do
        printf '\n[[rules]]\nname = "rule-%d"\npath = "/api/v1/thing%d/*"\nlimits = [{ limit = %d, window = "1m" }]\n' \
            "$i" "$i" $((100 + i % 50))
    done
}

rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status"; }
runs() { curl -s "http://127.0.0.1:$1/metrics" | awk -F' ' '/^slidegate_config_reloads_total\{result="ok"\}/ { print $2 }'; }

# fastest CMD...: the fastest of three runs of CMD, in seconds.
fastest() {
    python3 - "$@" <<'PY'
import subprocess, sys, time
times = []
for _ in range(3):
    start = time.monotonic()
    subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)
    times.append(time.monotonic() - start)
print(f"{min(times):.3f}")
PY
}

echo "check-config, fastest of 3 (s):"
for n in 7500 15000 30000; do
    rules "$n" 0 > "$dir/r$n.toml"
    printf "  %6d rules: %s\n" "$n" "$(fastest "$bin" check-config "$dir/r$n.toml" 2>/dev/null)"
done

start_serve() {
    "$bin" serve -c "$1" 2> "$dir/serve.log" &
    pid=$!
    for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$2/healthz" && return; sleep 0.1; done
    echo "serve did not start" >&2; cat "$dir/serve.log" >&2; exit 1
}

p=$(port); rules 30000 "$p" > "$dir/big.toml"; start_serve "$dir/big.toml" "$p"
took=$(fastest curl -s -X POST "http://127.0.0.1:$p/admin/reload")
printf 'a reload of 30,000 rules, fastest of 3: %s s, RSS %d MB\n' "$took" $(( $(rss) / 1024 ))
kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""

p=$(port); rules 2000 "$p" > "$dir/small.toml"; start_serve "$dir/small.toml" "$p"
echo "2,000 rules: RSS (MB) and reloads run"
printf '  started: %d\n' $(( $(rss) / 1024 ))
for i in 1 2 3; do curl -s -o /dev/null -X POST "http://127.0.0.1:$p/admin/reload"; done
printf '  after 3 reloads one by one: %d\n' $(( $(rss) / 1024 ))
for ((r = 1; r <= rounds; r++)); do
    before=$(runs "$p")
    calls=()
    for _ in $(seq 50); do
        curl -s -o /dev/null -X POST "http://127.0.0.1:$p/admin/reload" &
        calls+=($!)
    done
    wait "${calls[@]}"
    printf '  after 50 parallel (round %d): %d, %d reloads ran\n' "$r" $(( $(rss) / 1024 )) $(( $(runs "$p") - before ))
done

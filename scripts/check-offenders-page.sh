#!/usr/bin/env bash
# Checks the top offenders page (/offenders) in a real headless browser.
#
# NOT PART OF CI: it needs Chromium (Debian: `apt-get update && apt-get install -y chromium`)
# and is run by hand after changing the page. The e2e test
# crates/slidegate-cli/tests/attacks/offenders.rs checks the HTML and JSON
# without a browser; this script checks what a browser renders, after the
# page's inline script has fetched /v1/offenders and rebuilt the table.
#
# It starts a tiny upstream (python3 -m http.server) and `slidegate serve`
# (embedded store, admin endpoints on their own loopback port), makes three
# clients exceed a limit with curl, then loads /offenders in headless
# Chromium: the dumped DOM must show the rule, the exact denial counts and
# the script's "Refreshed" status; a screenshot is written for a person to look at.
#
# Usage: scripts/check-offenders-page.sh [screenshot.png]
# Env:   SLIDEGATE=path/to/slidegate (default: target/debug/slidegate, built if missing)
#        CHROMIUM=chromium
set -euo pipefail

cd "$(dirname "$0")/.."
shot=${1:-target/offenders-page.png}
slidegate=${SLIDEGATE:-target/debug/slidegate}
chromium=${CHROMIUM:-chromium}
command -v "$chromium" >/dev/null || { echo "no $chromium: apt-get install -y chromium" >&2; exit 2; }
command -v curl >/dev/null || { echo "no curl" >&2; exit 2; }
[ -x "$slidegate" ] || cargo build -p slidegate-cli
mkdir -p "$(dirname "$shot")"

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# Waits (bounded) until FILE has a line matching PATTERN; prints the match.
wait_line() {
    local file=$1 pattern=$2
    for _ in $(seq 1 200); do
        if grep -m1 -oE "$pattern" "$file" 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    echo "timed out waiting for /$pattern/ in $file:" >&2
    cat "$file" >&2
    return 1
}

# The upstream: any static server on a loopback port the system picks.
mkdir -p "$work/www/api/videos"
for i in $(seq 1 20); do echo "video $i" > "$work/www/api/videos/$i"; done
(cd "$work/www" && exec python3 -u -m http.server --bind 127.0.0.1 0) >"$work/upstream.log" 2>&1 &
pids+=($!)
upstream_port=$(wait_line "$work/upstream.log" 'port [0-9]+' | cut -d' ' -f2)

cat >"$work/slidegate.toml" <<TOML
[server]
listen = "127.0.0.1:0"
upstream = "http://127.0.0.1:$upstream_port"
admin_listen = "127.0.0.1:0"

[identity]
api_key_header = "x-api-key"

[[rules]]
name = "videos"
path = "/api/videos/{id}"
methods = ["GET"]
limits = [{ limit = 3, window = "1m", algorithm = "sliding_log" }]
TOML
SLIDEGATE_LOG=warn "$slidegate" serve --config "$work/slidegate.toml" 2>"$work/slidegate.log" &
pids+=($!)
public=$(wait_line "$work/slidegate.log" 'listening on [0-9.:]+' | cut -d' ' -f3)
admin=$(wait_line "$work/slidegate.log" 'admin endpoints on [0-9.:]+' | cut -d' ' -f4)

# Three clients over the limit of 3: 7, 3 and 1 denials.
scrape() {
    local key=$1 requests=$2 denied=0
    for i in $(seq 1 "$requests"); do
        status=$(curl -s -o /dev/null -w '%{http_code}' -H "x-api-key: $key" "http://$public/api/videos/$i")
        [ "$status" = 429 ] && denied=$((denied + 1))
    done
    echo "$key: $requests requests, $denied denied"
}
scrape scraper-alpha 10
scrape scraper-bravo 6
scrape scraper-charlie 4

echo "--- /v1/offenders"
curl -s "http://$admin/v1/offenders"
echo

# The DOM after the inline script ran: virtual time lets its fetch finish.
"$chromium" --headless --no-sandbox --disable-gpu --virtual-time-budget=3000 \
    --dump-dom "http://$admin/offenders" >"$work/dom.html" 2>"$work/chromium.log"
"$chromium" --headless --no-sandbox --disable-gpu --virtual-time-budget=3000 --hide-scrollbars \
    --window-size=1000,420 --screenshot="$shot" "http://$admin/offenders" >>"$work/chromium.log" 2>&1

fail=0
check() {
    if grep -qF -- "$1" "$work/dom.html"; then echo "ok: $2"; else echo "MISSING: $2 ($1)"; fail=1; fi
}
check 'Refreshed ' "the inline script fetched the JSON and rebuilt the table"
check '<td>videos</td>' "the rule"
check '<td class="num">7</td>' "7 denials of the first scraper"
check '<td class="num">3</td>' "3 denials of the second"
check '<td class="num">1</td>' "1 denial of the third"
check 'not blocked' "the block state"
if grep -q 'scraper-' "$work/dom.html"; then echo "RAW KEY IN THE PAGE"; fail=1; fi
rows=$(grep -o '<tr>' "$work/dom.html" | wc -l)
echo "table rows (header included): $rows"
[ "$rows" = 4 ] || fail=1
echo "screenshot: $shot"
if [ "$fail" != 0 ]; then
    echo "--- DOM"; cat "$work/dom.html"; echo "--- chromium"; cat "$work/chromium.log"
    exit 1
fi
echo "offenders page OK"

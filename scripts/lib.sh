# What the bench and check scripts share: the tools a script needs, a
# scratch directory and the processes it starts (both gone when it exits,
# however it exits), free loopback ports, and nginx configurations.
#
# Sourced, from the repository's root, after `set -euo pipefail`:
#   . scripts/lib.sh
#   needs SCRIPT TOOL...          exits naming the first TOOL not installed
#   scratch PREFIX                WORK: a new directory; PIDS: () — on exit each
#                                 pid in PIDS is killed, then `on_exit` runs if
#                                 the script defines it, then WORK is removed
#   free_port                     prints a free port on 127.0.0.1
#   ports NAME...                 sets each NAME to a free port, or to consecutive
#                                 ones from SLIDEGATE_BENCH_PORTS (e.g. 17450)
#   nginx_conf NAME WORKERS HTTP  writes $WORK/NAME/nginx.conf: nginx in the
#                                 foreground, its files under $WORK/NAME, HTTP
#                                 inside `http { }` (run: nginx -c FILE)
#   top_priority                  NICE: the prefix that runs a command at the
#                                 highest priority as root (else empty), and the
#                                 session's autogroup at that priority until exit

needs() {
    local script=$1 tool
    shift
    for tool in "$@"; do
        command -v "$tool" >/dev/null || { echo "$script: $tool is not installed" >&2; exit 1; }
    done
}

scratch() {
    WORK="$(mktemp -d -t "$1-XXXXXX")"
    PIDS=()
    trap _scratch_cleanup EXIT
}

_scratch_cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if declare -F on_exit >/dev/null; then on_exit; fi
    if [ -n "${_GROUP_NICE:-}" ]; then echo "$_GROUP_NICE" > /proc/self/autogroup; fi
    rm -rf "$WORK"
}

# Other work on the machine skews tail latencies: as root, every process of
# a benchmark (servers and load generator alike) runs at the highest
# priority. With autogroup scheduling (sched_autogroup_enabled, the default
# of most distributions) a nice value only weighs against the processes of
# the same session: each session's group gets an equal share of the CPU
# whatever the nice values inside, so a build in another terminal took half
# the machine from a nice -19 benchmark all the same. The session's group is
# weighted at nice -19 too while the benchmark runs (restored on exit, by
# `scratch`'s clean-up: call `scratch` first).
top_priority() {
    NICE=()
    if [ "$(id -u)" = 0 ]; then
        NICE=(nice -n -19)
        if [ -w /proc/self/autogroup ]; then
            _GROUP_NICE=$(awk '{ print $NF }' /proc/self/autogroup)
            echo -19 > /proc/self/autogroup
        fi
    fi
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

_NEXT_PORT="${SLIDEGATE_BENCH_PORTS:-}"
ports() {
    local name
    for name in "$@"; do
        if [ -n "$_NEXT_PORT" ]; then
            printf -v "$name" %s "$_NEXT_PORT"
            _NEXT_PORT=$((_NEXT_PORT + 1))
        else
            printf -v "$name" %s "$(free_port)"
        fi
    done
}

nginx_conf() {
    mkdir -p "$WORK/$1"
    cat > "$WORK/$1/nginx.conf" <<EOF
daemon off;
worker_processes $2;
pid $WORK/$1/nginx.pid;
error_log $WORK/$1/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $WORK/$1;
    proxy_temp_path $WORK/$1;
    fastcgi_temp_path $WORK/$1;
    uwsgi_temp_path $WORK/$1;
    scgi_temp_path $WORK/$1;
    $3
}
EOF
}

#!/usr/bin/env bash
# The native module's cost against the article's script on one loopback
# redis-server (BENCHMARKS.md, "Native Redis module"): for the sliding window
# counter, the fixed window and the script, N fresh identities ("create")
# then the same again ("update"), through scripts/module-driver.py.
#
#   scripts/bench-module.sh callgrind MODULE.so PORT [replica]
#       instructions per call, load-independent: inclusive of Redis's call()
#       (callgrind_annotate --inclusive=yes) and of the whole server
#   scripts/bench-module.sh perf MODULE.so PORT [replica]
#       redis-server CPU time per call (perf stat -e task-clock -p)
#
# "replica": a second redis-server replicating from the first, online
# before the first call. N (default 10,000 for callgrind, 100,000 for perf).
set -euo pipefail
MODE=$1 SO=$2 PORT=$3 REPL=${4:-}
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$(mktemp -d)
case $MODE in
  callgrind) N=${N:-10000}
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$DIR/cg.out" \
      redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" \
      --loadmodule "$SO" >"$DIR/valgrind.log" 2>&1 &
    PID=$! ;;
  perf) N=${N:-100000}
    redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" \
      --loadmodule "$SO" --daemonize yes --logfile "$DIR/master.log" --pidfile "$DIR/master.pid"
    until [ -s "$DIR/master.pid" ]; do sleep 0.2; done
    PID=$(cat "$DIR/master.pid") ;;
  *) echo "usage: $0 callgrind|perf MODULE.so PORT [replica]" >&2; exit 64 ;;
esac
until redis-cli -p "$PORT" ping >/dev/null 2>&1; do sleep 0.5; done
if [ -n "$REPL" ]; then
  redis-server --port $((PORT + 1)) --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" \
    --replicaof 127.0.0.1 "$PORT" --daemonize yes --logfile "$DIR/replica.log"
  until redis-cli -p "$PORT" info replication | grep -q "slave0:.*online"; do sleep 0.5; done
fi
for kind in swc fw script; do
  for phase in create update; do
    if [ "$MODE" = callgrind ]; then
      callgrind_control -z "$PID" >/dev/null 2>&1
      callgrind_control -i on "$PID" >/dev/null 2>&1
      python3 "$HERE/module-driver.py" "$PORT" "$kind" "$N"
      callgrind_control -i off "$PID" >/dev/null 2>&1
      callgrind_control -d "$kind-$phase" "$PID" >/dev/null 2>&1
      out=$(grep -l "^desc: Trigger: dump $kind-$phase\$" "$DIR"/cg.out.*)
      total=$(grep -m1 "^totals:" "$out" | awk '{print $2}')
      call=$(callgrind_annotate --inclusive=yes "$out" | grep -m1 ':call \[' | awk '{gsub(",", "", $1); print $1}')
      echo "$kind $phase call() $((call / N)) whole-server $((total / N)) instructions per call"
    else
      perf stat -e task-clock -p "$PID" -x, -o "$DIR/$kind-$phase.csv" -- \
        python3 "$HERE/module-driver.py" "$PORT" "$kind" "$N"
      ms=$(grep task-clock "$DIR/$kind-$phase.csv" | cut -d, -f1)
      echo "$kind $phase $(python3 -c "print(round($ms * 1e6 / $N))") ns of server CPU per call"
    fi
  done
done
[ -n "$REPL" ] && redis-cli -p $((PORT + 1)) shutdown nosave >/dev/null 2>&1 || true
redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
wait 2>/dev/null || true
[ "$MODE" = callgrind ] && echo "profiles: $DIR/cg.out.*" || true

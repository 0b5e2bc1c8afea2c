#!/usr/bin/env bash
# make mooncake-failover: the same Mooncake client loop (tests/mooncakeloop,
# Mooncake's HA client build, given only etcd) putting while the serving
# master is stopped (SIGKILL, or SIGTERM with SIGNAL=TERM), against
# Mooncake's own HA pair (two mooncake_master with --enable_ha) and against
# three moonraft nodes at their default flags.
# Reports, per system: puts acknowledged and failed, the longest time
# without an acknowledged put (the loop waits out the put in flight at the
# kill, which Mooncake's client pool retries on the dead address for ~4 s),
# the longest time in which no fresh call (one started every 50 ms beside
# the loop) succeeded, and acknowledged puts not read back.
#   SECONDS_RUN=25 KILL_AT=5 SIGNAL=KILL MOONCAKE_DIR=../shared/mooncake
set -euo pipefail
cd "$(dirname "$0")/.."
MC="${MOONCAKE_DIR:-../shared/mooncake}"
RUN="${SECONDS_RUN:-25}"
KILL_AT="${KILL_AT:-5}"
SIGNAL="${SIGNAL:-KILL}"
BIN=./bin
dir=$(mktemp -d /tmp/mooncake-failover.XXXXXX)
pids=()
cleanup() {
  kill -KILL "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
gcc -O2 -pthread -o "$dir/loop" tests/mooncakeloop/loop.c -I"$MC/ha/include" -L"$MC/ha/lib" -lmooncake_store -Wl,-rpath,"$MC/ha/lib"

start_etcd() { # $1: client port
  "$BIN/moonraft" etcd --data-dir "$dir/etcd$1" --listen-client "http://127.0.0.1:$1" --listen-peer "http://127.0.0.1:$(($1 + 1))" \
    >"$dir/etcd$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do grep -q serving "$dir/etcd$1.log" 2>/dev/null && break; sleep 0.2; done
}

# run_loop NAME ETCD_PORT KILL_CMD: the loop for RUN seconds, KILL_CMD at KILL_AT.
run_loop() {
  echo "$1: client loop for ${RUN}s, SIG$SIGNAL to the serving master at ${KILL_AT}s" >&2
  stdbuf -oL "$dir/loop" "etcd://127.0.0.1:$2" "$RUN" >"$dir/$1.out" 2>"$dir/$1.err" &
  local lp=$!
  sleep "$KILL_AT"
  eval "$3"
  wait "$lp" || true
  read -r _ acked _ failed _ gap < <(grep '^acked' "$dir/$1.out")
  fresh=$(sed -n 's/^fresh_gap \([0-9]*\)$/\1/p' "$dir/$1.out")
  lost=$(sed -n 's/^lost \([0-9]*\)$/\1/p' "$dir/$1.out")
  printf "| %s | %s | %s | %s | %s | %s |\n" "$1" "$acked" "$failed" "$gap" "${fresh:-?}" "${lost:-?}" >>"$dir/table"
}

echo "Mooncake's HA pair" >&2
start_etcd 18579
for i in 0 1; do
  "$MC/ha/bin/mooncake_master" --enable_ha=true --enable_oplog=true --etcd_endpoints=127.0.0.1:18579 \
    --cluster_id=mooncake_cluster --rpc_address=127.0.0.1 --rpc_port=1855$i --metrics_host=127.0.0.1 \
    --metrics_port=1856$i --logtostderr >"$dir/mooncake$i.log" 2>&1 &
  pids+=($!)
  eval "mc$i=$!"
  sleep 3
done
# The first one started serves: kill it.
run_loop "Mooncake HA pair (3b5a594)" 18579 'kill -$SIGNAL $mc0'

echo "moonraft: three nodes at the default flags" >&2
start_etcd 18679
peers="n0=127.0.0.1:18600,n1=127.0.0.1:18601,n2=127.0.0.1:18602"
for i in 0 1 2; do
  "$BIN/moonraft" --id "n$i" --data-dir "$dir/n$i" --raft-addr "127.0.0.1:1860$i" --grpc-addr "127.0.0.1:1870$i" \
    --mooncake-addr "127.0.0.1:1880$i" --bootstrap --peers "$peers" --etcd-endpoints http://127.0.0.1:18679 \
    >"$dir/n$i.log" 2>&1 &
  pids+=($!)
  eval "mr$i=$!"
done
leader=""
for _ in $(seq 1 100); do
  leader=$("$BIN/moonctl" --endpoints 127.0.0.1:18700,127.0.0.1:18701,127.0.0.1:18702 --timeout 1s status 2>/dev/null |
    awk '$4 == "leader" {print $1}') || true
  [ -n "$leader" ] && break
  sleep 0.2
done
[ -n "$leader" ] || { echo "no leader" >&2; exit 1; }
sleep 1
run_loop "moonraft, 3 nodes" 18679 "kill -\$SIGNAL \$mr${leader#n}"

echo "| system | puts acknowledged | puts failed | longest time without an acknowledged put (ms) | longest time without a successful fresh call (ms) | acknowledged puts lost |"
echo "|---|---|---|---|---|---|"
cat "$dir/table"

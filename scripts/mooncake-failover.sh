#!/usr/bin/env bash
# make mooncake-failover: the same Mooncake client loop (tests/mooncakeloop,
# Mooncake's HA client build, given only etcd) putting while the serving
# master is stopped (SIGKILL, or SIGTERM with SIGNAL=TERM), against
# Mooncake's own HA pair (two mooncake_master with --enable_ha) and against
# three moonraft nodes at their default flags; then plain clients (the C
# loop built without etcd, and tests/mooncakepy/loop.py over Mooncake's
# Python module) given only haproxy's address in front of three moonraft
# nodes without etcd, the first server (the one they are connected to)
# being the leader that is stopped.
# Reports, per system: writes acknowledged and failed, the longest time
# without an acknowledged write (the C loop waits out the put in flight at
# the kill, which Mooncake's client pool retries on the dead address for
# ~4 s), the longest time in which no fresh call (one started every 50 ms
# beside the C loop) succeeded, and acknowledged writes not read back. The
# Python loop writes batches of eight 4-256 KiB blocks and counts blocks.
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
gcc -O2 -pthread -o "$dir/plainloop" tests/mooncakeloop/loop.c -I"$MC/include" -L"$MC/lib" -lmooncake_store -Wl,-rpath,"$MC/lib"
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)

start_etcd() { # $1: client port
  "$BIN/moonraft" etcd --data-dir "$dir/etcd$1" --listen-client "http://127.0.0.1:$1" --listen-peer "http://127.0.0.1:$(($1 + 1))" \
    >"$dir/etcd$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do grep -q serving "$dir/etcd$1.log" 2>/dev/null && break; sleep 0.2; done
}

# run_loop NAME MASTER KILL_CMD [LOOP...]: the loop (default: the HA C loop)
# given MASTER for RUN seconds, KILL_CMD at KILL_AT.
run_loop() {
  local name=$1 master=$2 killcmd=$3
  shift 3
  [ $# -gt 0 ] || set -- "$dir/loop"
  echo "$name: client loop for ${RUN}s, SIG$SIGNAL to the serving master at ${KILL_AT}s" >&2
  stdbuf -oL "$@" "$master" "$RUN" >"$dir/$name.out" 2>"$dir/$name.err" &
  local lp=$!
  sleep "$KILL_AT"
  eval "$killcmd"
  wait "$lp" || true
  if grep -q '^READY' "$dir/$name.out"; then # the Python loop
    read -r _ acked _ failed _ _ _ lost _ gap < <(grep '^acked' "$dir/$name.out")
    fresh="—"
  else
    read -r _ acked _ failed _ gap < <(grep '^acked' "$dir/$name.out")
    fresh=$(sed -n 's/^fresh_gap \([0-9]*\)$/\1/p' "$dir/$name.out")
    lost=$(sed -n 's/^lost \([0-9]*\)$/\1/p' "$dir/$name.out")
  fi
  printf "| %s | %s | %s | %s | %s | %s |\n" "$name" "$acked" "$failed" "$gap" "${fresh:-?}" "${lost:-?}" >>"$dir/table"
}

# start_moonraft BASE [FLAGS...]: three nodes on ports BASE+0..2 (Raft),
# +100 (gRPC), +200 (Mooncake), +300 (HTTP); sets $leader (n0..n2).
start_moonraft() {
  local base=$1
  shift
  local peers="n0=127.0.0.1:$base,n1=127.0.0.1:$((base + 1)),n2=127.0.0.1:$((base + 2))"
  for i in 0 1 2; do
    "$BIN/moonraft" --id "n$i" --data-dir "$dir/$base-n$i" --raft-addr "127.0.0.1:$((base + i))" \
      --grpc-addr "127.0.0.1:$((base + 100 + i))" --mooncake-addr "127.0.0.1:$((base + 200 + i))" \
      --http-addr "127.0.0.1:$((base + 300 + i))" --bootstrap --peers "$peers" "$@" >"$dir/$base-n$i.log" 2>&1 &
    pids+=($!)
    eval "mr$i=$!"
  done
  leader=""
  for _ in $(seq 1 100); do
    leader=$("$BIN/moonctl" --endpoints "127.0.0.1:$((base + 100)),127.0.0.1:$((base + 101)),127.0.0.1:$((base + 102))" \
      --timeout 1s status 2>/dev/null | awk '$4 == "leader" {print $1}') || true
    [ -n "$leader" ] && break
    sleep 0.2
  done
  [ -n "$leader" ] || { echo "no leader" >&2; exit 1; }
  sleep 1
}

# start_haproxy BASE PORT: haproxy on PORT in front of the Mooncake ports of
# start_moonraft BASE, the leader first (balance first: every connection
# goes to it while it is up), /readyz checks (docs/balancer/haproxy.cfg).
start_haproxy() {
  local base=$1 port=$2 l=${leader#n}
  {
    printf 'defaults\n  mode tcp\n  timeout connect 1s\n  timeout client 1h\n  timeout server 1h\n  retries 3\n  option redispatch\n'
    printf 'frontend mooncake\n  bind 127.0.0.1:%s\n  default_backend moonraft\n' "$port"
    printf 'backend moonraft\n  balance first\n  option httpchk GET /readyz\n  default-server inter 300ms fall 2 rise 2\n'
    for i in $l $(( (l + 1) % 3 )) $(( (l + 2) % 3 )); do
      printf '  server n%s 127.0.0.1:%s check port %s\n' "$i" "$((base + 200 + i))" "$((base + 300 + i))"
    done
  } >"$dir/haproxy-$port.cfg"
  "$HAPROXY" -db -f "$dir/haproxy-$port.cfg" >"$dir/haproxy-$port.log" 2>&1 &
  pids+=($!)
  sleep 1
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
run_loop "Mooncake HA pair (3b5a594)" etcd://127.0.0.1:18579 'kill -$SIGNAL $mc0'

echo "moonraft: three nodes at the default flags" >&2
start_etcd 18679
start_moonraft 18600 --etcd-endpoints http://127.0.0.1:18679
run_loop "moonraft, 3 nodes, HA client through etcd" etcd://127.0.0.1:18679 "kill -\$SIGNAL \$mr${leader#n}"

echo "moonraft without etcd behind haproxy: the plain C loop" >&2
start_moonraft 19000
start_haproxy 19000 19500
run_loop "moonraft behind haproxy, plain C client, no etcd" 127.0.0.1:19500 "kill -\$SIGNAL \$mr${leader#n}" "$dir/plainloop"

echo "moonraft without etcd behind haproxy: the Python loop" >&2
start_moonraft 20000
start_haproxy 20000 20500
PYTHONPATH="$MC/python" run_loop "moonraft behind haproxy, Python client (blocks), no etcd" 127.0.0.1:20500 \
  "kill -\$SIGNAL \$mr${leader#n}" /usr/bin/python3 tests/mooncakepy/loop.py

echo "| system | writes acknowledged | writes failed | longest time without an acknowledged write (ms) | longest time without a successful fresh call (ms) | acknowledged writes lost |"
echo "|---|---|---|---|---|---|"
cat "$dir/table"

#!/usr/bin/env bash
# make sustained: Mooncake's master_bench writing for minutes through the
# Mooncake protocol into three moonraft nodes at their default flags,
# exporting to an embedded etcd on the same machine: the load under which
# writes outpace etcd (docs/OPERATIONS.md, "When writes outpace etcd").
# moonbench --watch samples the leader's export every second beside it and
# draws the admitted rate, etcd's rate and the backlog. Prints master_bench's
# result, its failed calls, the leader changes and the backlog's peak.
# BENCH_ARGS go to master_bench as they are: --segment_size=16777216 caps its
# 512 segments at 8 GiB, about two million 4 KiB objects, so that a long run
# evicts instead of outgrowing the machine's memory. NODE_ARGS go to every
# node (--pprof, say: node i serves /debug/pprof/ at 127.0.0.1:1890i); BIN
# is where moonraft, moonctl and moonbench are (another build's, to compare).
#   DURATION=600 CLIENTS=4 OPERATION=BatchPut OUT=/tmp/sustained BENCH_ARGS= NODE_ARGS= BIN=./bin MOONCAKE_DIR=../shared/mooncake
set -euo pipefail
cd "$(dirname "$0")/.."
MC="${MOONCAKE_DIR:-../shared/mooncake}"
DURATION="${DURATION:-600}"
CLIENTS="${CLIENTS:-4}"
OPERATION="${OPERATION:-BatchPut}"
OUT="${OUT:-/tmp/sustained}"
BENCH_ARGS="${BENCH_ARGS:-}"
NODE_ARGS="${NODE_ARGS:-}"
BIN="${BIN:-./bin}"
mkdir -p "$OUT"
run=$(mktemp -d /tmp/sustained-run.XXXXXX)
pids=()
cleanup() {
  [ "${#pids[@]}" -gt 0 ] && { kill -TERM "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; }
  cp "$run"/*.log "$OUT/" 2>/dev/null || true
  rm -rf "$run"
}
trap cleanup EXIT

"$BIN/moonraft" etcd --data-dir "$run/etcd" --listen-client http://127.0.0.1:18579 --listen-peer http://127.0.0.1:18580 \
  >"$run/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do grep -q serving "$run/etcd.log" 2>/dev/null && break; sleep 0.2; done
peers="n0=127.0.0.1:18600,n1=127.0.0.1:18601,n2=127.0.0.1:18602"
endpoints="127.0.0.1:18700,127.0.0.1:18701,127.0.0.1:18702"
for i in 0 1 2; do
  "$BIN/moonraft" --id "n$i" --data-dir "$run/n$i" --raft-addr "127.0.0.1:1860$i" --grpc-addr "127.0.0.1:1870$i" \
    --mooncake-addr "127.0.0.1:1880$i" --http-addr "127.0.0.1:1890$i" --bootstrap --peers "$peers" \
    --etcd-endpoints http://127.0.0.1:18579 $NODE_ARGS >"$run/n$i.log" 2>&1 &
  pids+=($!)
done
leader=""
for _ in $(seq 1 100); do
  leader=$("$BIN/moonctl" --endpoints "$endpoints" --timeout 1s status 2>/dev/null | awk '$4 == "leader" {print $1}') || true
  [ -n "$leader" ] && break
  sleep 0.2
done
[ -n "$leader" ] || { echo "no leader after 20 s" >&2; exit 1; }

# The watch runs past master_bench's window: its clients unmount at the
# end, and the export drains after that.
"$BIN/moonbench" --endpoints "$endpoints" --watch "$((DURATION + 120))s" --json "$OUT/watch.json" --plot "$OUT/watch.svg" \
  >"$OUT/watch.txt" 2>&1 &
watcher=$!
echo "master_bench --operation=$OPERATION --num_clients=$CLIENTS --duration=$DURATION $BENCH_ARGS through n${leader#n}'s Mooncake address; the watch in $OUT/watch.txt" >&2
start=$(date +%s)
rc=0
"$MC/bin/master_bench" --master_server="127.0.0.1:1880${leader#n}" --operation="$OPERATION" --duration="$DURATION" \
  --num_clients="$CLIENTS" $BENCH_ARGS >"$OUT/master_bench.out" 2>&1 || rc=$?
echo "master_bench exited $rc after $(($(date +%s) - start)) s" >&2
wait "$watcher" || true
tail -1 "$OUT/watch.txt" >&2
grep -E "^Operations per second|Total operations" "$OUT/master_bench.out" >&2 || true
echo "failed calls reported by master_bench: $(grep -ciE 'fail|error' "$OUT/master_bench.out" || true)" >&2
"$BIN/moonctl" --endpoints "$endpoints" status >&2 || true
exit "$rc"

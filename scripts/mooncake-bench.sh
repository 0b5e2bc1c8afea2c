#!/usr/bin/env bash
# make mooncake-bench: Mooncake's own master_bench against the real
# mooncake_master (one process, nothing replicated) and against three
# moonraft nodes at their default flags (Raft on disk, OpLog exported to an
# embedded etcd), through the leader's --mooncake-addr; in one sitting, so
# the ratios compare like with like. Prints a Markdown table.
#   DURATION=10 CLIENTS="4 16" OPS="Put Get BatchPut BatchGet" MOONCAKE_DIR=../shared/mooncake
set -euo pipefail
cd "$(dirname "$0")/.."
MC="${MOONCAKE_DIR:-../shared/mooncake}"
DURATION="${DURATION:-10}"
CLIENTS="${CLIENTS:-4 16}"
OPS="${OPS:-Put Get BatchPut BatchGet}"
BIN=./bin
dir=$(mktemp -d /tmp/mooncake-bench.XXXXXX)
pids=()
cleanup() {
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

# bench SYSTEM ADDR: one master_bench run per operation and client count.
declare -A result
bench() {
  for op in $OPS; do
    for n in $CLIENTS; do
      echo "  $1 $op, $n clients, ${DURATION}s..." >&2
      out=$("$MC/bin/master_bench" --master_server="$2" --operation="$op" --duration="$DURATION" --num_clients="$n" 2>/dev/null)
      result[$1,$op,$n]=$(echo "$out" | sed -n 's/^Operations per second: //p')
    done
  done
}

echo "mooncake_master (3b5a594), unreplicated" >&2
"$MC/bin/mooncake_master" --rpc_port=17551 --rpc_address=127.0.0.1 --metrics_host=127.0.0.1 --metrics_port=17552 \
  --logtostderr >"$dir/mooncake_master.log" 2>&1 &
pids+=($!)
sleep 2
bench mooncake 127.0.0.1:17551
kill -TERM "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true; pids=()

echo "moonraft: three nodes at the default flags and an embedded etcd" >&2
"$BIN/moonraft" etcd --data-dir "$dir/etcd" --listen-client http://127.0.0.1:17579 --listen-peer http://127.0.0.1:17580 \
  >"$dir/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do grep -q serving "$dir/etcd.log" 2>/dev/null && break; sleep 0.2; done
peers="n0=127.0.0.1:17600,n1=127.0.0.1:17601,n2=127.0.0.1:17602"
for i in 0 1 2; do
  "$BIN/moonraft" --id "n$i" --data-dir "$dir/n$i" --raft-addr "127.0.0.1:1760$i" --grpc-addr "127.0.0.1:1770$i" \
    --mooncake-addr "127.0.0.1:1780$i" --bootstrap --peers "$peers" --etcd-endpoints http://127.0.0.1:17579 \
    >"$dir/n$i.log" 2>&1 &
  pids+=($!)
done
leader=""
for _ in $(seq 1 100); do
  leader=$("$BIN/moonctl" --endpoints 127.0.0.1:17700,127.0.0.1:17701,127.0.0.1:17702 --timeout 1s status 2>/dev/null |
    awk '$4 == "leader" {print $1}') || true
  [ -n "$leader" ] && break
  sleep 0.2
done
[ -n "$leader" ] || { echo "no leader" >&2; exit 1; }
bench moonraft "127.0.0.1:1780${leader#n}"

echo "| operation | clients | mooncake_master ops/s | moonraft ops/s | moonraft × |"
echo "|---|---|---|---|---|"
for op in $OPS; do
  for n in $CLIENTS; do
    m=${result[mooncake,$op,$n]:-0}; r=${result[moonraft,$op,$n]:-0}
    ratio=$(awk -v a="$r" -v b="$m" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
    printf "| %s | %s | %.0f | %.0f | %s |\n" "$op" "$n" "$m" "$r" "$ratio"
  done
done

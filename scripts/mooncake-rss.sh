#!/usr/bin/env bash
# mooncake_master's resident memory when it holds each of SIZES keys, for
# the scale tables (make scale; docs/BENCHMARKS.md): the real master on
# loopback, filled by its own master_bench (BatchPut of 4 KiB values, its
# defaults otherwise: 4 clients, batches of 128, 128 segments of 64 GiB, so
# nothing is evicted), whose key count is read from the master's metrics
# every half second; at each size its VmRSS from /proc, and when the
# largest is reached master_bench is killed (its unmounts would empty the
# master). Prints a Markdown table.
#   SIZES=1000000,3000000 MOONCAKE_DIR=../shared/mooncake
set -euo pipefail
cd "$(dirname "$0")/.."
MC="${MOONCAKE_DIR:-../shared/mooncake}"
SIZES="${SIZES:-1000000,3000000}"
dir=$(mktemp -d /tmp/mooncake-rss.XXXXXX)
pids=()
cleanup() {
  [ "${#pids[@]}" -gt 0 ] && { kill -KILL "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; }
  rm -rf "$dir"
}
trap cleanup EXIT

"$MC/bin/mooncake_master" --rpc_port=50151 --rpc_address=127.0.0.1 --metrics_host=127.0.0.1 --metrics_port=9103 \
  --logtostderr >"$dir/master.log" 2>&1 &
master=$!
pids+=("$master")
for _ in $(seq 1 100); do curl -sf http://127.0.0.1:9103/metrics >/dev/null && break; sleep 0.1; done
keys() { curl -sf http://127.0.0.1:9103/metrics | awk '$1 == "master_key_count" {printf "%.0f", $2}'; }
[ -n "$(keys)" ] || { echo "mooncake_master serves no master_key_count metric" >&2; exit 1; }

"$MC/bin/master_bench" --master_server=127.0.0.1:50151 --operation=BatchPut --duration=3600 >"$dir/bench.log" 2>&1 &
pids+=($!)
start=$(date +%s)
echo "| keys | mooncake_master RSS | per key | filled after |"
echo "|---|---|---|---|"
for size in ${SIZES//,/ }; do
  for i in $(seq 1 100000); do
    n=$(keys)
    [ "${n:-0}" -ge "$size" ] && break
    kill -0 "${pids[1]}" 2>/dev/null || { echo "master_bench ended before $size keys:" >&2; tail -5 "$dir/bench.log" >&2; exit 1; }
    [ $((i % 20)) -eq 0 ] && echo "filling mooncake_master to $size: ${n:-0} keys" >&2
    sleep 0.5
  done
  # kB to bytes in bash: mawk's printf %d stops at 2^31-1 (2,147 MB).
  rss=$(( $(awk '/^VmRSS/ {print $2}' "/proc/$master/status") * 1024 ))
  echo "| $n | $((rss / 1000000)) MB | $((rss / n)) B | $(($(date +%s) - start)) s |"
done

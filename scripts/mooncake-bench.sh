#!/usr/bin/env bash
# make mooncake-bench: Mooncake's own master_bench against the real
# mooncake_master (one process, nothing replicated) and against three
# moonraft nodes at their default flags (Raft on disk, OpLog exported to an
# embedded etcd), through the leader's --mooncake-addr; in one sitting, so
# the ratios compare like with like. Prints a Markdown table. Each run has
# master_bench's own default window, 60 s (about 25 minutes in all):
# master_bench prefills its keys just before the window of a read, and
# moonraft's export of them to etcd shares the window's first seconds on
# the same cores; a shorter DURATION weighs that more.
#   DURATION=60 CLIENTS="4 16" OPS="Put Get BatchPut BatchGet" MOONCAKE_DIR=../shared/mooncake
set -euo pipefail
cd "$(dirname "$0")/.."
MC="${MOONCAKE_DIR:-../shared/mooncake}"
DURATION="${DURATION:-60}"
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

# settle ENDPOINTS: wait until the last master_bench client's segments are
# gone from moonraft and the leader has exported everything to etcd, so a
# run does not pay for the last one's cleanup. master_bench stops pinging
# before it unmounts its 128 segments one by one; each unmount drops its
# objects through Raft, so the last ones can outlive the client's session
# and still be mounted when the next run mounts segments of the same names
# (SEGMENT_ALREADY_EXISTS). A failed status (a busy leader past the
# timeout) proves nothing. A 60 s BatchPut leaves ~2 million objects to
# drop and export: the wait is bounded by ten times the window.
settle() {
  local out bound=$((DURATION * 10 > 120 ? DURATION * 10 : 120)) told=""
  local deadline=$((SECONDS + bound))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if out=$("$BIN/moonctl" --endpoints "$1" --timeout 2s segment status 2>/dev/null) && ! grep -q segment_client <<<"$out" &&
      "$BIN/moonctl" --endpoints "$1" --timeout 2s --json status 2>/dev/null | awk -F': ' '
        /"role"/ { role = $2 } /"applied_seq"/ { applied = $2 + 0 }
        /"exported_seq"/ { if (role ~ /leader/ && applied == $2 + 0) done = 1 }
        END { exit !done }'; then
      return
    fi
    if [ -z "$told" ] && [ "$((deadline - SECONDS))" -lt "$((bound - 10))" ]; then
      echo "    waiting for the last run's objects to be dropped and exported (up to ${bound}s)..." >&2
      told=1
    fi
    sleep 0.2
  done
  echo "the last run's segments still mounted, or its OpLog not exported, after ${bound}s" >&2
  exit 1
}

# quiet: wait (up to 60 s) until the masters' processes use under 15 % of a
# core over a second, so a run does not share the machine with the last
# one's background work (snapshots, etcd's OpLog cleanup and compaction).
quiet() {
  local before after p
  for _ in $(seq 1 60); do
    before=0; after=0
    for p in "${pids[@]}"; do before=$((before + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
    sleep 1
    for p in "${pids[@]}"; do after=$((after + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
    [ $((after - before)) -lt "$(($(getconf CLK_TCK) * 15 / 100))" ] && return
  done
  echo "  (the masters were still busy after 60 s; going on)" >&2
}

# bench SYSTEM ADDR [ENDPOINTS]: one master_bench run per operation and
# client count, each after the last one's work is done (with ENDPOINTS,
# its segments gone and its OpLog exported; for both, the processes quiet).
declare -A result
bench() {
  for op in $OPS; do
    for n in $CLIENTS; do
      echo "  $1 $op, $n clients, ${DURATION}s..." >&2
      if ! "$MC/bin/master_bench" --master_server="$2" --operation="$op" --duration="$DURATION" --num_clients="$n" \
        >"$dir/bench.out" 2>&1; then
        echo "master_bench $op against $1 failed; its last lines:" >&2
        tail -20 "$dir/bench.out" >&2
        exit 1
      fi
      result[$1,$op,$n]=$(sed -n 's/^Operations per second: //p' "$dir/bench.out")
      echo "    ${result[$1,$op,$n]} ops/s" >&2
      [ -z "${3:-}" ] || settle "$3"
      quiet
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
bench moonraft "127.0.0.1:1780${leader#n}" 127.0.0.1:17700,127.0.0.1:17701,127.0.0.1:17702

echo "| operation | clients | mooncake_master ops/s | moonraft ops/s | moonraft × |"
echo "|---|---|---|---|---|"
for op in $OPS; do
  for n in $CLIENTS; do
    m=${result[mooncake,$op,$n]:-0}; r=${result[moonraft,$op,$n]:-0}
    ratio=$(awk -v a="$r" -v b="$m" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
    printf "| %s | %s | %.0f | %.0f | %s |\n" "$op" "$n" "$m" "$r" "$ratio"
  done
done

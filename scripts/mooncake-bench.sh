#!/usr/bin/env bash
# make mooncake-bench: Mooncake's own master_bench against the real
# mooncake_master (one process, nothing replicated) and against three
# moonraft nodes at their default flags (Raft on disk, OpLog exported to an
# embedded etcd), through the leader's --mooncake-addr; in one sitting, so
# the ratios compare like with like. Prints a Markdown table.
#
# The two systems take turns cell by cell (operation × clients): ROUNDS
# rounds of one run each, the first system alternating between rounds, each
# run on freshly started servers with empty data directories, so a run pays
# neither for the last run's cleanup nor for minutes of drift between the
# two systems' runs of the same cell (this shared machine moves by a fifth
# within the hour). The table gives each system's median over the rounds,
# the ratio of the medians, and every round. A run that master_bench ends
# with an error is listed as "failed", left out of the median, and its logs
# are kept in /tmp; the sitting goes on.
#
# Each run has master_bench's own default window, 60 s (with ROUNDS=3 about
# 70 minutes in all): master_bench prefills its keys just before the window
# of a read, and moonraft's export of them to etcd shares the window's first
# seconds on the same cores; a shorter DURATION weighs that more.
#   DURATION=60 ROUNDS=3 CLIENTS="4 16" OPS="Put Get BatchPut BatchGet" MOONCAKE_DIR=../shared/mooncake
set -euo pipefail
cd "$(dirname "$0")/.."
MC="${MOONCAKE_DIR:-../shared/mooncake}"
DURATION="${DURATION:-60}"
ROUNDS="${ROUNDS:-3}"
CLIENTS="${CLIENTS:-4 16}"
OPS="${OPS:-Put Get BatchPut BatchGet}"
BIN=./bin
dir=$(mktemp -d /tmp/mooncake-bench.XXXXXX)
pids=()
stop() {
  [ "${#pids[@]}" -eq 0 ] && return
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  pids=()
}
cleanup() {
  stop
  rm -rf "$dir"
}
trap cleanup EXIT

# quiet: wait (up to 60 s) until the whole machine is under 15 % of a core
# busy over a second (steal not counted: that is the host's), so a run does
# not share the cores with the last one's exit (its data directory written
# back and removed).
quiet() {
  local a b
  for _ in $(seq 1 60); do
    a=($(head -1 /proc/stat)); sleep 1; b=($(head -1 /proc/stat))
    # user nice system idle iowait irq softirq steal
    local busy=$(((b[1] + b[2] + b[3] + b[6] + b[7]) - (a[1] + a[2] + a[3] + a[6] + a[7])))
    [ "$busy" -lt "$(($(getconf CLK_TCK) * 15 / 100))" ] && return
  done
  echo "  (the machine was still busy after 60 s; going on)" >&2
}

# start_mooncake and start_moonraft start a system on empty state and set
# addr to the address master_bench is given.
start_mooncake() {
  "$MC/bin/mooncake_master" --rpc_port=17551 --rpc_address=127.0.0.1 --metrics_host=127.0.0.1 --metrics_port=17552 \
    --logtostderr >"$dir/mooncake_master.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do ss -ltn | grep -q ':17551 ' && break; sleep 0.1; done
  addr=127.0.0.1:17551
}

start_moonraft() {
  local run="$dir/run" leader=""
  rm -rf "$run"; mkdir -p "$run"
  "$BIN/moonraft" etcd --data-dir "$run/etcd" --listen-client http://127.0.0.1:17579 --listen-peer http://127.0.0.1:17580 \
    >"$run/etcd.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do grep -q serving "$run/etcd.log" 2>/dev/null && break; sleep 0.2; done
  local peers="n0=127.0.0.1:17600,n1=127.0.0.1:17601,n2=127.0.0.1:17602"
  for i in 0 1 2; do
    "$BIN/moonraft" --id "n$i" --data-dir "$run/n$i" --raft-addr "127.0.0.1:1760$i" --grpc-addr "127.0.0.1:1770$i" \
      --mooncake-addr "127.0.0.1:1780$i" --bootstrap --peers "$peers" --etcd-endpoints http://127.0.0.1:17579 \
      >"$run/n$i.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 1 100); do
    leader=$("$BIN/moonctl" --endpoints 127.0.0.1:17700,127.0.0.1:17701,127.0.0.1:17702 --timeout 1s status 2>/dev/null |
      awk '$4 == "leader" {print $1}') || true
    [ -n "$leader" ] && break
    sleep 0.2
  done
  [ -n "$leader" ] || { echo "moonraft: no leader after 20 s; the nodes' last lines:" >&2; tail -5 "$run"/n?.log >&2; exit 1; }
  addr="127.0.0.1:1780${leader#n}"
}

# run SYSTEM OP N: one master_bench run on a fresh SYSTEM; sets ops to its
# ops/s.
run() {
  quiet
  "start_$1"
  echo "  $1 $2, $3 clients, ${DURATION}s..." >&2
  if ! "$MC/bin/master_bench" --master_server="$addr" --operation="$2" --duration="$DURATION" --num_clients="$3" \
    >"$dir/bench.out" 2>&1; then
    stop
    # Kept for a look at why: the run's servers' logs and master_bench's.
    local kept
    kept=$(mktemp -d "/tmp/mooncake-bench-failed-$1-$2-$3.XXXXXX")
    cp "$dir/bench.out" "$kept/"
    [ "$1" = moonraft ] && cp "$dir"/run/*.log "$kept/" || cp "$dir/mooncake_master.log" "$kept/"
    echo "    master_bench $2 against $1 failed ($(grep -m1 -E 'what\(\)|ERROR' "$dir/bench.out" || tail -1 "$dir/bench.out")); logs kept in $kept" >&2
    ops=failed
    return
  fi
  stop
  ops=$(sed -n 's/^Operations per second: //p' "$dir/bench.out")
  echo "    ${ops} ops/s" >&2
}

median() { tr ' ' '\n' | awk NF | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "mooncake_master (3b5a594, unreplicated) and moonraft (three nodes at the default flags, an embedded etcd):" \
  "$ROUNDS round(s) a cell, taking turns" >&2
declare -A result
for op in $OPS; do
  for n in $CLIENTS; do
    for r in $(seq 1 "$ROUNDS"); do
      order="mooncake moonraft"
      [ $((r % 2)) -eq 0 ] && order="moonraft mooncake"
      for sys in $order; do
        run "$sys" "$op" "$n"
        [ "$ops" = failed ] || ops=$(printf '%.0f' "$ops")
        result[$sys,$op,$n]="${result[$sys,$op,$n]:-} $ops"
      done
    done
  done
done

echo "| operation | clients | mooncake_master ops/s (median) | moonraft ops/s (median) | moonraft × | rounds, mooncake_master | rounds, moonraft |"
echo "|---|---|---|---|---|---|---|"
for op in $OPS; do
  for n in $CLIENTS; do
    m=$(median <<<"${result[mooncake,$op,$n]//failed/}"); r=$(median <<<"${result[moonraft,$op,$n]//failed/}")
    ratio=$(awk -v a="$r" -v b="$m" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
    printf "| %s | %s | %.0f | %.0f | %s |%s |%s |\n" "$op" "$n" "$m" "$r" "$ratio" "${result[mooncake,$op,$n]}" "${result[moonraft,$op,$n]}"
  done
done

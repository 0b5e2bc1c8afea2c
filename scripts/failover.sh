#!/usr/bin/env bash
# make failover [KILLS=10]: the black-box failover at the default flags, as a
# user would time it. Three nodes (every Raft flag at its default) and an
# etcd on loopback; then, KILLS times: SIGKILL the leader, run a fresh
# `moonctl put` (a new process: dial, find the leader, write) until one
# succeeds, print the time from the kill, restart the killed node and let
# it catch up. Ends with the median and the maximum. Data in a temp dir,
# removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${BIN:-./bin}" # another build's, to compare
KILLS=${KILLS:-10}
DIR=$(mktemp -d /tmp/moonraft-failover-XXXXXX)
PEERS="n0=127.0.0.1:7520,n1=127.0.0.1:7521,n2=127.0.0.1:7522"
ENDPOINTS=127.0.0.1:7510,127.0.0.1:7511,127.0.0.1:7512
declare -A pid
etcd_pid=""
cleanup() {
  kill -TERM "${pid[@]}" "$etcd_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT
ctl() { "$BIN/moonctl" --endpoints "$ENDPOINTS" "$@"; }
start_node() {
  local i=$1
  # --client-ttl only keeps the script's client session alive without pings.
  "$BIN/moonraft" --id "n$i" --data-dir "$DIR/n$i" --raft-addr "127.0.0.1:752$i" --grpc-addr "127.0.0.1:751$i" \
    --bootstrap --peers "$PEERS" --etcd-endpoints http://127.0.0.1:2479 --client-ttl 1h \
    >>"$DIR/n$i.log" 2>&1 &
  pid[$i]=$!
}
leader() { ctl --timeout 1s status 2>/dev/null | awk '$4 == "leader" { print substr($1, 2) }'; }
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

"$BIN/moonraft" etcd --data-dir "$DIR/etcd" --listen-client http://127.0.0.1:2479 --listen-peer http://127.0.0.1:2480 >"$DIR/etcd.log" 2>&1 &
etcd_pid=$!
for i in 0 1 2; do start_node "$i"; done
for _ in $(seq 1 150); do [ -n "$(leader)" ] && break; sleep 0.2; done
ctl mount --client fo --segment fo-seg --size 1073741824 >/dev/null
gaps=()
for k in $(seq 1 "$KILLS"); do
  sleep 2
  l=$(leader)
  if [ -z "$l" ]; then echo "no leader before kill $k" >&2; exit 1; fi
  t0=$(date +%s%N)
  kill -KILL "${pid[$l]}"
  wait "${pid[$l]}" 2>/dev/null || true
  until ctl --timeout 2s put "fo-$k" --size 4096 --client fo >/dev/null 2>&1; do :; done
  gap=$(ms "$t0")
  gaps+=("$gap")
  echo "kill $k/$KILLS: n$l killed, a fresh moonctl put succeeded after $gap ms"
  start_node "$l"
  # Caught up: all three answer with the same applied OpLog seq.
  for _ in $(seq 1 150); do
    seqs=$(ctl --timeout 1s status 2>/dev/null | awk 'NR > 1 { print $(NF-4) }')
    [ "$(echo "$seqs" | wc -l)" = 3 ] && [ "$(echo "$seqs" | sort -u | wc -l)" = 1 ] && break
    sleep 0.2
  done
done
sorted=$(printf '%s\n' "${gaps[@]}" | sort -n)
n=${#gaps[@]}
echo "failover at the default flags, $n kills: p50 $(echo "$sorted" | sed -n "$(( (n + 1) / 2 ))p") ms, max $(echo "$sorted" | tail -1) ms (all: ${gaps[*]})"

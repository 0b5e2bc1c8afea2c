#!/usr/bin/env bash
# make run: an embedded etcd (127.0.0.1:2379) and three moonraft nodes on
# 127.0.0.1 (gRPC 7100-7102, Raft 7200-7202, HTTP 7300-7302, the Mooncake
# protocol 50051-50053) exporting their OpLog to it; data under ./run/.
# Ctrl-C, SIGTERM or SIGHUP stops them cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=./bin
PEERS="n0=127.0.0.1:7200,n1=127.0.0.1:7201,n2=127.0.0.1:7202"
mkdir -p run
pids=()
etcd_pid=""
stop() {
  trap - INT TERM HUP
  echo
  echo "stopping..."
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  if [ -n "$etcd_pid" ]; then
    kill -TERM "$etcd_pid" 2>/dev/null || true
    wait "$etcd_pid" 2>/dev/null || true
  fi
  echo "stopped; data is kept in ./run/ (make clean removes it)"
  exit 0
}
trap stop INT TERM HUP
"$BIN/moonraft" etcd --data-dir run/etcd --listen-client http://127.0.0.1:2379 --listen-peer http://127.0.0.1:2380 \
  >run/etcd.log 2>&1 &
etcd_pid=$!
for _ in $(seq 1 100); do
  grep -q "serving" run/etcd.log 2>/dev/null && break
  sleep 0.2
done
for i in 0 1 2; do
  "$BIN/moonraft" --id "n$i" --data-dir "run/n$i" \
    --raft-addr "127.0.0.1:720$i" --grpc-addr "127.0.0.1:710$i" --http-addr "127.0.0.1:730$i" \
    --mooncake-addr "127.0.0.1:5005$((i + 1))" \
    --bootstrap --peers "$PEERS" --heartbeat-timeout 300ms --election-timeout 300ms \
    --etcd-endpoints http://127.0.0.1:2379 \
    >"run/n$i.log" 2>&1 &
  pids+=($!)
done
ENDPOINTS=127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102
printf "waiting for a leader"
for _ in $(seq 1 100); do
  if "$BIN/moonctl" --endpoints "$ENDPOINTS" --timeout 1s status 2>/dev/null | grep -q '  leader  '; then
    break
  fi
  printf "."
  sleep 0.2
done
echo
"$BIN/moonctl" --endpoints "$ENDPOINTS" status
cat <<MSG

moonraft is running: gRPC $ENDPOINTS, etcd http://127.0.0.1:2379, logs in run/*.log.
Unmodified Mooncake clients: 127.0.0.1:50051 (any of 50051-50053), or etcd://127.0.0.1:2379 for HA clients.
Try:
  bin/moonctl --endpoints $ENDPOINTS mount --client c1 --segment seg1 --size 1073741824
  bin/moonctl --endpoints $ENDPOINTS put hello --size 4096 --replicas 1 --client c1
  bin/moonctl --endpoints $ENDPOINTS get hello
  bin/moonctl --endpoints $ENDPOINTS ls
  bin/moonctl --endpoints $ENDPOINTS leader transfer
  bin/moonctl --endpoints $ENDPOINTS status
  bin/moonctl oplog tail
Ctrl-C stops every node.
MSG
# make does not pass SIGHUP on to its recipe: stop as well once the process
# that started us is gone.
parent=$PPID
while kill -0 "$parent" 2>/dev/null; do
  sleep 1 &
  wait $! || true
done
stop

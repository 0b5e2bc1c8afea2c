#!/usr/bin/env python3
"""A KV-cache-shaped loop over Mooncake's Python store module (mooncake.store),
through the calls vLLM's and SGLang's Mooncake connectors make: batches of
blocks written from a registered buffer (batch_put_from), checked
(batch_is_exist) and read back into one (batch_get_into), and removed
(remove, batch_remove).

Usage: loop.py MASTER SECONDS

Prints READY once set up, then writes batches of 4-256 KiB blocks for
SECONDS, removing the oldest batches to stay well under its 1 GiB segment (a
cache that evicts what it no longer needs; a new leader's lease floor holds
every object for a lease's time, so the segment leaves room for that). Then it reads back every acknowledged
block it kept and prints "acked A failed F checked C lost L longest_gap_ms G"
and PY LOOP OK when every block read back is the block written. G is the
longest time between two fully acknowledged batches, the end included.
"""
import ctypes
import os
import random
import sys
import time
from collections import deque

from mooncake.store import MooncakeDistributedStore

BLOCKS = 8  # a batch
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10]
KEEP = 64 << 20  # acknowledged bytes kept before the oldest batch is removed


def content(seed, size):
    return random.Random(seed).randbytes(size)


def main():
    master, seconds = sys.argv[1], float(sys.argv[2])
    store = MooncakeDistributedStore()
    # setup(local_hostname, metadata_server, global_segment_size,
    #       local_buffer_size, protocol, rdma_devices, master_server_addr)
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 1 << 30, 64 << 20, "tcp", "", master)
    if rc != 0:
        print(f"setup rc={rc}", flush=True)
        return 2
    span = BLOCKS * max(SIZES)
    src = ctypes.create_string_buffer(span)
    dst = ctypes.create_string_buffer(span)
    sa, da = ctypes.addressof(src), ctypes.addressof(dst)
    if store.register_buffer(sa, span) != 0 or store.register_buffer(da, span) != 0:
        print("register_buffer failed", flush=True)
        return 2
    print("READY", flush=True)

    rng = random.Random(os.getpid())
    acked = {}  # key -> (size, seed)
    batches = deque()  # acknowledged keys by batch, oldest first
    kept = total = failed = 0
    codes = set()  # of the failed puts
    start = last_ok = time.monotonic()
    gap = 0.0
    i = 0
    while time.monotonic() - start < seconds:
        keys = [f"kv-{os.getpid()}-{i}-{b}" for b in range(BLOCKS)]
        sizes = [rng.choice(SIZES) for _ in keys]
        seeds = [rng.getrandbits(63) for _ in keys]
        for b, (size, seed) in enumerate(zip(sizes, seeds)):
            ctypes.memmove(sa + b * max(SIZES), content(seed, size), size)
        rcs = store.batch_put_from(keys, [sa + b * max(SIZES) for b in range(BLOCKS)], sizes)
        ok = [k for k, rc in zip(keys, rcs) if rc == 0]
        codes.update(rc for rc in rcs if rc != 0)
        total += len(ok)
        failed += len(keys) - len(ok)
        if len(ok) == len(keys):
            now = time.monotonic()
            gap, last_ok = max(gap, now - last_ok), now
        for k, size, seed, rc in zip(keys, sizes, seeds, rcs):
            if rc == 0:
                acked[k] = (size, seed)
                kept += size
        batches.append(ok)
        while kept > KEEP:
            old = batches.popleft()
            if old:  # one key by remove, the rest by batch_remove
                store.remove(old[0])
                store.batch_remove(old[1:], force=False)
            for k in old:
                # Removed or not (an unknown outcome across a failover), the
                # block is no longer checked.
                kept -= acked.pop(k)[0]
        i += 1
    gap = max(gap, time.monotonic() - last_ok)

    lost = 0
    keys = list(acked)
    for at in range(0, len(keys), BLOCKS):
        chunk = keys[at:at + BLOCKS]
        exist = store.batch_is_exist(chunk)
        sizes = [acked[k][0] for k in chunk]
        ns = store.batch_get_into(chunk, [da + b * max(SIZES) for b in range(len(chunk))], sizes)
        for b, k in enumerate(chunk):
            size, seed = acked[k]
            got = ctypes.string_at(da + b * max(SIZES), size)
            if exist[b] != 1 or ns[b] != size or got != content(seed, size):
                lost += 1
                print(f"lost {k}: exist={exist[b]} read={ns[b]} of {size}", flush=True)
    rcs = store.batch_remove(keys, force=True)
    if any(rc != 0 for rc in rcs):
        print(f"batch_remove of the checked blocks: {sorted(set(rcs))}", flush=True)
    print(f"acked {total} failed {failed} checked {len(keys)} lost {lost} longest_gap_ms {int(gap * 1000)}", flush=True)
    if codes:
        print(f"failed with {sorted(codes)}", flush=True)
    store.close()
    print("PY LOOP OK" if lost == 0 else "PY LOOP FAIL", flush=True)
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

/* A long-lived Mooncake client for moonraft's failover test, over the store's
 * C API (Mooncake 3b5a594, store_c.h): it puts key i with a value naming i for
 * DURATION seconds, one after the other, remembering which puts were
 * acknowledged, then reads every acknowledged key back through the transfer
 * engine and checks its bytes. Prints "acked N failed F gap MS" (gap: the
 * longest time between two acknowledged puts, the service's outage as this
 * client saw it), then "lost K" and "LOOP OK" or "LOOP FAIL". Usage: loop MASTER SECONDS (MASTER: host:port,
 * or etcd://host:port for the HA build). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include "store_c.h"

#define MAX_KEYS 200000

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: loop MASTER SECONDS\n"); return 2; }
    double seconds = atof(argv[2]);
    mooncake_store_t s = mooncake_store_create();
    if (!s) { fprintf(stderr, "create failed\n"); return 1; }
    if (mooncake_store_setup(s, "127.0.0.1", "P2PHANDSHAKE", 256ull << 20, 16ull << 20, "tcp", "", argv[1])) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    static char acked[MAX_KEYS];
    mooncake_replicate_config_t cfg = {1, 0, 0, NULL, 0};
    char key[64], val[64], got[64];
    long n = 0, nacked = 0, failed = 0;
    double end = now() + seconds, last = now(), gap = 0;
    while (now() < end && n < MAX_KEYS) {
        snprintf(key, sizeof key, "loop-%ld", n);
        snprintf(val, sizeof val, "value of key %ld", n);
        if (mooncake_store_put(s, key, val, strlen(val) + 1, &cfg) == 0) {
            acked[n] = 1;
            nacked++;
            if (now() - last > gap) gap = now() - last;
            last = now();
        } else {
            failed++;
        }
        n++;
    }
    printf("acked %ld failed %ld gap %.0f\n", nacked, failed, gap * 1000);
    fflush(stdout);
    mooncake_store_register_buffer(s, got, sizeof got);
    long lost = 0;
    for (long i = 0; i < n; i++) {
        if (!acked[i]) continue;
        snprintf(key, sizeof key, "loop-%ld", i);
        snprintf(val, sizeof val, "value of key %ld", i);
        memset(got, 0, sizeof got);
        int64_t r = mooncake_store_get_into(s, key, got, sizeof got);
        if (r <= 0 || strcmp(got, val) != 0) {
            if (lost < 10) printf("lost %s (%lld)\n", key, (long long)r);
            lost++;
        }
    }
    printf("lost %ld\n%s\n", lost, lost == 0 && nacked > 0 ? "LOOP OK" : "LOOP FAIL");
    fflush(stdout);
    mooncake_store_unregister_buffer(s, got);
    /* _exit: the HA client's teardown waits out its leader monitor's 30 s
     * watch, which tests nothing of the master. */
    _exit(lost == 0 && nacked > 0 ? 0 : 3);
}

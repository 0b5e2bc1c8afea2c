/* A long-lived Mooncake client for moonraft's failover test, over the store's
 * C API (Mooncake 3b5a594, store_c.h): it puts key i with a value naming i for
 * DURATION seconds, one after the other, remembering which puts were
 * acknowledged, then reads every acknowledged key back through the transfer
 * engine and checks its bytes. Prints "acked N failed F gap MS" (gap: the
 * longest time between two acknowledged puts, the service's outage as this
 * loop saw it), "fresh_gap MS" (below), then "lost K" and "LOOP OK" or
 * "LOOP FAIL". Usage: loop MASTER SECONDS (MASTER: host:port, or
 * etcd://host:port for the HA build).
 *
 * A call in flight when its master dies is retried by Mooncake's client pool
 * on the dead address (yalantinglibs' client_pool: four connects, each
 * followed by a 1.0-1.2 s wait) whatever the new master does, and the put
 * loop waits for it. So beside the loop, a fresh call (an ExistKey on a thread
 * of its own) starts every 50 ms, as other threads of a real client would
 * call; fresh_gap is the longest time in which none of them succeeded: the
 * outage a call made after the failure sees. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
#include "store_c.h"

#define MAX_KEYS 200000

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The fresh calls' successes, in the order they were recorded. */
static pthread_mutex_t fresh_mu = PTHREAD_MUTEX_INITIALIZER;
static double fresh_last, fresh_gap;

static void *fresh_call(void *store) {
    if (mooncake_store_is_exist(store, "loop-0") < 0) return NULL;
    pthread_mutex_lock(&fresh_mu);
    double t = now();
    if (t - fresh_last > fresh_gap) fresh_gap = t - fresh_last;
    fresh_last = t;
    pthread_mutex_unlock(&fresh_mu);
    return NULL;
}

struct starter { mooncake_store_t s; double end; };

/* start_fresh_calls starts one fresh call every 50 ms until end; a call
 * stuck on a dead master does not delay the next. */
static void *start_fresh_calls(void *arg) {
    struct starter *st = arg;
    pthread_attr_t detached;
    pthread_attr_init(&detached);
    pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
    while (now() < st->end) {
        pthread_t t;
        pthread_create(&t, &detached, fresh_call, st->s);
        usleep(50000);
    }
    return NULL;
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
    fresh_last = now();
    struct starter st = {s, end};
    pthread_t starter;
    pthread_create(&starter, NULL, start_fresh_calls, &st);
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
    /* An outage that lasts to the end counts too. */
    if (now() - last > gap) gap = now() - last;
    pthread_join(starter, NULL);
    pthread_mutex_lock(&fresh_mu);
    if (now() - fresh_last > fresh_gap) fresh_gap = now() - fresh_last;
    printf("acked %ld failed %ld gap %.0f\nfresh_gap %.0f\n", nacked, failed, gap * 1000, fresh_gap * 1000);
    pthread_mutex_unlock(&fresh_mu);
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

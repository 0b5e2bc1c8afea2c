/* The calls of Mooncake's C API (store_c.h) that store_c_smoke and
 * master_bench do not make, for `make mooncake-golden`: BatchExistKey,
 * RemoveByRegex and RemoveAll, each once with something to find and once
 * with nothing. Prints CALLS OK when every answer is what the master of
 * 3b5a594 gives. */
#include <stdio.h>
#include <string.h>
#include "store_c.h"

int main(int argc, char **argv) {
    const char *master = argc > 1 ? argv[1] : "127.0.0.1:50051";
    mooncake_store_t s = mooncake_store_create();
    if (!s || mooncake_store_setup(s, "127.0.0.1", "P2PHANDSHAKE", 64ull << 20,
                                   16ull << 20, "tcp", "", master) != 0) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    mooncake_replicate_config_t cfg = {1, 0, 0, NULL, 0};
    const char *keys[] = {"calls/a", "calls/b", "calls/none"};
    const char *val = "value";
    for (int i = 0; i < 2; i++) {
        if (mooncake_store_put(s, keys[i], val, strlen(val) + 1, &cfg) != 0) {
            fprintf(stderr, "put %s failed\n", keys[i]);
            return 2;
        }
    }
    int found[3] = {-1, -1, -1};
    int rc = mooncake_store_batch_is_exist(s, keys, 3, found);
    printf("batch_is_exist rc=%d found=%d,%d,%d\n", rc, found[0], found[1], found[2]);
    int ok = rc == 0 && found[0] == 1 && found[1] == 1 && found[2] == 0;
    int64_t n = mooncake_store_remove_by_regex(s, "^calls/a$", 1);
    printf("remove_by_regex removed=%lld\n", (long long)n);
    ok = ok && n == 1;
    n = mooncake_store_remove_by_regex(s, "^nothing/", 1);
    printf("remove_by_regex (no match) removed=%lld\n", (long long)n);
    ok = ok && n == 0;
    n = mooncake_store_remove_all(s, 1);
    printf("remove_all removed=%lld\n", (long long)n);
    ok = ok && n == 1;
    n = mooncake_store_remove_all(s, 1);
    printf("remove_all (empty) removed=%lld\n", (long long)n);
    ok = ok && n == 0;
    mooncake_store_destroy(s);
    printf(ok ? "CALLS OK\n" : "CALLS FAIL\n");
    return ok ? 0 : 3;
}

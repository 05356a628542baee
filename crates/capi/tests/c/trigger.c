/* An outside trigger program in C (crates/cli/tests/plugin_c.rs compiles and runs it in a
 * multi-process run, the RUs and the BU as `evb node` processes):
 *
 *   ./trigger run.toml N
 *
 * Starts the run's EVM in this process, waits for the nodes, refuses a window that ends
 * where it begins and one naming source 7 (EVB_ERR_REFUSED), then decides N windows of
 * 500 ticks, every odd one over source 1 only, checks each record number, prints
 * `decided: N` and finishes (exit 0 only for a clean run). */
#include <evb.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s CONFIG N\n", argv[0]);
        return 2;
    }
    unsigned long long n = strtoull(argv[2], NULL, 10);
    EvbTrigger *t = NULL;
    if (evb_trigger_start(argv[1], &t) != EVB_OK) {
        fprintf(stderr, "start: %s\n", evb_last_error());
        return 1;
    }
    if (evb_trigger_wait_connected(t) != EVB_OK) {
        fprintf(stderr, "connect: %s\n", evb_last_error());
        return 1;
    }
    const uint16_t seven[] = {1, 7};
    if (evb_trigger_decide(t, 10, 10, NULL, 0, NULL) != EVB_ERR_REFUSED ||
        evb_trigger_decide(t, 0, 10, seven, 2, NULL) != EVB_ERR_REFUSED) {
        fprintf(stderr, "a bad window was not refused\n");
        return 1;
    }
    const uint16_t one[] = {1};
    for (unsigned long long k = 0; k < n; k++) {
        uint64_t record = 0;
        int odd = (int)(k % 2);
        int rc = evb_trigger_decide(t, k * 1000, k * 1000 + 500, odd ? one : NULL, odd ? 1 : 0,
                                    &record);
        if (rc != EVB_OK || record != k) {
            fprintf(stderr, "decision %llu: %d (%s)\n", k, rc, evb_last_error());
            return 1;
        }
    }
    printf("decided: %llu\n", n);
    int rc = evb_trigger_finish(t);
    evb_trigger_free(t);
    if (rc != EVB_OK) {
        fprintf(stderr, "finish: %d (%s)\n", rc, evb_last_error());
        return 1;
    }
    return 0;
}

/* A readout producer in C: feeds RU `ru_id` through libevb.
 *
 *   cc producer.c -I$PREFIX/include -L$PREFIX/lib -levb -o producer   (or: pkg-config --cflags --libs evb)
 *   ./producer run.toml ru0 100000 [FRAGMENT_BYTES]
 *
 * Event k's payload is k*397 % 4000 bytes (or FRAGMENT_BYTES), byte i = (k*131 + i*7) mod 256, its trigger number
 * k + 1: what the consumer example checks. Each payload is written straight into the RU's
 * pool (no copy). Every call answers EVB_OK or an error code, with evb_last_error() saying
 * why; crates/capi/tests/c/producer_errors.c shows the errors a producer can get. The
 * configuration can be given as TOML text instead of a path: evb_producer_start_toml. */
#include <evb.h>
#include <stdio.h>
#include <stdlib.h>

static int check(int rc, const char *what) {
    if (rc != EVB_OK) {
        fprintf(stderr, "%s: error %d: %s\n", what, rc, evb_last_error());
        exit(1);
    }
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s CONFIG RU_ID EVENTS [FRAGMENT_BYTES]\n", argv[0]);
        return 2;
    }
    unsigned long long events = strtoull(argv[3], NULL, 10);
    long fixed = argc == 5 ? atol(argv[4]) : -1;
    EvbProducer *p = NULL;
    check(evb_producer_start(argv[1], argv[2], &p), "evb_producer_start");

    EvbBuffer b;
    for (unsigned long long k = 0; k < events; k++) {
        size_t size = fixed >= 0 ? (size_t)fixed : (size_t)(k * 397 % 4000);
        check(evb_producer_buffer(p, size, 1, &b), "evb_producer_buffer"); /* waits while full */
        for (size_t i = 0; i < size; i++) b.data[i] = (uint8_t)(k * 131 + i * 7);
        uint64_t id = 0;
        check(evb_producer_submit(p, b.id, size, (uint32_t)(k + 1), &id), "evb_producer_submit");
        if (id != k) {
            fprintf(stderr, "event id %llu for fragment %llu\n", (unsigned long long)id, k);
            return 1;
        }
    }
    printf("submitted %llu fragments\n", events);
    int rc = evb_producer_finish(p);
    printf("run: %s\n", rc == EVB_OK ? "ok" : evb_last_error());
    evb_producer_free(p);
    return rc == EVB_OK ? 0 : 1;
}

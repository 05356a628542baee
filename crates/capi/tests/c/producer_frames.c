/* A C producer of timestamped frames in a run built by time (crates/cli/tests/plugin_c.rs
 * compiles and runs it in a multi-process run):
 *
 *   ./producer_frames run.toml ru0 FRAMES TICKS
 *
 * Submits FRAMES frames of TICKS ticks each, from tick 0, frame j of (j * 397) % 4000
 * bytes of (j * 131 + 7 i) % 256 (a fragment's buffer, and a frame that ends where it
 * begins, are refused with their codes), prints `frames: N bytes: B` and finishes. */
#include <evb.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s CONFIG RU_ID FRAMES TICKS\n", argv[0]);
        return 2;
    }
    unsigned long long frames = strtoull(argv[3], NULL, 10);
    unsigned long long ticks = strtoull(argv[4], NULL, 10);
    EvbProducer *p = NULL;
    if (evb_producer_start(argv[1], argv[2], &p) != EVB_OK) {
        fprintf(stderr, "start: %s\n", evb_last_error());
        return 1;
    }
    /* a fragment in a run by time: the wrong call, answered as one */
    EvbBuffer b;
    int rc = evb_producer_buffer(p, 16, 1, &b);
    if (rc != EVB_ERR_STATE) {
        fprintf(stderr, "a buffer in a run by time: got %d\n", rc);
        return 1;
    }
    static unsigned char data[4000];
    unsigned long long bytes = 0;
    for (unsigned long long j = 0; j < frames; j++) {
        size_t len = (size_t)(j * 397 % 4000);
        for (size_t i = 0; i < len; i++) data[i] = (unsigned char)(j * 131 + 7 * i);
        uint64_t n = 0;
        rc = evb_producer_submit_frame(p, j * ticks, (j + 1) * ticks, data, len, 1, &n);
        if (rc != EVB_OK || n != j) {
            fprintf(stderr, "frame %llu: %d (%s)\n", j, rc, evb_last_error());
            return 1;
        }
        bytes += len;
    }
    rc = evb_producer_submit_frame(p, 10, 10, data, 0, 1, NULL);
    if (rc != EVB_ERR_SIZE) {
        fprintf(stderr, "a frame ending where it begins: got %d\n", rc);
        return 1;
    }
    printf("frames: %llu bytes: %llu\n", frames, bytes);
    rc = evb_producer_finish(p);
    if (rc != EVB_OK) {
        fprintf(stderr, "finish: %d (%s)\n", rc, evb_last_error());
        return 1;
    }
    return 0;
}

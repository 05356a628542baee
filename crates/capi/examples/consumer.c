/* A consumer in C: takes BU `bu_id`'s built events through libevb and checks every byte of
 * the payloads the producer example writes (RU 0's fragment of event k).
 *
 *   cc consumer.c -I$PREFIX/include -L$PREFIX/lib -levb -o consumer
 *   ./consumer run.toml bu0 [SLEEP_US]
 *
 * Payloads are read in place in the BU's pool; releasing an event gives them back. With
 * SLEEP_US it works that long on each event: the builder slows to its pace (back-pressure),
 * nothing is lost. */
/* nanosleep is POSIX: ask for it, so that the file builds with -std=c11 -Wpedantic */
#define _POSIX_C_SOURCE 200809L
#include <evb.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <time.h>

/* Waits `us` microseconds. */
static void pause_us(unsigned long us) {
    struct timespec t = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    nanosleep(&t, NULL);
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s CONFIG BU_ID [SLEEP_US]\n", argv[0]);
        return 2;
    }
    unsigned sleep_us = argc == 4 ? (unsigned)atoi(argv[3]) : 0;
    EvbConsumer *c = NULL;
    if (evb_consumer_start(argv[1], argv[2], 4, &c) != EVB_OK) {
        fprintf(stderr, "evb_consumer_start: %s\n", evb_last_error());
        return 1;
    }
    unsigned long long events = 0, bytes = 0, bad = 0, id_sum = 0;
    for (;;) {
        EvbEvent *e = NULL;
        int rc = evb_consumer_next(c, 60000, &e);
        if (rc == EVB_END) break;
        if (rc != EVB_OK) {
            fprintf(stderr, "evb_consumer_next: %d %s\n", rc, evb_last_error());
            return 1;
        }
        uint64_t k = evb_event_id(e);
        EvbFragment f;
        if (evb_event_fragment(e, 0, &f) != EVB_OK) return 1;
        bad += f.size != k * 397 % 4000 || f.trigger_number != (uint32_t)(k + 1);
        size_t at = 0;
        for (size_t j = 0; j < f.chunks; j++) {
            const uint8_t *data;
            size_t len;
            if (evb_event_chunk(e, 0, j, &data, &len) != EVB_OK) return 1;
            for (size_t i = 0; i < len; i++, at++) bad += data[i] != (uint8_t)(k * 131 + at * 7);
        }
        bytes += at;
        id_sum += k;
        events++;
        if (sleep_us) pause_us(sleep_us);
        evb_event_release(e);
    }
    int rc = evb_consumer_finish(c);
    printf("consumed %llu events, %llu bytes, id sum %llu, %llu bad; run: %s\n", events, bytes,
           id_sum, bad, rc == EVB_OK ? "ok" : evb_last_error());
    evb_consumer_free(c);
    return rc == EVB_OK && bad == 0 ? 0 : 1;
}

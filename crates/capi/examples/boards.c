/* Several producers into one RU from C: one thread per front-end board, each with its own
 * producer handle from evb_producer_start_many (the RU's `[[ru]] producer_sources`). The RU
 * joins the boards' k-th fragments into event k's super-fragment.
 *
 *   cc -pthread boards.c -I$PREFIX/include -L$PREFIX/lib -levb -o boards
 *   ./boards run.toml ru0 100000
 *
 * Board b's payload of event k is k*397 % 1000 + 1 bytes, byte i = (k*131 + i*7 + b) mod 256,
 * its trigger number k + 1. */
#include <evb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_BOARDS 64

struct board {
    EvbProducer *p;
    unsigned b;
    unsigned long long events;
    int rc;
};

static void *feed(void *arg) {
    struct board *w = arg;
    EvbBuffer buf;
    for (unsigned long long k = 0; k < w->events; k++) {
        size_t size = (size_t)(k * 397 % 1000) + 1;
        if ((w->rc = evb_producer_buffer(w->p, size, 1, &buf)) != EVB_OK) return NULL;
        for (size_t i = 0; i < size; i++) buf.data[i] = (uint8_t)(k * 131 + i * 7 + w->b);
        if ((w->rc = evb_producer_submit(w->p, buf.id, size, (uint32_t)(k + 1), NULL)) != EVB_OK)
            return NULL;
    }
    w->rc = evb_producer_finish(w->p);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s CONFIG RU_ID EVENTS\n", argv[0]);
        return 2;
    }
    EvbProducer *ps[MAX_BOARDS];
    size_t k = 0;
    if (evb_producer_start_many(argv[1], argv[2], ps, MAX_BOARDS, &k) != EVB_OK) {
        fprintf(stderr, "evb_producer_start_many: %s\n", evb_last_error());
        return 1;
    }
    struct board w[MAX_BOARDS];
    pthread_t t[MAX_BOARDS];
    for (size_t b = 0; b < k; b++) {
        w[b] = (struct board){ps[b], (unsigned)b, strtoull(argv[3], NULL, 10), EVB_OK};
        pthread_create(&t[b], NULL, feed, &w[b]);
    }
    int ok = 1;
    for (size_t b = 0; b < k; b++) {
        pthread_join(t[b], NULL);
        if (w[b].rc != EVB_OK) {
            fprintf(stderr, "board %zu: error %d\n", b, w[b].rc);
            ok = 0;
        }
        evb_producer_free(ps[b]);
    }
    printf("boards: %zu, run: %s\n", k, ok ? "ok" : "failed");
    return ok ? 0 : 1;
}

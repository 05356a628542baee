/* Publish/subscribe by tag in C: one publisher and two subscribers in one program, each
 * subscriber on a thread of its own (as they would be in processes of their own).
 *
 *   cc -pthread pubsub.c -I$PREFIX/include -L$PREFIX/lib -levb -o pubsub
 *   ./pubsub [tcp|shm [PER_TAG [POLICY [SLOW_US]]]]
 *
 * The publisher publishes PER_TAG messages on each of the tags 0..9, round robin; subscriber
 * A takes tags 2 and 5-7 (packed into pages), B tags 0 and 9 (each on the wire at once).
 * Message seq of tag t is 16 + (t * 131 + seq * 17) % 3000 bytes: tag and seq (little
 * endian u64s), then byte i = (i * 7 + t + seq) mod 256. Each subscriber checks every byte,
 * the order (seq 0, 1, ... per tag, anything skipped announced by a gap) and the tags, and
 * prints what it got; the exit status is 0 only if everything adds up. With SLOW_US,
 * subscriber A sleeps that long per message and the publisher's max_queued is its least
 * (4 KiB): under policy drop A misses messages, each announced by a gap, and for every
 * subscriber received + missed is what was published on its tags. */
/* nanosleep is POSIX: ask for it, so that the file builds with -std=c11 -Wpedantic */
#define _POSIX_C_SOURCE 200809L
#include <evb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

/* Waits `us` microseconds. */
static void pause_us(unsigned long us) {
    struct timespec t = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    nanosleep(&t, NULL);
}

#define TAGS 10

struct sub {
    const char *name, *tags;
    const char *options;
    unsigned slow_us;
    EvbSub *s;
    unsigned long long received[TAGS], missed[TAGS], next[TAGS];
    unsigned long long out_of_order, bad, others;
    char goodbye[256];
    uint8_t want[16 + 3000];
    int rc;
};

static size_t size_of(uint64_t tag, uint64_t seq) { return 16 + (size_t)((tag * 131 + seq * 17) % 3000); }

static void fill(uint8_t *buf, uint64_t tag, uint64_t seq) {
    size_t n = size_of(tag, seq);
    for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(i * 7 + tag + seq);
    for (int i = 0; i < 8; i++) {
        buf[i] = (uint8_t)(tag >> (8 * i));
        buf[8 + i] = (uint8_t)(seq >> (8 * i));
    }
}

static void *take(void *arg) {
    struct sub *w = arg;
    EvbSubMsg m;
    for (;;) {
        int rc = evb_sub_recv(w->s, 30000, &m);
        if (rc == EVB_END) break;
        if (rc != EVB_OK) {
            fprintf(stderr, "%s: evb_sub_recv: %d %s\n", w->name, rc, evb_last_error());
            w->rc = rc;
            return NULL;
        }
        if (m.kind == EVB_SUB_MESSAGE) {
            if (m.tag >= TAGS) {
                w->others++;
                continue;
            }
            w->out_of_order += m.seq != w->next[m.tag];
            w->next[m.tag] = m.seq + 1;
            w->received[m.tag]++;
            if (w->slow_us) pause_us(w->slow_us);
            fill(w->want, m.tag, m.seq);
            w->bad += m.len != size_of(m.tag, m.seq) || memcmp(m.data, w->want, m.len) != 0;
        } else if (m.kind == EVB_SUB_GAP) {
            if (m.tag < TAGS) {
                w->missed[m.tag] += m.missed;
                w->next[m.tag] += m.missed;
            }
        } else if (m.kind == EVB_SUB_GOODBYE) {
            snprintf(w->goodbye, sizeof w->goodbye, "%.*s", (int)m.len, (const char *)m.data);
        }
        /* EVB_SUB_CLOSED: EVB_END follows once every publisher is closed */
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *transport = argc > 1 ? argv[1] : "tcp";
    unsigned long long per_tag = argc > 2 ? strtoull(argv[2], NULL, 10) : 1000;
    const char *policy = argc > 3 ? argv[3] : "block";
    unsigned slow_us = argc > 4 ? (unsigned)strtoul(argv[4], NULL, 10) : 0;
    char opts[256];

    /* a mistake is an error code and a message naming it */
    EvbPub *p = NULL;
    int rc = evb_pub_open("127.0.0.1:0", "policy=sometimes", &p);
    printf("bad option: %d (%s)\n", rc, evb_last_error());

    snprintf(opts, sizeof opts, "transport=%s policy=%s run_id=cdemo%s", transport, policy,
             slow_us ? " max_queued=4096" : "");
    if (evb_pub_open("127.0.0.1:0", opts, &p) != EVB_OK) {
        fprintf(stderr, "evb_pub_open: %s\n", evb_last_error());
        return 1;
    }
    const char *addr = evb_pub_local_addr(p);
    printf("publisher on %s (%s)\n", addr, opts);

    char sub_opts[2][128];
    struct sub subs[2] = {{.name = "A", .tags = "2,5-7", .slow_us = slow_us},
                          {.name = "B", .tags = "0,9"}};
    const int ntags[2] = {4, 2};
    snprintf(sub_opts[0], sizeof sub_opts[0], "transport=%s run_id=cdemo delivery=throughput", transport);
    snprintf(sub_opts[1], sizeof sub_opts[1], "transport=%s run_id=cdemo delivery=latency", transport);
    pthread_t threads[2];
    for (int i = 0; i < 2; i++) {
        subs[i].options = sub_opts[i];
        if (evb_sub_open(addr, subs[i].tags, subs[i].options, &subs[i].s) != EVB_OK) {
            fprintf(stderr, "evb_sub_open: %s\n", evb_last_error());
            return 1;
        }
        pthread_create(&threads[i], NULL, take, &subs[i]);
    }
    if (evb_pub_wait_subscribers(p, 2, 30000, NULL) != EVB_OK) {
        fprintf(stderr, "evb_pub_wait_subscribers: %s\n", evb_last_error());
        return 1;
    }

    static uint8_t buf[16 + 3000];
    unsigned long long delivered = 0, dropped = 0;
    for (uint64_t seq = 0; seq < per_tag; seq++) {
        for (uint64_t tag = 0; tag < TAGS; tag++) {
            EvbPubSent sent;
            fill(buf, tag, seq);
            if (evb_pub_send(p, tag, buf, size_of(tag, seq), &sent) != EVB_OK) {
                fprintf(stderr, "evb_pub_send: %s\n", evb_last_error());
                return 1;
            }
            delivered += sent.delivered;
            dropped += sent.dropped;
        }
    }
    EvbPubStats st;
    evb_pub_flush(p);
    evb_pub_stats(p, &st);
    if (evb_pub_close(p, "the C example is done") != EVB_OK) {
        fprintf(stderr, "evb_pub_close: %s\n", evb_last_error());
        return 1;
    }
    printf("published %llu messages on %d tags: delivered %llu, dropped %llu (stats: %llu, %llu, %llu)\n",
           per_tag * TAGS, TAGS, delivered, dropped, (unsigned long long)st.published,
           (unsigned long long)st.delivered, (unsigned long long)st.dropped);

    int ok = 1;
    unsigned long long received_all = 0, missed_all = 0;
    for (int i = 0; i < 2; i++) {
        struct sub *w = &subs[i];
        pthread_join(threads[i], NULL);
        EvbSubStats ss;
        evb_sub_stats(w->s, &ss);
        evb_sub_close(w->s);
        printf("subscriber %s (tags %s):", w->name, w->tags);
        unsigned long long total = 0, lost = 0;
        for (int t = 0; t < TAGS; t++) {
            if (w->received[t] || w->missed[t]) printf(" %d:%llu", t, w->received[t]);
            if (w->missed[t]) printf("+%llu missed", w->missed[t]);
            total += w->received[t];
            lost += w->missed[t];
        }
        printf("; %llu messages, %llu missed, %llu out of order, %llu bad, %llu other tags; goodbye: %s\n",
               total, lost, w->out_of_order, w->bad, w->others, w->goodbye);
        ok &= w->rc == 0 && w->out_of_order == 0 && w->bad == 0 && w->others == 0 &&
              ss.received == total && ss.missed == lost && total + lost == per_tag * ntags[i];
        received_all += total;
        missed_all += lost;
    }
    /* both sides count the same: what was sent was received, what was dropped was missed */
    ok &= received_all == st.delivered && missed_all == st.dropped;
    printf("received %llu + missed %llu = published on the subscribed tags: %s\n", received_all,
           missed_all, ok ? "yes" : "NO");
    return ok ? 0 : 1;
}

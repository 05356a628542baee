/* The errors a producer can get, each checked for its code (crates/cli/tests/plugin_c.rs
 * compiles and runs it in a multi-process run):
 *
 *   ./producer_errors run.toml ru0 EVENTS
 *
 * The configuration is read from the file and handed to libevb as TOML text
 * (evb_producer_start_toml). Each check prints `NAME: CODE (MESSAGE)` and a wrong code
 * exits 1 at once; after the checks the producer submits EVENTS fragments (event k: k*397 %
 * 4000 bytes, as the producer example) and the run must end cleanly. */
#include <evb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int expect(const char *name, int rc, int want) {
    printf("%s: %d (%s)\n", name, rc, rc == EVB_OK ? "ok" : evb_last_error());
    if (rc != want) {
        fprintf(stderr, "%s: got %d, expected %d\n", name, rc, want);
        exit(1);
    }
    return rc;
}

/* The whole file as a NUL-terminated string. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0, n;
    char *text = malloc(cap);
    while (text && (n = fread(text + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len == 1) text = realloc(text, cap *= 2);
    }
    fclose(f);
    if (text) text[len] = '\0';
    return text;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s CONFIG RU_ID EVENTS\n", argv[0]);
        return 2;
    }
    unsigned long long events = strtoull(argv[3], NULL, 10);
    char *toml = slurp(argv[1]);
    if (!toml) {
        perror(argv[1]);
        return 2;
    }
    EvbProducer *p = NULL;
    expect("text that is not TOML", evb_producer_start_toml("[run\n", argv[2], &p), EVB_ERR_CONFIG);
    expect("an invalid configuration", evb_producer_start_toml("[fragments]\nsize = 0\n", argv[2], &p),
           EVB_ERR_CONFIG);
    expect("a NULL configuration", evb_producer_start_toml(NULL, argv[2], &p), EVB_ERR_ARG);
    expect("no such RU", evb_producer_start_toml(toml, "ru99", &p), EVB_ERR_SETUP);
    if (p != NULL) return 1;
    expect("start from TOML text", evb_producer_start_toml(toml, argv[2], &p), EVB_OK);

    EvbBuffer b;
    expect("1 GiB buffer", evb_producer_buffer(p, (size_t)1 << 30, 1, &b), EVB_ERR_SIZE);
    expect("release of a buffer never given", evb_producer_release(p, 12345), EVB_ERR_UNKNOWN_BUFFER);
    for (unsigned long long k = 0; k < events; k++) {
        size_t size = (size_t)(k * 397 % 4000);
        int rc = evb_producer_buffer(p, size, 1, &b); /* waits while the pool is full */
        if (k == 0 || rc != EVB_OK) expect("buffer", rc, EVB_OK);
        for (size_t i = 0; i < size; i++) b.data[i] = (uint8_t)(k * 131 + i * 7);
        rc = evb_producer_submit(p, b.id, size, (uint32_t)(k + 1), NULL);
        if (k == 0) {
            expect("submit", rc, EVB_OK);
            expect("submitted twice", evb_producer_submit(p, b.id, size, 2, NULL), EVB_ERR_UNKNOWN_BUFFER);
            expect("released after its submit", evb_producer_release(p, b.id), EVB_ERR_UNKNOWN_BUFFER);
        } else if (rc != EVB_OK) {
            expect("submit", rc, EVB_OK);
        }
    }
    printf("submitted %llu fragments\n", events);
    expect("finish", evb_producer_finish(p), EVB_OK);
    expect("a buffer after finish", evb_producer_buffer(p, 16, 1, &b), EVB_ERR_STATE);
    evb_producer_free(p);
    free(toml);
    printf("all checks passed\n");
    return 0;
}

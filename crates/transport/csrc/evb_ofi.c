/*
 * evb's libfabric shim.
 *
 * libfabric's data-path calls (fi_send, fi_recv, fi_cq_read, fi_mr_reg, fi_endpoint,
 * fi_connect, ...) are static inline functions in its headers that dispatch through the
 * ops tables of each object; they have no exported symbol, so they are called from here,
 * compiled against the headers. The few real exported functions (fi_getinfo, fi_freeinfo,
 * fi_fabric, fi_dupinfo, fi_strerror) are looked up with dlsym in libfabric.so.1 loaded at
 * run time: evb never links libfabric, so it starts (and every other transport works) on a
 * machine without it.
 *
 * Everything Rust sees is declared in this file with evb_ types: Rust never depends on
 * libfabric's own struct layouts. Objects cross as opaque pointers; operation contexts are
 * plain 64-bit ids (the providers we ask for must not require FI_CONTEXT: hints.mode = 0).
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#define EVB_API_VERSION FI_VERSION(1, 9)

typedef int (*getinfo_fn)(uint32_t, const char *, const char *, uint64_t,
                          const struct fi_info *, struct fi_info **);
typedef void (*freeinfo_fn)(struct fi_info *);
typedef struct fi_info *(*dupinfo_fn)(const struct fi_info *);
typedef int (*fabric_fn)(struct fi_fabric_attr *, struct fid_fabric **, void *);
typedef const char *(*strerror_fn)(int);

static struct {
    void *lib;
    getinfo_fn getinfo;
    freeinfo_fn freeinfo;
    dupinfo_fn dupinfo;
    fabric_fn fabric;
    strerror_fn strerror;
} F;

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

static void seterr(char *err, size_t errlen, const char *fmt, const char *a, int code) {
    if (!err || !errlen)
        return;
    char buf[64] = "";
    if (code) {
        const char *s = F.strerror ? F.strerror(code < 0 ? -code : code) : NULL;
        snprintf(buf, sizeof buf, "%s", s ? s : "error");
    }
    snprintf(err, errlen, fmt, a ? a : "", buf);
}

/* Loads libfabric (the first library that loads serves the whole process). The name is
 * opened on every call, so a name that does not load is an error even after another did:
 * dlopen of an already-loaded library only counts a reference, which is dropped again.
 * 0 on success; otherwise err says why. */
int evb_ofi_load(const char *libname, char *err, size_t errlen) {
    pthread_mutex_lock(&load_lock);
    void *lib = dlopen(libname, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(err, errlen, "%s", e ? e : "dlopen failed");
        pthread_mutex_unlock(&load_lock);
        return -1;
    }
    if (F.lib) {
        dlclose(lib);
        pthread_mutex_unlock(&load_lock);
        return 0;
    }
    getinfo_fn gi = (getinfo_fn)dlsym(lib, "fi_getinfo");
    freeinfo_fn fi = (freeinfo_fn)dlsym(lib, "fi_freeinfo");
    dupinfo_fn di = (dupinfo_fn)dlsym(lib, "fi_dupinfo");
    fabric_fn fa = (fabric_fn)dlsym(lib, "fi_fabric");
    strerror_fn se = (strerror_fn)dlsym(lib, "fi_strerror");
    if (!gi || !fi || !di || !fa || !se) {
        snprintf(err, errlen, "%s lacks the fi_getinfo/fi_freeinfo/fi_dupinfo/fi_fabric/fi_strerror symbols",
                 libname);
        dlclose(lib);
        pthread_mutex_unlock(&load_lock);
        return -1;
    }
    F.getinfo = gi;
    F.freeinfo = fi;
    F.dupinfo = di;
    F.fabric = fa;
    F.strerror = se;
    F.lib = lib;
    pthread_mutex_unlock(&load_lock);
    return 0;
}

const char *evb_ofi_strerror(int code) {
    if (!F.strerror)
        return "libfabric not loaded";
    return F.strerror(code < 0 ? -code : code);
}

/* The hints every query uses: connected message endpoints, two-sided messages. */
static struct fi_info *make_hints(const char *prov) {
    struct fi_info *h = F.dupinfo(NULL); /* fi_allocinfo() is this, inline */
    if (!h)
        return NULL;
    h->caps = FI_MSG;
    h->mode = 0;
    h->ep_attr->type = FI_EP_MSG;
    /* What verbs needs; providers that need less (tcp: nothing) accept these too. */
    h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    h->domain_attr->threading = FI_THREAD_DOMAIN;
    h->tx_attr->msg_order = FI_ORDER_SAS;
    h->rx_attr->msg_order = FI_ORDER_SAS;
    if (prov && *prov) {
        /* freed by fi_freeinfo: must come from malloc */
        h->fabric_attr->prov_name = strdup(prov);
    }
    return h;
}

/* Checks that `prov` (empty: any) offers what evb needs; writes the provider that would be
 * used. 0 on success. */
int evb_ofi_check(const char *prov, char *chosen, size_t chosenlen, char *err, size_t errlen) {
    struct fi_info *h = make_hints(prov);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    struct fi_info *info = NULL;
    int rc = F.getinfo(EVB_API_VERSION, NULL, NULL, 0, h, &info);
    F.freeinfo(h);
    if (rc || !info) {
        seterr(err, errlen, "no libfabric provider%s offers connected message endpoints (FI_EP_MSG): %s",
               prov && *prov ? prov : "", rc ? rc : FI_ENODATA);
        return -1;
    }
    snprintf(chosen, chosenlen, "%s", info->fabric_attr->prov_name);
    F.freeinfo(info);
    return 0;
}

typedef struct evb_ofi {
    char prov[64];
    struct fi_info *info; /* the info the domain was opened from */
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_eq *eq;
    struct fid_cq *cq;
    int eq_fd, cq_fd;
} evb_ofi;

evb_ofi *evb_ofi_new(const char *prov) {
    evb_ofi *o = calloc(1, sizeof *o);
    if (!o)
        return NULL;
    snprintf(o->prov, sizeof o->prov, "%s", prov ? prov : "");
    o->eq_fd = -1;
    o->cq_fd = -1;
    return o;
}

int evb_ofi_has_domain(const evb_ofi *o) { return o->domain != NULL; }
int evb_ofi_mr_local(const evb_ofi *o) {
    return o->info && (o->info->domain_attr->mr_mode & FI_MR_LOCAL) != 0;
}
size_t evb_ofi_iov_limit(const evb_ofi *o) {
    size_t n = o->info ? o->info->tx_attr->iov_limit : 1;
    return n ? n : 1;
}
const char *evb_ofi_domain_name(const evb_ofi *o) {
    return o->info && o->info->domain_attr->name ? o->info->domain_attr->name : "";
}
const char *evb_ofi_prov_name(const evb_ofi *o) {
    return o->info && o->info->fabric_attr->prov_name ? o->info->fabric_attr->prov_name : o->prov;
}

static int open_domain(evb_ofi *o, struct fi_info *info, char *err, size_t errlen) {
    int rc;
    o->info = F.dupinfo(info);
    if (!o->info) {
        snprintf(err, errlen, "out of memory");
        return -FI_ENOMEM;
    }
    if ((rc = F.fabric(o->info->fabric_attr, &o->fabric, NULL))) {
        seterr(err, errlen, "fi_fabric%s: %s", "", rc);
        return rc;
    }
    if ((rc = fi_domain(o->fabric, o->info, &o->domain, NULL))) {
        seterr(err, errlen, "fi_domain%s: %s", "", rc);
        return rc;
    }
    struct fi_eq_attr eqa = {0};
    eqa.size = 256;
    eqa.wait_obj = FI_WAIT_FD;
    if ((rc = fi_eq_open(o->fabric, &eqa, &o->eq, NULL))) {
        eqa.wait_obj = FI_WAIT_NONE;
        if ((rc = fi_eq_open(o->fabric, &eqa, &o->eq, NULL))) {
            seterr(err, errlen, "fi_eq_open%s: %s", "", rc);
            return rc;
        }
    } else if (fi_control(&o->eq->fid, FI_GETWAIT, &o->eq_fd)) {
        o->eq_fd = -1;
    }
    struct fi_cq_attr cqa = {0};
    cqa.size = 8192;
    cqa.format = FI_CQ_FORMAT_MSG;
    cqa.wait_obj = FI_WAIT_FD;
    if ((rc = fi_cq_open(o->domain, &cqa, &o->cq, NULL))) {
        cqa.wait_obj = FI_WAIT_NONE;
        if ((rc = fi_cq_open(o->domain, &cqa, &o->cq, NULL))) {
            seterr(err, errlen, "fi_cq_open%s: %s", "", rc);
            return rc;
        }
    } else if (fi_control(&o->cq->fid, FI_GETWAIT, &o->cq_fd)) {
        o->cq_fd = -1;
    }
    return 0;
}

/* Resolves node:service (as a local address when `source`), opening the domain on first use.
 * The returned info belongs to the caller (evb_ofi_freeinfo). */
int evb_ofi_getinfo(evb_ofi *o, const char *node, const char *service, int source, void **out,
                    char *err, size_t errlen) {
    struct fi_info *h = make_hints(o->prov);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return -FI_ENOMEM;
    }
    if (o->info) {
        /* stay with the provider and fabric already open */
        free(h->fabric_attr->prov_name);
        h->fabric_attr->prov_name = strdup(o->info->fabric_attr->prov_name);
    }
    struct fi_info *info = NULL;
    int rc = F.getinfo(EVB_API_VERSION, node, service, source ? FI_SOURCE : 0, h, &info);
    F.freeinfo(h);
    if (rc || !info) {
        seterr(err, errlen, "fi_getinfo for %s: %s", node, rc ? rc : FI_ENODATA);
        return rc ? rc : -FI_ENODATA;
    }
    if (!o->domain && (rc = open_domain(o, info, err, errlen))) {
        F.freeinfo(info);
        return rc;
    }
    *out = info;
    return 0;
}

void evb_ofi_freeinfo(void *info) {
    if (info)
        F.freeinfo((struct fi_info *)info);
}

/* A listening passive endpoint; writes the bound address as "ip:port". */
int evb_ofi_pep(evb_ofi *o, void *vinfo, uint64_t ctx, void **out, char *bound, size_t boundlen,
                char *err, size_t errlen) {
    struct fi_info *info = vinfo;
    struct fid_pep *pep = NULL;
    int rc;
    if ((rc = fi_passive_ep(o->fabric, info, &pep, (void *)(uintptr_t)ctx))) {
        seterr(err, errlen, "fi_passive_ep%s: %s", "", rc);
        return rc;
    }
    if ((rc = fi_pep_bind(pep, &o->eq->fid, 0)) || (rc = fi_listen(pep))) {
        seterr(err, errlen, "fi_listen%s: %s", "", rc);
        fi_close(&pep->fid);
        return rc;
    }
    struct sockaddr_storage ss;
    size_t len = sizeof ss;
    memset(&ss, 0, sizeof ss);
    if ((rc = fi_getname(&pep->fid, &ss, &len))) {
        seterr(err, errlen, "fi_getname%s: %s", "", rc);
        fi_close(&pep->fid);
        return rc;
    }
    char ip[INET6_ADDRSTRLEN] = "";
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof ip);
        snprintf(bound, boundlen, "%s:%u", ip, ntohs(sin->sin_port));
    } else if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &sin6->sin6_addr, ip, sizeof ip);
        snprintf(bound, boundlen, "[%s]:%u", ip, ntohs(sin6->sin6_port));
    } else {
        snprintf(bound, boundlen, "?");
    }
    *out = pep;
    return 0;
}

/* An active endpoint bound to the EQ and the CQ, enabled (receives can be posted). */
int evb_ofi_ep(evb_ofi *o, void *vinfo, uint64_t ctx, void **out, char *err, size_t errlen) {
    struct fi_info *info = vinfo;
    struct fid_ep *ep = NULL;
    int rc;
    if ((rc = fi_endpoint(o->domain, info, &ep, (void *)(uintptr_t)ctx))) {
        seterr(err, errlen, "fi_endpoint%s: %s", "", rc);
        return rc;
    }
    if ((rc = fi_ep_bind(ep, &o->eq->fid, 0)) ||
        (rc = fi_ep_bind(ep, &o->cq->fid, FI_TRANSMIT | FI_RECV)) || (rc = fi_enable(ep))) {
        seterr(err, errlen, "binding the endpoint%s: %s", "", rc);
        fi_close(&ep->fid);
        return rc;
    }
    *out = ep;
    return 0;
}

int evb_ofi_connect(void *ep, void *vinfo, const void *param, size_t plen) {
    struct fi_info *info = vinfo;
    return fi_connect((struct fid_ep *)ep, info->dest_addr, param, plen);
}

int evb_ofi_accept(void *ep, const void *param, size_t plen) {
    return fi_accept((struct fid_ep *)ep, param, plen);
}

int evb_ofi_reject(void *pep, void *vinfo) {
    struct fi_info *info = vinfo;
    return fi_reject((struct fid_pep *)pep, info->handle, NULL, 0);
}

int evb_ofi_shutdown(void *ep) { return fi_shutdown((struct fid_ep *)ep, 0); }

/* Closes any fid (endpoint, passive endpoint, memory region). */
int evb_ofi_close_fid(void *f) {
    if (!f)
        return 0;
    return fi_close((struct fid *)f);
}

/* Registers [buf, buf+len) once for sending and receiving. */
int evb_ofi_reg(evb_ofi *o, void *buf, size_t len, void **mr_out, void **desc_out, char *err,
                size_t errlen) {
    struct fid_mr *mr = NULL;
    int rc = fi_mr_reg(o->domain, buf, len, FI_SEND | FI_RECV, 0, 0, 0, &mr, NULL);
    if (rc) {
        seterr(err, errlen, "fi_mr_reg%s: %s", "", rc);
        return rc;
    }
    *mr_out = mr;
    *desc_out = fi_mr_desc(mr);
    return 0;
}

ssize_t evb_ofi_recv(void *ep, void *buf, size_t len, void *desc, uint64_t ctx) {
    return fi_recv((struct fid_ep *)ep, buf, len, desc, 0, (void *)(uintptr_t)ctx);
}

ssize_t evb_ofi_sendv(void *ep, const struct iovec *iov, void **desc, size_t count, uint64_t ctx) {
    return fi_sendv((struct fid_ep *)ep, iov, desc, count, 0, (void *)(uintptr_t)ctx);
}

/* What the event queue reported. */
enum { EVB_EQ_NONE = 0, EVB_EQ_CONNREQ = 1, EVB_EQ_CONNECTED = 2, EVB_EQ_SHUTDOWN = 3, EVB_EQ_ERROR = 4 };

typedef struct {
    uint32_t kind;
    int32_t err;     /* EVB_EQ_ERROR: the (positive) error number */
    uint64_t ctx;    /* the endpoint's (or listener's) id */
    void *info;      /* EVB_EQ_CONNREQ: the request, owned by the caller */
    uint32_t datalen;
    uint8_t data[64];
} evb_eq_ev;

/* Reads one event: 1, 0 when there is none, < 0 on failure. */
int evb_ofi_eq_read(evb_ofi *o, evb_eq_ev *ev) {
    union {
        struct fi_eq_cm_entry cm;
        uint8_t raw[sizeof(struct fi_eq_cm_entry) + 256];
    } buf;
    uint32_t event = 0;
    memset(ev, 0, sizeof *ev);
    if (!o->eq)
        return 0;
    ssize_t n = fi_eq_read(o->eq, &event, &buf, sizeof buf, 0);
    if (n == -FI_EAGAIN)
        return 0;
    if (n == -FI_EAVAIL) {
        struct fi_eq_err_entry e;
        memset(&e, 0, sizeof e);
        ssize_t r = fi_eq_readerr(o->eq, &e, 0);
        if (r < 0)
            return r == -FI_EAGAIN ? 0 : (int)r;
        ev->kind = EVB_EQ_ERROR;
        ev->err = e.err ? e.err : FI_EOTHER;
        ev->ctx = e.fid ? (uint64_t)(uintptr_t)e.fid->context : 0;
        return 1;
    }
    if (n < 0)
        return (int)n;
    ev->ctx = buf.cm.fid ? (uint64_t)(uintptr_t)buf.cm.fid->context : 0;
    size_t data = (size_t)n > sizeof(struct fi_eq_cm_entry) ? (size_t)n - sizeof(struct fi_eq_cm_entry) : 0;
    if (data > sizeof ev->data)
        data = sizeof ev->data;
    switch (event) {
    case FI_CONNREQ:
        ev->kind = EVB_EQ_CONNREQ;
        ev->info = buf.cm.info;
        break;
    case FI_CONNECTED:
        ev->kind = EVB_EQ_CONNECTED;
        if (buf.cm.info)
            F.freeinfo(buf.cm.info);
        break;
    case FI_SHUTDOWN:
        ev->kind = EVB_EQ_SHUTDOWN;
        data = 0;
        break;
    default:
        ev->kind = EVB_EQ_NONE;
        data = 0;
        return 1;
    }
    ev->datalen = (uint32_t)data;
    memcpy(ev->data, buf.cm.data, data);
    return 1;
}

typedef struct {
    uint64_t ctx;
    uint64_t len;
    int32_t err; /* 0, or the (positive) error number of a failed operation */
    uint32_t recv; /* 1 for a receive */
} evb_cq_ev;

/* Reads up to n completions: the count, 0 when there is none, < 0 on failure. */
int evb_ofi_cq_read(evb_ofi *o, evb_cq_ev *out, size_t n) {
    struct fi_cq_msg_entry e[64];
    if (!o->cq)
        return 0;
    if (n > 64)
        n = 64;
    ssize_t r = fi_cq_read(o->cq, e, n);
    if (r == -FI_EAGAIN)
        return 0;
    if (r == -FI_EAVAIL) {
        struct fi_cq_err_entry ee;
        memset(&ee, 0, sizeof ee);
        ssize_t k = fi_cq_readerr(o->cq, &ee, 0);
        if (k < 0)
            return k == -FI_EAGAIN ? 0 : (int)k;
        out[0].ctx = (uint64_t)(uintptr_t)ee.op_context;
        out[0].len = ee.len;
        out[0].err = ee.err ? ee.err : FI_EOTHER;
        out[0].recv = (ee.flags & FI_RECV) != 0;
        return 1;
    }
    if (r < 0)
        return (int)r;
    for (ssize_t i = 0; i < r; i++) {
        out[i].ctx = (uint64_t)(uintptr_t)e[i].op_context;
        out[i].len = e[i].len;
        out[i].err = 0;
        out[i].recv = (e[i].flags & FI_RECV) != 0;
    }
    return (int)r;
}

/* Sleeps until the EQ or the CQ may have something, at most timeout_ms (< 0: no limit).
 * Returns at once when libfabric says it has work pending (fi_trywait). */
int evb_ofi_wait(evb_ofi *o, int timeout_ms) {
    if (!o->fabric || o->cq_fd < 0 || o->eq_fd < 0) {
        if (timeout_ms != 0) {
            struct timespec ts = {0, 100 * 1000}; /* no wait fd: nap briefly */
            nanosleep(&ts, NULL);
        }
        return 0;
    }
    struct fid *fids[2] = {&o->cq->fid, &o->eq->fid};
    if (fi_trywait(o->fabric, fids, 2) != FI_SUCCESS)
        return 0;
    struct pollfd p[2] = {{o->cq_fd, POLLIN, 0}, {o->eq_fd, POLLIN, 0}};
    int r = poll(p, 2, timeout_ms);
    return r < 0 && errno != EINTR ? -errno : 0;
}

void evb_ofi_free(evb_ofi *o) {
    if (!o)
        return;
    if (o->cq)
        fi_close(&o->cq->fid);
    if (o->eq)
        fi_close(&o->eq->fid);
    if (o->domain)
        fi_close(&o->domain->fid);
    if (o->fabric)
        fi_close(&o->fabric->fid);
    if (o->info)
        F.freeinfo(o->info);
    free(o);
}

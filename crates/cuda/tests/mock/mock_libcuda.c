/*
 * A stand-in for libcuda.so, for checking cudamem-cuda's GPU tests and bench on a machine
 * without a GPU (scripts/gpu/mock-test.sh builds it and puts it on LD_LIBRARY_PATH).
 *
 * It implements only the driver calls cudamem-cuda, its tests and its bench make, on host
 * memory: "device" memory is mmap'd host memory, VMM reservations are PROT_NONE ranges whose
 * pages become readable and writable only after cuMemMap + cuMemSetAccess, and capacity is
 * counted against MOCK_CUDA_TOTAL bytes (default 4 GiB). It enforces what the real driver
 * enforces and the Rust code relies on: a current context for memory calls, whole mappings for
 * cuMemUnmap, copies only into valid ranges, OOM past capacity. Events recorded after
 * asynchronous work on a stream stay NOT_READY until that stream (or the event, or the context)
 * is synchronised; a stream that waits for such an event (cuStreamWaitEvent) becomes pending too.
 * Enough of cudarc's safe API is served (cuCtxSetCurrent, asynchronous copies) for cudamem's
 * interop tests. It says nothing about the real driver's timing or exact error choices.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

enum {
    OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201, INVALID_HANDLE = 400, NOT_READY = 600, NOT_SUPPORTED = 801,
};

#define GRAN (2ull << 20)
#define MAXN 65536

struct ctx { int dev; int refs; };
struct range { CUdeviceptr p; unsigned long long n; CUmemGenericAllocationHandle h; int used; };
struct stream { int dirty; };
struct event { struct stream *s; int pending; };
struct handle { unsigned long long size; int live; int released; int maps; };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int inited, ndev = 1;
static unsigned long long total = 4ull << 30, used;
static struct ctx ctxs[8];
static struct range allocs[MAXN], reservations[MAXN], mappings[MAXN];
static struct handle handles[MAXN];
static struct stream legacy, *streams[1024];
static __thread struct ctx *stack[64];
static __thread int depth;

#define LOCK pthread_mutex_lock(&mu)
#define RET(x) do { CUresult r_ = (x); pthread_mutex_unlock(&mu); return r_; } while (0)

static struct ctx *cur(void) { return depth ? stack[depth - 1] : 0; }

static struct range *add(struct range *t, CUdeviceptr p, unsigned long long n, CUmemGenericAllocationHandle h) {
    for (int i = 0; i < MAXN; i++)
        if (!t[i].used) { t[i] = (struct range){p, n, h, 1}; return &t[i]; }
    return 0;
}
static struct range *find(struct range *t, CUdeviceptr p) {
    for (int i = 0; i < MAXN; i++)
        if (t[i].used && t[i].p == p) return &t[i];
    return 0;
}
static struct range *containing(struct range *t, CUdeviceptr p, unsigned long long n) {
    for (int i = 0; i < MAXN; i++)
        if (t[i].used && p >= t[i].p && p + n <= t[i].p + t[i].n) return &t[i];
    return 0;
}
/* [p, p+n) lies in one allocation, or is covered by accessible mappings. */
static int valid(CUdeviceptr p, unsigned long long n) {
    if (p == 0 || n == 0) return p != 0;
    if (containing(allocs, p, n)) return 1;
    for (CUdeviceptr q = p; q < p + n;) {
        struct range *m = containing(mappings, q, 1);
        if (!m || !handles[m->h].live) return 0;
        q = m->p + m->n;
    }
    return 1;
}
static void *host_map(unsigned long long n, int prot) {
    void *a = mmap(0, n, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return a == MAP_FAILED ? 0 : a;
}
static void maybe_free_handle(CUmemGenericAllocationHandle h) {
    if (handles[h].live && handles[h].released && handles[h].maps == 0) {
        used -= handles[h].size;
        handles[h].live = 0;
    }
}

CUresult cuInit(unsigned flags) {
    (void)flags;
    LOCK;
    const char *t = getenv("MOCK_CUDA_TOTAL"), *d = getenv("MOCK_CUDA_DEVICES");
    if (t) total = strtoull(t, 0, 10);
    if (d) ndev = atoi(d);
    if (ndev > 8) ndev = 8;
    inited = 1;
    RET(OK);
}
CUresult cuDriverGetVersion(int *v) { *v = 12080; return OK; }
CUresult cuDeviceGetCount(int *n) { if (!inited) return NOT_INITIALIZED; *n = ndev; return OK; }
CUresult cuDeviceGet(CUdevice *d, int o) {
    if (!inited) return NOT_INITIALIZED;
    if (o < 0 || o >= ndev) return INVALID_DEVICE;
    *d = o;
    return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { (void)d; *b = total; return OK; }
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) { (void)d; *v = attr == 102; return OK; }

static const char *names[][2] = {
    {"0", "CUDA_SUCCESS"}, {"1", "CUDA_ERROR_INVALID_VALUE"}, {"2", "CUDA_ERROR_OUT_OF_MEMORY"},
    {"3", "CUDA_ERROR_NOT_INITIALIZED"}, {"101", "CUDA_ERROR_INVALID_DEVICE"},
    {"201", "CUDA_ERROR_INVALID_CONTEXT"}, {"400", "CUDA_ERROR_INVALID_HANDLE"},
    {"600", "CUDA_ERROR_NOT_READY"}, {"801", "CUDA_ERROR_NOT_SUPPORTED"},
};
CUresult cuGetErrorName(CUresult e, const char **s) {
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (atoi(names[i][0]) == e) { *s = names[i][1]; return OK; }
    *s = 0;
    return INVALID_VALUE;
}

CUresult cuDevicePrimaryCtxRetain(struct ctx **c, CUdevice d) {
    LOCK;
    ctxs[d].dev = d;
    ctxs[d].refs++;
    *c = &ctxs[d];
    RET(OK);
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    LOCK;
    if (ctxs[d].refs <= 0) RET(INVALID_CONTEXT);
    ctxs[d].refs--;
    RET(OK);
}
CUresult cuCtxGetCurrent(struct ctx **c) { if (!inited) return NOT_INITIALIZED; *c = cur(); return OK; }
CUresult cuCtxPushCurrent_v2(struct ctx *c) {
    if (!c || depth == 64) return INVALID_VALUE;
    stack[depth++] = c;
    return OK;
}
CUresult cuCtxSetCurrent(struct ctx *c) {
    if (!c) { depth = 0; return OK; }
    if (depth) stack[depth - 1] = c; else stack[depth++] = c;
    return OK;
}
CUresult cuCtxPopCurrent_v2(struct ctx **c) {
    if (!depth) return INVALID_CONTEXT;
    *c = stack[--depth];
    return OK;
}
#define NEED_CTX do { if (!cur()) RET(INVALID_CONTEXT); } while (0)

CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { LOCK; NEED_CTX; *f = total - used; *t = total; RET(OK); }

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    LOCK; NEED_CTX;
    if (n == 0) RET(INVALID_VALUE);
    if (used + n > total) RET(OUT_OF_MEMORY);
    void *a = host_map(n, PROT_READ | PROT_WRITE);
    if (!a || !add(allocs, (CUdeviceptr)a, n, 0)) RET(OUT_OF_MEMORY);
    used += n;
    *p = (CUdeviceptr)a;
    RET(OK);
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    LOCK; NEED_CTX;
    struct range *r = find(allocs, p);
    if (!r) RET(INVALID_VALUE);
    munmap((void *)p, r->n);
    used -= r->n;
    r->used = 0;
    RET(OK);
}
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, struct stream *s) { (void)s; return cuMemAlloc_v2(p, n); }
CUresult cuMemFreeAsync(CUdeviceptr p, struct stream *s) { (void)s; return cuMemFree_v2(p); }
static int pool_token;
CUresult cuDeviceGetDefaultMemPool(void **pool, CUdevice d) { (void)d; *pool = &pool_token; return OK; }
CUresult cuMemPoolSetAttribute(void *pool, int attr, void *v) { (void)attr; (void)v; return pool == &pool_token ? OK : INVALID_VALUE; }
CUresult cuMemPoolTrimTo(void *pool, size_t keep) { (void)keep; return pool == &pool_token ? OK : INVALID_VALUE; }

CUresult cuMemGetAllocationGranularity(size_t *g, const void *prop, int opt) { (void)prop; (void)opt; *g = GRAN; return OK; }
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t align, CUdeviceptr addr, unsigned long long f) {
    (void)addr; (void)f;
    LOCK;
    if (n == 0 || n % GRAN) RET(INVALID_VALUE);
    if (n > (1ull << 46)) RET(OUT_OF_MEMORY);
    if (align < GRAN) align = GRAN;
    void *a = host_map(n + align, PROT_NONE);
    if (!a) RET(OUT_OF_MEMORY);
    CUdeviceptr q = ((CUdeviceptr)a + align - 1) / align * align;
    add(reservations, q, n, 0);
    *p = q;
    RET(OK);
}
CUresult cuMemAddressFree(CUdeviceptr p, size_t n) {
    LOCK;
    struct range *r = find(reservations, p);
    if (!r || r->n != n) RET(INVALID_VALUE);
    for (int i = 0; i < MAXN; i++)
        if (mappings[i].used && mappings[i].p >= p && mappings[i].p < p + n) RET(INVALID_VALUE);
    r->used = 0;
    RET(OK);
}
struct prop { int type; int handle_types; int loc_type; int loc_id; };
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const struct prop *pr, unsigned long long f) {
    LOCK; NEED_CTX;
    if (f || n == 0 || n % GRAN || pr->type != 1 || pr->loc_type != 1 || pr->loc_id >= ndev) RET(INVALID_VALUE);
    if (used + n > total) RET(OUT_OF_MEMORY);
    for (int i = 1; i < MAXN; i++)
        if (!handles[i].live) {
            handles[i] = (struct handle){n, 1, 0, 0};
            used += n;
            *h = i;
            RET(OK);
        }
    RET(OUT_OF_MEMORY);
}
CUresult cuMemMap(CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h, unsigned long long f) {
    LOCK;
    if (f || off || h == 0 || h >= MAXN || !handles[h].live || handles[h].size != n) RET(INVALID_VALUE);
    if (!containing(reservations, p, n)) RET(INVALID_VALUE);
    for (int i = 0; i < MAXN; i++)
        if (mappings[i].used && mappings[i].p < p + n && p < mappings[i].p + mappings[i].n) RET(INVALID_VALUE);
    add(mappings, p, n, h);
    handles[h].maps++;
    RET(OK);
}
struct access { int loc_type; int loc_id; int flags; };
CUresult cuMemSetAccess(CUdeviceptr p, size_t n, const struct access *d, size_t count) {
    LOCK;
    if (count != 1 || d->loc_type != 1 || d->flags != 3) RET(INVALID_VALUE);
    for (CUdeviceptr q = p; q < p + n;) {
        struct range *m = find(mappings, q);
        if (!m || m->p + m->n > p + n) RET(INVALID_VALUE);
        q += m->n;
    }
    mprotect((void *)p, n, PROT_READ | PROT_WRITE);
    RET(OK);
}
CUresult cuMemUnmap(CUdeviceptr p, size_t n) {
    LOCK;
    for (CUdeviceptr q = p; q < p + n;) {
        struct range *m = find(mappings, q);
        if (!m || m->p + m->n > p + n) RET(INVALID_VALUE);
        q += m->n;
    }
    for (CUdeviceptr q = p; q < p + n;) {
        struct range *m = find(mappings, q);
        q += m->n;
        m->used = 0;
        handles[m->h].maps--;
        maybe_free_handle(m->h);
    }
    madvise((void *)p, n, MADV_DONTNEED);
    mprotect((void *)p, n, PROT_NONE);
    RET(OK);
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    LOCK;
    if (h == 0 || h >= MAXN || !handles[h].live || handles[h].released) RET(INVALID_HANDLE);
    handles[h].released = 1;
    maybe_free_handle(h);
    RET(OK);
}

static struct stream *S(struct stream *s) { return (s == 0 || (uintptr_t)s <= 2) ? &legacy : s; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) {
    LOCK; NEED_CTX;
    if (!valid(d, n)) RET(INVALID_VALUE);
    memcpy((void *)d, h, n);
    RET(OK);
}
CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) {
    LOCK; NEED_CTX;
    if (!valid(d, n)) RET(INVALID_VALUE);
    memcpy(h, (void *)d, n);
    RET(OK);
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, struct stream *s) {
    LOCK; NEED_CTX;
    if (!valid(d, n)) RET(INVALID_VALUE);
    memcpy((void *)d, h, n);
    S(s)->dirty = 1;
    RET(OK);
}
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, struct stream *s) {
    LOCK; NEED_CTX;
    if (!valid(d, n)) RET(INVALID_VALUE);
    memcpy(h, (void *)d, n);
    S(s)->dirty = 1;
    RET(OK);
}
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
    LOCK; NEED_CTX;
    if (!valid(d, n)) RET(INVALID_VALUE);
    memset((void *)d, v, n);
    RET(OK);
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, struct stream *s) {
    LOCK; NEED_CTX;
    if (!valid(d, n)) RET(INVALID_VALUE);
    memset((void *)d, v, n);
    S(s)->dirty = 1;
    RET(OK);
}
CUresult cuStreamCreate(struct stream **s, unsigned flags) {
    if (!cur()) return INVALID_CONTEXT;
    if (flags > 1) return INVALID_VALUE;
    LOCK;
    for (int i = 0; i < 1024; i++)
        if (!streams[i]) { *s = streams[i] = calloc(1, sizeof **s); RET(OK); }
    RET(OUT_OF_MEMORY);
}
CUresult cuStreamDestroy_v2(struct stream *s) {
    LOCK; NEED_CTX;
    for (int i = 0; i < 1024; i++)
        if (streams[i] == s) { streams[i] = 0; free(s); RET(OK); }
    RET(INVALID_HANDLE);
}
CUresult cuStreamSynchronize(struct stream *s) { LOCK; NEED_CTX; S(s)->dirty = 0; RET(OK); }
CUresult cuCtxSynchronize(void) {
    LOCK; NEED_CTX;
    legacy.dirty = 0;
    for (int i = 0; i < 1024; i++)
        if (streams[i]) streams[i]->dirty = 0;
    RET(OK);
}

CUresult cuEventCreate(struct event **e, unsigned flags) {
    if (!cur()) return INVALID_CONTEXT;
    if (flags != 2) return INVALID_VALUE;
    *e = calloc(1, sizeof **e);
    return OK;
}
CUresult cuEventDestroy_v2(struct event *e) { if (!cur()) return INVALID_CONTEXT; free(e); return OK; }
CUresult cuEventRecord(struct event *e, struct stream *s) {
    LOCK; NEED_CTX;
    e->s = S(s);
    e->pending = e->s->dirty;
    RET(OK);
}
CUresult cuEventQuery(struct event *e) {
    LOCK; NEED_CTX;
    if (e->pending && e->s->dirty) RET(NOT_READY);
    e->pending = 0;
    RET(OK);
}
/* The waiting stream inherits the pending work of the event's stream. */
CUresult cuStreamWaitEvent(struct stream *s, struct event *e, unsigned flags) {
    LOCK; NEED_CTX;
    if (flags) RET(INVALID_VALUE);
    if (e->pending && e->s && e->s->dirty) S(s)->dirty = 1;
    RET(OK);
}
CUresult cuEventSynchronize(struct event *e) { LOCK; NEED_CTX; e->pending = 0; if (e->s) e->s->dirty = 0; RET(OK); }

/*
 * A stub CUDA driver (built as libcuda.so.1) for the interposer's tests and bench: no GPU.
 *
 * One simulated device per process. Work (kernels, event records, async copies) goes into one
 * FIFO in submission order, which a device thread executes in real time: a kernel starts when
 * the previous one ends or when it was launched, whichever is later, and lasts exactly its
 * duration (start and end are CLOCK_MONOTONIC instants computed this way, not the thread's
 * wake-ups; the thread sleeps until the end and then marks the work done). So the device's
 * busy time is exact and comparable with the token server's clock (time.monotonic).
 *
 * Kernel durations (microseconds): kernelParams[0] points to an unsigned int when the caller
 * passes parameters, else STUB_CUDA_KERNEL_US="name=us,..." by function name, else 100.
 * Memory: STUB_CUDA_MEM_MB (default 1024) of device memory; allocations past it fail.
 * At exit, STUB_CUDA_LOG=<path> gets one line per kernel: "start_ns end_ns name", and a last
 * line "# mem_used_bytes N failed_allocs N". STUB_CUDA_NO_FUNC_NAME=1: cuFuncGetName fails
 * (a driver older than 12.3), so the interposer falls back to the cuModuleGetFunction name.
 * Graphs: an instantiated graph is one opaque piece of work of STUB_CUDA_GRAPH_US (default
 * 500), logged as "graph". VMM: cuMemCreate takes device memory like an allocation (the handle
 * is its address), cuMemRelease gives it back; reserving and mapping address ranges succeed
 * and do nothing. Memory pools: cuMemAllocFromPoolAsync allocates like cuMemAllocAsync.
 * Stream capture (one at a time, on a created stream): kernels and event records on the
 * capturing stream do not run; in the global capture mode a synchronisation or an event or
 * stream query from any thread meanwhile fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
 * invalidates the capture (cuStreamEndCapture then fails with ..._INVALIDATED), as CUDA does.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#undef cuGetProcAddress
#undef cuEventElapsedTime

#define API __attribute__((visibility("default")))

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

struct CUfunc_st {
    char name[128];
    unsigned default_us;
};
struct CUevent_st {
    uint64_t idx; /* global index of its record op (0: never recorded) */
    int64_t t_ns; /* device timestamp */
};
struct CUstream_st {
    uint64_t last; /* global index of its last op */
    int capturing, invalidated;
};
struct CUctx_st {
    int dummy;
};
struct CUgraph_st {
    int dummy;
};
struct CUgraphExec_st {
    struct CUfunc_st fn; /* logged as a kernel named "graph" */
};

enum { OP_KERNEL, OP_EVENT, OP_MARK };
typedef struct op {
    int kind;
    uint64_t idx;
    int64_t enq_ns, dur_ns;
    CUevent ev;
    CUfunction fn;
    struct op *next;
} op;

typedef struct {
    int64_t start, end;
    CUfunction fn;
} span;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    int started;
    op *head, *tail;
    uint64_t submitted, completed;
    int64_t free_at; /* device time at which the last executed op ended */
    span *log;
    size_t log_len, log_cap;
    size_t mem_total, mem_used;
    uint64_t failed_allocs;
    CUdeviceptr next_addr;
    struct {
        CUdeviceptr p;
        size_t n;
    } *allocs;
    size_t n_allocs, cap_allocs;
} d = {.mu = PTHREAD_MUTEX_INITIALIZER,
       .work = PTHREAD_COND_INITIALIZER,
       .done = PTHREAD_COND_INITIALIZER};

static struct CUstream_st default_stream;
static CUstream capture_stream; /* the capture in progress (d.mu) */
static int capture_global;

/* A "potentially unsafe" call while a global-mode capture is in progress. */
static int unsafe(void) {
    pthread_mutex_lock(&d.mu);
    int bad = capture_stream && capture_global;
    if (bad) capture_stream->invalidated = 1;
    pthread_mutex_unlock(&d.mu);
    return bad;
}
static int captured(CUstream s) {
    pthread_mutex_lock(&d.mu);
    int c = s && s->capturing;
    pthread_mutex_unlock(&d.mu);
    return c;
}
static struct CUctx_st the_ctx;
static __thread CUcontext current;

static void sleep_until(int64_t t) {
    struct timespec ts = {t / 1000000000LL, t % 1000000000LL};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL)) {
    }
}

static void *device(void *arg) {
    (void)arg;
    pthread_mutex_lock(&d.mu);
    for (;;) {
        while (!d.head) pthread_cond_wait(&d.work, &d.mu);
        op *o = d.head;
        int64_t start = o->enq_ns > d.free_at ? o->enq_ns : d.free_at;
        int64_t end = start + o->dur_ns;
        if (o->kind == OP_KERNEL) {
            if (end > now_ns()) {
                pthread_mutex_unlock(&d.mu);
                sleep_until(end);
                pthread_mutex_lock(&d.mu);
            }
            if (d.log_len == d.log_cap) {
                d.log_cap = d.log_cap ? 2 * d.log_cap : 4096;
                d.log = realloc(d.log, d.log_cap * sizeof *d.log);
            }
            d.log[d.log_len++] = (span){start, end, o->fn};
        } else if (o->kind == OP_EVENT) {
            o->ev->t_ns = start;
        }
        d.free_at = end;
        d.head = o->next;
        if (!d.head) d.tail = NULL;
        d.completed = o->idx;
        free(o);
        pthread_cond_broadcast(&d.done);
    }
    return NULL;
}

static void start_device(void) { /* d.mu held */
    if (d.started) return;
    d.started = 1;
    const char *mb = getenv("STUB_CUDA_MEM_MB");
    d.mem_total = (size_t)((mb && *mb ? atof(mb) : 1024.0) * 1048576.0);
    d.next_addr = 0x700000000000ULL;
    pthread_t t;
    pthread_create(&t, NULL, device, NULL);
    pthread_detach(t);
}

static uint64_t submit(int kind, CUstream s, int64_t dur_ns, CUevent ev, CUfunction fn) {
    op *o = calloc(1, sizeof *o);
    o->enq_ns = now_ns(); /* submission time: the device sees the work from here on, even if
                           * this thread then waits for the queue's lock */
    pthread_mutex_lock(&d.mu);
    start_device();
    o->kind = kind;
    o->idx = ++d.submitted;
    o->dur_ns = dur_ns;
    o->ev = ev;
    o->fn = fn;
    if (d.tail) d.tail->next = o;
    else d.head = o;
    d.tail = o;
    (s ? s : &default_stream)->last = o->idx;
    if (ev) ev->idx = o->idx;
    pthread_cond_signal(&d.work);
    pthread_mutex_unlock(&d.mu);
    return o->idx;
}

static void wait_for(uint64_t idx) {
    pthread_mutex_lock(&d.mu);
    while (d.completed < idx) pthread_cond_wait(&d.done, &d.mu);
    pthread_mutex_unlock(&d.mu);
}

__attribute__((destructor)) static void write_log(void) {
    const char *path = getenv("STUB_CUDA_LOG");
    if (!path || !*path) return;
    pthread_mutex_lock(&d.mu);
    uint64_t last = d.submitted;
    while (d.completed < last) pthread_cond_wait(&d.done, &d.mu); /* finish queued work */
    FILE *f = fopen(path, "w");
    if (f) {
        for (size_t i = 0; i < d.log_len; i++)
            fprintf(f, "%lld %lld %s\n", (long long)d.log[i].start, (long long)d.log[i].end,
                    d.log[i].fn->name);
        fprintf(f, "# mem_used_bytes %zu failed_allocs %llu\n", d.mem_used,
                (unsigned long long)d.failed_allocs);
        fclose(f);
    }
    pthread_mutex_unlock(&d.mu);
}

/* ---- stub-only: the device's busy time so far (bench) ---- */
API int64_t stub_cuda_busy_ns(void) {
    pthread_mutex_lock(&d.mu);
    int64_t t = 0;
    for (size_t i = 0; i < d.log_len; i++) t += d.log[i].end - d.log[i].start;
    pthread_mutex_unlock(&d.mu);
    return t;
}

/* ---- init, device, context ---- */
API CUresult cuInit(unsigned flags) {
    pthread_mutex_lock(&d.mu);
    start_device();
    pthread_mutex_unlock(&d.mu);
    return CUDA_SUCCESS;
}
API CUresult cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }
API CUresult cuDeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }
API CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *dev = 0;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    snprintf(name, (size_t)len, "gshare stub device");
    return CUDA_SUCCESS;
}
API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    cuInit(0);
    *bytes = d.mem_total;
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice dev) {
    cuInit(0);
    *c = &the_ctx;
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return CUDA_SUCCESS; }
API CUresult cuCtxSetCurrent(CUcontext c) { current = c; return CUDA_SUCCESS; }
API CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return CUDA_SUCCESS; }
API CUresult cuCtxSynchronize(void) {
    if (unsafe()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&d.mu);
    uint64_t last = d.submitted;
    pthread_mutex_unlock(&d.mu);
    wait_for(last);
    return CUDA_SUCCESS;
}
/* CUDA 13's ABI of "cuCtxSynchronize" (cuGetProcAddress at version >= 13000): a context, NULL
 * for the current one; anything else is refused, as a driver refuses a context it does not
 * know -- so a caller that drops the argument (a wrapper of the old ABI) is caught. */
API CUresult cuCtxSynchronize_v2(CUcontext c) {
    if (c != NULL && c != current) return CUDA_ERROR_INVALID_CONTEXT;
    return cuCtxSynchronize();
}

/* ---- modules and functions ---- */
API CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    *m = (CUmodule)&the_ctx;
    return CUDA_SUCCESS;
}
API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    CUfunction fn = calloc(1, sizeof *fn);
    snprintf(fn->name, sizeof fn->name, "%s", name);
    fn->default_us = 100;
    const char *table = getenv("STUB_CUDA_KERNEL_US"); /* name=us,name=us */
    size_t n = strlen(name);
    for (const char *p = table; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == '=') fn->default_us = (unsigned)atoi(p + n + 1);
    *f = fn;
    return CUDA_SUCCESS;
}
API CUresult cuFuncGetName(const char **name, CUfunction f) {
    const char *off = getenv("STUB_CUDA_NO_FUNC_NAME");
    if (off && *off == '1') return CUDA_ERROR_NOT_SUPPORTED;
    *name = f->name;
    return CUDA_SUCCESS;
}

/* ---- launches ---- */
static CUresult launch(CUfunction f, CUstream s, void **params) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    unsigned us = params && params[0] ? *(unsigned *)params[0] : f->default_us;
    if (captured(s)) return CUDA_SUCCESS; /* recorded into the graph, not run */
    submit(OP_KERNEL, s, (int64_t)us * 1000, NULL, f);
    return CUDA_SUCCESS;
}
API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params,
                            void **extra) {
    return launch(f, s, params);
}
API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params,
                              void **extra) {
    return launch(f, c->hStream, params);
}
API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                       unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                       CUstream s, void **params) {
    return launch(f, s, params);
}

/* ---- graphs ---- */
API CUresult cuGraphCreate(CUgraph *g, unsigned flags) {
    *g = calloc(1, sizeof **g);
    return CUDA_SUCCESS;
}
API CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags) {
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    *e = calloc(1, sizeof **e);
    snprintf((*e)->fn.name, sizeof (*e)->fn.name, "graph");
    const char *us = getenv("STUB_CUDA_GRAPH_US");
    (*e)->fn.default_us = us && *us ? (unsigned)atoi(us) : 500;
    return CUDA_SUCCESS;
}
API CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    submit(OP_KERNEL, s, (int64_t)e->fn.default_us * 1000, NULL, &e->fn);
    return CUDA_SUCCESS;
}
API CUresult cuGraphExecDestroy(CUgraphExec e) { free(e); return CUDA_SUCCESS; }
API CUresult cuGraphDestroy(CUgraph g) { free(g); return CUDA_SUCCESS; }

/* ---- streams ---- */
API CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    *s = calloc(1, sizeof **s);
    return CUDA_SUCCESS;
}
API CUresult cuStreamDestroy_v2(CUstream s) { free(s); return CUDA_SUCCESS; }
API CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
    if (!s) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* not the legacy stream */
    pthread_mutex_lock(&d.mu);
    CUresult rc = CUDA_ERROR_ILLEGAL_STATE; /* (the stub captures one stream at a time) */
    if (!capture_stream) {
        capture_stream = s;
        capture_global = mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
        s->capturing = 1;
        s->invalidated = 0;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&d.mu);
    return rc;
}
API CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
    pthread_mutex_lock(&d.mu);
    if (!s || s != capture_stream) {
        pthread_mutex_unlock(&d.mu);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    capture_stream = NULL;
    s->capturing = 0;
    int bad = s->invalidated;
    pthread_mutex_unlock(&d.mu);
    *g = bad ? NULL : calloc(1, sizeof **g);
    return bad ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}
API CUresult cuStreamSynchronize(CUstream s) {
    if (unsafe()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    wait_for((s ? s : &default_stream)->last);
    return CUDA_SUCCESS;
}
API CUresult cuStreamQuery(CUstream s) {
    if (unsafe()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&d.mu);
    int ready = d.completed >= (s ? s : &default_stream)->last;
    pthread_mutex_unlock(&d.mu);
    return ready ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

/* ---- events ---- */
API CUresult cuEventCreate(CUevent *e, unsigned flags) {
    *e = calloc(1, sizeof **e);
    return CUDA_SUCCESS;
}
API CUresult cuEventDestroy_v2(CUevent e) { free(e); return CUDA_SUCCESS; }
API CUresult cuEventRecord(CUevent e, CUstream s) {
    if (captured(s)) return CUDA_SUCCESS; /* a node of the graph, not run */
    submit(OP_EVENT, s, 0, e, NULL);
    return CUDA_SUCCESS;
}
API CUresult cuEventQuery(CUevent e) {
    if (unsafe()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&d.mu);
    int ready = d.completed >= e->idx;
    pthread_mutex_unlock(&d.mu);
    return ready ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
API CUresult cuEventSynchronize(CUevent e) {
    if (unsafe()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    wait_for(e->idx);
    return CUDA_SUCCESS;
}
API CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    pthread_mutex_lock(&d.mu);
    int ready = a->idx && b->idx && d.completed >= a->idx && d.completed >= b->idx;
    if (ready) *ms = (float)((double)(b->t_ns - a->t_ns) / 1e6);
    pthread_mutex_unlock(&d.mu);
    return ready ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
API CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) {
    return cuEventElapsedTime(ms, a, b);
}

/* ---- memory ---- */
static CUresult dev_alloc(CUdeviceptr *p, size_t n) {
    pthread_mutex_lock(&d.mu);
    start_device();
    if (n == 0 || n > d.mem_total - d.mem_used) {
        d.failed_allocs++;
        pthread_mutex_unlock(&d.mu);
        return n ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
    }
    if (d.n_allocs == d.cap_allocs) {
        d.cap_allocs = d.cap_allocs ? 2 * d.cap_allocs : 256;
        d.allocs = realloc(d.allocs, d.cap_allocs * sizeof *d.allocs);
    }
    *p = d.next_addr;
    d.next_addr += (n + 511) & ~(size_t)511; /* never reused: stale frees are caught */
    d.allocs[d.n_allocs].p = *p;
    d.allocs[d.n_allocs++].n = n;
    d.mem_used += n;
    pthread_mutex_unlock(&d.mu);
    return CUDA_SUCCESS;
}
static CUresult dev_free(CUdeviceptr p) {
    pthread_mutex_lock(&d.mu);
    for (size_t i = 0; i < d.n_allocs; i++)
        if (d.allocs[i].p == p) {
            d.mem_used -= d.allocs[i].n;
            d.allocs[i] = d.allocs[--d.n_allocs];
            pthread_mutex_unlock(&d.mu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&d.mu);
    return CUDA_ERROR_INVALID_VALUE;
}
API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return dev_alloc(p, n); }
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned flags) {
    return dev_alloc(p, n);
}
API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h,
                                unsigned elem) {
    *pitch = (w + 511) & ~(size_t)511;
    return dev_alloc(p, *pitch * h);
}
API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { return dev_alloc(p, n); }
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    return dev_alloc(p, n);
}
API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n,
                         const CUmemAllocationProp *prop, unsigned long long flags) {
    CUdeviceptr p = 0;
    CUresult rc = dev_alloc(&p, n);
    if (rc == CUDA_SUCCESS) *h = (CUmemGenericAllocationHandle)p;
    return rc;
}
API CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return dev_free((CUdeviceptr)h); }
API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t align, CUdeviceptr addr,
                                 unsigned long long flags) {
    pthread_mutex_lock(&d.mu);
    start_device();
    *p = d.next_addr; /* address space only: no memory */
    d.next_addr += (n + 511) & ~(size_t)511;
    pthread_mutex_unlock(&d.mu);
    return CUDA_SUCCESS;
}
API CUresult cuMemAddressFree(CUdeviceptr p, size_t n) { return CUDA_SUCCESS; }
API CUresult cuMemMap(CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h,
                      unsigned long long flags) {
    return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
API CUresult cuMemUnmap(CUdeviceptr p, size_t n) { return CUDA_SUCCESS; }
API CUresult cuMemFree_v2(CUdeviceptr p) { return dev_free(p); }
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return dev_free(p); }
API CUresult cuMemGetInfo_v2(size_t *freeb, size_t *total) {
    pthread_mutex_lock(&d.mu);
    start_device();
    *total = d.mem_total;
    *freeb = d.mem_total - d.mem_used;
    pthread_mutex_unlock(&d.mu);
    return CUDA_SUCCESS;
}
API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    cuCtxSynchronize();
    return CUDA_SUCCESS;
}
API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    cuCtxSynchronize(); /* a synchronous copy waits for the device */
    memset(dst, 0, n);
    return CUDA_SUCCESS;
}
API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    memset(dst, 0, n);
    submit(OP_MARK, s, 0, NULL, NULL);
    return CUDA_SUCCESS;
}

/* ---- entry points by name (what cuGetProcAddress resolves; the stub ignores the
 * per-thread-default-stream flag: it has one FIFO) ---- */
API CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t,
                                 CUdriverProcAddressQueryResult *);
API CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);

#define E(base, fn) {base, (void *)fn}
static const struct {
    const char *name;
    void *fn;
} entries[] = {
    E("cuInit", cuInit), E("cuDriverGetVersion", cuDriverGetVersion),
    E("cuDeviceGetCount", cuDeviceGetCount), E("cuDeviceGet", cuDeviceGet),
    E("cuDeviceGetName", cuDeviceGetName), E("cuDeviceTotalMem", cuDeviceTotalMem_v2),
    E("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain),
    E("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2),
    E("cuCtxSetCurrent", cuCtxSetCurrent), E("cuCtxGetCurrent", cuCtxGetCurrent),
    E("cuCtxSynchronize", cuCtxSynchronize), E("cuModuleLoadData", cuModuleLoadData),
    E("cuModuleGetFunction", cuModuleGetFunction), E("cuFuncGetName", cuFuncGetName),
    E("cuLaunchKernel", cuLaunchKernel), E("cuLaunchKernelEx", cuLaunchKernelEx),
    E("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel),
    E("cuStreamCreate", cuStreamCreate), E("cuStreamDestroy", cuStreamDestroy_v2),
    E("cuStreamSynchronize", cuStreamSynchronize), E("cuStreamQuery", cuStreamQuery),
    E("cuEventCreate", cuEventCreate), E("cuEventDestroy", cuEventDestroy_v2),
    E("cuEventRecord", cuEventRecord), E("cuEventQuery", cuEventQuery),
    E("cuEventSynchronize", cuEventSynchronize), E("cuEventElapsedTime", cuEventElapsedTime),
    E("cuMemAlloc", cuMemAlloc_v2), E("cuMemAllocManaged", cuMemAllocManaged),
    E("cuMemAllocPitch", cuMemAllocPitch_v2), E("cuMemAllocAsync", cuMemAllocAsync),
    E("cuMemFree", cuMemFree_v2), E("cuMemFreeAsync", cuMemFreeAsync),
    E("cuMemGetInfo", cuMemGetInfo_v2), E("cuMemcpyHtoD", cuMemcpyHtoD_v2),
    E("cuMemcpyDtoH", cuMemcpyDtoH_v2), E("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2),
    E("cuGraphCreate", cuGraphCreate), E("cuGraphInstantiate", cuGraphInstantiateWithFlags),
    E("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags),
    E("cuGraphLaunch", cuGraphLaunch), E("cuGraphExecDestroy", cuGraphExecDestroy),
    E("cuGraphDestroy", cuGraphDestroy), E("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync),
    E("cuMemCreate", cuMemCreate), E("cuMemRelease", cuMemRelease),
    E("cuMemAddressReserve", cuMemAddressReserve), E("cuMemAddressFree", cuMemAddressFree),
    E("cuMemMap", cuMemMap), E("cuMemUnmap", cuMemUnmap),
    E("cuStreamBeginCapture", cuStreamBeginCapture_v2), E("cuStreamEndCapture", cuStreamEndCapture),
};

static CUresult lookup(const char *sym, void **pfn, int ver) {
    if (!strcmp(sym, "cuGetProcAddress")) {
        *pfn = ver >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
        return CUDA_SUCCESS;
    }
    if (!strcmp(sym, "cuCtxSynchronize") && ver >= 13000) { /* the ABI changed in CUDA 13 */
        *pfn = (void *)cuCtxSynchronize_v2;
        return CUDA_SUCCESS;
    }
    for (size_t i = 0; i < sizeof entries / sizeof *entries; i++)
        if (!strcmp(entries[i].name, sym)) {
            *pfn = entries[i].fn;
            return CUDA_SUCCESS;
        }
    *pfn = NULL;
    return CUDA_ERROR_NOT_FOUND;
}
API CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status) {
    CUresult rc = lookup(sym, pfn, ver);
    if (status) *status = rc == CUDA_SUCCESS ? CU_GET_PROC_ADDRESS_SUCCESS
                                             : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return rc;
}
API CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags) {
    return lookup(sym, pfn, ver);
}

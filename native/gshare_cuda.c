/*
 * libgshare_cuda.so -- gshare's CUDA driver-API interposer (DESIGN "GPU frontend").
 *
 * Two deployments of the same code (gshare.runtime.native, GSHARE_CUDA_DEPLOYMENT):
 *
 *   preload  libgshare_cuda.so in LD_PRELOAD. It exports the intercepted driver symbols, a
 *            dlsym() that hands out the same wrappers for them (the CUDA runtime dlopens
 *            libcuda.so.1 and dlsyms from that handle, which LD_PRELOAD does not reach), and a
 *            cuGetProcAddress (v1 and _v2) that does too. A runtime that reaches the driver
 *            any other way is not governed.
 *   shim     built with -DGSHARE_SHIM into DIR/libcuda.so.1 (build_shim) together with
 *            generated x86-64 forwarders (`jmp *slot`) for every other function the real
 *            driver exports; DIR first on LD_LIBRARY_PATH. Every dlopen("libcuda.so.1") and
 *            -lcuda finds it. The real driver is dlopened RTLD_LOCAL by absolute path
 *            (GSHARE_REAL_LIBCUDA, else the path the shim was built from; refused if it is a
 *            gshare library) and the slots are filled by a constructor. No dlsym export.
 *
 * Every path to a kernel launch ends in one gate:
 *
 *   tokens  (FaST-GShare 3.3.2, Gemini): a launch (cuLaunchKernel, cuLaunchKernelEx,
 *           cuLaunchCooperativeKernel, their _ptsz forms) or a graph launch (cuGraphLaunch,
 *           _ptsz: one opaque burst keyed by the graph exec, sampled with events like a
 *           kernel) needs a time token from the node's token server (gshare.runtime.tokens,
 *           same Unix-socket protocol and policy as the Python client). While a token is held
 *           the gate is a mutex (uncontended: one atomic, no syscall), a vDSO clock read and a
 *           hash lookup. When the predicted device end of the work queued on the token plus
 *           the predicted next kernel passes the token's end, the token is given back early
 *           (Gemini revocation): the work queued on it is drained, its device busy time
 *           (events recorded around the burst) is reported on RELEASE, and a new token is
 *           asked for. A reaper thread gives a token back when it expires while the process
 *           launches nothing. While a stream capture is in progress (cuStreamBeginCapture*
 *           .. cuStreamEndCapture*) launches pass through ungated: they record a graph, and the
 *           gate's event queries would invalidate a global-mode capture.
 *   memory  device allocations (cuMemAlloc/_Pitch/Managed/Async, cuMemAllocFromPoolAsync) and
 *           VMM physical allocations (cuMemCreate, per handle) are accounted exactly and
 *           refused with CUDA_ERROR_OUT_OF_MEMORY past GSHARE_CUDA_MEM_LIMIT_MB; frees (sync
 *           and async) and cuMemRelease return their bytes; cuMemGetInfo reports the cap.
 *   kernel identity (FIKIT 3.2): function name (cuFuncGetName, else the name given to
 *           cuModuleGetFunction, else "fn@<address>") + grid + block. Kernel durations are
 *           sampled with event pairs (first launches of an ID, then 1 in SAMPLE_EVERY) to
 *           predict the next kernel; GSHARE_CUDA_PROFILE=<path> measures every kernel and its
 *           idle gap and writes a policy.priority KernelProfile (to_records JSON) at exit
 *           (graphs have no kernel ID: they are left out of it).
 *
 * Configuration (read at the first intercepted call; gshare_cuda_configure() overrides it,
 * which is how the runtime passes the instance secret without putting it in the environment):
 *   GSHARE_TOKEN_SOCKET, GSHARE_CLIENT_ID, GSHARE_TOKEN_SECRET   token server and identity
 *                                        (no socket: launches are not governed)
 *   GSHARE_CUDA_MEM_LIMIT_MB             memory cap (unset or 0: none)
 *   GSHARE_CUDA_PROFILE, GSHARE_CUDA_TASK_KEY   measurement mode output and its task key
 *   GSHARE_CUDA_STATS                    JSON counters written at exit (also when nothing was
 *                                        intercepted): launches, launches_by_entry (per entry
 *                                        point), graph_launches,
 *                                        launches_while_capturing, deployment ("preload" |
 *                                        "shim", from the name this library was loaded as),
 *                                        tokens, memory (mem_live_bytes includes
 *                                        vmm_bytes_live), ...
 *   GSHARE_CUDA_MARGIN_US                stop this much before the token end (default 200)
 *   GSHARE_TOKEN_EPOCH_S                 the token server's epoch_s (CLOCK_MONOTONIC seconds):
 *                                        work on a token then also stops at its window's end
 *   GSHARE_REAL_LIBCUDA                  the real driver (preload: default libcuda.so.1; shim:
 *                                        an absolute path, default the one it was built from)
 *
 * Limits (see DESIGN): one context per process is assumed for the burst events; multi-GPU
 * processes are not handled; launches from other streams during a capture are ungoverned,
 * and a token held when a capture begins is kept until it ends; a graph's first launches run
 * unmeasured; cuGetExportTable (the runtime's private tables) is forwarded untouched; an async
 * free and cuMemRelease are credited when called. Never run on a real GPU.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* cuda.h renames these to their _v2 forms; we export both versions by their real names. */
#undef cuGetProcAddress
#undef cuEventElapsedTime
#undef cuStreamBeginCapture

#define API __attribute__((visibility("default")))
#define SAMPLE_FIRST 3      /* sample the first launches of every kernel ID ... */
#define SAMPLE_EVERY 64     /* ... then one launch in this many */
#define N_KERNELS 4096      /* kernel-ID table (open addressing) */
#define N_SAMPLES 256       /* event pairs in flight */
#define N_STREAMS 16        /* streams tracked per burst */
#define N_SEGS 64           /* closed burst segments waiting to be read */
#define SPLIT_NS 100000     /* split a segment when the device is predicted idle this long */
#define N_CAPTURES 64       /* stream captures in progress tracked by stream */

/* The launch entry points, counted apart (stats "launches_by_entry"): which doors the
 * application's launches really came through is the check that the interception works. */
enum { E_LAUNCH, E_LAUNCH_PTSZ, E_LAUNCH_EX, E_LAUNCH_EX_PTSZ, E_COOP, E_COOP_PTSZ, E_GRAPH,
       E_GRAPH_PTSZ, N_ENTRIES };
static const char *const entry_names[N_ENTRIES] = {
    "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
    "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz", "cuGraphLaunch",
    "cuGraphLaunch_ptsz"};

/* ---------------------------------------------------------------- real driver lookup ---- */

static void warn(const char *fmt, ...);
typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym;
static void *libcuda;

#ifdef GSHARE_SHIM
/* The shim is libcuda.so.1 itself: it does not export dlsym (nothing to redirect: a handle on
 * libcuda.so.1 is this library), so libc's dlsym is the real one. */
static void resolve_dlsym(void) { real_dlsym = dlsym; }
#ifndef GSHARE_SHIM_REAL
#define GSHARE_SHIM_REAL ""
#endif
#else
static void resolve_dlsym(void) {
    if (!real_dlsym) real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym) real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
}
#endif

/* Loads the real driver. Preloaded: GSHARE_REAL_LIBCUDA, else "libcuda.so.1" (the library
 * path finds the driver). As the shim: GSHARE_REAL_LIBCUDA, else the path the shim was built
 * from; never "libcuda.so.1" (that name is the shim), loaded RTLD_LOCAL so that the real
 * symbols never enter the global scope, and refused when the path is a gshare library. */
static void *open_real(void) {
    const char *path = getenv("GSHARE_REAL_LIBCUDA");
#ifdef GSHARE_SHIM
    static int failed; /* said once (at load): every call fails after that, no retry */
    if (__atomic_load_n(&failed, __ATOMIC_RELAXED)) return NULL;
    if (!path || !*path) path = GSHARE_SHIM_REAL;
    void *h = NULL;
    if (!*path || path[0] != '/') {
        warn("shim: GSHARE_REAL_LIBCUDA must be the real driver's absolute path (got \"%s\")",
             path);
    } else if (!(h = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
        warn("shim: cannot load the real driver %s: %s", path, dlerror());
    } else if (dlsym(h, "gshare_cuda_configure")) {
        warn("shim: %s is a gshare library, not the real driver", path);
        dlclose(h);
        h = NULL;
    }
    if (!h) __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
    return h;
#else
    return dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
#endif
}

static void *real_sym(const char *name) {
    resolve_dlsym();
    if (!libcuda) {
        void *h = open_real();
        if (!h) return NULL;
        libcuda = h; /* a benign race: dlopen returns the same handle */
    }
    return real_dlsym(libcuda, name);
}

/* One slot per exported real symbol, filled on first use (a benign race: same value). */
static inline void *real_of(void **slot, const char *name) {
    void *p = *slot;
    if (__builtin_expect(!p, 0)) p = *slot = real_sym(name);
    return p;
}
#define REAL(slot, name) real_of(&(slot), name)

static void *r_cuLaunchKernel, *r_cuLaunchKernel_ptsz, *r_cuLaunchKernelEx,
    *r_cuLaunchKernelEx_ptsz, *r_cuLaunchCooperativeKernel, *r_cuLaunchCooperativeKernel_ptsz,
    *r_cuCtxSynchronize, *r_cuCtxSynchronize_v2, *r_cuStreamSynchronize,
    *r_cuStreamSynchronize_ptsz, *r_cuEventSynchronize, *r_cuMemcpyDtoH_v2,
    *r_cuMemcpyDtoH_v2_ptds, *r_cuMemcpyDtoHAsync_v2, *r_cuMemcpyDtoHAsync_v2_ptsz,
    *r_cuMemAlloc_v2, *r_cuMemAllocManaged, *r_cuMemAllocPitch_v2, *r_cuMemAllocAsync,
    *r_cuMemAllocAsync_ptsz, *r_cuMemFree_v2, *r_cuMemFreeAsync, *r_cuMemFreeAsync_ptsz,
    *r_cuMemGetInfo_v2, *r_cuModuleGetFunction, *r_cuGetProcAddress, *r_cuGetProcAddress_v2,
    *r_cuGraphLaunch, *r_cuGraphLaunch_ptsz, *r_cuMemCreate, *r_cuMemRelease,
    *r_cuMemAllocFromPoolAsync, *r_cuMemAllocFromPoolAsync_ptsz, *r_cuStreamBeginCapture,
    *r_cuStreamBeginCapture_ptsz, *r_cuStreamBeginCapture_v2, *r_cuStreamBeginCapture_v2_ptsz,
    *r_cuStreamBeginCaptureToGraph, *r_cuStreamBeginCaptureToGraph_ptsz, *r_cuStreamEndCapture,
    *r_cuStreamEndCapture_ptsz;
/* used by the gate itself, never wrapped */
static void *r_cuEventCreate, *r_cuEventRecord, *r_cuEventQuery, *r_cuEventElapsedTime,
    *r_cuCtxGetCurrent, *r_cuCtxSetCurrent, *r_cuFuncGetName, *r_cuEventSync_raw;

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, unsigned, CUstream, void **);
typedef CUresult (*void_fn)(void);
typedef CUresult (*ctx_fn)(CUcontext);
typedef CUresult (*ctxp_fn)(CUcontext *);
typedef CUresult (*stream_fn)(CUstream);
typedef CUresult (*event_fn)(CUevent);
typedef CUresult (*event_create_fn)(CUevent *, unsigned);
typedef CUresult (*event_record_fn)(CUevent, CUstream);
typedef CUresult (*elapsed_fn)(float *, CUevent, CUevent);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t);
typedef CUresult (*dtoh_async_fn)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*alloc_managed_fn)(CUdeviceptr *, size_t, unsigned);
typedef CUresult (*alloc_pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*alloc_pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*mem_create_fn)(CUmemGenericAllocationHandle *, size_t,
                                  const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*mem_release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*graph_launch_fn)(CUgraphExec, CUstream);
typedef CUresult (*capture1_fn)(CUstream);
typedef CUresult (*capture2_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*capture_graph_fn)(CUstream, CUgraph, const CUgraphNode *,
                                     const CUgraphEdgeData *, size_t, CUstreamCaptureMode);
typedef CUresult (*end_capture_fn)(CUstream, CUgraph *);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
typedef CUresult (*meminfo_fn)(size_t *, size_t *);
typedef CUresult (*getfunc_fn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*funcname_fn)(const char **, CUfunction);
typedef CUresult (*gpa1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t,
                            CUdriverProcAddressQueryResult *);

static inline CUresult ev_record(CUevent e, CUstream s) {
    return ((event_record_fn)REAL(r_cuEventRecord, "cuEventRecord"))(e, s);
}
static inline CUresult ev_sync(CUevent e) {
    return ((event_fn)REAL(r_cuEventSync_raw, "cuEventSynchronize"))(e);
}
static inline CUresult ev_query(CUevent e) {
    return ((event_fn)REAL(r_cuEventQuery, "cuEventQuery"))(e);
}
static float ev_elapsed_ms(CUevent a, CUevent b) {
    float ms = 0.f;
    if (!r_cuEventElapsedTime) r_cuEventElapsedTime = real_sym("cuEventElapsedTime_v2");
    if (!r_cuEventElapsedTime) r_cuEventElapsedTime = real_sym("cuEventElapsedTime");
    if (!r_cuEventElapsedTime || ((elapsed_fn)r_cuEventElapsedTime)(&ms, a, b) != CUDA_SUCCESS)
        return -1.f;
    return ms;
}

/* ---------------------------------------------------------------- state ----------------- */

static inline int64_t now_ns(void) { /* CLOCK_MONOTONIC: vDSO, no syscall */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

typedef struct {
    CUfunction fn; /* NULL = free slot */
    unsigned grid[3], block[3];
    char name[200];
    uint64_t launches;
    double ewma_ns; /* predicted duration (0: never measured) */
    uint64_t samples;
    /* measurement mode: KernelProfile sums */
    uint64_t count, gap_count;
    double total_ms, gap_total_ms;
} kentry;

typedef struct {
    kentry *k;
    CUevent start, end;
    double idle_ms; /* host time from the start event to the launch, on an idle device */
} sample;

static struct {
    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;
    int inited;
    /* configuration */
    char sock_path[108], client_id[256], secret[256];
    int governed, profile_all;
    char profile_path[512], stats_path[512], task_key[256];
    int64_t margin_ns;
    /* token */
    int fd;
    uint32_t seq;
    int held;
    uint64_t grant_no;
    int64_t t_grant, token_ns, dev_end;
    int64_t window_ns, epoch_ns; /* the server's windows (WELCOME), aligned to epoch_ns if known */
    int64_t slice_end;           /* where the held token's work must end */
    CUcontext ctx;
    int burst_open;     /* a burst segment is open: its start event is recorded */
    int64_t seg_t0;     /* host time of the segment's first launch */
    double seg_busy_ms; /* device time of the segments closed on this token */
    int64_t lead_ns;    /* device idle inside segments: from a start event to the first
                         * kernel, from the predicted end of the work to an end event */
    int64_t mark_tail_ns;
    int64_t seg_open_t;
    CUevent segs[N_SEGS][2]; /* closed segments not read yet (start, end) */
    int n_segs;
    CUevent burst_start, stream_end[N_STREAMS];
    CUstream streams[N_STREAMS];
    int n_streams, streams_overflow;
    int reaper_started;
    /* kernel IDs and samples */
    kentry *kernels;
    sample ring[N_SAMPLES];
    CUevent pool[2 * N_SAMPLES];
    int n_pool, ring_head, ring_len;
    CUevent prof_ref; /* measurement mode: time origin */
    kentry *prof_last;
    double prof_last_end_ms;
    /* memory (mem_used includes vmm_used: one account, one cap) */
    size_t mem_cap, mem_used, mem_peak, vmm_used;
    /* counters */
    uint64_t launches, fast, tokens, revoked, reaped, oom, denied, sampled, waited, late;
    uint64_t by_entry[N_ENTRIES];
    /* stream capture in progress: launches pass through (see cuStreamBeginCapture) */
    CUstream capturing[N_CAPTURES];
    int n_capturing, capture_overflow;
    uint64_t captured;
    int64_t max_late_ns;
    double busy_ms;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .fd = -1};

/* Memory accounting has its own lock: allocations never wait behind a token. */
static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
typedef struct {
    CUdeviceptr p; /* a device pointer, or a cuMemCreate handle (0: free slot) */
    size_t n;
} alloc_rec;
typedef struct {
    alloc_rec *v;
    size_t cap, len;
} rec_table;
static rec_table allocs, handles; /* by pointer; VMM physical allocations by handle */

/* Function names given to cuModuleGetFunction (the symbol-derived key when the driver has
 * no cuFuncGetName). Small append-only list guarded by g.mu. */
typedef struct {
    CUfunction fn;
    char name[200];
} fname;
static fname *fnames;
static size_t fnames_len, fnames_cap;

static void warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("gshare_cuda: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void copy_env(char *dst, size_t n, const char *var) {
    const char *v = getenv(var);
    if (v && *v) snprintf(dst, n, "%s", v);
}

static void finish(void);
static void init_locked(void) {
    if (g.inited) return;
    g.inited = 1;
    if (!g.sock_path[0]) copy_env(g.sock_path, sizeof g.sock_path, "GSHARE_TOKEN_SOCKET");
    if (!g.client_id[0]) copy_env(g.client_id, sizeof g.client_id, "GSHARE_CLIENT_ID");
    if (!g.secret[0]) copy_env(g.secret, sizeof g.secret, "GSHARE_TOKEN_SECRET");
    g.governed = g.sock_path[0] && g.client_id[0];
    const char *mb = getenv("GSHARE_CUDA_MEM_LIMIT_MB");
    if (mb && *mb && !g.mem_cap) g.mem_cap = (size_t)(strtod(mb, NULL) * 1048576.0);
    copy_env(g.profile_path, sizeof g.profile_path, "GSHARE_CUDA_PROFILE");
    copy_env(g.stats_path, sizeof g.stats_path, "GSHARE_CUDA_STATS");
    snprintf(g.task_key, sizeof g.task_key, "%s",
             getenv("GSHARE_CUDA_TASK_KEY") ? getenv("GSHARE_CUDA_TASK_KEY") : "process");
    g.profile_all = g.profile_path[0] != 0;
    const char *ep = getenv("GSHARE_TOKEN_EPOCH_S");
    if (ep && *ep) g.epoch_ns = (int64_t)(strtod(ep, NULL) * 1e9);
    const char *m = getenv("GSHARE_CUDA_MARGIN_US");
    g.margin_ns = (int64_t)((m && *m ? strtod(m, NULL) : 200.0) * 1000.0);
    g.kernels = calloc(N_KERNELS, sizeof(kentry));
    pthread_condattr_t a; /* the reaper's timed waits are on CLOCK_MONOTONIC, like now_ns */
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_destroy(&g.cv);
    pthread_cond_init(&g.cv, &a);
    atexit(finish);
}

static inline void ensure_init(void) {
    if (__builtin_expect(!__atomic_load_n(&g.inited, __ATOMIC_ACQUIRE), 0)) {
        pthread_mutex_lock(&g.mu);
        init_locked();
        pthread_mutex_unlock(&g.mu);
    }
}

/* With GSHARE_CUDA_STATS set, the counters are written even when nothing was intercepted: a
 * stats file with no launches says that the library was loaded and saw none (the check that
 * a stack's launches really come through it). */
__attribute__((constructor)) static void stats_at_load(void) {
    const char *s = getenv("GSHARE_CUDA_STATS");
    if (s && *s) ensure_init();
}

/* Called by the gshare runtime (ctypes) before the instance touches CUDA. */
API int gshare_cuda_configure(const char *sock, const char *client_id, const char *secret,
                              double mem_limit_mb) {
    pthread_mutex_lock(&g.mu);
    if (sock) snprintf(g.sock_path, sizeof g.sock_path, "%s", sock);
    if (client_id) snprintf(g.client_id, sizeof g.client_id, "%s", client_id);
    if (secret) snprintf(g.secret, sizeof g.secret, "%s", secret);
    if (mem_limit_mb > 0) g.mem_cap = (size_t)(mem_limit_mb * 1048576.0);
    g.governed = g.sock_path[0] && g.client_id[0];
    init_locked();
    g.governed = g.sock_path[0] && g.client_id[0];
    pthread_mutex_unlock(&g.mu);
    return 0;
}

/* ---------------------------------------------------------------- token protocol -------- */

#pragma pack(push, 1)
typedef struct {
    uint8_t op, flags;
    uint16_t length;
    uint32_t seq;
    double value; /* ms */
} frame;
#pragma pack(pop)
_Static_assert(sizeof(frame) == 16, "wire frame is 16 bytes (tokens.protocol.FRAME)");

enum { OP_HELLO = 1, OP_ACQUIRE = 2, OP_RELEASE = 3, OP_WELCOME = 0x81, OP_GRANT = 0x82,
       OP_ERROR = 0xEE };

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n) {
        ssize_t k = recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

/* Reads an ERROR's text into msg (truncated) and discards the rest. */
static void read_text(int fd, uint16_t len, char *msg, size_t n) {
    char buf[1024];
    size_t k = len < sizeof buf ? len : sizeof buf - 1;
    if (read_all(fd, buf, len < sizeof buf ? len : sizeof buf) < 0) k = 0;
    buf[k] = 0;
    snprintf(msg, n, "%s", buf);
}

static void drop_conn(void) {
    if (g.fd >= 0) close(g.fd);
    g.fd = -1;
    g.held = 0;
}

static int connect_server(void) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", g.sock_path);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        warn("no token server on %s: %s", g.sock_path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    size_t idn = strlen(g.client_id), sn = strlen(g.secret);
    char text[600];
    memcpy(text, g.client_id, idn);
    size_t len = idn;
    if (sn) {
        text[len++] = 0;
        memcpy(text + len, g.secret, sn);
        len += sn;
    }
    frame f = {OP_HELLO, 1 /* protocol version */, (uint16_t)len, 0, 0.0}, r;
    if (write_all(fd, &f, sizeof f) < 0 || write_all(fd, text, len) < 0 ||
        read_all(fd, &r, sizeof r) < 0) {
        warn("token server on %s closed the connection", g.sock_path);
        close(fd);
        return -1;
    }
    if (r.op != OP_WELCOME) {
        char msg[256] = "";
        if (r.op == OP_ERROR) read_text(fd, r.length, msg, sizeof msg);
        warn("token server refused client %s: %s", g.client_id, msg);
        close(fd);
        return -1;
    }
    g.fd = fd;
    g.window_ns = (int64_t)(r.value * 1e6);
    return 0;
}

/* Blocks until the server grants a token. 0 on success, -1: no token (fail closed). */
static int acquire_token(void) {
    if (g.fd < 0 && connect_server() < 0) return -1;
    uint32_t seq = ++g.seq;
    frame f = {OP_ACQUIRE, 0, 0, seq, 0.0}, r;
    if (write_all(g.fd, &f, sizeof f) < 0) goto lost;
    for (;;) {
        if (read_all(g.fd, &r, sizeof r) < 0) goto lost;
        if (r.op == OP_GRANT && r.seq == seq) break;
        if (r.op == OP_ERROR) {
            char msg[256];
            read_text(g.fd, r.length, msg, sizeof msg);
            warn("token server: %s", msg);
            if (r.seq == seq) return -1;
            continue;
        }
        goto lost;
    }
    g.held = 1;
    g.grant_no++;
    g.tokens++;
    g.t_grant = g.dev_end = now_ns();
    g.token_ns = (int64_t)(r.value * 1e6);
    g.slice_end = g.t_grant + g.token_ns - g.margin_ns;
    if (g.epoch_ns > 0 && g.window_ns > 0 && g.t_grant > g.epoch_ns) {
        /* Work stops at the end of the grant's window too: the scheduler charges a token
         * that crosses a window boundary by wall time since its grant, so device work late
         * in the token would fall into the next window uncharged. */
        int64_t w_end = g.epoch_ns + ((g.t_grant - g.epoch_ns) / g.window_ns + 1) * g.window_ns;
        if (w_end - g.margin_ns < g.slice_end) g.slice_end = w_end - g.margin_ns;
    }
    g.burst_open = 0;
    g.seg_busy_ms = 0.0;
    g.lead_ns = 0;
    pthread_cond_broadcast(&g.cv);
    return 0;
lost:
    warn("lost the token server on %s", g.sock_path);
    drop_conn();
    return -1;
}

static void resolve_samples(int wait);

/* Device busy time of a token = the sum of its burst segments. A segment opens at the first
 * launch on the token or after a synchronisation, with an event recorded before that launch
 * (the device is idle then, so the host time from that record to the launch -- normally a
 * microsecond, more when the host is preempted in between -- is device idle time and is
 * taken off; so is the time from the predicted end of the queued work to an end event
 * recorded later, when the host came late),
 * and closes at the next application synchronisation that drains it (an end event recorded
 * before the wait, read after it: Gemini's piggy-backed measurement) or at the release (end
 * events recorded and waited for). The device's idle time between segments -- the host
 * preparing the next batch -- is not charged. */

/* Reads the closed segments (their events are complete once the token is drained or the
 * application's wait returned) into seg_busy_ms and returns their events to the pool. */
static void read_segments(void) {
    for (int i = 0; i < g.n_segs; i++) {
        float ms = ev_elapsed_ms(g.segs[i][0], g.segs[i][1]);
        if (ms > 0.f) g.seg_busy_ms += ms;
        g.pool[g.n_pool++] = g.segs[i][0];
        g.pool[g.n_pool++] = g.segs[i][1];
    }
    g.n_segs = 0;
}

/* Drains the work queued on the held token, reports its device busy time, gives it back. */
static void release_token(int completed) {
    if (!g.held) return;
    double busy = 0.0;
    CUcontext prev = NULL;
    if (g.burst_open) {
        /* the events live in the context of the burst (the reaper thread has none current;
         * an application thread may have another one current: restored below) */
        ((ctxp_fn)REAL(r_cuCtxGetCurrent, "cuCtxGetCurrent"))(&prev);
        if (g.ctx && prev != g.ctx) ((ctx_fn)REAL(r_cuCtxSetCurrent, "cuCtxSetCurrent"))(g.ctx);
        if (g.streams_overflow) {
            /* too many streams to track: wait for the context, charge host time */
            ((void_fn)REAL(r_cuCtxSynchronize, "cuCtxSynchronize"))();
            busy = (double)(now_ns() - g.seg_t0) / 1e6;
        } else {
            int64_t t = now_ns();
            if (t > g.dev_end) g.lead_ns += t - g.dev_end; /* drained before: idle tail */
            for (int i = 0; i < g.n_streams; i++) ev_record(g.stream_end[i], g.streams[i]);
            for (int i = 0; i < g.n_streams; i++) {
                ev_sync(g.stream_end[i]);
                float ms = ev_elapsed_ms(g.burst_start, g.stream_end[i]);
                if (ms > busy) busy = ms;
            }
        }
        resolve_samples(0);
        if (g.ctx && prev != g.ctx) ((ctx_fn)REAL(r_cuCtxSetCurrent, "cuCtxSetCurrent"))(prev);
    }
    read_segments();
    busy += g.seg_busy_ms - (double)g.lead_ns / 1e6;
    if (busy < 0) busy = 0;
    g.busy_ms += busy;
    frame f = {OP_RELEASE, (uint8_t)(completed ? 1 : 0), 0, ++g.seq, busy};
    g.held = 0;
    g.burst_open = 0;
    if (write_all(g.fd, &f, sizeof f) < 0) drop_conn();
    pthread_cond_broadcast(&g.cv);
}

/* Gives back a token that expired while the process launched nothing (the server never
 * takes one back, so an idle holder would block the device). */
static void *reaper(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g.mu);
    for (;;) {
        while (!g.held) pthread_cond_wait(&g.cv, &g.mu);
        uint64_t no = g.grant_no;
        int64_t end = g.t_grant + g.token_ns;
        if (g.dev_end > end) end = g.dev_end;
        struct timespec ts = {end / 1000000000LL, end % 1000000000LL};
        int rc = pthread_cond_timedwait(&g.cv, &g.mu, &ts); /* cv uses CLOCK_MONOTONIC */
        if (rc == ETIMEDOUT && g.held && g.grant_no == no) {
            /* no event query or synchronisation while a capture is in progress: it would
             * invalidate the capture (global capture mode); the token is kept until it ends */
            while (g.n_capturing > 0) pthread_cond_wait(&g.cv, &g.mu);
            if (g.held && g.grant_no == no) {
                g.reaped++;
                release_token(1);
            }
        }
    }
    return NULL;
}

static void start_reaper(void) {
    pthread_t t;
    pthread_attr_t ta;
    pthread_attr_init(&ta);
    pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &ta, reaper, NULL) == 0) g.reaper_started = 1;
}

/* ---------------------------------------------------------------- kernel identity ------- */

static const char *name_of(CUfunction f, char *buf, size_t n) {
    const char *s = NULL;
    if (!r_cuFuncGetName) r_cuFuncGetName = real_sym("cuFuncGetName");
    if (r_cuFuncGetName && ((funcname_fn)r_cuFuncGetName)(&s, f) == CUDA_SUCCESS && s && *s)
        return s;
    for (size_t i = 0; i < fnames_len; i++)
        if (fnames[i].fn == f) return fnames[i].name;
    snprintf(buf, n, "fn@%p", (void *)f); /* not stable across runs: no name was seen */
    return buf;
}

static kentry *kernel_of(CUfunction f, const unsigned grid[3], const unsigned block[3]) {
    uint64_t h = (uint64_t)(uintptr_t)f * 0x9E3779B97F4A7C15ULL;
    for (int i = 0; i < 3; i++) h = (h ^ grid[i]) * 0x100000001B3ULL;
    for (int i = 0; i < 3; i++) h = (h ^ block[i]) * 0x100000001B3ULL;
    for (unsigned probe = 0; probe < N_KERNELS; probe++) {
        kentry *k = &g.kernels[(h + probe) & (N_KERNELS - 1)];
        if (k->fn == f && !memcmp(k->grid, grid, sizeof k->grid) &&
            !memcmp(k->block, block, sizeof k->block))
            return k;
        if (!k->fn) {
            char buf[64];
            k->fn = f;
            memcpy(k->grid, grid, sizeof k->grid);
            memcpy(k->block, block, sizeof k->block);
            if (grid[0]) snprintf(k->name, sizeof k->name, "%s", name_of(f, buf, sizeof buf));
            else snprintf(k->name, sizeof k->name, "graph@%p", (void *)f); /* a graph exec */
            return k;
        }
    }
    return NULL; /* table full: the kernel is neither predicted nor profiled */
}

/* Reads completed event pairs (oldest first): updates the duration EWMA and, in measurement
 * mode, the KernelProfile sums (duration and idle gap after the previous kernel). */
static void resolve_samples(int wait) {
    while (g.ring_len) {
        sample *s = &g.ring[g.ring_head];
        if (wait) ev_sync(s->end);
        else if (ev_query(s->end) != CUDA_SUCCESS) return;
        float ms = ev_elapsed_ms(s->start, s->end);
        if (ms >= 0.f && s->k) {
            kentry *k = s->k;
            if (ms - s->idle_ms > 0) ms -= (float)s->idle_ms; /* the host's launch latency */
            double ns = ms * 1e6;
            k->ewma_ns = k->samples ? 0.7 * k->ewma_ns + 0.3 * ns : ns;
            if (ns > k->ewma_ns) k->ewma_ns = ns; /* never under-predict the last one seen */
            k->samples++;
            if (g.profile_all) {
                float t0 = ev_elapsed_ms(g.prof_ref, s->start);
                k->count++;
                k->total_ms += ms;
                if (g.prof_last && t0 >= 0.f) {
                    double gap = t0 - g.prof_last_end_ms;
                    g.prof_last->gap_count++;
                    g.prof_last->gap_total_ms += gap > 0 ? gap : 0;
                }
                g.prof_last = k;
                g.prof_last_end_ms = t0 + ms;
            }
        }
        g.pool[g.n_pool++] = s->start;
        g.pool[g.n_pool++] = s->end;
        g.ring_head = (g.ring_head + 1) % N_SAMPLES;
        g.ring_len--;
    }
}

static CUevent new_event(void) {
    CUevent e = NULL;
    ((event_create_fn)REAL(r_cuEventCreate, "cuEventCreate"))(&e, CU_EVENT_DEFAULT);
    return e;
}

/* First use of the events (slow path): create them in the caller's context. */
static void ensure_events(void) {
    if (g.burst_start) return;
    ((ctxp_fn)REAL(r_cuCtxGetCurrent, "cuCtxGetCurrent"))(&g.ctx);
    g.burst_start = new_event();
    for (int i = 0; i < N_STREAMS; i++) g.stream_end[i] = new_event();
    for (int i = 0; i < 2 * N_SAMPLES; i++) g.pool[g.n_pool++] = new_event();
    if (g.profile_all) {
        g.prof_ref = new_event();
        ev_record(g.prof_ref, NULL);
    }
}

/* ---------------------------------------------------------------- the launch gate ------- */

/* 1 when the launch's stream has nothing left to run (cuStreamQuery), 0 when it is busy, -1
 * when the query is missing. Asked only on sampled launches: it re-anchors the predicted end
 * of the queued work (g.dev_end), which otherwise drifts ahead of the device by every
 * over-predicted kernel, and it tells a sample whose start event waited for the host's
 * launch (an idle stream) from one that waited for earlier kernels -- which the prediction
 * alone gets wrong for a kernel's first launches (predicted 0 ms, so the device looks idle
 * behind them): the host's latency was then subtracted from a kernel that ran back to back,
 * and a host preempted there under-measured it. Seen on an H200: without the re-anchoring,
 * resnet50's predicted end ran ahead, nearly every inference revoked its token (drain +
 * round trip), and the governed p50 rose by 6 to 80 %. */
static void *r_cuStreamQuery, *r_cuStreamQuery_ptsz;
static int stream_idle(CUstream s, int entry) {
    int ptsz = entry == E_LAUNCH_PTSZ || entry == E_LAUNCH_EX_PTSZ || entry == E_COOP_PTSZ ||
               entry == E_GRAPH_PTSZ;
    void *fn = ptsz ? REAL(r_cuStreamQuery_ptsz, "cuStreamQuery_ptsz")
                    : REAL(r_cuStreamQuery, "cuStreamQuery");
    return fn ? ((stream_fn)fn)(s) == CUDA_SUCCESS : -1;
}

typedef struct {
    kentry *k;
    int sample, opened, idle; /* idle: the device had nothing queued before this kernel */
    CUevent start, end;
    int64_t pred, t_check, t_sample, t_submit;
} gate_t;

/* Runs with g.mu held. Returns 0 when the launch may go (a token is held and the kernel is
 * predicted to end inside it), else a CUresult to return. */
static CUresult gate_enter(CUfunction f, const unsigned grid[3], const unsigned block[3],
                           CUstream stream, int entry, gate_t *gt) {
    init_locked();
    g.launches++;
    g.by_entry[entry]++;
    gt->sample = gt->opened = gt->idle = 0;
    gt->k = NULL;
    gt->t_check = 0;
    if (!g.governed && !g.profile_all) return CUDA_SUCCESS; /* pass-through */
    if (__builtin_expect(g.n_capturing > 0, 0)) {
        g.captured++; /* a stream capture is in progress: pass-through (cuStreamBeginCapture) */
        return CUDA_SUCCESS;
    }
    kentry *k = gt->k = kernel_of(f, grid, block);
    double pred = k ? k->ewma_ns : 0.0;
    gt->pred = (int64_t)pred;
    int want_sample =
        k && (g.profile_all || k->launches < SAMPLE_FIRST || k->launches % SAMPLE_EVERY == 0);
    int s_idle = want_sample ? stream_idle(stream, entry) : -1; /* -1: not known */
    if (s_idle == 1 && (g.n_streams == 0 || (g.n_streams == 1 && g.streams[0] == stream)) &&
        g.dev_end > now_ns())
        g.dev_end = now_ns(); /* the queue is empty: nothing is predicted ahead (stream_idle) */
    if (g.governed) {
        int64_t now = now_ns();
        int64_t start = g.dev_end > now ? g.dev_end : now;
        if (g.held && start + (int64_t)pred <= g.slice_end) {
            g.fast++; /* fast path: a token is held and the kernel fits in its rest */
        } else {
            if (g.held) {
                g.revoked++;
                release_token(0); /* Gemini revocation: the next kernel does not fit */
            }
            int ok = acquire_token() == 0;
            /* A fresh token too short for the predicted kernel (the rest of the client's quota
             * in this window, or a grant late in the window): give it back unused, wait for
             * the next window and ask again -- once: a kernel longer than any token the client
             * can get runs on the next one, and the policy charges the overrun as debt.
             * Without the server's epoch the window is unknown and the kernel runs at once. */
            if (ok && g.epoch_ns > 0 && g.window_ns > 0 && g.t_grant + (int64_t)pred > g.slice_end) {
                int64_t w_end =
                    g.epoch_ns + ((g.t_grant - g.epoch_ns) / g.window_ns + 1) * g.window_ns;
                release_token(0);
                g.waited++;
                struct timespec ts = {w_end / 1000000000LL, w_end % 1000000000LL};
                while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL)) {
                }
                ok = acquire_token() == 0;
            }
            if (!ok) {
                g.denied++;
                return CUDA_ERROR_NOT_PERMITTED; /* no launch without a token */
            }
            if (!g.reaper_started) start_reaper();
            now = g.t_grant;
            start = now;
        }
        ensure_events();
        if (g.burst_open && now > g.dev_end + SPLIT_NS && g.n_streams == 1 &&
            g.streams[0] == stream && g.n_segs < N_SEGS && g.n_pool >= 4) {
            /* the device is predicted idle (the host was slow to launch): close the segment
             * here so that the idle time is not charged, and open a new one */
            CUevent end = g.pool[--g.n_pool], begin = g.pool[--g.n_pool];
            g.lead_ns += now - g.dev_end; /* the device idled since the predicted end */
            ev_record(end, stream);
            g.segs[g.n_segs][0] = g.burst_start;
            g.segs[g.n_segs++][1] = end;
            g.burst_start = begin;
            g.burst_open = 0;
        }
        gt->idle = s_idle >= 0 ? s_idle : start == now;
        g.dev_end = start + (int64_t)pred;
        if (!g.burst_open) { /* a new burst segment, on an idle device */
            gt->opened = 1;
            g.seg_open_t = now_ns();
            ev_record(g.burst_start, stream);
            g.burst_open = 1;
            g.seg_t0 = now;
            g.n_streams = 0;
            g.streams_overflow = 0;
        }
        int seen = 0;
        for (int i = 0; i < g.n_streams; i++) seen |= g.streams[i] == stream;
        if (!seen) {
            if (g.n_streams < N_STREAMS) g.streams[g.n_streams++] = stream;
            else g.streams_overflow = 1;
        }
        gt->t_check = now;
    } else {
        ensure_events(); /* measurement mode without tokens */
        int64_t now = now_ns();
        gt->idle = s_idle >= 0 ? s_idle : g.dev_end <= now;
        g.dev_end = (g.dev_end > now ? g.dev_end : now) + (int64_t)pred;
    }
    if (want_sample) {
        if (g.ring_len == N_SAMPLES) resolve_samples(0);
        if (g.ring_len < N_SAMPLES && g.n_pool >= 2) {
            gt->sample = 1;
            gt->start = g.pool[--g.n_pool];
            gt->end = g.pool[--g.n_pool];
            ev_record(gt->start, stream);
            gt->t_sample = now_ns(); /* after the record: the latency subtracted is never more
                                      * than the host's time from the event to the launch */
        }
    }
    if (k) k->launches++;
    return CUDA_SUCCESS;
}

static void gate_exit(gate_t *gt, CUstream stream, CUresult rc) {
    if (gt->sample) {
        ev_record(gt->end, stream);
        if (rc == CUDA_SUCCESS) {
            int tail = (g.ring_head + g.ring_len) % N_SAMPLES;
            double idle = gt->idle ? (double)(gt->t_submit - gt->t_sample) / 1e6 : 0.0;
            g.ring[tail] = (sample){gt->k, gt->start, gt->end, idle};
            g.ring_len++;
            g.sampled++;
        } else {
            g.pool[g.n_pool++] = gt->start;
            g.pool[g.n_pool++] = gt->end;
        }
    }
}

/* A host preempted between the token check and the launch delays the kernel past the end the
 * check predicted (an overrun of up to the delay that no interposer can prevent): counted,
 * and the prediction moved so that the next launch is checked against it. */
static void late_check(gate_t *gt) {
    if (!gt->t_check) return;
    int64_t late = gt->t_submit - gt->t_check;
    if (late > SPLIT_NS) {
        g.late++;
        if (late > g.max_late_ns) g.max_late_ns = late;
    }
    if (g.dev_end < gt->t_submit + gt->pred) g.dev_end = gt->t_submit + gt->pred;
}

#define GATED_LAUNCH(slot, sym, entry, stream, call)                                            \
    do {                                                                                       \
        gate_t gt;                                                                             \
        pthread_mutex_lock(&g.mu);                                                             \
        CUresult rc = gate_enter(f, grid, block, stream, entry, &gt);                          \
        if (rc == CUDA_SUCCESS) {                                                              \
            void *real = REAL(slot, sym);                                                      \
            gt.t_submit = now_ns();                                                            \
            if (gt.opened) g.lead_ns += gt.t_submit - g.seg_open_t;                            \
            late_check(&gt);                                                                   \
            rc = real ? (call) : CUDA_ERROR_NOT_INITIALIZED;                                   \
            gate_exit(&gt, stream, rc);                                                        \
        }                                                                                      \
        pthread_mutex_unlock(&g.mu);                                                           \
        return rc;                                                                             \
    } while (0)

#define LAUNCH_ARGS                                                                            \
    CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
        unsigned shmem, CUstream s, void **params
#define DIMS                                                                                   \
    const unsigned grid[3] = {gx, gy, gz};                                                     \
    const unsigned block[3] = {bx, by, bz}

API CUresult cuLaunchKernel(LAUNCH_ARGS, void **extra) {
    DIMS;
    GATED_LAUNCH(r_cuLaunchKernel, "cuLaunchKernel", E_LAUNCH, s,
                 ((launch_fn)real)(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));
}
API CUresult cuLaunchKernel_ptsz(LAUNCH_ARGS, void **extra) {
    DIMS;
    GATED_LAUNCH(r_cuLaunchKernel_ptsz, "cuLaunchKernel_ptsz", E_LAUNCH_PTSZ, s,
                 ((launch_fn)real)(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));
}
API CUresult cuLaunchCooperativeKernel(LAUNCH_ARGS) {
    DIMS;
    GATED_LAUNCH(r_cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", E_COOP, s,
                 ((coop_fn)real)(f, gx, gy, gz, bx, by, bz, shmem, s, params));
}
API CUresult cuLaunchCooperativeKernel_ptsz(LAUNCH_ARGS) {
    DIMS;
    GATED_LAUNCH(r_cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel_ptsz", E_COOP_PTSZ, s,
                 ((coop_fn)real)(f, gx, gy, gz, bx, by, bz, shmem, s, params));
}
API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params,
                              void **extra) {
    const unsigned grid[3] = {c->gridDimX, c->gridDimY, c->gridDimZ};
    const unsigned block[3] = {c->blockDimX, c->blockDimY, c->blockDimZ};
    GATED_LAUNCH(r_cuLaunchKernelEx, "cuLaunchKernelEx", E_LAUNCH_EX, c->hStream,
                 ((launch_ex_fn)real)(c, f, params, extra));
}
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params,
                                   void **extra) {
    const unsigned grid[3] = {c->gridDimX, c->gridDimY, c->gridDimZ};
    const unsigned block[3] = {c->blockDimX, c->blockDimY, c->blockDimZ};
    GATED_LAUNCH(r_cuLaunchKernelEx_ptsz, "cuLaunchKernelEx_ptsz", E_LAUNCH_EX_PTSZ, c->hStream,
                 ((launch_ex_fn)real)(c, f, params, extra));
}

/* A graph launch is gated like a kernel: one opaque burst whose duration is unknown until
 * sampled (event pairs around it, like a kernel's), keyed by the graph exec handle with a zero
 * grid (no kernel has one). Its kernels are not seen one by one: the token may be overrun by
 * up to one graph's length on its first launches, before it has been measured. */
#define GRAPH_LAUNCH(slot, sym, entry)                                                          \
    do {                                                                                       \
        CUfunction f = (CUfunction)(void *)exec;                                               \
        const unsigned grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};                              \
        GATED_LAUNCH(slot, sym, entry, s, ((graph_launch_fn)real)(exec, s));                   \
    } while (0)
API CUresult cuGraphLaunch(CUgraphExec exec, CUstream s) {
    GRAPH_LAUNCH(r_cuGraphLaunch, "cuGraphLaunch", E_GRAPH);
}
API CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s) {
    GRAPH_LAUNCH(r_cuGraphLaunch_ptsz, "cuGraphLaunch_ptsz", E_GRAPH_PTSZ);
}

/* ---------------------------------------------------------------- stream capture -------- */
/* While a stream capture is in progress (CUDA graphs: PyTorch's torch.cuda.graph, vLLM and
 * torch.compile capture at start-up), the kernels launched into the capturing stream do not
 * run: they are recorded into a graph. Gating or sampling them would acquire tokens for
 * nothing and record events into the graph, and in the global capture mode (PyTorch's
 * default) any event query or synchronisation by the gate -- a revocation, the reaper -- from
 * any thread invalidates the capture. So while any capture is in progress every launch passes
 * through ungated (counted: stats "launches_while_capturing"), and the reaper keeps a held
 * token until the capture ends. The graph's launches are gated (cuGraphLaunch). */
static void capture_begin(CUstream s) {
    pthread_mutex_lock(&g.mu);
    if (g.n_capturing - g.capture_overflow < N_CAPTURES)
        g.capturing[g.n_capturing - g.capture_overflow] = s;
    else
        g.capture_overflow++;
    g.n_capturing++;
    pthread_mutex_unlock(&g.mu);
}
static void capture_end(CUstream s) {
    pthread_mutex_lock(&g.mu);
    int tracked = g.n_capturing - g.capture_overflow, found = 0;
    for (int i = 0; i < tracked && !found; i++)
        if (g.capturing[i] == s) {
            g.capturing[i] = g.capturing[tracked - 1];
            found = 1;
        }
    if (!found && g.capture_overflow) g.capture_overflow--, found = 1;
    if (found) g.n_capturing--;
    pthread_cond_broadcast(&g.cv); /* the reaper */
    pthread_mutex_unlock(&g.mu);
}
#define BEGIN_CAPTURE(slot, sym, type, ...)                                                     \
    do {                                                                                       \
        ensure_init();                                                                         \
        void *r = REAL(slot, sym);                                                             \
        CUresult rc = r ? ((type)r)(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED;                 \
        if (rc == CUDA_SUCCESS) capture_begin(s);                                              \
        return rc;                                                                             \
    } while (0)
API CUresult cuStreamBeginCapture(CUstream s) {
    BEGIN_CAPTURE(r_cuStreamBeginCapture, "cuStreamBeginCapture", capture1_fn, s);
}
API CUresult cuStreamBeginCapture_ptsz(CUstream s) {
    BEGIN_CAPTURE(r_cuStreamBeginCapture_ptsz, "cuStreamBeginCapture_ptsz", capture1_fn, s);
}
API CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
    BEGIN_CAPTURE(r_cuStreamBeginCapture_v2, "cuStreamBeginCapture_v2", capture2_fn, s, mode);
}
API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
    BEGIN_CAPTURE(r_cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture_v2_ptsz", capture2_fn,
                  s, mode);
}
API CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph graph, const CUgraphNode *deps,
                                         const CUgraphEdgeData *data, size_t n,
                                         CUstreamCaptureMode mode) {
    BEGIN_CAPTURE(r_cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph",
                  capture_graph_fn, s, graph, deps, data, n, mode);
}
API CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph graph,
                                              const CUgraphNode *deps,
                                              const CUgraphEdgeData *data, size_t n,
                                              CUstreamCaptureMode mode) {
    BEGIN_CAPTURE(r_cuStreamBeginCaptureToGraph_ptsz, "cuStreamBeginCaptureToGraph_ptsz",
                  capture_graph_fn, s, graph, deps, data, n, mode);
}
static CUresult end_capture(void **slot, const char *sym, CUstream s, CUgraph *graph) {
    void *r = REAL(*slot, sym);
    CUresult rc = r ? ((end_capture_fn)r)(s, graph) : CUDA_ERROR_NOT_INITIALIZED;
    /* over when it succeeded or was invalidated (other errors -- wrong thread, not capturing
     * -- leave it as it was; a stream never seen to begin one is ignored) */
    if (rc == CUDA_SUCCESS || rc == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) capture_end(s);
    return rc;
}
API CUresult cuStreamEndCapture(CUstream s, CUgraph *graph) {
    return end_capture(&r_cuStreamEndCapture, "cuStreamEndCapture", s, graph);
}
API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *graph) {
    return end_capture(&r_cuStreamEndCapture_ptsz, "cuStreamEndCapture_ptsz", s, graph);
}

/* ---------------------------------------------------------------- synchronisation ------- */
/* The application's own waits: after the real call, completed samples are read (Gemini
 * piggy-backs its measurement on them); no extra synchronisation is added. */

/* Before a wait that drains every stream of the open segment (a whole-context wait, or a
 * wait on its only stream): record the segment's end events. Returns a tag (0: no segment
 * end marked) that seg_close checks, so that a launch from another thread meanwhile keeps
 * the segment open. */
static uint64_t seg_mark(int whole, CUstream s) {
    uint64_t tag = 0;
    pthread_mutex_lock(&g.mu);
    if (g.held && g.burst_open && !g.streams_overflow &&
        (whole || (g.n_streams == 1 && g.streams[0] == s))) {
        int64_t t = now_ns(); /* the host came late to its wait: the device idled meanwhile */
        g.mark_tail_ns = t > g.dev_end ? t - g.dev_end : 0;
        for (int i = 0; i < g.n_streams; i++) ev_record(g.stream_end[i], g.streams[i]);
        tag = g.launches + 1;
    }
    pthread_mutex_unlock(&g.mu);
    return tag;
}

/* After the wait: close the segment (its end events are complete now) and read the kernel
 * samples that completed. */
static CUresult seg_close(uint64_t tag, CUresult rc) {
    pthread_mutex_lock(&g.mu);
    if (tag && rc == CUDA_SUCCESS && g.held && g.burst_open && g.launches + 1 == tag) {
        double busy = 0.0;
        int ok = 1;
        for (int i = 0; i < g.n_streams; i++) {
            float ms = ev_elapsed_ms(g.burst_start, g.stream_end[i]);
            ok &= ms >= 0.f;
            if (ms > busy) busy = ms;
        }
        if (ok) {
            int64_t t = now_ns(); /* the wait drained the queue: nothing is predicted ahead */
            if (g.dev_end > t) g.dev_end = t;
            read_segments();
            g.seg_busy_ms += busy;
            g.lead_ns += g.mark_tail_ns;
            g.burst_open = 0;
        }
    }
    if (g.ring_len) resolve_samples(0);
    pthread_mutex_unlock(&g.mu);
    return rc;
}

#define SYNC_WRAP(whole, stream, call)                                                         \
    do {                                                                                       \
        ensure_init();                                                                         \
        uint64_t tag = seg_mark(whole, stream);                                                \
        return seg_close(tag, call);                                                           \
    } while (0)

API CUresult cuCtxSynchronize(void) {
    void *r = REAL(r_cuCtxSynchronize, "cuCtxSynchronize");
    SYNC_WRAP(1, NULL, r ? ((void_fn)r)() : CUDA_ERROR_NOT_INITIALIZED);
}
API CUresult cuCtxSynchronize_v2(CUcontext c) {
    void *r = REAL(r_cuCtxSynchronize_v2, "cuCtxSynchronize_v2");
    SYNC_WRAP(1, NULL, r ? ((ctx_fn)r)(c) : CUDA_ERROR_NOT_INITIALIZED);
}
API CUresult cuStreamSynchronize(CUstream s) {
    void *r = REAL(r_cuStreamSynchronize, "cuStreamSynchronize");
    SYNC_WRAP(0, s, r ? ((stream_fn)r)(s) : CUDA_ERROR_NOT_INITIALIZED);
}
API CUresult cuStreamSynchronize_ptsz(CUstream s) {
    void *r = REAL(r_cuStreamSynchronize_ptsz, "cuStreamSynchronize_ptsz");
    SYNC_WRAP(0, s, r ? ((stream_fn)r)(s) : CUDA_ERROR_NOT_INITIALIZED);
}
API CUresult cuEventSynchronize(CUevent e) {
    void *r = REAL(r_cuEventSynchronize, "cuEventSynchronize");
    SYNC_WRAP(0, (CUstream)-1, r ? ((event_fn)r)(e) : CUDA_ERROR_NOT_INITIALIZED);
}
API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    void *r = REAL(r_cuMemcpyDtoH_v2, "cuMemcpyDtoH_v2");
    SYNC_WRAP(0, NULL, r ? ((dtoh_fn)r)(dst, src, n) : CUDA_ERROR_NOT_INITIALIZED);
}
API CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n) {
    void *r = REAL(r_cuMemcpyDtoH_v2_ptds, "cuMemcpyDtoH_v2_ptds");
    SYNC_WRAP(0, NULL, r ? ((dtoh_fn)r)(dst, src, n) : CUDA_ERROR_NOT_INITIALIZED);
}
API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    void *r = REAL(r_cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync_v2");
    SYNC_WRAP(0, (CUstream)-1, r ? ((dtoh_async_fn)r)(dst, src, n, s) : CUDA_ERROR_NOT_INITIALIZED);
}
API CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    void *r = REAL(r_cuMemcpyDtoHAsync_v2_ptsz, "cuMemcpyDtoHAsync_v2_ptsz");
    SYNC_WRAP(0, (CUstream)-1, r ? ((dtoh_async_fn)r)(dst, src, n, s) : CUDA_ERROR_NOT_INITIALIZED);
}

/* ---------------------------------------------------------------- memory ---------------- */

static inline size_t rec_hash(CUdeviceptr p, size_t cap) {
    return (size_t)((p * 0x9E3779B97F4A7C15ULL) >> 20) & (cap - 1);
}

static void rec_put(rec_table *t, CUdeviceptr p, size_t n) { /* linear probing */
    if (!p) return;
    if ((t->len + 1) * 2 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        alloc_rec *v = calloc(cap, sizeof *v), *old = t->v;
        for (size_t i = 0; i < t->cap; i++)
            if (old[i].p) {
                size_t j = rec_hash(old[i].p, cap);
                while (v[j].p) j = (j + 1) & (cap - 1);
                v[j] = old[i];
            }
        free(old);
        t->v = v, t->cap = cap;
    }
    size_t j = rec_hash(p, t->cap);
    while (t->v[j].p) j = (j + 1) & (t->cap - 1);
    t->v[j] = (alloc_rec){p, n};
    t->len++;
}

/* The size recorded for p, removed (backward-shift delete); 0 if unknown. */
static size_t rec_take(rec_table *t, CUdeviceptr p) {
    if (!t->cap || !p) return 0;
    size_t j = rec_hash(p, t->cap);
    while (t->v[j].p && t->v[j].p != p) j = (j + 1) & (t->cap - 1);
    if (!t->v[j].p) return 0;
    size_t n = t->v[j].n;
    t->v[j].p = 0;
    t->len--;
    for (size_t k = (j + 1) & (t->cap - 1); t->v[k].p; k = (k + 1) & (t->cap - 1)) {
        alloc_rec r = t->v[k];
        t->v[k].p = 0;
        size_t h = rec_hash(r.p, t->cap);
        while (t->v[h].p) h = (h + 1) & (t->cap - 1);
        t->v[h] = r;
    }
    return n;
}

/* Reserves n bytes against the cap before the real call (so two threads cannot both pass). */
static int mem_reserve(size_t n) {
    ensure_init();
    pthread_mutex_lock(&mem_mu);
    int ok = !g.mem_cap || (g.mem_used <= g.mem_cap && n <= g.mem_cap - g.mem_used);
    if (ok) {
        g.mem_used += n;
        if (g.mem_used > g.mem_peak) g.mem_peak = g.mem_used;
    } else {
        g.oom++;
    }
    pthread_mutex_unlock(&mem_mu);
    return ok;
}

/* After the real call: keep the reservation as a record of p, or give it back. */
static void mem_commit(CUresult rc, CUdeviceptr *p, size_t reserved, size_t actual) {
    pthread_mutex_lock(&mem_mu);
    g.mem_used -= reserved;
    if (rc == CUDA_SUCCESS && p) {
        g.mem_used += actual;
        if (g.mem_used > g.mem_peak) g.mem_peak = g.mem_used;
        rec_put(&allocs, *p, actual);
    }
    pthread_mutex_unlock(&mem_mu);
}

static void mem_release(CUdeviceptr p) {
    pthread_mutex_lock(&mem_mu);
    g.mem_used -= rec_take(&allocs, p);
    pthread_mutex_unlock(&mem_mu);
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (!mem_reserve(n)) return CUDA_ERROR_OUT_OF_MEMORY;
    void *r = REAL(r_cuMemAlloc_v2, "cuMemAlloc_v2");
    CUresult rc = r ? ((alloc_fn)r)(p, n) : CUDA_ERROR_NOT_INITIALIZED;
    mem_commit(rc, p, n, n);
    return rc;
}
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned flags) {
    if (!mem_reserve(n)) return CUDA_ERROR_OUT_OF_MEMORY;
    void *r = REAL(r_cuMemAllocManaged, "cuMemAllocManaged");
    CUresult rc = r ? ((alloc_managed_fn)r)(p, n, flags) : CUDA_ERROR_NOT_INITIALIZED;
    mem_commit(rc, p, n, n);
    return rc;
}
API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h,
                                unsigned elem) {
    size_t want = w * h; /* the pitch is only known after the call: checked again below */
    if (!mem_reserve(want)) return CUDA_ERROR_OUT_OF_MEMORY;
    void *r = REAL(r_cuMemAllocPitch_v2, "cuMemAllocPitch_v2");
    CUresult rc = r ? ((alloc_pitch_fn)r)(p, pitch, w, h, elem) : CUDA_ERROR_NOT_INITIALIZED;
    size_t actual = rc == CUDA_SUCCESS ? *pitch * h : 0;
    if (rc == CUDA_SUCCESS && actual > want) { /* padding: the cap holds on actual bytes */
        pthread_mutex_lock(&mem_mu);
        int over = g.mem_cap && g.mem_used - want + actual > g.mem_cap;
        pthread_mutex_unlock(&mem_mu);
        if (over) {
            ((free_fn)REAL(r_cuMemFree_v2, "cuMemFree_v2"))(*p);
            mem_commit(CUDA_ERROR_OUT_OF_MEMORY, NULL, want, 0);
            pthread_mutex_lock(&mem_mu);
            g.oom++;
            pthread_mutex_unlock(&mem_mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    mem_commit(rc, p, want, actual);
    return rc;
}
static CUresult alloc_async(void **slot, const char *sym, CUdeviceptr *p, size_t n,
                            CUstream s) {
    if (!mem_reserve(n)) return CUDA_ERROR_OUT_OF_MEMORY;
    void *r = REAL(*slot, sym);
    CUresult rc = r ? ((alloc_async_fn)r)(p, n, s) : CUDA_ERROR_NOT_INITIALIZED;
    mem_commit(rc, p, n, n);
    return rc;
}
API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) {
    return alloc_async(&r_cuMemAllocAsync, "cuMemAllocAsync", p, n, s);
}
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) {
    return alloc_async(&r_cuMemAllocAsync_ptsz, "cuMemAllocAsync_ptsz", p, n, s);
}
static CUresult alloc_pool(void **slot, const char *sym, CUdeviceptr *p, size_t n,
                           CUmemoryPool pool, CUstream s) {
    if (!mem_reserve(n)) return CUDA_ERROR_OUT_OF_MEMORY;
    void *r = REAL(*slot, sym);
    CUresult rc = r ? ((alloc_pool_fn)r)(p, n, pool, s) : CUDA_ERROR_NOT_INITIALIZED;
    mem_commit(rc, p, n, n);
    return rc;
}
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    return alloc_pool(&r_cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", p, n, pool, s);
}
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool,
                                          CUstream s) {
    return alloc_pool(&r_cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync_ptsz", p, n,
                      pool, s);
}

/* The virtual memory management API (PyTorch's expandable segments): physical memory is
 * cuMemCreate'd per handle and mapped into reserved address ranges (cuMemAddressReserve,
 * cuMemMap: not memory, not accounted). A handle's bytes count against the same cap from its
 * creation to its cuMemRelease (the driver keeps the memory until the last mapping is unmapped
 * too: credited at the release, like an async free at its enqueue). */
API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n,
                         const CUmemAllocationProp *prop, unsigned long long flags) {
    if (!mem_reserve(n)) return CUDA_ERROR_OUT_OF_MEMORY;
    void *r = REAL(r_cuMemCreate, "cuMemCreate");
    CUresult rc = r ? ((mem_create_fn)r)(h, n, prop, flags) : CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&mem_mu);
    if (rc == CUDA_SUCCESS && h && *h) {
        rec_put(&handles, *h, n);
        g.vmm_used += n;
    } else {
        g.mem_used -= n;
    }
    pthread_mutex_unlock(&mem_mu);
    return rc;
}
API CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    void *r = REAL(r_cuMemRelease, "cuMemRelease");
    CUresult rc = r ? ((mem_release_fn)r)(h) : CUDA_ERROR_NOT_INITIALIZED;
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&mem_mu);
        size_t n = rec_take(&handles, h);
        g.mem_used -= n;
        g.vmm_used -= n;
        pthread_mutex_unlock(&mem_mu);
    }
    return rc;
}

API CUresult cuMemFree_v2(CUdeviceptr p) {
    void *r = REAL(r_cuMemFree_v2, "cuMemFree_v2");
    CUresult rc = r ? ((free_fn)r)(p) : CUDA_ERROR_NOT_INITIALIZED;
    if (rc == CUDA_SUCCESS) mem_release(p);
    return rc;
}
static CUresult free_async(void **slot, const char *sym, CUdeviceptr p, CUstream s) {
    void *r = REAL(*slot, sym);
    CUresult rc = r ? ((free_async_fn)r)(p, s) : CUDA_ERROR_NOT_INITIALIZED;
    if (rc == CUDA_SUCCESS) mem_release(p); /* credited at enqueue, not when the stream runs */
    return rc;
}
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    return free_async(&r_cuMemFreeAsync, "cuMemFreeAsync", p, s);
}
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    return free_async(&r_cuMemFreeAsync_ptsz, "cuMemFreeAsync_ptsz", p, s);
}
API CUresult cuMemGetInfo_v2(size_t *freeb, size_t *total) {
    void *r = REAL(r_cuMemGetInfo_v2, "cuMemGetInfo_v2");
    CUresult rc = r ? ((meminfo_fn)r)(freeb, total) : CUDA_ERROR_NOT_INITIALIZED;
    ensure_init();
    if (rc == CUDA_SUCCESS && g.mem_cap) { /* the instance sees its cap as the device */
        pthread_mutex_lock(&mem_mu);
        size_t left = g.mem_cap > g.mem_used ? g.mem_cap - g.mem_used : 0;
        pthread_mutex_unlock(&mem_mu);
        if (*total > g.mem_cap) *total = g.mem_cap;
        if (*freeb > left) *freeb = left;
    }
    return rc;
}

/* Symbol-derived kernel key for drivers without cuFuncGetName. */
API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    void *r = REAL(r_cuModuleGetFunction, "cuModuleGetFunction");
    CUresult rc = r ? ((getfunc_fn)r)(f, m, name) : CUDA_ERROR_NOT_INITIALIZED;
    if (rc == CUDA_SUCCESS && name) {
        pthread_mutex_lock(&g.mu);
        if (fnames_len == fnames_cap) {
            fnames_cap = fnames_cap ? 2 * fnames_cap : 64;
            fnames = realloc(fnames, fnames_cap * sizeof *fnames);
        }
        fnames[fnames_len].fn = *f;
        snprintf(fnames[fnames_len++].name, sizeof fnames->name, "%s", name);
        pthread_mutex_unlock(&g.mu);
    }
    return rc;
}

/* ---------------------------------------------------------------- entry-point lookup ---- */

API CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);
API CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t,
                                 CUdriverProcAddressQueryResult *);

/* Exported name -> wrapper (dlsym hook) and real slot. */
typedef struct {
    const char *name;
    void *wrapper;
    void **real;
} hook;

#define H(fn) {#fn, (void *)fn, &r_##fn}
static const hook hooks[] = {
    H(cuLaunchKernel), H(cuLaunchKernel_ptsz), H(cuLaunchKernelEx), H(cuLaunchKernelEx_ptsz),
    H(cuLaunchCooperativeKernel), H(cuLaunchCooperativeKernel_ptsz), H(cuCtxSynchronize),
    H(cuCtxSynchronize_v2), H(cuStreamSynchronize), H(cuStreamSynchronize_ptsz),
    H(cuEventSynchronize), H(cuMemcpyDtoH_v2), H(cuMemcpyDtoH_v2_ptds),
    H(cuMemcpyDtoHAsync_v2), H(cuMemcpyDtoHAsync_v2_ptsz), H(cuMemAlloc_v2),
    H(cuMemAllocManaged), H(cuMemAllocPitch_v2), H(cuMemAllocAsync), H(cuMemAllocAsync_ptsz),
    H(cuMemFree_v2), H(cuMemFreeAsync), H(cuMemFreeAsync_ptsz), H(cuMemGetInfo_v2),
    H(cuModuleGetFunction), H(cuGetProcAddress), H(cuGetProcAddress_v2), H(cuGraphLaunch),
    H(cuGraphLaunch_ptsz), H(cuMemCreate), H(cuMemRelease), H(cuMemAllocFromPoolAsync),
    H(cuMemAllocFromPoolAsync_ptsz), H(cuStreamBeginCapture), H(cuStreamBeginCapture_ptsz),
    H(cuStreamBeginCapture_v2), H(cuStreamBeginCapture_v2_ptsz), H(cuStreamBeginCaptureToGraph),
    H(cuStreamBeginCaptureToGraph_ptsz), H(cuStreamEndCapture), H(cuStreamEndCapture_ptsz),
};

static const hook *find_hook(const char *name) {
    for (size_t i = 0; i < sizeof hooks / sizeof *hooks; i++)
        if (!strcmp(hooks[i].name, name)) return &hooks[i];
    return NULL;
}

/* cuGetProcAddress takes a base name ("cuMemAlloc") and a CUDA version; the driver picks the
 * ABI version (_v2 ...) and, with the per-thread flag, the _ptsz/_ptds form. We ask the real
 * driver, then hand out the wrapper of the same exported form (keeping the real pointer). */
static void *gpa_wrap(const char *sym, void *real, int ver, cuuint64_t flags) {
    static const struct {
        const char *base;
        const char *legacy, *ptsz;
        int min_ver; /* below it the driver returns an older ABI we do not wrap */
    } map[] = {
        {"cuLaunchKernel", "cuLaunchKernel", "cuLaunchKernel_ptsz", 0},
        {"cuLaunchKernelEx", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz", 0},
        {"cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel",
         "cuLaunchCooperativeKernel_ptsz", 0},
        {"cuCtxSynchronize", "cuCtxSynchronize", "cuCtxSynchronize", 0},
        {"cuCtxSynchronize_v2", "cuCtxSynchronize_v2", "cuCtxSynchronize_v2", 0},
        {"cuStreamSynchronize", "cuStreamSynchronize", "cuStreamSynchronize_ptsz", 0},
        {"cuEventSynchronize", "cuEventSynchronize", "cuEventSynchronize", 0},
        {"cuMemcpyDtoH", "cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds", 3020},
        {"cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz", 3020},
        {"cuMemAlloc", "cuMemAlloc_v2", "cuMemAlloc_v2", 3020},
        {"cuMemAllocManaged", "cuMemAllocManaged", "cuMemAllocManaged", 0},
        {"cuMemAllocPitch", "cuMemAllocPitch_v2", "cuMemAllocPitch_v2", 3020},
        {"cuMemAllocAsync", "cuMemAllocAsync", "cuMemAllocAsync_ptsz", 0},
        {"cuMemFree", "cuMemFree_v2", "cuMemFree_v2", 3020},
        {"cuMemFreeAsync", "cuMemFreeAsync", "cuMemFreeAsync_ptsz", 0},
        {"cuMemGetInfo", "cuMemGetInfo_v2", "cuMemGetInfo_v2", 3020},
        {"cuModuleGetFunction", "cuModuleGetFunction", "cuModuleGetFunction", 0},
        {"cuGetProcAddress", "cuGetProcAddress", "cuGetProcAddress", 0},
        {"cuGraphLaunch", "cuGraphLaunch", "cuGraphLaunch_ptsz", 0},
        {"cuMemCreate", "cuMemCreate", "cuMemCreate", 0},
        {"cuMemRelease", "cuMemRelease", "cuMemRelease", 0},
        {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz", 0},
        {"cuStreamBeginCapture", "cuStreamBeginCapture_v2", "cuStreamBeginCapture_v2_ptsz", 0},
        {"cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph",
         "cuStreamBeginCaptureToGraph_ptsz", 0},
        {"cuStreamEndCapture", "cuStreamEndCapture", "cuStreamEndCapture_ptsz", 0},
    };
    for (size_t i = 0; i < sizeof map / sizeof *map; i++) {
        if (strcmp(map[i].base, sym)) continue;
        if (ver < map[i].min_ver) return real;
        const char *exp = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? map[i].ptsz
                                                                                 : map[i].legacy;
        if (!strcmp(sym, "cuGetProcAddress") && ver >= 12000) exp = "cuGetProcAddress_v2";
        /* CUDA 13 changed the ABI behind the name: cuCtxSynchronize_v2(CUcontext) */
        if (!strcmp(sym, "cuCtxSynchronize") && ver >= 13000) exp = "cuCtxSynchronize_v2";
        if (!strcmp(sym, "cuStreamBeginCapture") && ver < 10010) /* before the mode argument */
            exp = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
                      ? "cuStreamBeginCapture_ptsz"
                      : "cuStreamBeginCapture";
        const hook *h = find_hook(exp);
        if (!h || real == h->wrapper) return real; /* never our own wrapper as the real one */
        if (!*h->real) *h->real = real;
        return h->wrapper;
    }
    return real;
}

API CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status) {
    void *r = REAL(r_cuGetProcAddress_v2, "cuGetProcAddress_v2");
    if (!r) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = ((gpa2_fn)r)(sym, pfn, ver, flags, status);
    if (rc == CUDA_SUCCESS && pfn && *pfn) *pfn = gpa_wrap(sym, *pfn, ver, flags);
    return rc;
}

API CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags) {
    void *r = REAL(r_cuGetProcAddress, "cuGetProcAddress");
    if (!r) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = ((gpa1_fn)r)(sym, pfn, ver, flags);
    if (rc == CUDA_SUCCESS && pfn && *pfn) *pfn = gpa_wrap(sym, *pfn, ver, flags);
    return rc;
}

/* The CUDA runtime dlopens libcuda.so.1 and dlsyms cuGetProcAddress from that handle, which
 * bypasses LD_PRELOAD (a handle's lookup scope is the library and its dependencies): so
 * dlsym itself hands out our wrappers for the symbols we intercept. */
#ifndef GSHARE_SHIM
API void *dlsym(void *handle, const char *symbol) {
    resolve_dlsym();
    if (!real_dlsym) return NULL;
    void *p = real_dlsym(handle, symbol);
    if (p && symbol[0] == 'c' && symbol[1] == 'u') {
        const hook *h = find_hook(symbol);
        if (h && p != h->wrapper) {
            if (!*h->real) *h->real = p;
            return h->wrapper;
        }
    }
    return p;
}
#endif

/* ---------------------------------------------------------------- the shim's forwarders - */
#ifdef GSHARE_SHIM
/* Built as libcuda.so.1 (gshare.runtime.native.build_shim): a generated assembly file defines
 * every other function the real driver exports as `jmp *gshare_fwd_slots[i](%rip)`, with the
 * names in gshare_fwd_names (NUL-separated) and every slot set to gshare_fwd_unresolved until
 * this constructor, run when the shim is loaded, points them at the real driver's functions. */
#define HIDDEN __attribute__((visibility("hidden")))
extern void *gshare_fwd_slots[] HIDDEN;
extern const char gshare_fwd_names[] HIDDEN;
extern const unsigned gshare_fwd_count HIDDEN;

/* A forwarded function the real driver lacks, or every one when it could not be loaded. */
HIDDEN CUresult gshare_fwd_unresolved(void) {
    return libcuda ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_SHARED_OBJECT_INIT_FAILED;
}

__attribute__((constructor)) static void shim_load(void) {
    resolve_dlsym();
    if (!libcuda) libcuda = open_real();
    if (!libcuda) return; /* warned; every forwarder fails, every wrapper too */
    const char *name = gshare_fwd_names;
    for (unsigned i = 0; i < gshare_fwd_count; i++, name += strlen(name) + 1) {
        void *p = real_dlsym(libcuda, name);
        if (p) gshare_fwd_slots[i] = p;
    }
}
#endif

/* ---------------------------------------------------------------- exit ------------------ */

static void write_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

/* "shim" when this library was loaded as libcuda.so.1 (the shim deployment), else
 * "preload" (LD_PRELOAD of libgshare_cuda.so). */
static const char *deployment(void) {
    Dl_info info;
    if (dladdr((void *)deployment, &info) && info.dli_fname) {
        const char *base = strrchr(info.dli_fname, '/');
        base = base ? base + 1 : info.dli_fname;
        if (!strncmp(base, "libcuda.so", 10)) return "shim";
    }
    return "preload";
}

static void finish(void) {
    pthread_mutex_lock(&g.mu);
    if (g.held) release_token(1);
    if (g.ring_len) resolve_samples(1);
    if (g.profile_path[0] && g.kernels) { /* policy.priority KernelProfile.to_records() */
        FILE *f = fopen(g.profile_path, "w");
        if (f) {
            fprintf(f, "{\"task_key\": ");
            write_json_str(f, g.task_key);
            fprintf(f, ", \"runs\": 1, \"kernels\": [");
            int first = 1;
            for (int i = 0; i < N_KERNELS; i++) {
                kentry *k = &g.kernels[i];
                if (!k->fn || !k->count || !k->grid[0]) continue; /* graphs: no kernel ID */
                fprintf(f, "%s\n  {\"kernel\": {\"device\": \"gpu\", \"name\": ", first ? "" : ",");
                write_json_str(f, k->name);
                fprintf(f,
                        ", \"grid\": [%u, %u, %u], \"block\": [%u, %u, %u]}, \"count\": %" PRIu64
                        ", \"total_ms\": %.6f, \"gap_count\": %" PRIu64
                        ", \"gap_total_ms\": %.6f}",
                        k->grid[0], k->grid[1], k->grid[2], k->block[0], k->block[1],
                        k->block[2], k->count, k->total_ms, k->gap_count, k->gap_total_ms);
                first = 0;
            }
            fprintf(f, "\n]}\n");
            fclose(f);
        }
    }
    if (g.stats_path[0]) {
        FILE *f = fopen(g.stats_path, "w");
        if (f) {
            fprintf(f,
                    "{\"launches\": %" PRIu64 ", \"fast_path\": %" PRIu64 ", \"tokens\": %" PRIu64
                    ", \"revoked\": %" PRIu64 ", \"reaped\": %" PRIu64 ", \"denied\": %" PRIu64
                    ", \"sampled\": %" PRIu64 ", \"waited\": %" PRIu64
                    ", \"late_launches\": %" PRIu64 ", \"max_late_us\": %.1f"
                    ", \"busy_ms_reported\": %.6f"
                    ", \"mem_limit_bytes\": %zu, \"mem_live_bytes\": %zu"
                    ", \"mem_peak_bytes\": %zu, \"oom_refusals\": %" PRIu64
                    ", \"vmm_bytes_live\": %zu, \"graph_launches\": %" PRIu64
                    ", \"launches_while_capturing\": %" PRIu64
                    ", \"deployment\": \"%s\", \"launches_by_entry\": {",
                    g.launches, g.fast, g.tokens, g.revoked, g.reaped, g.denied, g.sampled, g.waited,
                    g.late, (double)g.max_late_ns / 1e3, g.busy_ms, g.mem_cap, g.mem_used,
                    g.mem_peak, g.oom, g.vmm_used, g.by_entry[E_GRAPH] + g.by_entry[E_GRAPH_PTSZ],
                    g.captured, deployment());
            for (int i = 0; i < N_ENTRIES; i++)
                fprintf(f, "%s\"%s\": %" PRIu64, i ? ", " : "", entry_names[i], g.by_entry[i]);
            fprintf(f, "}}\n");
            fclose(f);
        }
    }
    if (g.fd >= 0) close(g.fd);
    g.fd = -1;
    pthread_mutex_unlock(&g.mu);
}

/*
 * A CUDA driver-API application for the interposer's tests and bench (linked with -lcuda,
 * run against the stub libcuda.so.1, with or without libgshare_cuda.so preloaded).
 *
 * Entry points are taken either directly (the symbols this program links against: what
 * LD_PRELOAD interposes) or, with "gpa", the way the CUDA runtime does it: dlopen
 * libcuda.so.1, dlsym cuGetProcAddress_v2 from that handle, and resolve everything through it.
 *
 *   cuda_app run   MODE SECONDS KERNEL_US BATCH [graph]   "ready", waits for a stdin line,
 *                  then launches BATCH kernels of KERNEL_US (or, with "graph", BATCH launches
 *                  of one instantiated graph: the stub's STUB_CUDA_GRAPH_US) and synchronises,
 *                  for SECONDS
 *   cuda_app once  MODE                           one kernel; prints its launch result
 *   cuda_app alloc MODE                           the allocation script (prints results)
 *   cuda_app ids   MODE                           named kernels at several grids
 *   cuda_app bench MODE N                         N launches of 0-us kernels: ns per launch
 *   cuda_app graph MODE N                         N launches of one graph; prints each result
 *   cuda_app capture MODE SLEEP_MS                captures two kernels on a stream into a
 *                                                 graph (global mode), sleeping SLEEP_MS
 *                                                 between them, then launches the graph
 *   cuda_app info  MODE                           calls that no deployment intercepts
 *                                                 (driver version, device name) and, in
 *                                                 direct mode, the library they came from
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct {
    CUresult (*init)(unsigned);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*get_function)(CUfunction *, CUmodule, const char *);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **);
    CUresult (*launch_ex)(const CUlaunchConfig *, CUfunction, void **, void **);
    CUresult (*stream_sync)(CUstream);
    CUresult (*ctx_sync)(CUcontext); /* CUDA 13's ABI: a context, NULL for the current */
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*alloc_managed)(CUdeviceptr *, size_t, unsigned);
    CUresult (*alloc_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*free)(CUdeviceptr);
    CUresult (*free_async)(CUdeviceptr, CUstream);
    CUresult (*mem_info)(size_t *, size_t *);
    CUresult (*dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*alloc_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                           unsigned long long);
    CUresult (*mem_release)(CUmemGenericAllocationHandle);
    CUresult (*addr_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*addr_free)(CUdeviceptr, size_t);
    CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                        unsigned long long);
    CUresult (*mem_unmap)(CUdeviceptr, size_t);
    CUresult (*graph_create)(CUgraph *, unsigned);
    CUresult (*graph_instantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*graph_launch)(CUgraphExec, CUstream);
    CUresult (*driver_version)(int *);
    CUresult (*device_name)(char *, int, CUdevice);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*begin_capture)(CUstream, CUstreamCaptureMode);
    CUresult (*end_capture)(CUstream, CUgraph *);
} cu;

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t,
                           CUdriverProcAddressQueryResult *);

/* Direct mode links the old ABI, cuCtxSynchronize(void); "gpa" asks for the name at CUDA 13000
 * and gets cuCtxSynchronize_v2's, as CUDA 13's runtime does. */
static CUresult ctx_sync_legacy(CUcontext c) {
    (void)c;
    return cuCtxSynchronize();
}

static void resolve(const char *mode) {
    if (strcmp(mode, "gpa") != 0) {
        cu.init = cuInit;
        cu.retain = cuDevicePrimaryCtxRetain;
        cu.set_current = cuCtxSetCurrent;
        cu.get_function = cuModuleGetFunction;
        cu.launch = cuLaunchKernel;
        cu.launch_ex = cuLaunchKernelEx;
        cu.stream_sync = cuStreamSynchronize;
        cu.ctx_sync = ctx_sync_legacy;
        cu.alloc = cuMemAlloc;
        cu.alloc_managed = cuMemAllocManaged;
        cu.alloc_pitch = cuMemAllocPitch;
        cu.alloc_async = cuMemAllocAsync;
        cu.free = cuMemFree;
        cu.free_async = cuMemFreeAsync;
        cu.mem_info = cuMemGetInfo;
        cu.dtoh = cuMemcpyDtoH;
        cu.alloc_pool = cuMemAllocFromPoolAsync;
        cu.mem_create = cuMemCreate;
        cu.mem_release = cuMemRelease;
        cu.addr_reserve = cuMemAddressReserve;
        cu.addr_free = cuMemAddressFree;
        cu.mem_map = cuMemMap;
        cu.mem_unmap = cuMemUnmap;
        cu.graph_create = cuGraphCreate;
        cu.graph_instantiate = cuGraphInstantiateWithFlags;
        cu.graph_launch = cuGraphLaunch;
        cu.driver_version = cuDriverGetVersion;
        cu.device_name = cuDeviceGetName;
        cu.stream_create = cuStreamCreate;
        cu.begin_capture = cuStreamBeginCapture; /* cuda.h: cuStreamBeginCapture_v2 */
        cu.end_capture = cuStreamEndCapture;
        return;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    gpa_fn gpa = h ? (gpa_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
    if (!gpa) {
        fprintf(stderr, "no cuGetProcAddress_v2: %s\n", dlerror());
        exit(2);
    }
    /* as the runtime does: the driver's own cuGetProcAddress first, through itself */
    void *p = NULL;
    if (gpa("cuGetProcAddress", &p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, NULL) == CUDA_SUCCESS && p)
        gpa = (gpa_fn)p;
#define GET(field, name)                                                                        \
    if (gpa(name, (void **)&cu.field, 13000, CU_GET_PROC_ADDRESS_DEFAULT, NULL) != CUDA_SUCCESS) \
        exit(3);
    GET(init, "cuInit");
    GET(retain, "cuDevicePrimaryCtxRetain");
    GET(set_current, "cuCtxSetCurrent");
    GET(get_function, "cuModuleGetFunction");
    GET(launch, "cuLaunchKernel");
    GET(launch_ex, "cuLaunchKernelEx");
    GET(stream_sync, "cuStreamSynchronize");
    GET(ctx_sync, "cuCtxSynchronize");
    GET(alloc, "cuMemAlloc");
    GET(alloc_managed, "cuMemAllocManaged");
    GET(alloc_pitch, "cuMemAllocPitch");
    GET(alloc_async, "cuMemAllocAsync");
    GET(free, "cuMemFree");
    GET(free_async, "cuMemFreeAsync");
    GET(mem_info, "cuMemGetInfo");
    GET(dtoh, "cuMemcpyDtoH");
    GET(alloc_pool, "cuMemAllocFromPoolAsync");
    GET(mem_create, "cuMemCreate");
    GET(mem_release, "cuMemRelease");
    GET(addr_reserve, "cuMemAddressReserve");
    GET(addr_free, "cuMemAddressFree");
    GET(mem_map, "cuMemMap");
    GET(mem_unmap, "cuMemUnmap");
    GET(graph_create, "cuGraphCreate");
    GET(graph_instantiate, "cuGraphInstantiate");
    GET(graph_launch, "cuGraphLaunch");
    GET(driver_version, "cuDriverGetVersion");
    GET(device_name, "cuDeviceGetName");
    GET(stream_create, "cuStreamCreate");
    GET(begin_capture, "cuStreamBeginCapture");
    GET(end_capture, "cuStreamEndCapture");
}

static CUgraphExec make_graph(void) {
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    if (cu.graph_create(&graph, 0) || cu.graph_instantiate(&exec, graph, 0)) exit(5);
    return exec;
}

static void setup(void) {
    CUcontext ctx;
    if (cu.init(0) || cu.retain(&ctx, 0) || cu.set_current(ctx)) exit(4);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static CUresult kernel(CUfunction f, unsigned us, unsigned grid, unsigned block) {
    void *params[] = {&us};
    return cu.launch(f, grid, 1, 1, block, 1, 1, 0, NULL, params, NULL);
}

int main(int argc, char **argv) {
    if (argc < 3) return 1;
    const char *what = argv[1];
    resolve(argv[2]);
    setup();
    CUfunction f;
    cu.get_function(&f, NULL, "gshare_test_kernel");

    if (!strcmp(what, "run") && argc >= 6) {
        double seconds = atof(argv[3]);
        unsigned us = (unsigned)atoi(argv[4]);
        int batch = atoi(argv[5]);
        CUgraphExec graph = argc >= 7 && !strcmp(argv[6], "graph") ? make_graph() : NULL;
        long launched = 0, failed = 0;
        printf("ready\n");
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) return 1;
        double end = now_s() + seconds;
        while (now_s() < end) {
            for (int i = 0; i < batch; i++) {
                CUresult rc = graph ? cu.graph_launch(graph, NULL) : kernel(f, us, 64, 256);
                if (rc == CUDA_SUCCESS) launched++;
                else failed++;
            }
            cu.stream_sync(NULL);
        }
        printf("launched %ld failed %ld\n", launched, failed);
        return 0;
    }
    if (!strcmp(what, "once")) {
        CUresult rc = kernel(f, 1000, 1, 1);
        cu.ctx_sync(NULL);
        printf("launch %d\n", (int)rc);
        return 0;
    }
    if (!strcmp(what, "alloc")) {
        /* Run with a 64 MiB cap. Exactly the lines marked OOM must fail: every API counts
         * against one account, frees (sync and async) give the bytes back, the cap is exact
         * (64 MiB fits, one byte more does not), pitch padding counts. */
        const size_t MB = 1 << 20;
        CUdeviceptr a = 0, b = 0, c = 0, m = 0, p = 0, x = 0, y = 0;
        size_t pitch = 0, freeb = 0, total = 0;
        printf("alloc40 %d\n", (int)cu.alloc(&a, 40 * MB));
        printf("alloc30 %d\n", (int)cu.alloc(&b, 30 * MB));                        /* OOM */
        printf("managed30 %d\n", (int)cu.alloc_managed(&m, 30 * MB, CU_MEM_ATTACH_GLOBAL)); /* OOM */
        printf("async30 %d\n", (int)cu.alloc_async(&x, 30 * MB, NULL));            /* OOM */
        printf("alloc24 %d\n", (int)cu.alloc(&c, 24 * MB));
        printf("alloc1 %d\n", (int)cu.alloc(&b, 1));                              /* OOM */
        cu.mem_info(&freeb, &total);
        printf("info_free %zu\n", freeb);
        printf("info_total %zu\n", total);
        printf("free40 %d\n", (int)cu.free(a));
        printf("pitch %d\n", (int)cu.alloc_pitch(&p, &pitch, 1000, 30 * 1024, 4)); /* 30 MiB */
        printf("managed10 %d\n", (int)cu.alloc_managed(&m, 10 * MB, CU_MEM_ATTACH_GLOBAL));
        printf("free_m %d\n", (int)cu.free(m));
        printf("async10 %d\n", (int)cu.alloc_async(&y, 10 * MB, NULL));
        printf("freeasync %d\n", (int)cu.free_async(y, NULL));
        printf("async10again %d\n", (int)cu.alloc_async(&y, 10 * MB, NULL));
        printf("launch %d\n", (int)kernel(f, 10, 1, 1));
        printf("sync %d\n", (int)cu.ctx_sync(NULL));
        printf("free_c %d\n", (int)cu.free(c));
        printf("free_p %d\n", (int)cu.free(p));
        printf("free_y %d\n", (int)cu.free(y));
        printf("alloc64 %d\n", (int)cu.alloc(&a, 64 * MB));
        printf("free64 %d\n", (int)cu.free(a));
        /* The VMM API (PyTorch's expandable segments) and pool allocations: the same account.
         * Live here: nothing. */
        CUmemGenericAllocationHandle h40 = 0, h30 = 0, h1 = 0, hleak = 0;
        CUmemAllocationProp prop = {0};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        CUdeviceptr va = 0, q = 0, q2 = 0;
        printf("vmm40 %d\n", (int)cu.mem_create(&h40, 40 * MB, &prop, 0));
        printf("reserve %d\n", (int)cu.addr_reserve(&va, 128 * MB, 0, 0, 0));
        printf("map40 %d\n", (int)cu.mem_map(va, 40 * MB, 0, h40, 0));
        printf("vmm30 %d\n", (int)cu.mem_create(&h30, 30 * MB, &prop, 0));        /* OOM */
        printf("pool30 %d\n", (int)cu.alloc_pool(&q, 30 * MB, NULL, NULL));       /* OOM */
        printf("pool24 %d\n", (int)cu.alloc_pool(&q, 24 * MB, NULL, NULL));
        printf("vmm1 %d\n", (int)cu.mem_create(&h1, 1, &prop, 0));                /* OOM */
        printf("unmap40 %d\n", (int)cu.mem_unmap(va, 40 * MB));
        printf("release40 %d\n", (int)cu.mem_release(h40));
        printf("vmm30again %d\n", (int)cu.mem_create(&h30, 30 * MB, &prop, 0));
        printf("pool10 %d\n", (int)cu.alloc_pool(&q2, 10 * MB, NULL, NULL));
        printf("free_pool24 %d\n", (int)cu.free_async(q, NULL));
        printf("free_pool10 %d\n", (int)cu.free(q2));
        printf("release30 %d\n", (int)cu.mem_release(h30));
        printf("addr_free %d\n", (int)cu.addr_free(va, 128 * MB));
        printf("alloc_leak %d\n", (int)cu.alloc(&a, 3 * MB)); /* left for exit accounting */
        printf("vmm_leak %d\n", (int)cu.mem_create(&hleak, 2 * MB, &prop, 0)); /* likewise */
        return 0;
    }
    if (!strcmp(what, "ids")) {
        CUfunction g2, h3;
        cu.get_function(&g2, NULL, "gemm_tile");
        cu.get_function(&h3, NULL, "softmax_rows");
        for (int rep = 0; rep < 3; rep++) {
            kernel(f, 2000, 8, 128);
            kernel(g2, 3000, 16, 256);
            kernel(g2, 3000, 32, 256);
            CUlaunchConfig cfg = {4, 2, 1, 64, 1, 1, 0, NULL, NULL, 0};
            unsigned us = 1000;
            void *params[] = {&us};
            cu.launch_ex(&cfg, h3, params, NULL);
            cu.ctx_sync(NULL);
        }
        return 0;
    }
    if (!strcmp(what, "graph") && argc >= 4) {
        long n = atol(argv[3]);
        CUgraphExec graph = make_graph();
        for (long i = 0; i < n; i++) printf("graph %d\n", (int)cu.graph_launch(graph, NULL));
        cu.ctx_sync(NULL);
        return 0;
    }
    if (!strcmp(what, "capture") && argc >= 4) {
        int sleep_ms = atoi(argv[3]);
        CUstream st = NULL;
        CUgraph graph = NULL;
        CUgraphExec exec = NULL;
        unsigned us = 300;
        void *params[] = {&us};
        cu.stream_create(&st, 0);
        printf("begin %d\n", (int)cu.begin_capture(st, CU_STREAM_CAPTURE_MODE_GLOBAL));
        printf("launch %d\n", (int)cu.launch(f, 1, 1, 1, 1, 1, 1, 0, st, params, NULL));
        struct timespec ts = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL); /* longer than a token: the gate must not touch the capture */
        printf("launch %d\n", (int)cu.launch(f, 1, 1, 1, 1, 1, 1, 0, st, params, NULL));
        CUresult rc = cu.end_capture(st, &graph);
        printf("end %d\n", (int)rc);
        if (rc == CUDA_SUCCESS && cu.graph_instantiate(&exec, graph, 0) == CUDA_SUCCESS)
            printf("graph %d\n", (int)cu.graph_launch(exec, st));
        cu.ctx_sync(NULL);
        return 0;
    }
    if (!strcmp(what, "info")) {
        int version = 0;
        char name[64] = "";
        CUresult rv = cu.driver_version(&version), rn = cu.device_name(name, sizeof name, 0);
        printf("version %d %d\n", (int)rv, version);
        printf("name %d %s\n", (int)rn, name);
        Dl_info where;
        if (cu.device_name == cuDeviceGetName && dladdr((void *)cuDeviceGetName, &where))
            printf("from %s\n", where.dli_fname);
        return 0;
    }
    if (!strcmp(what, "bench") && argc >= 4) {
        long n = atol(argv[3]);
        double best = 1e9;
        for (int rep = 0; rep < 5; rep++) { /* best of 5: the least disturbed run */
            double t0 = now_s();
            for (long i = 0; i < n; i++) kernel(f, 0, 1, 1);
            double t1 = now_s();
            cu.ctx_sync(NULL);
            if ((t1 - t0) / n < best) best = (t1 - t0) / n;
        }
        printf("ns_per_launch %.1f\n", best * 1e9);
        return 0;
    }
    return 1;
}

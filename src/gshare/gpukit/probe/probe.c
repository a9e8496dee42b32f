/*
 * The GPU kit's driver-API probe: launches the kernels of kernels.cu (PTX, loaded with
 * cuModuleLoadData) the way the CUDA runtime reaches the driver -- dlopen("libcuda.so.1"),
 * then every entry point through the driver's cuGetProcAddress -- so that both deployments of
 * the interposer (LD_PRELOAD, or a libcuda.so.1 shim first on LD_LIBRARY_PATH) see it as they
 * would see PyTorch. It runs against a real driver and, in the kit's dry run, against the stub
 * driver of tests/native (which reads every kernel's first parameter as its duration in us).
 *
 *   probe info                               one JSON line: driver version, device, memory
 *   probe bench PTX N ROUNDS                 ROUNDS x N launches of gk_empty, a synchronise
 *                                            every 256: "ns_per_launch BEST MEDIAN"
 *   probe saturate PTX SECONDS KERNEL_US BATCH
 *                                            "ready", waits for a line on stdin, then BATCH
 *                                            launches of gk_busy(KERNEL_US) and a synchronise,
 *                                            for SECONDS: "launches N failed F"
 *   probe spin PTX MS OUT                    "ready", waits for a line, then one gk_spin of MS
 *                                            milliseconds; writes its start, end and
 *                                            interruptions (globaltimer ns) to OUT
 *
 * Entry points are asked for at CUDA version 13000, as CUDA 13's runtime asks: "cuCtxSynchronize"
 * then has the ABI of cuCtxSynchronize_v2 (a context argument, NULL for the current one).
 *
 * Exit codes: 0 done, 2 usage, 3 no driver or entry point, 4 a driver call failed (its
 * name and CUresult on stderr).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t,
                           CUdriverProcAddressQueryResult *);

static struct {
    CUresult (*init)(unsigned);
    CUresult (*driver_version)(int *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_name)(char *, int, CUdevice);
    CUresult (*total_mem)(size_t *, CUdevice);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*load_data)(CUmodule *, const void *);
    CUresult (*get_function)(CUfunction *, CUmodule, const char *);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **);
    CUresult (*ctx_sync)(CUcontext); /* CUDA 13's ABI of "cuCtxSynchronize" (NULL: current) */
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*dtoh)(void *, CUdeviceptr, size_t);
} cu;

#define CHECK(call, what)                                                                      \
    do {                                                                                       \
        CUresult rc_ = (call);                                                                 \
        if (rc_ != CUDA_SUCCESS) {                                                             \
            fprintf(stderr, "probe: %s failed: CUresult %d\n", what, (int)rc_);                \
            exit(4);                                                                           \
        }                                                                                      \
    } while (0)

static void resolve(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "probe: cannot load libcuda.so.1: %s\n", dlerror());
        exit(3);
    }
    gpa_fn gpa = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) {
        fprintf(stderr, "probe: no cuGetProcAddress_v2 in libcuda.so.1\n");
        exit(3);
    }
    void *p = NULL; /* as the runtime does: the driver's cuGetProcAddress, through itself */
    if (gpa("cuGetProcAddress", &p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, NULL) == CUDA_SUCCESS && p)
        gpa = (gpa_fn)p;
#define GET(field, name)                                                                       \
    if (gpa(name, (void **)&cu.field, 13000, CU_GET_PROC_ADDRESS_DEFAULT, NULL) != CUDA_SUCCESS \
        || !cu.field) {                                                                        \
        fprintf(stderr, "probe: no entry point %s\n", name);                                   \
        exit(3);                                                                               \
    }
    GET(init, "cuInit");
    GET(driver_version, "cuDriverGetVersion");
    GET(device_get, "cuDeviceGet");
    GET(device_name, "cuDeviceGetName");
    GET(total_mem, "cuDeviceTotalMem");
    GET(retain, "cuDevicePrimaryCtxRetain");
    GET(set_current, "cuCtxSetCurrent");
    GET(load_data, "cuModuleLoadData");
    GET(get_function, "cuModuleGetFunction");
    GET(launch, "cuLaunchKernel");
    GET(ctx_sync, "cuCtxSynchronize");
    GET(alloc, "cuMemAlloc");
    GET(free, "cuMemFree");
    GET(dtoh, "cuMemcpyDtoH");
#undef GET
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "probe: cannot read %s\n", path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) exit(2);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static CUmodule setup(const char *ptx) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CHECK(cu.init(0), "cuInit");
    CHECK(cu.device_get(&dev, 0), "cuDeviceGet");
    CHECK(cu.retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    CHECK(cu.set_current(ctx), "cuCtxSetCurrent");
    CHECK(cu.load_data(&mod, read_file(ptx)), "cuModuleLoadData");
    return mod;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void wait_go(void) {
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) exit(2);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: probe info | bench PTX N ROUNDS | saturate PTX S US BATCH | spin PTX MS OUT\n");
        return 2;
    }
    const char *what = argv[1];
    resolve();
    if (!strcmp(what, "info")) {
        int version = 0;
        CUdevice dev;
        char name[256] = "";
        size_t total = 0;
        CHECK(cu.init(0), "cuInit");
        CHECK(cu.driver_version(&version), "cuDriverGetVersion");
        CHECK(cu.device_get(&dev, 0), "cuDeviceGet");
        CHECK(cu.device_name(name, sizeof name, dev), "cuDeviceGetName");
        CHECK(cu.total_mem(&total, dev), "cuDeviceTotalMem");
        printf("{\"driver_version\": %d, \"device\": \"%s\", \"total_bytes\": %zu}\n", version,
               name, total);
        return 0;
    }
    if (argc < 3) return 2;
    CUmodule mod = setup(argv[2]);
    if (!strcmp(what, "bench") && argc >= 5) {
        long n = atol(argv[3]);
        int rounds = atoi(argv[4]);
        if (n <= 0 || rounds <= 0 || rounds > 64) return 2;
        CUfunction f;
        CHECK(cu.get_function(&f, mod, "gk_empty"), "cuModuleGetFunction(gk_empty)");
        unsigned us = 0;
        void *params[] = {&us};
        double per[64];
        CHECK(cu.launch(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL), "cuLaunchKernel"); /* warm */
        CHECK(cu.ctx_sync(NULL), "cuCtxSynchronize");
        for (int r = 0; r < rounds; r++) {
            double t0 = now_s();
            for (long i = 0; i < n; i++) {
                CHECK(cu.launch(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL), "cuLaunchKernel");
                if ((i & 255) == 255) CHECK(cu.ctx_sync(NULL), "cuCtxSynchronize");
            }
            CHECK(cu.ctx_sync(NULL), "cuCtxSynchronize");
            per[r] = (now_s() - t0) * 1e9 / (double)n;
        }
        qsort(per, (size_t)rounds, sizeof per[0], cmp_double);
        printf("ns_per_launch %.1f %.1f\n", per[0], per[rounds / 2]);
        return 0;
    }
    if (!strcmp(what, "saturate") && argc >= 6) {
        double seconds = atof(argv[3]);
        unsigned us = (unsigned)atoi(argv[4]);
        int batch = atoi(argv[5]);
        CUfunction f;
        CHECK(cu.get_function(&f, mod, "gk_busy"), "cuModuleGetFunction(gk_busy)");
        void *params[] = {&us};
        long launched = 0, failed = 0;
        wait_go();
        double end = now_s() + seconds;
        while (now_s() < end) {
            for (int i = 0; i < batch; i++) {
                if (cu.launch(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL) != CUDA_SUCCESS) failed++;
                launched++;
            }
            if (cu.ctx_sync(NULL) != CUDA_SUCCESS) failed++;
        }
        printf("launches %ld failed %ld\n", launched, failed);
        return 0;
    }
    if (!strcmp(what, "spin") && argc >= 5) {
        unsigned us = (unsigned)(atof(argv[3]) * 1000.0);
        const unsigned max_records = 200000;
        unsigned long long gap_ns = 2000;
        size_t bytes = (4 + 2 * (size_t)max_records) * sizeof(unsigned long long);
        CUfunction f;
        CUdeviceptr out;
        CHECK(cu.get_function(&f, mod, "gk_spin"), "cuModuleGetFunction(gk_spin)");
        CHECK(cu.alloc(&out, bytes), "cuMemAlloc");
        unsigned long long *host = calloc(1, bytes);
        void *params[] = {&us, &out, &gap_ns, (void *)&max_records};
        wait_go();
        CHECK(cu.launch(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL), "cuLaunchKernel(gk_spin)");
        CHECK(cu.ctx_sync(NULL), "cuCtxSynchronize");
        CHECK(cu.dtoh(host, out, bytes), "cuMemcpyDtoH");
        FILE *o = fopen(argv[4], "w");
        if (!o) return 2;
        unsigned long long n = host[2] < max_records ? host[2] : max_records;
        fprintf(o, "# start end records (globaltimer ns), then one interruption per line\n");
        fprintf(o, "%llu %llu %llu\n", host[0], host[1], n);
        for (unsigned long long i = 0; i < n; i++)
            fprintf(o, "%llu %llu\n", host[4 + 2 * i], host[5 + 2 * i]);
        fclose(o);
        cu.free(out);
        return 0;
    }
    fprintf(stderr, "probe: unknown or incomplete command %s\n", what);
    return 2;
}

// Kernels of the GPU kit's driver-API probe (probe.c), compiled to PTX with nvcc and loaded
// with cuModuleLoadData. Every kernel takes its duration in microseconds as its FIRST parameter
// (an unsigned int), as the stub driver of tests/native reads it: the same launches run on a
// real GPU and, in the kit's dry run, on the stub.

// A launch that does nothing: the per-launch cost of the driver (and of the interposer).
extern "C" __global__ void gk_empty(unsigned us) {}

// One thread busy for `us` microseconds of global time: saturating work of a known length.
extern "C" __global__ void gk_busy(unsigned us) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < 1000ull * us);
}

// One thread spins for `us` microseconds of global time and records every interruption: two
// consecutive reads of %globaltimer more than `gap_ns` apart mean the device ran another
// context in between (time-slicing). out = [start, end, n, 0, (from, to) x n], in ns.
extern "C" __global__ void gk_spin(unsigned us, unsigned long long *out, unsigned long long gap_ns,
                                   unsigned max_records) {
    unsigned long long start, prev, now;
    unsigned n = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    prev = start;
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - prev > gap_ns && n < max_records) {
            out[4 + 2 * n] = prev;
            out[5 + 2 * n] = now;
            n++;
        }
        prev = now;
    } while (now - start < 1000ull * us);
    out[0] = start;
    out[1] = now;
    out[2] = n;
}

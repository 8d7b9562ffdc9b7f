// Issue #44's question: how fast can a borrower give GIB of burst back to
// the GPU (move it to the host) while keeping its pointers valid, and what
// do its kernels get from the memory once it is on the host? Each way, one
// after the other in one process on device 0:
//
//   managed-1   cuMemAllocManaged, resident on the GPU (preferred location
//               and accessed-by the GPU, prefetched), then one
//               cuMemPrefetchAsync to the host on one stream; back; again
//   managed-8   the same moved in 1 GiB pieces over 8 streams
//   managed-cpu the same, preferred location switched to the host first
//               (the GPU keeps a mapping: its kernels read the host pages
//               instead of pulling them back), then a touch pass
//   vmm-host    cuMemCreate device memory mapped at a reserved range; a
//               host allocation made by cuMemCreate (location HOST) copied
//               into over 8 streams, the device memory unmapped and the
//               host memory mapped at the same range: the pointers stay
//               valid; a touch pass over the host memory
//   pinned      the link's ceiling: a device buffer copied into pinned
//               host memory over 8 streams
//
// Each line: the way, the step, seconds, GiB/s, the GPU's free memory
// after it (cuMemGetInfo). A touch pass reads and writes every 16 bytes.
//   giveback [GIB=40]
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <vector>

#define CK(x)                                                                                                  \
    do {                                                                                                       \
        CUresult r_ = (x);                                                                                     \
        if (r_ != CUDA_SUCCESS) {                                                                              \
            const char *s_ = "";                                                                               \
            cuGetErrorName(r_, &s_);                                                                           \
            std::printf("%s: %s -> %s (line %d)\n", way, #x, s_, __LINE__);                                    \
            return 1;                                                                                          \
        }                                                                                                      \
    } while (0)

static const char *way = "setup";
static const int NSTREAMS = 8;
static CUstream streams[NSTREAMS];
static CUdevice dev;
static size_t bytes;

__global__ void touch(uint4 *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = p[i];
        v.x += 1;
        p[i] = v;
    }
}

static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static size_t free_mem() {
    size_t f = 0, t = 0;
    cuMemGetInfo(&f, &t);
    return f;
}

static void line(const char *step, double secs, size_t moved) {
    std::printf("%-12s %-34s %8.3f s %8.1f GiB/s   free %6.1f GiB\n", way, step, secs,
                moved ? (double)moved / (1 << 30) / secs : 0.0, (double)free_mem() / (1 << 30));
    std::fflush(stdout);
}

static int touch_pass(CUdeviceptr p, const char *step) {
    double t = now();
    touch<<<1320, 512>>>((uint4 *)p, bytes / 16);
    if (cudaDeviceSynchronize() != cudaSuccess) {
        std::printf("%s: %s: touch failed: %s\n", way, step, cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    line(step, now() - t, 2 * bytes);
    return 0;
}

static CUmemLocation loc(bool host) {
    CUmemLocation l = {};
    l.type = host ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
    l.id = host ? 0 : (int)dev;
    return l;
}

static CUresult prefetch(CUdeviceptr p, size_t n, bool host, CUstream s) {
#if CUDA_VERSION >= 13000
    return cuMemPrefetchAsync(p, n, loc(host), 0, s);
#else
    return cuMemPrefetchAsync_v2(p, n, loc(host), 0, s);
#endif
}

static CUresult advise(CUdeviceptr p, size_t n, CUmem_advise a, bool host) {
#if CUDA_VERSION >= 13000
    return cuMemAdvise(p, n, a, loc(host));
#else
    return cuMemAdvise_v2(p, n, a, loc(host));
#endif
}

static CUresult sync_all() {
    for (auto s : streams) {
        CUresult r = cuStreamSynchronize(s);
        if (r != CUDA_SUCCESS)
            return r;
    }
    return CUDA_SUCCESS;
}

static CUresult move(CUdeviceptr p, bool host, int nstreams) {
    size_t piece = nstreams == 1 ? bytes : (size_t)1 << 30;
    int k = 0;
    for (size_t off = 0; off < bytes; off += piece, k++) {
        size_t n = bytes - off < piece ? bytes - off : piece;
        CUresult r = prefetch(p + off, n, host, streams[k % nstreams]);
        if (r != CUDA_SUCCESS)
            return r;
    }
    return sync_all();
}

static int managed(const char *name, int nstreams, bool prefer_host) {
    way = name;
    CUdeviceptr p;
    double t = now();
    CK(cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL));
    CK(advise(p, bytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, false));
    CK(advise(p, bytes, CU_MEM_ADVISE_SET_ACCESSED_BY, false));
    CK(move(p, false, nstreams));
    line("alloc + prefetch to GPU", now() - t, bytes);
    if (touch_pass(p, "touch, resident"))
        return 1;
    for (int round = 1; round <= 2; round++) {
        t = now();
        if (prefer_host)
            CK(advise(p, bytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, true));
        CK(move(p, true, nstreams));
        line(round == 1 ? "to host (1st)" : "to host (2nd)", now() - t, bytes);
        if (prefer_host && touch_pass(p, "touch, on the host"))
            return 1;
        t = now();
        if (prefer_host)
            CK(advise(p, bytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, false));
        CK(move(p, false, nstreams));
        line("back to GPU", now() - t, bytes);
    }
    if (touch_pass(p, "touch, resident again"))
        return 1;
    CK(cuMemFree(p));
    return 0;
}

static int vmm_host() {
    way = "vmm-host";
    CUmemAllocationProp dp = {};
    dp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    dp.location = loc(false);
    size_t g = 0;
    CK(cuMemGetAllocationGranularity(&g, &dp, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    size_t n = (bytes + g - 1) / g * g;
    CUdeviceptr va, hva;
    CUmemGenericAllocationHandle dh, hh;
    CUmemAccessDesc acc = {};
    acc.location = loc(false);
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemAddressReserve(&va, n, 0, 0, 0));
    CK(cuMemAddressReserve(&hva, n, 0, 0, 0));
    double t = now();
    CK(cuMemCreate(&dh, n, &dp, 0));
    CK(cuMemMap(va, n, 0, dh, 0));
    CK(cuMemSetAccess(va, n, &acc, 1));
    line("device alloc + map", now() - t, 0);
    CK(cuMemsetD32(va, 7, n / 4));
    if (touch_pass(va, "touch, resident"))
        return 1;
    CUmemAllocationProp hp = {};
    hp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    hp.location = loc(true);
    size_t hg = 0;
    CK(cuMemGetAllocationGranularity(&hg, &hp, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    t = now();
    CK(cuMemCreate(&hh, n, &hp, 0));
    CK(cuMemMap(hva, n, 0, hh, 0));
    CK(cuMemSetAccess(hva, n, &acc, 1));
    line("host alloc + map (ready beforehand)", now() - t, 0);
    t = now();
    size_t piece = (size_t)1 << 30;
    int k = 0;
    for (size_t off = 0; off < n; off += piece, k++)
        CK(cuMemcpyAsync(hva + off, va + off, n - off < piece ? n - off : piece, streams[k % NSTREAMS]));
    CK(sync_all());
    double copy = now() - t;
    line("copy to host", copy, n);
    t = now();
    CK(cuMemUnmap(va, n));
    CK(cuMemRelease(dh));
    CK(cuMemMap(va, n, 0, hh, 0));
    CK(cuMemSetAccess(va, n, &acc, 1));
    line("remap: the range now host memory", now() - t, 0);
    line("give-back total (copy + remap)", copy + now() - t, n);
    if (touch_pass(va, "touch, on the host"))
        return 1;
    unsigned v[2] = {0, 0};
    CK(cuMemcpyDtoH(v, va, 4));
    CK(cuMemcpyDtoH(v + 1, va + n - 16, 4));
    std::printf("%-12s first and last word %u %u (expected %u: set 7, two passes)\n", way, v[0], v[1], 9u);
    CK(cuMemUnmap(va, n));
    CK(cuMemUnmap(hva, n));
    CK(cuMemRelease(hh));
    CK(cuMemAddressFree(va, n));
    CK(cuMemAddressFree(hva, n));
    return 0;
}

static int pinned() {
    way = "pinned";
    void *h;
    CUdeviceptr p;
    double t = now();
    CK(cuMemHostAlloc(&h, bytes, 0));
    line("cuMemHostAlloc", now() - t, 0);
    CK(cuMemAlloc(&p, bytes));
    CK(cuMemsetD32(p, 1, bytes / 4));
    CK(cuCtxSynchronize());
    for (int round = 1; round <= 2; round++) {
        t = now();
        size_t piece = (size_t)1 << 30;
        int k = 0;
        for (size_t off = 0; off < bytes; off += piece, k++)
            CK(cuMemcpyDtoHAsync((char *)h + off, p + off, bytes - off < piece ? bytes - off : piece,
                                 streams[k % NSTREAMS]));
        CK(sync_all());
        line(round == 1 ? "device to pinned (1st)" : "device to pinned (2nd)", now() - t, bytes);
    }
    CK(cuMemFree(p));
    CK(cuMemFreeHost(h));
    return 0;
}

// hold: managed memory moved to the host, then held for HOLD_S seconds
// (another process asks for the GPU's memory meanwhile), then touched.
static int hold() {
    way = "hold";
    CUdeviceptr p;
    CK(cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL));
    CK(advise(p, bytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, false));
    CK(move(p, false, NSTREAMS));
    if (touch_pass(p, "touch, resident"))
        return 1;
    double t = now();
    CK(advise(p, bytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, true));
    CK(move(p, true, NSTREAMS));
    line("to host; holding", now() - t, bytes);
    const char *h = std::getenv("HOLD_S");
    sleep(h ? std::atoi(h) : 30);
    line("held", 0, 0);
    if (touch_pass(p, "touch, after the hold"))
        return 1;
    CK(cuMemFree(p));
    return 0;
}

int main(int argc, char **argv) {
    double gib = argc > 1 ? std::atof(argv[1]) : 40;
    bytes = (size_t)(gib * (1 << 30)) / 16 * 16;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    cudaSetDevice(0);
    cudaFree(0);
    for (auto &s : streams)
        CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    std::printf("giveback: %.1f GiB, free %.1f GiB\n", gib, (double)free_mem() / (1 << 30));
    const char *only = std::getenv("GIVEBACK_ONLY");
    auto want = [&](const char *w) { return !only || std::strstr(only, w); };
    int rc = 0;
    if (only && std::strcmp(only, "hold") == 0)
        return hold();
    if (want("pinned"))
        rc |= pinned();
    if (want("vmm"))
        rc |= vmm_host();
    if (want("managed-1"))
        rc |= managed("managed-1", 1, false);
    if (want("managed-8"))
        rc |= managed("managed-8", NSTREAMS, false);
    if (want("managed-cpu"))
        rc |= managed("managed-cpu", NSTREAMS, true);
    return rc;
}

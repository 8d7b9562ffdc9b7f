/* Path 3: cuGetProcAddress, the way cudart (>= 11.3), PyTorch, JAX and CuPy
 * reach the driver: dlsym only cuGetProcAddress_v2, then ask it for base
 * names with the CUDA version the program was built for and the
 * default-stream flags. */
#include "workload.h"

typedef CUresult (*gpa2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa1_t)(const char *, void **, int, cuuint64_t);

static gpa2_t gpa;

static void *get(const char *name, int ver, cuuint64_t flags) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = gpa(name, &p, ver, flags, &st);
    if (r != CUDA_SUCCESS || !p || st != CU_GET_PROC_ADDRESS_SUCCESS) {
        fprintf(stderr, "FAIL cuGetProcAddress_v2(%s, %d, %llu) -> %d status %d\n", name, ver,
                (unsigned long long)flags, (int)r, (int)st);
        exit(1);
    }
    return p;
}

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "FAIL dlopen: %s\n", dlerror());
        return 1;
    }
    gpa = (gpa2_t)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) return 1;
    describe("dlsym:cuGetProcAddress_v2", (void *)gpa);

    const int ver = 12000;
    const cuuint64_t def = CU_GET_PROC_ADDRESS_DEFAULT;
    const cuuint64_t ptds = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    struct api a;
    a.Init = get("cuInit", ver, def);
    a.DeviceGet = get("cuDeviceGet", ver, def);
    a.PrimaryCtxRetain = get("cuDevicePrimaryCtxRetain", ver, def);
    a.CtxSetCurrent = get("cuCtxSetCurrent", ver, def);
    a.MemGetInfo = get("cuMemGetInfo", ver, def);
    a.DeviceTotalMem = get("cuDeviceTotalMem", ver, def);
    a.MemAlloc = get("cuMemAlloc", ver, def);
    a.MemFree = get("cuMemFree", ver, def);
    a.MemAllocAsync = get("cuMemAllocAsync", ver, ptds);
    a.MemFreeAsync = get("cuMemFreeAsync", ver, ptds);
    a.MemCreate = get("cuMemCreate", ver, def);
    a.MemRelease = get("cuMemRelease", ver, def);
    a.ModuleLoadData = get("cuModuleLoadData", ver, def);
    a.ModuleGetFunction = get("cuModuleGetFunction", ver, def);
    a.LaunchKernel = get("cuLaunchKernel", ver, ptds);
    a.LaunchKernelEx = get("cuLaunchKernelEx", ver, def);
    a.CtxSynchronize = get("cuCtxSynchronize", ver, def);

    /* Which entry each (name, version, flags) request landed on. */
    describe("gpa:cuMemAlloc", (void *)a.MemAlloc);
    describe("gpa:cuLaunchKernel/ptds", (void *)a.LaunchKernel);
    describe("gpa:cuLaunchKernel/default", get("cuLaunchKernel", ver, def));
    describe("gpa:cuLaunchKernelEx", (void *)a.LaunchKernelEx);
    describe("gpa:cuGraphLaunch/ptds", get("cuGraphLaunch", ver, ptds));
    describe("gpa:cuMemAllocAsync/ptds", (void *)a.MemAllocAsync);
    describe("gpa:cuCtxCreate/13000", get("cuCtxCreate", 13000, def));
    describe("gpa:cuCtxCreate/11040", get("cuCtxCreate", 11040, def));
    describe("gpa:cuCtxCreate/3020", get("cuCtxCreate", 3020, def));
    describe("gpa:cuCtxCreate/3000", get("cuCtxCreate", 3000, def));
    describe("gpa:cuMemAlloc/3000", get("cuMemAlloc", 3000, def));
    describe("gpa:cuGetProcAddress", get("cuGetProcAddress", ver, def));
    describe("gpa:cuDeviceGetName", get("cuDeviceGetName", ver, def));

    /* The legacy 4-argument entry point, as cudart 11.x calls it. */
    gpa1_t gpa1 = (gpa1_t)dlsym(h, "cuGetProcAddress");
    void *p1 = NULL;
    CHECK(gpa1("cuMemAlloc", &p1, 11000, def));
    describe("gpa1:cuMemAlloc", p1);

    /* Unknown symbols: the driver's own answer passes through. */
    void *none = (void *)1;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult r = gpa("cuNoSuchFunction", &none, ver, def, &st);
    printf("R unknown=%d status=%d null=%d\n", (int)r, (int)st, none == NULL);

    run_workload(&a);
    return 0;
}

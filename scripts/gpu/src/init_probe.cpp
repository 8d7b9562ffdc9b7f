// Start-up cost probe: cuInit, primary context, one allocation, exit.
#include <cuda.h>
#include <cstdio>
int main() {
    CUdevice d;
    CUcontext c;
    CUdeviceptr p;
    if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c) || cuMemAlloc(&p, 1 << 20)) {
        std::puts("FAIL");
        return 1;
    }
    cuMemFree(p);
    return 0;
}

/* A forked child keeps using the shim: the parent initialises CUDA, forks,
 * the child initialises CUDA afresh (a parent's context is not usable after
 * fork, on the real driver as on the fake) and does its own work, and each
 * process reports its own call counts. */
#include "app.h"

#include <sys/wait.h>
#include <unistd.h>

static void allocs(int n) {
    for (int i = 0; i < n; i++) {
        CUdeviceptr p;
        CHECK(cuMemAlloc_v2(&p, 4096));
        CHECK(cuMemFree_v2(p));
    }
}

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    allocs(3);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        CUcontext cctx;
        CHECK(cuInit(0));
        CHECK(cuDeviceGet(&dev, 0));
        CHECK(cuDevicePrimaryCtxRetain(&cctx, dev));
        CHECK(cuCtxSetCurrent(cctx));
        allocs(10);
        printf("R child done\n");
        fflush(stdout);
        exit(0); /* exit, not _exit: the exit report runs from .fini_array */
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("R child status=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    allocs(5);
    printf("R parent done\n");
    return 0;
}

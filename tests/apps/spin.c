/* A compute-bound tenant on the fake GPU: launches "sleep" kernels of
 * KERNEL_NS back to back for SECONDS, synchronising every BATCH launches
 * (as real programs do: a real GPU queue blocks at about a thousand
 * launches). With "ahead", each synchronisation waits for the batch
 * before the one just launched (an event), so that a batch stays queued
 * while the program is off the CPU, as a training loop that runs ahead of
 * its GPU keeps it busy on a loaded host. Prints a progress line every
 * 100 ms:
 *   P <ms since start> <GPU ms of its kernels completed>
 * (first: S <CLOCK_MONOTONIC ms at its start>, so that a test can place
 * another process's, or its own, moments in this run's time)
 * and at the end: R launched=N busy_ms=B wall_ms=W
 *   spin SECONDS KERNEL_NS [BATCH [graph] [ahead]] */
#include "app.h"

#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    double seconds = atof(argv[1]);
    unsigned long long ns = strtoull(argv[2], NULL, 10);
    int batch = argc > 3 ? atoi(argv[3]) : 16;
    int use_graph = 0, ahead = 0;
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "graph")) use_graph = 1;
        else if (!strcmp(argv[i], "ahead")) ahead = 1;
        else return 2;
    }
    CUdevice dev;
    CUfunction f;
    CUstream s;
    f = sleep_kernel_on_device0(&dev);
    CHECK(cuStreamCreate(&s, 0));
    void *params[] = {&ns};
    CUgraphExec exec = NULL;
    if (use_graph) {
        /* One graph of one kernel, replayed like torch.cuda.CUDAGraph. */
        CUgraph g;
        CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
        CHECK(cuStreamEndCapture(s, &g));
        CHECK(cuGraphInstantiateWithFlags(&exec, g, 0));
    }
    CUevent ev[2];
    CHECK(cuEventCreate(&ev[0], CU_EVENT_DISABLE_TIMING));
    CHECK(cuEventCreate(&ev[1], CU_EVENT_DISABLE_TIMING));
    double t0 = now_ms(), next = t0 + 100;
    printf("S %.3f\n", t0);
    unsigned long long launched = 0, done = 0, batches = 0;
    for (;;) {
        for (int i = 0; i < batch; i++) {
            if (use_graph) CHECK(cuGraphLaunch(exec, s));
            else CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
        }
        launched += batch;
        if (ahead) {
            /* Wait for the batch before this one: this one stays queued. */
            CHECK(cuEventRecord(ev[batches % 2], s));
            if (batches > 0) {
                CHECK(cuEventSynchronize(ev[(batches + 1) % 2]));
                done = launched - batch;
            }
            batches++;
        } else {
            CHECK(cuStreamSynchronize(s));
            done = launched;
        }
        double t = now_ms();
        if (t >= next) {
            printf("P %.1f %.3f\n", t - t0, done * (double)ns / 1e6);
            next += 100;
        }
        if (t - t0 >= seconds * 1e3) break;
    }
    CHECK(cuStreamSynchronize(s));
    printf("R launched=%llu busy_ms=%.3f wall_ms=%.3f\n", launched, launched * (double)ns / 1e6, now_ms() - t0);
    return 0;
}

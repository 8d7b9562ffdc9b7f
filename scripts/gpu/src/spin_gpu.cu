// A compute-bound tenant for the compute-share benchmark: kernels that spin
// for a fixed number of clock cycles on every SM.
//   spin_gpu calib MICROSECONDS         -> prints "CYCLES c" for that kernel length
//   spin_gpu run SECONDS CYCLES [progress]
//       -> "START <monotonic ms>", optional "P <monotonic ms> <kernels done>"
//          every 20 ms, and "RATE <kernels/s>"
#include <cuda_runtime.h>
#include <time.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>

__global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

static double mono_ms() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int blocks() {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    return sms * 4;
}

static float time_kernels(long long cycles, int n) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a);
    for (int i = 0; i < n; i++) spin<<<blocks(), 256>>>(cycles);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return ms / n;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(argv[1], "calib")) {
        double target_ms = atof(argv[2]) / 1000.0;
        long long c = 1000000;
        time_kernels(c, 5);
        for (int k = 0; k < 4; k++) {
            float ms = time_kernels(c, 20);
            c = (long long)(c * target_ms / ms);
        }
        printf("CYCLES %lld %.4f\n", c, time_kernels(c, 20));
        return 0;
    }
    double seconds = atof(argv[2]);
    long long cycles = atoll(argv[3]);
    bool progress = argc > 4;
    float kms = time_kernels(cycles, 3);
    int batch = (int)(5.0 / kms);
    if (batch < 1) batch = 1;
    cudaDeviceSynchronize();
    double t0 = mono_ms(), next = t0;
    printf("START %.3f\n", t0);
    long long done = 0;
    for (;;) {
        for (int i = 0; i < batch; i++) spin<<<blocks(), 256>>>(cycles);
        cudaDeviceSynchronize();
        done += batch;
        double t = mono_ms();
        if (progress && t >= next) {
            printf("P %.3f %lld\n", t, done);
            next = t + 20;
        }
        if (t - t0 >= seconds * 1e3) {
            printf("RATE %.3f\n", done / ((t - t0) / 1e3));
            return 0;
        }
    }
}

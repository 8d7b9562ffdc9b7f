// How long does a tiny kernel wait when another process keeps the GPU busy
// with long kernels? Launches a one-block empty kernel at jittered
// intervals, synchronises, and prints the latency percentiles. Run beside
// `spin_gpu run` with kernels of different lengths: if the wait stays near
// the driver's time-slice however long the other kernels are, the GPU
// preempts running kernels between contexts.
//   timeslice_probe SECONDS PERIOD_US  -> "PING <p50 us> <p90 us> <p99 us> <max us> <n>"
#include <cuda_runtime.h>
#include <time.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void empty() {}

static double mono_us() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    double period = argc > 2 ? atof(argv[2]) : 10000;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (int i = 0; i < 100; i++) empty<<<1, 32, 0, s>>>();
    cudaStreamSynchronize(s);
    std::vector<double> lat;
    srand(1);
    double t0 = mono_us();
    while (mono_us() - t0 < seconds * 1e6) {
        double next = mono_us() + period * (0.5 + (rand() % 1000) / 1000.0);
        while (mono_us() < next) {
        }
        double a = mono_us();
        empty<<<1, 32, 0, s>>>();
        cudaStreamSynchronize(s);
        lat.push_back(mono_us() - a);
    }
    std::sort(lat.begin(), lat.end());
    auto q = [&](double f) { return lat[std::min(lat.size() - 1, (size_t)(f * lat.size()))]; };
    printf("PING %.1f %.1f %.1f %.1f %zu\n", q(0.5), q(0.9), q(0.99), lat.back(), lat.size());
    return 0;
}

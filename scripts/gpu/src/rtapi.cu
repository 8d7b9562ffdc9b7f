// A CUDA runtime program built by nvcc (cudart linked statically, the
// default): cudaMalloc, cudaMallocAsync, <<<>>> launches, copies.
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                  \
    do {                                                                          \
        cudaError_t e_ = (x);                                                     \
        if (e_ != cudaSuccess) {                                                  \
            std::fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #x,      \
                         cudaGetErrorString(e_));                                 \
            std::exit(1);                                                         \
        }                                                                         \
    } while (0)

__global__ void scale(int n, float a, float *v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = v[i] * a + 1.0f;
}

int main() {
    int n = 1 << 20;
    std::vector<float> h(n);
    for (int i = 0; i < n; i++) h[i] = (float)(i % 977) * 0.01f;
    float *d, *tmp;
    CHECK(cudaMalloc(&d, n * sizeof(float)));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMallocAsync(&tmp, n * sizeof(float), s));
    CHECK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    for (int rep = 0; rep < 10; rep++) scale<<<(n + 255) / 256, 256, 0, s>>>(n, 0.5f, d);
    CHECK(cudaMemcpyAsync(tmp, d, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(h.data(), tmp, n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaFreeAsync(tmp, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaFree(d));
    double sum = 0;
    for (float v : h) sum += v;
    size_t fr, tot;
    CHECK(cudaMemGetInfo(&fr, &tot));
    std::printf("RESULT rtapi checksum=%.6e total_gib=%.3f\n", sum, tot / 1073741824.0);
    return 0;
}

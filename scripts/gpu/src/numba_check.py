# Numba CUDA: a @cuda.jit kernel.
import numpy as np
from numba import cuda

@cuda.jit
def axpy(a, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]

n = 1 << 20
x = np.arange(n, dtype=np.float32) % 1000
y = np.ones(n, dtype=np.float32)
d_out = cuda.device_array(n, dtype=np.float32)
axpy[(n + 255) // 256, 256](2.0, cuda.to_device(x), cuda.to_device(y), d_out)
print(f"RESULT numba sum={float(d_out.copy_to_host().sum()):.6e}")

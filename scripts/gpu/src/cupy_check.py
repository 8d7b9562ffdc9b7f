# CuPy: elementwise kernels, reductions, matmul.
import cupy as cp

a = cp.arange(1 << 20, dtype=cp.float32) % 1000 / 1000
b = (a * 2 + 1).sum()
m = cp.arange(512 * 512, dtype=cp.float64).reshape(512, 512) % 7
p = (m @ m).sum()
k = cp.ElementwiseKernel("float32 x", "float32 y", "y = x * x + 1", "sq1")
c = k(a).sum()
cp.cuda.Device().synchronize()
free, total = cp.cuda.runtime.memGetInfo()
print(f"RESULT cupy b={float(b):.6e} p={float(p):.6e} c={float(c):.6e} total_gib={total / 2**30:.3f}")

# JAX's default preallocation (75 % of what the device reports) under a quota.
import jax
import jax.numpy as jnp

from mem_common import process_used_mib

d = jax.devices()[0]
x = jnp.ones((1024, 1024), dtype=jnp.float32).block_until_ready()
stats = d.memory_stats() or {}
limit = stats.get("bytes_limit", -1)
err = "none"
try:
    big = jnp.ones((limit // 4 + (1 << 28),), dtype=jnp.float32).block_until_ready()
except Exception as e:
    err = type(e).__name__
print(f"RESULT jax bytes_limit_gib={limit / 2**30:.3f} over_limit_alloc={err} nvml_process_mib={process_used_mib()}")

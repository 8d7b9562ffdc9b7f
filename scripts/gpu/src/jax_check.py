# JAX: jit, matmul, grad.
import jax
import jax.numpy as jnp

jax.config.update("jax_default_matmul_precision", "highest")
key = jax.random.PRNGKey(0)
x = jax.random.normal(key, (1024, 1024), dtype=jnp.float32)
w = jax.random.normal(jax.random.PRNGKey(1), (1024, 1024), dtype=jnp.float32)
loss = lambda w: jnp.sum(jax.nn.relu(x @ w))
v, g = jax.jit(jax.value_and_grad(loss))(w)
print(f"RESULT jax loss={float(v):.6e} g={float(jnp.abs(g).sum()):.6e} devices={jax.devices()[0].platform}")

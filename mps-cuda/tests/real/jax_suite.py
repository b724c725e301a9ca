"""JAX/XLA: `jit` of a small network, its forward pass and its gradient."""

import jax
import jax.numpy as jnp

from common import emit, run


def body():
    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    params = {"w1": jax.random.normal(k1, (256, 512)) * 0.05,
              "w2": jax.random.normal(k2, (512, 10)) * 0.05}
    x = jax.random.normal(k3, (64, 256))

    @jax.jit
    def loss(p, x):
        h = jax.nn.relu(x @ p["w1"])
        return jnp.mean(jax.nn.log_softmax(h @ p["w2"]) ** 2)

    value = loss(params, x)
    grads = jax.jit(jax.grad(loss))(params, x)
    assert jax.devices()[0].platform == "gpu", jax.devices()
    emit("jax_suite", {"loss": float(value), "g1": jnp.ravel(grads["w1"])[:8],
                       "g2": jnp.ravel(grads["w2"])[:8]},
         {"loss": 1e-4, "g1": 1e-3, "g2": 1e-3})


run("jax_suite", body)

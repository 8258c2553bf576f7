"""``xgrad.with_sharding_constraint`` on four host devices, in every mode, against ``jax.grad``.

The FSDP pattern: weights sharded over ``data``, constrained to be replicated where they
are used, the batch sharded over ``data``. The loss and the weights' gradients must be
``jax.grad``'s of the same function on plain arrays, and each ``.grad`` must keep its
weight's sharding, eagerly, with the compiled backward and under ``xgrad.compile``.
"""

from __future__ import annotations

import numpy as np

from tests._scripts import run_json

SCRIPT = """
import json
import numpy as np
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import xgrad
from xgrad.autograd import compiled

mesh = Mesh(np.array(jax.devices()), ("data",))
sharded, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
rng = np.random.default_rng(0)
X, W1, W2 = rng.normal(size=(8, 4)), rng.normal(size=(4, 8)), rng.normal(size=(8, 4))


def jax_loss(w1, w2, x):
    h = jnp.tanh(x @ jax.lax.with_sharding_constraint(w1, replicated))
    return jnp.sum((h @ jax.lax.with_sharding_constraint(w2, replicated)) ** 2)


def loss(w1, w2, x):
    h = (x @ xgrad.with_sharding_constraint(w1, replicated)).tanh()
    return ((h @ xgrad.with_sharding_constraint(w2, replicated)) ** 2).sum()


args = [jax.device_put(a, sharded) for a in (W1, W2, X)]
want_loss, want = jax.jit(jax.value_and_grad(jax_loss, argnums=(0, 1)))(*args)


def step(w1, w2, x):
    value = loss(w1, w2, x)
    value.backward()
    return value


found = {"want_loss": float(want_loss), "want": [np.asarray(g).tolist() for g in want]}
for mode in ("eager", "compiled backward", "xgrad.compile"):
    w1, w2 = (xgrad.tensor(a, requires_grad=True) for a in args[:2])
    x = xgrad.tensor(args[2])
    run = xgrad.compile(step, fallback="error") if mode == "xgrad.compile" else step
    compiled.set_enabled(mode == "compiled backward")
    values = [float(run(w1, w2, x)) for _ in range(2)]  # the second accumulates into .grad
    compiled.set_enabled(False)
    found[mode] = {
        "loss": values,
        "grads": [np.asarray(w.grad.array).tolist() for w in (w1, w2)],
        "same_sharding": [w.grad.array.sharding.is_equivalent_to(w.array.sharding, 2) for w in (w1, w2)],
        "specs": [str(w.grad.array.sharding.spec) for w in (w1, w2)],
    }
print(json.dumps(found))
"""


def test_fsdp_constraint_gives_jax_grads_with_the_leaf_sharding_in_every_mode():
    found = run_json(SCRIPT, devices=4, timeout=240)
    for mode in ("eager", "compiled backward", "xgrad.compile"):
        got = found[mode]
        np.testing.assert_allclose(got["loss"], [found["want_loss"]] * 2, rtol=1e-12, err_msg=mode)
        for g, w in zip(got["grads"], found["want"], strict=True):
            np.testing.assert_allclose(g, 2 * np.asarray(w), rtol=1e-12, err_msg=mode)
        assert got["same_sharding"] == [True, True], (mode, got["specs"])

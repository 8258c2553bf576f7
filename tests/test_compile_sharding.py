"""``xgrad.compile`` on sharded inputs: data parallel over four host devices, against eager.

The script runs in a fresh interpreter with the host split into four devices (the test
session has two). It trains the same MLP eagerly and under ``xgrad.compile`` with the
batch sharded over all four devices and the parameters replicated, and reports values,
``.grad``s, parameters, Adam's state and the shardings of all of them.
"""

from __future__ import annotations

import numpy as np

from tests._scripts import run_json

SCRIPT = """
import json
import numpy as np
import optax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import xgrad
from xgrad import nn
from xgrad.optim import Optax

assert jax.device_count() == 4
mesh = Mesh(np.array(jax.devices()), ("data",))
batch, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
rng = np.random.default_rng(0)
X, Y = rng.normal(size=(16, 3)), rng.integers(0, 4, size=16)
STEPS = 4


def setup():
    model = nn.MLP([3, 8, 4], activation=nn.Tanh, key=0, dtype=jnp.float64)
    for p in model.parameters():
        p._array = jax.device_put(p.array, replicated)
    opt = Optax(model.parameters(), optax.adam(1e-2))

    def step(x, y):
        opt.zero_grad()
        logits = model(x)
        loss = xgrad.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        return loss, logits.detach()

    return list(model.parameters()), opt, step


def describe(array):
    sharding = array.sharding
    return {
        "value": np.asarray(array).tolist(),
        "devices": sorted(d.id for d in sharding.device_set),
        "spec": list(sharding.spec),
        "replicated": bool(sharding.is_fully_replicated),
        "sharding": sharding,
        "ndim": array.ndim,
    }


found = {}
for mode in ("eager", "compile"):
    params, opt, step = setup()
    run = xgrad.compile(step, fallback="error") if mode == "compile" else step
    x, y = xgrad.tensor(jax.device_put(X, batch)), xgrad.tensor(jax.device_put(Y, batch))
    results = [run(x, y) for _ in range(STEPS)]
    # A target out of range, in the sharded batch: eager's error, and the next step works.
    try:
        run(x, xgrad.tensor(jax.device_put(np.where(np.arange(16) == 13, 4, Y), batch)))
    except IndexError as exc:
        error = str(exc)
    results.append(run(x, y))
    found[mode] = {
        "loss": [describe(loss.array) for loss, _ in results],
        "logits": [describe(logits.array) for _, logits in results],
        "params": [describe(p.array) for p in params],
        "grads": [describe(p.grad.array) for p in params],
        "opt": [describe(leaf) for leaf in jax.tree.leaves(opt.state)],
        "versions": [p._version for p in params],
        "error": error,
    }
    if mode == "compile":
        found["stats"] = run.stats()

# Shardings compare by equivalence (the same placement); JSON gets their descriptions.
for key in ("loss", "logits", "params", "grads", "opt"):
    for eager, compiled in zip(found["eager"][key], found["compile"][key], strict=True):
        compiled["same_sharding"] = eager["sharding"].is_equivalent_to(compiled["sharding"], eager["ndim"])
for mode in ("eager", "compile"):
    for key in ("loss", "logits", "params", "grads", "opt"):
        for entry in found[mode][key]:
            del entry["sharding"]
print(json.dumps(found))
"""


def test_data_parallel_training_on_four_devices_matches_eager():
    found = run_json(SCRIPT, devices=4, timeout=240)
    eager, compiled = found["eager"], found["compile"]
    assert found["stats"]["compiles"] == 1 and found["stats"]["hits"] == 5 and found["stats"]["fallbacks"] == 0
    assert compiled["error"] == eager["error"] == "Target 4 is out of bounds."
    assert compiled["versions"] == eager["versions"]
    for key in ("loss", "logits", "params", "grads", "opt"):
        assert len(compiled[key]) == len(eager[key]) > 0
        for i, (a, b) in enumerate(zip(eager[key], compiled[key], strict=True)):
            np.testing.assert_allclose(b["value"], a["value"], rtol=1e-10, atol=1e-13, err_msg=f"{key}[{i}]")
            where = f"{key}[{i}]: eager {a['spec']} on {a['devices']}, compiled {b['spec']} on {b['devices']}"
            assert b["same_sharding"], where
            assert b["devices"] == a["devices"] == [0, 1, 2, 3], where
    # Data parallel: the batch stays split four ways, parameters and their state stay replicated.
    assert all(e["spec"] == ["data"] and not e["replicated"] for e in compiled["logits"])
    assert all(e["replicated"] for key in ("params", "grads", "opt") for e in compiled[key])

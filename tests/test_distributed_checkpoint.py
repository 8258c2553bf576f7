"""``xgrad.distributed.CheckpointManager``: a job killed mid-run resumes from its latest complete checkpoint.

``python tests/test_distributed_checkpoint.py CKPT NUM_PROCESSES PROCESS_ID PORT STEPS DIE_AFTER RESTORE``
is the worker: an MLP trains data parallel with Adam over every device of every process,
float64, checkpointing every 2 steps (``max_to_keep=2``); it resumes from checkpoint
``RESTORE`` (``latest``: the newest complete one; ``none``: from scratch), and process 1
``os._exit``s after step ``DIE_AFTER`` (-1: never). Each process prints ``loss STEP VALUE``
per step. The tests launch it as 2 processes × 2 host devices and as 1 process × 4.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from tests._scripts import FAST_COMPILES
from tests.test_distributed import _free_port, launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, FEATURES, HIDDEN, CLASSES = 8, 6, 8, 4
STEPS, EVERY, KEEP, LR = 6, 2, 2, 0.05


def initial_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"0.weight": rng.normal(size=(HIDDEN, FEATURES)) / 2, "0.bias": rng.normal(size=HIDDEN) / 4,
            "2.weight": rng.normal(size=(CLASSES, HIDDEN)) / 2, "2.bias": rng.normal(size=CLASSES) / 4}


def global_batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of ``step``, whoever runs it."""
    data = np.random.default_rng(step)
    return data.normal(size=(BATCH, FEATURES)), data.integers(0, CLASSES, size=BATCH)


def reference_losses() -> dict[int, float]:
    """The uninterrupted run: ``jax.grad`` of the same loss and optax's Adam (PyTorch's formula), one device."""
    import jax
    import jax.numpy as jnp
    import optax

    def loss_fn(params, x, labels):
        h = jnp.tanh(x @ params["0.weight"].T + params["0.bias"])
        logp = jax.nn.log_softmax(h @ params["2.weight"].T + params["2.bias"], axis=-1)
        return -jnp.take_along_axis(logp, labels[:, None], axis=1).mean()

    params = {k: jnp.asarray(v) for k, v in initial_params().items()}
    adam = optax.adam(LR, b1=0.9, b2=0.999, eps=1e-8)
    state, losses = adam.init(params), {}
    for step in range(1, STEPS + 1):
        loss, grads = jax.value_and_grad(loss_fn)(params, *map(jnp.asarray, global_batch(step)))
        updates, state = adam.update(grads, state)
        params, losses[step] = optax.apply_updates(params, updates), float(loss)
    return losses


def worker(ckpt: str, num_processes: int, process_id: int, port: int, steps: int, die_after: int,
           restore: str) -> None:  # pragma: no cover - runs in children
    import jax

    import xgrad

    if num_processes > 1:
        xgrad.distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id, initialization_timeout=60)
    jax.config.update("jax_enable_x64", True)
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    nn = xgrad.nn
    mesh = Mesh(np.array(jax.devices()), ("data",))
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN, dtype=np.float64), nn.Tanh(),
                          nn.Linear(HIDDEN, CLASSES, dtype=np.float64))
    for name, value in initial_params().items():  # replicated over every device of every process
        index, attribute = name.split(".")
        setattr(model[int(index)], attribute, nn.Parameter(xgrad.tensor(value, device=NamedSharding(mesh, P()))))
    optimizer = xgrad.optim.Adam(model.parameters(), lr=LR)
    manager = xgrad.distributed.CheckpointManager(ckpt, max_to_keep=KEEP)
    start = None if restore == "none" else manager.latest_step() if restore == "latest" else int(restore)
    if start is not None:
        manager.restore(start, model=model, optimizer=optimizer)
    batch = NamedSharding(mesh, P("data"))
    rows = slice(jax.process_index() * BATCH // jax.process_count(), (jax.process_index() + 1) * BATCH // jax.process_count())
    for step in range((start or 0) + 1, steps + 1):
        x, labels = (xgrad.tensor(jax.make_array_from_process_local_data(batch, v[rows])) for v in global_batch(step))
        optimizer.zero_grad()
        loss = xgrad.nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        optimizer.step()
        print(f"loss {step} {loss.item()!r}", flush=True)
        if step % EVERY == 0:
            manager.save(step, model=model, optimizer=optimizer)
        if step == die_after and process_id == 1:
            os._exit(1)


def _env() -> dict[str, str]:
    """launch's environment for two processes of two devices each."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count=2 {FAST_COMPILES}"
    env.pop("XGRAD_HYPOTHESIS_PROFILE", None)
    return env


def _argv(ckpt, num_processes: int, port: int, die_after: int = -1, restore: str = "latest"):
    return lambda i: [sys.executable, __file__, str(ckpt), str(num_processes), str(i), str(port), str(STEPS),
                      str(die_after), restore]


def _losses(output: str) -> dict[int, float]:
    return {int(s): float(v) for s, v in re.findall(r"^loss (\d+) (\S+)$", output, flags=re.MULTILINE)}


def run(ckpt, num_processes: int, restore: str = "latest") -> list[dict[int, float]]:
    devices = 4 // num_processes
    return [_losses(out) for out in launch(_argv(ckpt, num_processes, _free_port(), restore=restore),
                                           num_processes, devices, timeout=120)]


def run_killed(ckpt, die_after: int) -> list[str]:
    """Two processes; process 1 exits after ``die_after``, and process 0 is killed then, not left to JAX's timeout."""
    argv = _argv(ckpt, 2, _free_port(), die_after=die_after)
    children = [subprocess.Popen(argv(i), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
                for i in range(2)]
    try:
        children[1].wait(timeout=120)
        time.sleep(0.5)  # process 0 may finish printing the step it is in
    finally:
        for child in children:
            child.kill()
    outputs = [child.communicate()[0] for child in children]
    assert children[1].returncode == 1, outputs[1]
    return outputs


@pytest.mark.slow
def test_killed_job_resumes_from_latest_complete_checkpoint(tmp_path):
    import xgrad

    uninterrupted = reference_losses()

    killed = run_killed(tmp_path, die_after=5)
    assert sorted(_losses(killed[1])) == [1, 2, 3, 4, 5], killed[1]
    manager = xgrad.distributed.CheckpointManager(tmp_path, max_to_keep=KEEP)
    assert manager.all_steps() == [2, 4]
    # A torn save (killed before its rename) is never the latest, and the next save removes it.
    torn = tmp_path / "step_6.tmp-0123456789abcdef"
    torn.mkdir()
    (torn / "model.safetensors").write_bytes(b"half")
    assert manager.latest_step() == 4

    resumed = run(tmp_path, 2)
    for losses in resumed:
        assert sorted(losses) == [5, 6]
        for step, loss in losses.items():
            assert loss == pytest.approx(uninterrupted[step], rel=1e-12, abs=1e-12), step
    for step in (1, 2, 3, 4, 5):  # and the killed run's own steps
        assert _losses(killed[1])[step] == pytest.approx(uninterrupted[step], rel=1e-12, abs=1e-12)
    assert sorted(os.listdir(tmp_path)) == ["step_4", "step_6"]
    assert sorted(os.listdir(tmp_path / "step_6")) == [
        "checkpoint.manifest", "model.safetensors", "model.shard0-of-2.safetensors", "model.shard1-of-2.safetensors", "optimizer.json",
        "optimizer.safetensors", "optimizer.shard0-of-2.safetensors", "optimizer.shard1-of-2.safetensors"]

    # What two processes saved restores in one process over four devices, to the same losses after.
    (one,) = run(tmp_path, 1, restore="4")
    assert sorted(one) == [5, 6]
    for step, loss in one.items():
        assert loss == pytest.approx(uninterrupted[step], rel=1e-12, abs=1e-12), step


def test_save_restore_in_this_process(tmp_path):
    """Adam's state and the model round-trip; only the newest ``max_to_keep`` remain; errors in words."""
    import jax

    import xgrad

    model = xgrad.nn.Linear(3, 2, key=jax.random.key(0))
    optimizer = xgrad.optim.Adam(model.parameters(), lr=0.1, betas=(0.8, 0.95))
    manager = xgrad.distributed.CheckpointManager(tmp_path / "run", max_to_keep=2)
    assert manager.latest_step() is None and manager.all_steps() == []
    x = xgrad.tensor(np.arange(12.0, dtype=np.float32).reshape(4, 3))
    snapshots = {}
    for step in range(1, 5):
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        manager.save(step, model=model, optimizer=optimizer)
        snapshots[step] = ({k: v.detach().numpy() for k, v in model.state_dict().items()}, optimizer.state_dict())
    assert manager.all_steps() == [3, 4] and manager.latest_step() == 4
    (tmp_path / "run" / "step_9.tmp-00").mkdir()
    assert manager.latest_step() == 4

    fresh = xgrad.nn.Linear(3, 2, key=jax.random.key(5))
    fresh_optimizer = xgrad.optim.Adam(fresh.parameters(), lr=0.5)
    manager.restore(3, model=fresh, optimizer=fresh_optimizer)
    weights, state = snapshots[3]
    for k, v in fresh.state_dict().items():
        np.testing.assert_array_equal(v.detach().numpy(), weights[k])
    restored = fresh_optimizer.state_dict()
    assert restored["param_groups"] == state["param_groups"]
    assert restored["param_groups"][0]["betas"] == (0.8, 0.95)
    assert set(restored["state"]) == {0, 1}
    for i, entries in state["state"].items():
        for name, value in entries.items():
            np.testing.assert_array_equal(restored["state"][i][name].numpy(), value.numpy())

    with pytest.raises(FileNotFoundError, match=r"no complete checkpoint of step 1 in .* \(complete ones: \[3, 4\]\)"):
        manager.restore(1, model=fresh)
    manager.save(4, model=fresh)  # a rerun from step 3 replaces step 4, and clears the torn save
    assert sorted(os.listdir(tmp_path / "run")) == ["step_3", "step_4"]
    assert sorted(os.listdir(tmp_path / "run" / "step_4")) == ["checkpoint.manifest", "model.safetensors"]
    tensor_lr = xgrad.optim.Adam(model.parameters(), lr=xgrad.tensor(0.1))
    tensor_lr.step()
    with pytest.raises(TypeError, match="must be JSON values .* a Tensor lr: pass a float"):
        manager.save(5, model=model, optimizer=tensor_lr)
    assert manager.all_steps() == [3, 4] and sorted(os.listdir(tmp_path / "run")) == ["step_3", "step_4"]
    with pytest.raises(ValueError, match="max_to_keep must be a positive int"):
        xgrad.distributed.CheckpointManager(tmp_path, max_to_keep=0)


@pytest.mark.parametrize("keep", [1, 2, 3, 4, 5])
def test_max_to_keep_keeps_the_newest_k(tmp_path, keep):
    import xgrad

    model = xgrad.nn.Linear(2, 1)
    manager = xgrad.distributed.CheckpointManager(tmp_path, max_to_keep=keep)
    for step in range(1, 8):
        manager.save(step, model=model)
        assert manager.all_steps() == list(range(1, step + 1))[-keep:]
    assert sorted(os.listdir(tmp_path)) == sorted(f"step_{s}" for s in range(8 - keep, 8))


def test_only_restorable_checkpoints_are_listed(tmp_path):
    """``step_07`` is not step 7; a step directory missing a file, or its manifest and every checkpoint file, is not
    listed, and restore names what is missing (one with its files but no manifest is an older xgrad's: listed)."""
    import shutil

    import xgrad
    from xgrad.serialization import CorruptCheckpointError

    model = xgrad.nn.Linear(2, 1)
    manager = xgrad.distributed.CheckpointManager(tmp_path)
    for step in (3, 5, 7):
        manager.save(step, model=model)
    shutil.copytree(tmp_path / "step_7", tmp_path / "step_07")
    shutil.copytree(tmp_path / "step_7", tmp_path / "step_9.old")  # not this manager's naming either
    os.remove(tmp_path / "step_5" / "model.safetensors")  # half deleted
    for name in ("checkpoint.manifest", "model.safetensors"):  # no checkpoint left in it
        os.remove(tmp_path / "step_7" / name)
    assert manager.all_steps() == [3] and manager.latest_step() == 3
    with pytest.raises(CorruptCheckpointError, match=r"step_5/model.safetensors' is missing"):
        manager.restore(5, model=model)
    with pytest.raises(CorruptCheckpointError, match=r"step_7/checkpoint.manifest' is missing: the directory is not a "
                                                     r"complete checkpoint"):
        manager.restore(7, model=model)
    with pytest.raises(FileNotFoundError, match=r"no complete checkpoint of step 9 .* \(complete ones: \[3\]\)"):
        manager.restore(9, model=model)
    manager.save(4, model=model)  # what is not in this manager's naming stays
    assert {"step_07", "step_9.old"} <= set(os.listdir(tmp_path))


def test_bad_arguments_raise_type_errors_naming_them(tmp_path):
    import xgrad

    model = xgrad.nn.Linear(2, 1)
    optimizer = xgrad.optim.SGD(model.parameters(), lr=0.1)
    manager = xgrad.distributed.CheckpointManager(tmp_path)
    with pytest.raises(TypeError, match=r"save: model= takes a module, an object with state_dict\(\) and "
                                        r"load_state_dict\(\); got dict \(a state dict: load it into its object"):
        manager.save(1, model=model.state_dict())
    with pytest.raises(TypeError, match=r"save: optimizer= takes an optimizer, .*; got Linear$"):
        manager.save(1, optimizer=model)
    with pytest.raises(TypeError, match="save: nothing to save: pass model=, optimizer= or both"):
        manager.save(1)
    assert os.listdir(tmp_path) == []  # nothing written, not even an empty checkpoint
    manager.save(1, model=model)
    with pytest.raises(TypeError, match="restore: nothing to restore into"):
        manager.restore(1)
    with pytest.raises(TypeError, match=r"restore: model= takes a module.*got dict"):
        manager.restore(1, model={})
    with pytest.raises(ValueError, match=r"step 1 in .* holds no optimizer state \(it was saved without optimizer=\)"):
        manager.restore(1, model=model, optimizer=optimizer)


def test_saved_mesh_rebuilt_on_as_many_devices():
    """Saved devices this run lacks map, in id order, onto ``jax.devices()`` in order; the mesh keeps its shape and axes."""
    import jax
    from jax.sharding import PartitionSpec as P

    from xgrad.serialization import _equivalent_sharding

    devices = jax.devices()[:2]
    desc = {"axes": ["data", "model"], "mesh_shape": [2, 1], "device_ids": [2049, 2048], "spec": [None, "data"]}
    sharding = _equivalent_sharding(desc, devices)
    assert sharding is not None
    assert [d.id for d in sharding.mesh.devices.flat] == [devices[1].id, devices[0].id]
    assert sharding.mesh.axis_names == ("data", "model") and sharding.mesh.devices.shape == (2, 1)
    assert sharding.spec == P(None, "data")
    assert _equivalent_sharding({**desc, "mesh_shape": [3], "device_ids": [7, 8, 9]}, devices) is None


if __name__ == "__main__":
    worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]),
           sys.argv[7])

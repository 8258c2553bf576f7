"""Scaling out: several processes over ``jax.distributed``, and one process over four devices.

``python tests/test_distributed.py OUT NUM_PROCESSES PROCESS_ID PORT`` is the worker: it
trains one step of a small MLP data-parallel, tensor-parallel and with mixed shardings,
in both engines, round-trips a sharded checkpoint, and writes what every process sees to
``OUT``. The tests launch it as 2 processes × 2 host devices (gloo collectives on CPU)
and as 1 process × 4 devices, and check everything against ``jax.grad`` of the same
loss on the whole global batch in one process, in float64.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests._scripts import FAST_COMPILES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, FEATURES, HIDDEN, CLASSES = 8, 6, 8, 4
SGD_LR = 0.1
PARAMS = ("w1", "b1", "w2", "b2")
# name -> spec of each parameter (() replicated) on the ('data', 'model') mesh; data_parallel uses a
# 1-D 'data' mesh of all four devices instead.
LAYOUTS = {
    "data_parallel": {"w1": (), "b1": (), "w2": (), "b2": ()},
    "tensor_parallel": {"w1": (None, "model"), "b1": ("model",), "w2": ("model", None), "b2": ()},
    "mixed": {"w1": (None, "model"), "b1": (), "w2": (), "b2": ()},
}


def global_batch() -> dict[str, np.ndarray]:
    """The same parameters and global batch in every process and in the reference."""
    rng = np.random.default_rng(0)
    return {
        "w1": rng.normal(size=(FEATURES, HIDDEN)) / 2, "b1": rng.normal(size=HIDDEN) / 4,
        "w2": rng.normal(size=(HIDDEN, CLASSES)) / 2, "b2": rng.normal(size=CLASSES) / 4,
        "x": rng.normal(size=(BATCH, FEATURES)), "labels": rng.integers(0, CLASSES, size=BATCH),
    }


def loss_fn(np_, params, x, labels):
    """The MLP's mean cross entropy, written against xgrad or jax.numpy."""
    h = np_.tanh(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    if np_.__name__ == "xgrad":
        return np_.cross_entropy(logits, labels)
    import jax

    logp = jax.nn.log_softmax(logits, axis=-1)
    return -np_.take_along_axis(logp, labels[:, None], axis=1).mean()


# -- the worker (runs in each launched process) -------------------------------------
def worker(out: str, num_processes: int, process_id: int, port: int) -> None:  # pragma: no cover - runs in children
    import jax

    if num_processes > 1:
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes,
                                   process_id=process_id, initialization_timeout=60)
    jax.config.update("jax_enable_x64", True)
    import optax
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import xgrad

    assert jax.device_count() == 4, jax.devices()
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
    data_mesh = Mesh(np.array(jax.devices()), ("data",))  # pure data parallel: the batch split 4 ways
    data = global_batch()
    found: dict[str, object] = {}
    arrays: dict[str, np.ndarray] = {}

    def put(value, spec, requires_grad=False, on=mesh):
        sharding = NamedSharding(on, P(*spec))
        array = jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
        return xgrad.tensor(array, requires_grad=requires_grad)

    def whole(t):
        array = t.array if isinstance(t, xgrad.Tensor) else t
        if array.is_fully_addressable:
            return np.asarray(array)
        return np.asarray(multihost_utils.process_allgather(array, tiled=True))

    for layout, specs in LAYOUTS.items():
        on = data_mesh if layout == "data_parallel" else mesh
        x, labels = put(data["x"], ("data",), on=on), put(data["labels"], ("data",), on=on)
        params = {n: put(data[n], specs[n], requires_grad=True, on=on) for n in PARAMS}
        for compiled in (False, True):
            for p in params.values():
                p.grad = None
            hlo_before = set(glob.glob(os.path.join(out, f"hlo{process_id}", "*jit_run*after_optimizations.txt")))
            loss_fn(xgrad, params, x, labels).backward(compiled=compiled)
            case = f"{layout}/{'compiled' if compiled else 'eager'}"
            if layout == "data_parallel" and compiled:
                found["hlo"] = sorted(set(glob.glob(os.path.join(out, f"hlo{process_id}", "*jit_run*after_optimizations.txt"))) - hlo_before)
            found[f"{case}/grad_specs"] = {n: str(p.grad.sharding.spec) for n, p in params.items()}
            found[f"{case}/leaf_specs"] = {n: str(p.sharding.spec) for n, p in params.items()}
            found[f"{case}/kept"] = all(p.grad.sharding.is_equivalent_to(p.sharding, p.ndim) for p in params.values())
            for n, p in params.items():
                arrays[f"{case}/{n}"] = whole(p.grad)
        if layout == "tensor_parallel":
            shardings = {n: p.sharding for n, p in params.items()}
            xgrad.optim.Optax(list(params.values()), optax.sgd(SGD_LR)).step()
            found["sgd/specs"] = {n: str(p.sharding.spec) for n, p in params.items()}
            found["sgd/kept"] = all(p.sharding.is_equivalent_to(shardings[n], p.ndim) for n, p in params.items())
            for n, p in params.items():
                arrays[f"sgd/{n}"] = whole(p)
            tp_params = params

    # A sharded checkpoint: each process writes its shards, everyone reads them back.
    ckpt = os.path.join(out, "ckpt.safetensors")
    xgrad.save({"params": tp_params, "x": x, "step": xgrad.tensor(3)}, ckpt)
    restored = xgrad.load(ckpt)
    xgrad.save({"x": x}, os.path.join(out, "x.npz"))  # the other format, the same way
    arrays["ckpt/x.npz"] = whole(xgrad.load(os.path.join(out, "x.npz"))["x"])
    arrays["ckpt/x"] = whole(restored["x"])
    resharded = xgrad.load(ckpt, device=NamedSharding(mesh, P("model")))  # another placement
    found["ckpt/resharded"] = all(t.sharding.spec == P("model") for t in resharded["params"].values())
    for n, t in resharded["params"].items():
        arrays[f"ckpt_resharded/{n}"] = whole(t)
    found["ckpt/x_same_sharding"] = restored["x"].sharding == x.sharding
    found["ckpt/specs"] = {n: str(t.sharding.spec) for n, t in restored["params"].items()}
    found["ckpt/same_mesh"] = all(t.sharding == tp_params[n].sharding for n, t in restored["params"].items())
    found["ckpt/step"] = restored["step"].item()
    for n, t in restored["params"].items():
        arrays[f"ckpt/{n}"] = whole(t)

    # A scalar meets a sharded tensor; dropout on a sharded tensor.
    xs = put(data["x"], ("data",), requires_grad=True)
    (xs * xgrad.tensor(2.0)).sum().backward()
    arrays["scalar/out"], arrays["scalar/grad"] = whole(xs * xgrad.tensor(2.0)), whole(xs.grad)
    found["scalar/grad_spec"] = str(xs.grad.sharding.spec)
    key = jax.random.key(7)
    dropped = xgrad.dropout(xs, p=0.5, key=key)
    found["dropout/spec"] = str(dropped.sharding.spec)
    arrays["dropout/sharded"] = whole(dropped)
    arrays["dropout/unsharded"] = xgrad.dropout(xgrad.tensor(data["x"]), p=0.5, key=key).detach().numpy()

    # What a process can and cannot read of an array it holds only part of.
    found["device_is_local"] = xs.device in jax.local_devices()
    found["repr"] = repr(xs)
    found["str_is_repr"] = str(xs) == repr(xs)
    found["errors"] = {}
    read_only = xs.detach()  # numpy() of a tensor that requires grad raises, as PyTorch's does
    for what, read in [("numpy", read_only.numpy), ("tolist", xs.tolist), ("item", xs.item), ("float", lambda: float(xs))]:
        try:
            read()
            found["errors"][what] = None
        except (RuntimeError, TypeError, ValueError) as exc:
            found["errors"][what] = f"{type(exc).__name__}: {exc}"
    found["loss_item"] = loss_fn(xgrad, tp_params, x, labels).item()  # a replicated value reads whole

    np.savez(os.path.join(out, f"arrays{process_id}.npz"), **arrays)
    with open(os.path.join(out, f"found{process_id}.json"), "w") as f:
        json.dump(found, f)


# -- the same edges on this session's two devices (fast) -----------------------------
def _session_mesh():
    import jax
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:2]), ("data",))


def _on(mesh, value, *spec, requires_grad=False):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import xgrad

    return xgrad.tensor(value, device=NamedSharding(mesh, P(*spec)), requires_grad=requires_grad)


@pytest.mark.parametrize("compiled", [False, True])
def test_scalar_meets_sharded_tensor(compiled):
    import xgrad

    value = np.arange(8.0).reshape(4, 2)
    x = _on(_session_mesh(), value, "data", requires_grad=True)
    scale = xgrad.tensor(3.0, requires_grad=True)
    y = x * scale
    assert y.sharding == x.sharding
    (y * y).sum().backward(compiled=compiled)
    np.testing.assert_allclose(x.grad.numpy(), 18.0 * value)  # d/dx (3x)^2 = 18x
    np.testing.assert_allclose(scale.grad.item(), 6.0 * (value**2).sum())  # d/ds (sx)^2 = 2s x^2
    assert x.grad.sharding.is_equivalent_to(x.sharding, 2)


def test_dropout_on_sharded_tensor_draws_the_unsharded_mask():
    import jax

    import xgrad

    value = np.arange(1.0, 33.0).reshape(8, 4)
    for key in (jax.random.key(3), jax.random.PRNGKey(3)):
        x = _on(_session_mesh(), value, "data", requires_grad=True)
        out = xgrad.dropout(x, p=0.25, key=key)
        assert out.sharding.is_equivalent_to(x.sharding, 2)
        expected = xgrad.dropout(xgrad.tensor(value), p=0.25, key=key).detach().numpy()
        np.testing.assert_array_equal(out.detach().numpy(), expected)
        out.sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), expected / value)


@pytest.mark.parametrize("compiled", [False, True])
def test_grads_keep_their_leaf_sharding(compiled):
    """Only w1 is sharded; eager once gave b1 and w2 grads w1's layout (P('model'))."""
    import jax
    from jax.sharding import Mesh

    import xgrad

    mesh = Mesh(np.array(jax.devices()[:2]), ("model",))
    data, grads = global_batch(), reference()
    params = {n: _on(mesh, data[n], *LAYOUTS["mixed"][n], requires_grad=True) for n in PARAMS}
    loss_fn(xgrad, params, _on(mesh, data["x"]), _on(mesh, data["labels"])).backward(compiled=compiled)
    for n, p in params.items():
        assert p.grad.sharding.is_equivalent_to(p.sharding, p.ndim), (n, p.grad.sharding, p.sharding)
        np.testing.assert_allclose(p.grad.numpy(), grads[n], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["eager", "compiled", "xgrad.compile"])
def test_conv2d_grads_on_a_mesh(mode):
    """conv2d's gradients of operands split over two devices, as ``jax.grad``'s on one: eager and
    ``xgrad.compile`` take the convolution's own transposes there, the compiled backward the CPU
    patches form (NOTE [Convolution gradients on CPU])."""
    import jax

    import xgrad

    rng = np.random.default_rng(0)
    values = rng.normal(size=(4, 2, 5, 5)), rng.normal(size=(4, 1, 3, 3))
    conv = dict(stride=(1, 2), padding=1, groups=2)

    def loss(x, w):
        return (xgrad.conv2d(x, w, **conv) ** 2).sum()

    def reference(x, w):
        out = jax.lax.conv_general_dilated(x, w, (1, 2), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                           feature_group_count=2)
        return (out**2).sum()

    mesh = _session_mesh()
    x, w = (_on(mesh, v, "data", requires_grad=True) for v in values)  # the batch, and w's out-channels, split
    if mode == "xgrad.compile":
        def step(x, w):
            value = loss(x, w)
            value.backward()
            return value

        xgrad.compile(step, fallback="error")(x, w)
    else:
        loss(x, w).backward(compiled=mode == "compiled")
    for t, expected in zip((x, w), jax.grad(reference, argnums=(0, 1))(*values), strict=True):
        np.testing.assert_allclose(t.grad.numpy(), expected, rtol=1e-10, atol=1e-12)
        assert t.grad.sharding.is_equivalent_to(t.sharding, t.ndim), (t.grad.sharding, t.sharding)


# -- launching ------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv_of, num_processes: int, devices_per_process: int, timeout: float, extra_flags: str = "") -> list[str]:
    """Start ``num_processes`` children (``argv_of(i)``), each with its own host devices; their outputs.

    Children that outlive ``timeout`` are killed, and the test fails with what they printed.
    """
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices_per_process} {FAST_COMPILES} {extra_flags}".strip()
    env.pop("XGRAD_HYPOTHESIS_PROFILE", None)
    children = [subprocess.Popen(argv_of(i), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                for i in range(num_processes)]
    outputs = []
    try:
        for child in children:
            outputs.append(child.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for child in children:
            child.kill()
        texts = [child.communicate()[0] for child in children]
        pytest.fail(f"processes did not finish in {timeout} s:\n" + "\n---\n".join(texts))
    for i, (child, text) in enumerate(zip(children, outputs, strict=True)):
        if child.returncode != 0:
            pytest.fail(f"process {i} exited with {child.returncode}:\n{text}")
    return outputs


def run_workers(out, num_processes: int, devices_per_process: int) -> tuple[list[dict], list[dict]]:
    port = _free_port()
    flags = f"--xla_dump_to={out}/hlo0 --xla_dump_hlo_as_text --xla_dump_hlo_module_re=jit_run"
    launch(lambda i: [sys.executable, __file__, str(out), str(num_processes), str(i), str(port)],
           num_processes, devices_per_process, timeout=120,
           extra_flags=flags if num_processes == 1 else "")
    found = [json.loads((out / f"found{i}.json").read_text()) for i in range(num_processes)]
    arrays = [dict(np.load(out / f"arrays{i}.npz")) for i in range(num_processes)]
    return found, arrays


def reference() -> dict[str, np.ndarray]:
    """``jax.grad`` of the same loss on the whole global batch, one device, float64."""
    import jax
    import jax.numpy as jnp

    data = global_batch()
    params = {n: jnp.asarray(data[n]) for n in PARAMS}
    grads = jax.grad(lambda p: loss_fn(jnp, p, jnp.asarray(data["x"]), jnp.asarray(data["labels"])))(params)
    return {n: np.asarray(g) for n, g in grads.items()}


def check(found: dict, arrays: dict, multi_process: bool) -> None:
    data, grads = global_batch(), reference()
    for layout in LAYOUTS:
        for engine in ("eager", "compiled"):
            case = f"{layout}/{engine}"
            for n in PARAMS:
                np.testing.assert_allclose(arrays[f"{case}/{n}"], grads[n], rtol=1e-10, atol=1e-12, err_msg=f"{case} grad of {n}")
            # Each grad keeps its leaf's sharding, in both engines.
            assert found[f"{case}/kept"], (case, found[f"{case}/grad_specs"], found[f"{case}/leaf_specs"])
    assert found["sgd/kept"], found["sgd/specs"]
    for n in PARAMS:
        np.testing.assert_allclose(arrays[f"sgd/{n}"], data[n] - SGD_LR * grads[n], rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(arrays[f"ckpt/{n}"], arrays[f"sgd/{n}"])
        np.testing.assert_array_equal(arrays[f"ckpt_resharded/{n}"], arrays[f"sgd/{n}"])
    assert found["ckpt/resharded"]
    assert found["ckpt/same_mesh"] and found["ckpt/x_same_sharding"] and found["ckpt/step"] == 3
    np.testing.assert_array_equal(arrays["ckpt/x"], data["x"])
    np.testing.assert_array_equal(arrays["ckpt/x.npz"], data["x"])
    np.testing.assert_array_equal(arrays["scalar/out"], 2 * data["x"])
    np.testing.assert_array_equal(arrays["scalar/grad"], np.full_like(data["x"], 2.0))
    assert found["scalar/grad_spec"] == "P('data',)"
    assert found["dropout/spec"] == "P('data',)"
    np.testing.assert_array_equal(arrays["dropout/sharded"], arrays["dropout/unsharded"])
    assert set(np.unique(arrays["dropout/sharded"] / data["x"]).round(12)) == {0.0, 2.0}
    assert found["device_is_local"]
    import jax.numpy as jnp

    stepped = {n: jnp.asarray(data[n] - SGD_LR * grads[n]) for n in PARAMS}
    assert found["loss_item"] == pytest.approx(float(loss_fn(jnp, stepped, jnp.asarray(data["x"]), jnp.asarray(data["labels"]))), rel=1e-12)
    assert found["str_is_repr"]
    if multi_process:
        assert "local shards" in found["repr"] and "shape=(8, 6)" in found["repr"] and "dtype=float64" in found["repr"]
        assert "P('data',)" in found["repr"], found["repr"]
        assert set(found["errors"]) == {"numpy", "tolist", "item", "float"}
        for what, error in found["errors"].items():
            assert error is not None and error.startswith(("RuntimeError: Tensor.", "RuntimeError: float(")), error
            assert "spans devices of other processes" in error, (what, error)
            assert "process_allgather" in error and "addressable_shards" in error
    else:
        assert found["repr"].startswith("tensor([[")
        assert found["errors"]["numpy"] is None and found["errors"]["tolist"] is None  # item of 48 elements: jax's error


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
    found, arrays = run_workers(tmp_path, num_processes=2, devices_per_process=2)
    for i in range(2):
        check(found[i], arrays[i], multi_process=True)
    # The checkpoint: one file of shards per process plus the structure. Each piece is written
    # once, by a process that holds it: x's rows are split between the processes.
    from safetensors import safe_open

    files = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "ckpt*")) + glob.glob(str(tmp_path / "x*")))
    assert files == ["ckpt.safetensors", "ckpt.shard0-of-2.safetensors", "ckpt.shard1-of-2.safetensors",
                     "x.npz", "x.shard0-of-2.npz", "x.shard1-of-2.npz"]
    with safe_open(str(tmp_path / "ckpt.safetensors"), "np") as f:
        assert list(f.keys()) == ["step"]
    sizes: dict[str, list[int]] = {}
    for i in range(2):
        with safe_open(str(tmp_path / f"ckpt.shard{i}-of-2.safetensors"), "np") as f:
            for k in f.keys():  # noqa: SIM118  (safe_open is no Mapping)
                sizes.setdefault(k.split("@")[0], [0, 0])[i] += f.get_tensor(k).size
    assert sizes["x"] == [BATCH * FEATURES // 2] * 2
    data = global_batch()
    assert {n: sum(s) for n, s in sizes.items()} == {f"params/{n}": data[n].size for n in PARAMS} | {"x": data["x"].size}

    # Read here, in one process that lacks the other process's devices.
    import xgrad

    ckpt = tmp_path / "ckpt.safetensors"
    with pytest.raises(ValueError, match="was saved sharded over devices .* pass device="):
        xgrad.load(ckpt)
    whole = xgrad.load(ckpt, device="cpu:0")
    for n in PARAMS:
        np.testing.assert_array_equal(whole["params"][n].detach().numpy(), arrays[0][f"sgd/{n}"])
    np.testing.assert_array_equal(whole["x"].detach().numpy(), data["x"])
    # A shard file of another save (an interrupted save) or a missing one is refused.
    shard1 = tmp_path / "ckpt.shard1-of-2.safetensors"
    with safe_open(str(shard1), "np") as f:
        meta, tensors = json.loads(f.metadata()["__xgrad__"]), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    from safetensors.numpy import save_file

    save_file(tensors, str(shard1), metadata={"__xgrad__": json.dumps({**meta, "save_id": "0" * 16})})
    with pytest.raises(ValueError, match="belongs to another save"):
        xgrad.load(ckpt, device="cpu:0")
    shard1.unlink()
    with pytest.raises(ValueError, match="ckpt.shard1-of-2.safetensors' is missing"):
        xgrad.load(ckpt, device="cpu:0")


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
    """One run of the worker in one process over four host devices, with the backward's HLO dumped."""
    return run_workers(tmp_path_factory.mktemp("four_devices"), num_processes=1, devices_per_process=4)


def _collectives(four_devices) -> list[tuple[str, str]]:
    """``(collective, op it came from)`` for each collective of the compiled data-parallel backward."""
    (hlo_file,) = four_devices[0][0]["hlo"]
    with open(hlo_file) as f:
        hlo = f.read()
    pattern = r"^.*? = .*?\b(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(.*?op_name=\"([^\"]*)\""
    return re.findall(pattern, hlo, flags=re.MULTILINE)


@pytest.mark.slow
def test_four_devices_in_one_process(four_devices):
    found, arrays = four_devices
    check(found[0], arrays[0], multi_process=False)


@pytest.mark.slow
def test_data_parallel_backward_all_reduces_the_grads_once(four_devices):
    """One all-reduce (XLA combines the grads' sums into one); no activation or label is gathered."""
    collectives = _collectives(four_devices)
    assert [kind for kind, _ in collectives] == ["all-reduce"], collectives


def _readme_commands() -> list[list[str]]:
    """The launch commands of README's "Scaling out" section, as argument lists."""
    with open(os.path.join(ROOT, "README.md")) as f:
        section = f.read().split("## Scaling out", 1)[1].split("\n## ", 1)[0]
    lines = [line.split("#", 1)[0].strip() for line in section.splitlines() if line.startswith("python examples/data_parallel.py")]
    return [shlex.split(line.removesuffix("&")) for line in lines]


@pytest.mark.slow
def test_readme_data_parallel_example_runs_as_two_processes():
    commands = _readme_commands()
    assert len(commands) == 3 and "--process-id" in commands[0] and "--process-id" in commands[1]
    port = str(_free_port())

    def argv(command):
        return [sys.executable, *(a.replace("12355", port) for a in command[1:])]

    # As the README runs them: two processes of two devices each, then one process.
    two = launch(lambda i: argv(commands[i]), num_processes=2, devices_per_process=2, timeout=120)
    (one,) = launch(lambda i: argv(commands[2]), num_processes=1, devices_per_process=2, timeout=120)

    def final_losses(output):
        return [float(v) for v in re.findall(r"final loss (\S+)", output)]

    losses = [float(v) for v in re.findall(r"step \d+ loss (\S+)", two[0])]
    assert len(losses) == 5 and losses[-1] < 0.8 * losses[0]
    # Both processes see the same replicated loss, and it is the one-process loss (float32 sums).
    assert final_losses(two[0]) == final_losses(two[1]) == [pytest.approx(losses[-1], abs=1e-6)]
    assert final_losses(one) == [pytest.approx(final_losses(two[0])[0], rel=1e-5)]


if __name__ == "__main__":
    worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))

"""Eager's programs compiled with XLA's fast CPU options (NOTE [Fast compiles] in ``xgrad/fast_compile.py``):
XLA's default results to rounding, the plain jit under a trace, and no program compiled twice for one step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad import fast_compile
from xgrad.fast_compile import FastJit
from xgrad.ops.fused_rules import UNFUSED
from xgrad.ops.registry import REGISTRY, PrimitiveNode
from xgrad.testing.op_specs import OP_SPECS

ROOT = Path(__file__).resolve().parent.parent

# Every op of the registry's table, forward and eager backward (its fused rules), in float32, once
# with the fast options and once with XLA's defaults, in a process without the test suite's
# XLA_FLAGS (which set fast options for every program). The table's shapes are small; the demo's
# ops run at a batch too, in float32 and float64 (float64 over the whole table differed in the
# same ops, by as little: measured once, too slow to run at every commit). Per op: how many arrays differ in any bit, and the largest
# difference of an array in units of its dtype's epsilon times its largest magnitude.
SAME_BITS = textwrap.dedent(
    """
    import json
    import jax
    import numpy as np
    jax.config.update("jax_enable_x64", True)
    import xgrad
    from xgrad import fast_compile
    from xgrad.engine import rules
    from xgrad.ops.registry import REGISTRY
    from xgrad.testing.op_specs import OP_SPECS

    SPECS = list({s.name: s for s in OP_SPECS if s.name != "to_device"}.values())

    def batch_ops(dtype):
        rng = np.random.default_rng(1)
        x = xgrad.tensor(rng.standard_normal((67, 33)).astype(dtype), requires_grad=True)
        w = xgrad.tensor(rng.standard_normal((65, 33)).astype(dtype), requires_grad=True)
        b = xgrad.tensor(rng.standard_normal(65).astype(dtype), requires_grad=True)
        h = xgrad.linear(x, w, b)
        target = xgrad.tensor(rng.integers(0, 65, 67).astype(np.int32))
        loss = xgrad.cross_entropy(xgrad.tanh(h), target) + h.relu().exp().log1p().mean() + h.softmax(-1).sum()
        loss.backward()
        return [loss, x.grad, w.grad, b.grad]

    def run(spec, dtype):
        if spec is None:
            return batch_ops(dtype)
        inputs = spec.sample(np.random.default_rng(0), 0, dtype)
        tensors = [
            xgrad.tensor(a, requires_grad=d.differentiable and np.issubdtype(a.dtype, np.floating))
            for a, d in zip(inputs, spec.domains)
        ]
        xgrad.manual_seed(0)
        out = spec.op(*tensors)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        wanted = [o for o in outs if o.requires_grad]
        if wanted:
            sum((o * 1.25).sum() for o in wanted).backward()
        return outs + [t.grad for t in tensors if t.grad is not None]

    def everything():
        results = {}
        for dtype, specs in ((np.float32, [*SPECS, None]), (np.float64, [None])):
            for spec in specs:
                name = f"{spec.id if spec else 'demo ops at a batch'} {np.dtype(dtype).name}"
                try:
                    results[name] = [np.asarray(t.array) for t in run(spec, dtype)]
                except Exception as e:  # an op its table runs in float64 only: the same error both ways
                    results[name] = repr(e)
        return results

    fast = everything()
    assert fast_compile.fast_compiler_options(), "no fast option is known to this XLA"
    fast_compile._known = {}  # XLA's defaults from here: every cached program made again
    for prim in REGISTRY.values():
        prim._jitted.clear()
        prim._fused.clear()
    rules._ZEROS.clear()
    default = everything()

    def distance(a, b):  # 0 for the same bits, else the largest difference in epsilons of b's scale
        if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(np.isnan(a), np.isnan(b)):
            return float("inf")
        if np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
            return 0.0
        if a.dtype.kind not in "fc":
            return float("inf")
        finite = ~np.isnan(b)
        scale = np.max(np.abs(b[finite])) * np.finfo(b.dtype).eps
        return float(np.max(np.abs(a[finite] - b[finite])) / scale)

    report = {}
    for name, values in fast.items():
        if isinstance(values, str) or isinstance(default[name], str):
            report[name] = 0.0 if values == default[name] else float("inf")
        elif len(values) != len(default[name]):
            report[name] = float("inf")
        else:
            report[name] = max(distance(a, b) for a, b in zip(values, default[name]))
    print(json.dumps(report))
    """
)


@pytest.mark.slow
def test_fast_options_keep_every_ops_bits():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"  # placement only: no compile option
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", SAME_BITS], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    distances = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(distances) > 180
    # Measured with jax 0.10: all but 9 the same bits; those (tan and reductions:
    # means, norms, pools, losses) within 2 epsilons, where the loop emitters order or
    # contract a reduction's arithmetic otherwise than the fusion emitters.
    assert {name: d for name, d in distances.items() if d > 4} == {}
    assert sum(d == 0 for d in distances.values()) > 0.9 * len(distances)


def test_unknown_options_are_left_out():
    known = fast_compile._options_xla_knows({"xla_no_such_option_anywhere": True, "xla_llvm_disable_expensive_passes": True})
    assert known == {"xla_llvm_disable_expensive_passes": True}


def test_fast_jit_runs_plainly_under_a_trace():
    """JAX refuses compiler options inside a trace that stages: there the plain jit runs, with
    the same result, and an error of the function itself still raises."""
    twice = FastJit(lambda x: 2 * x)
    assert twice(jnp.arange(3.0)).tolist() == [0.0, 2.0, 4.0]
    assert jax.jit(lambda x: twice(x) + 1)(jnp.arange(3.0)).tolist() == [1.0, 3.0, 5.0]
    # An op on concrete tensors inside a traced function (constants of the trace).
    constant = xgrad.tensor([1.0, 2.0])
    assert jax.jit(lambda a: (constant * 3.0).array + a)(jnp.ones(2)).tolist() == [4.0, 7.0]

    def bad(x):
        raise ValueError("the function's own error")

    with pytest.raises(ValueError, match="the function's own error"):
        FastJit(bad)(jnp.ones(2))
    with pytest.raises(ValueError, match="the function's own error"):
        jax.jit(lambda x: FastJit(bad)(x))(jnp.ones(2))


@pytest.fixture
def compiles() -> Iterator[list[str]]:
    """The names of the XLA programs compiled while the test runs."""
    names: list[str] = []

    def listener(event: str, seconds: float, **kwargs: object) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            names.append(str(kwargs.get("fun_name")))

    jax.monitoring.register_event_duration_secs_listener(listener)
    yield names
    jax.monitoring.unregister_event_duration_listener(listener)


@pytest.mark.parametrize("how", ["eager", "compiled backward", "xgrad.compile"])
@pytest.mark.parametrize("make_optimizer", [
    lambda ps: xgrad.optim.SGD(ps, lr=0.1, momentum=0.9), lambda ps: xgrad.optim.Adam(ps, lr=0.01),
], ids=["SGD", "Adam"])
def test_the_second_step_compiles_nothing(how, make_optimizer, compiles):
    """Parameters made on the default device are uncommitted; the update's outputs are committed.
    The optimizer commits them when they join, so the second step finds every program of the first."""
    model = xgrad.nn.MLP([3, 5, 2], activation=xgrad.nn.Tanh, key=7)
    optimizer = make_optimizer(model.parameters())
    x = xgrad.tensor(np.random.default_rng(0).standard_normal((4, 3)))
    y = xgrad.tensor(np.array([0, 1, 1, 0], np.int32))

    def step():
        optimizer.zero_grad()
        loss = xgrad.cross_entropy(model(x), y)
        loss.backward(compiled=how == "compiled backward")
        optimizer.step()
        return loss

    run = xgrad.compile(step, fallback="error") if how == "xgrad.compile" else step
    first = run().item()
    del compiles[:]
    second = run().item()
    assert compiles == []
    assert second < first  # the step moved the parameters


# NOTE [Cross-entropy without ignored targets] (xgrad/ops/nn.py): targets all in [0, C) with an
# ignore_index outside it divide the mean by the number of targets, not by a count of the kept
# ones. The reference counts them: an ignore_index inside [0, C) that no target takes.
@pytest.mark.filterwarnings("ignore::xgrad.autograd.compiled.RecompileWarning")  # one call site, many graphs
@pytest.mark.parametrize("how", ["eager", "compiled backward", "xgrad.compile"])
@pytest.mark.parametrize(("dtype", "shape", "reduction", "smoothing"), [
    (np.float32, (48, 10), "mean", 0.0),
    (np.float32, (7, 5, 3), "mean", 0.1),
    (np.float64, (33, 4), "sum", 0.0),
    (np.float16, (3001, 3), "mean", 0.0),  # a count float16 rounds (3001 -> 3000)
    (np.float32, (6, 3), "none", 0.2),
])
def test_cross_entropy_without_ignored_targets_has_the_masked_bits(how, dtype, shape, reduction, smoothing):
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(shape).astype(dtype)
    classes = shape[1]
    targets = rng.integers(0, classes - 1, (shape[0], *shape[2:])).astype(np.int32)  # never the last class

    def loss_and_grad(ignore_index):
        x = xgrad.tensor(logits, requires_grad=True)

        def step(t):
            loss = xgrad.cross_entropy(x, t, ignore_index=ignore_index, reduction=reduction, label_smoothing=smoothing)
            (loss.sum() * 1.5).backward(compiled=how == "compiled backward")
            return loss

        run = xgrad.compile(step, fallback="error") if how == "xgrad.compile" else step
        loss = run(xgrad.tensor(targets))
        return np.asarray(loss.array), np.asarray(x.grad.array)

    unmasked, masked = loss_and_grad(-100), loss_and_grad(classes - 1)
    for a, b in zip(unmasked, masked, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_cross_entropy_counts_kept_targets_only_when_some_may_be_ignored():
    x = xgrad.tensor(np.zeros((4, 3), np.float32), requires_grad=True)

    def run(targets, ignore_index=-100):
        loss = xgrad.cross_entropy(x, xgrad.tensor(np.array(targets, np.int32)), ignore_index=ignore_index)
        return loss.grad_fn.params["all_kept"], loss.item()

    assert run([0, 1, 2, 0]) == (True, pytest.approx(np.log(3)))
    assert run([0, -100, 2, 0]) == (False, pytest.approx(np.log(3)))  # one ignored: the mean of three
    assert run([0, 1, 2, 0], ignore_index=1) == (False, pytest.approx(np.log(3)))  # ignore_index is a class
    all_ignored = run([-100] * 4)
    assert all_ignored[0] is False and np.isnan(all_ignored[1])  # PyTorch's 0 / 0


def _nodes_of_several_outputs(outputs):
    """The graph's nodes of primitives with several outputs, each once."""
    found, seen = [], set()
    stack = [o.grad_fn for o in outputs if o.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, PrimitiveNode) and node.prim.num_outputs > 1:
            found.append(node)
        stack.extend(node for node, _ in node.next_functions)
    return found


# Probabilities as targets take the weighted formula, which no primitive of several outputs computes.
_SEVERAL_OUTPUTS = [
    s for s in OP_SPECS if s.name in {n for n, p in REGISTRY.items() if p.num_outputs > 1} and s.label != "probabilities"
]


# NOTE [Unmade zeros] (xgrad/ops/fused_rules.py): the fused rules make the zeros of the outputs
# no grad reached in their own program. The reference is the same node's rules given those
# zeros as arrays, as the engine made them before: the same program but for where the zeros
# come from, so the same bits, NaN and inf included.
@pytest.mark.parametrize("spec", _SEVERAL_OUTPUTS, ids=lambda s: s.id)
@pytest.mark.parametrize("reached", ["first output", "all but the first"])
@pytest.mark.parametrize("values", ["finite", "an inf input"])
def test_unmade_zeros_give_the_bits_of_made_ones(spec, reached, values):
    rng = np.random.default_rng(5)
    inputs = spec.sample(rng, 0, np.float32)
    if values == "an inf input":  # NaN and inf through the rules: inf * 0 still computed
        inputs[0].flat[0] = np.inf
    tensors = [
        xgrad.tensor(a, requires_grad=d.differentiable and np.issubdtype(a.dtype, np.floating))
        for a, d in zip(inputs, spec.domains, strict=True)
    ]
    out = spec.op(*tensors)
    nodes = _nodes_of_several_outputs(list(out) if isinstance(out, (tuple, list)) else [out])
    assert nodes
    for node in nodes:
        metadata = node.input_metadata
        grads = [xgrad.tensor(rng.standard_normal(m.shape).astype(m.dtype)) for m in metadata]
        first = reached == "first output"
        missing = [i for i in range(len(grads)) if (i > 0) == first]
        unmade = [None if i in missing else g for i, g in enumerate(grads)]
        made = [xgrad.tensor(np.zeros(metadata[i].shape, metadata[i].dtype)) if i in missing else g for i, g in enumerate(grads)]
        with xgrad.no_grad():
            node.prim._fused.clear()
            got = node.apply(unmade)
            expected = node.apply(made)
        # Two signatures (the zeros unmade, then made), fused alike: the rules' own ops decide.
        unmade_fused, made_fused = node.prim._fused.values()
        assert (unmade_fused is UNFUSED) == (made_fused is UNFUSED)
        for a, b in zip(got, expected, strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                np.testing.assert_array_equal(np.asarray(a.array), np.asarray(b.array), strict=True)


def test_a_new_batch_size_compiles_no_zeros(compiles):
    """The loss's unreached outputs' zeros are made in its fused rules' program, not by one of their own."""
    model = xgrad.nn.MLP([3, 5, 4], key=1)
    rng = np.random.default_rng(0)

    def step(n):
        x = xgrad.tensor(rng.standard_normal((n, 3)).astype(np.float32))
        y = xgrad.tensor(rng.integers(0, 4, n).astype(np.int32))
        xgrad.cross_entropy(model(x), y).backward()

    step(6)
    del compiles[:]
    step(5)
    assert compiles and not any("zeros" in name for name in compiles)


def _mean_cross_entropy(logits, targets):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[:, None], axis=1))


def test_outputs_on_several_devices_get_their_zeros_made():
    """Zeros of outputs spread over devices keep their placement: made by the engine, not by the rules' program."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("batch",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((8, 5)).astype(np.float32)
    targets = rng.integers(0, 5, 8).astype(np.int32)
    x = xgrad.tensor(jax.device_put(logits, rows), requires_grad=True)
    prim = REGISTRY["cross_entropy"]
    prim._fused.clear()
    xgrad.cross_entropy(x, xgrad.tensor(jax.device_put(targets, rows))).backward()
    (key,) = prim._fused
    assert key[-1] == (None, None, None, None)  # every grad an array: the zeros made by the engine
    expected = jax.grad(lambda a: _mean_cross_entropy(a, targets))(logits)
    np.testing.assert_allclose(np.asarray(x.grad.array), expected, rtol=1e-6, atol=1e-7)

"""Errors inside an ``xgrad.compile`` step: the eager error, and the state eager leaves behind.

An out-of-range index raises ``IndexError`` at the op in eager mode, after whatever ran
before it (here a ``zero_grad()`` and an in-place buffer update) and before anything
after it (the backward, its hooks, the optimizer). Each case runs the same steps
eagerly and compiled and checks the error, that state, and that the next call works.
"""

from __future__ import annotations

import re

import jax
import numpy as np
import optax
import pytest

import xgrad
from xgrad.optim import Optax

RNG = np.random.default_rng(0)
W = RNG.normal(size=(4, 3))
SRC = RNG.normal(size=(1, 3))


def f64(data, requires_grad=False):
    return xgrad.tensor(np.asarray(data, np.float64), requires_grad=requires_grad)


def index_put(w, i):
    h = w * 1.0
    h[i] = 0.0
    return h


# name: (the op on the (4, 3) parameter w and an index, a good index, a bad one, the eager message)
CASES = {
    "getitem": (lambda w, i: w[i], [0, 3], [0, 5], "index 5 is out of bounds for dimension 0 with size 4"),
    "getitem_negative": (lambda w, i: w[:, i], [-3, 2], [1, -4], "index -4 is out of bounds for dimension 1 with size 3"),
    "setitem": (index_put, [1, 2], [4, 1], "index 4 is out of bounds for dimension 0 with size 4"),
    "gather": (
        lambda w, i: xgrad.gather(w, 1, i), [[0], [2], [1], [2]], [[0], [3], [1], [-1]],
        "index 3 is out of bounds for dimension 1 with size 3",
    ),
    "index_select": (lambda w, i: xgrad.index_select(w, 0, i), [3, 0], [1, 7], "index out of range in self"),
    "scatter_add": (
        lambda w, i: xgrad.scatter_add(w, 0, i, f64(SRC)), [[0, 3, 1]], [[0, 1, 4]],
        "index 4 is out of bounds for dimension 0 with size 4",
    ),
    "embedding": (lambda w, i: xgrad.embedding(i, w), [[1, 0], [3, 3]], [[1, 0], [4, 2]], "index out of range in self"),
    "cross_entropy": (lambda w, i: xgrad.cross_entropy(w, i), [0, 2, 1, 2], [0, 3, 1, 2], "Target 3 is out of bounds."),
}


def setup(op, mode, update_buffer=True):
    w = f64(W, requires_grad=True)
    buffer = xgrad.zeros(2)
    opt = Optax([w], optax.adam(0.1))
    log = []
    w.register_hook(lambda g: log.append("hook"))

    def step(index):
        opt.zero_grad()
        if update_buffer:
            with xgrad.no_grad():
                buffer.add_(1.0)  # before the op: eager has done it when the op raises
        loss = op(w, index).sum()
        loss.backward()
        opt.step()
        return loss

    return {"w": w, "buffer": buffer, "opt": opt, "log": log, "step": xgrad.compile(step) if mode == "compile" else step}


def state(s):
    w = s["w"]
    return {
        "w": w.detach().numpy().copy(), "w_version": w._version, "grad": None if w.grad is None else w.grad.numpy().copy(),
        "buffer": s["buffer"].detach().numpy().copy(), "buffer_version": s["buffer"]._version,
        "opt": [np.asarray(x).copy() for x in jax.tree.leaves(s["opt"].state)], "hooks": len(s["log"]),
    }


def assert_states_equal(a, b, rtol=0.0):
    """Equal states (to ``rtol``: a program may round differently from eager ops)."""
    assert a.keys() == b.keys()
    for key in a:
        if key == "opt":
            for x, y in zip(a[key], b[key], strict=True):
                np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * 1e-3)
        elif a[key] is None or b[key] is None:
            assert a[key] is b[key] is None, key
        else:
            np.testing.assert_allclose(a[key], b[key], rtol=rtol, atol=rtol * 1e-3, err_msg=key)


def _checked_in_program(step):
    """Whether the compiled step reads its index checks from the program (else on the host, before it)."""
    (entry,) = step._cache.values()
    assert entry.flags is not None or entry.host_checks  # a step with hooks has flags anyway: whether one raised
    return not entry.host_checks


@pytest.mark.parametrize("mode", ["eager", "compile"])
@pytest.mark.parametrize("update_buffer", [True, False], ids=["after-a-buffer-update", "after-zero_grad"])
@pytest.mark.parametrize("case", list(CASES))
def test_out_of_range_index_raises_and_leaves_the_state_eager_leaves(case, update_buffer, mode):
    """After a buffer update the check is in the program; after only ``zero_grad()`` an index
    argument is checked on the host before the program runs (NOTE [Checks in a compiled step])."""
    op, good, bad, message = CASES[case]
    s, reference = setup(op, mode, update_buffer), setup(op, "eager", update_buffer)
    good_index, bad_index = xgrad.tensor(np.asarray(good)), xgrad.tensor(np.asarray(bad))
    s["step"](good_index), reference["step"](good_index)
    before = state(s)
    assert before["grad"] is not None and before["hooks"] == 1
    with pytest.raises(IndexError, match=f"^{re.escape(message)}$"):
        s["step"](bad_index)
    after = state(s)
    # What ran before the op did (zero_grad, the buffer update); nothing after it (hook, backward, optimizer).
    assert after["grad"] is None and after["hooks"] == 1
    np.testing.assert_array_equal(after["buffer"], before["buffer"] + update_buffer)
    assert after["buffer_version"] == before["buffer_version"] + update_buffer
    assert_states_equal({**after, "grad": None, "buffer": None, "buffer_version": None},
                        {**before, "grad": None, "buffer": None, "buffer_version": None})
    # The same as eager, and the next good call works.
    with pytest.raises(IndexError, match=f"^{re.escape(message)}$"):
        reference["step"](bad_index)
    assert_states_equal(after, state(reference), rtol=1e-12)
    for _ in range(2):
        np.testing.assert_allclose(s["step"](good_index).detach().numpy(), reference["step"](good_index).detach().numpy(), rtol=1e-12)
        assert_states_equal(state(s), state(reference), rtol=1e-12)
    if mode == "compile":
        assert s["step"].stats()["compiles"] == 1 and s["step"].stats()["fallbacks"] == 0
        assert _checked_in_program(s["step"]) == update_buffer


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_hooks_before_the_failing_op_run_and_those_after_do_not(mode):
    w = f64([1.0, -2.0, 0.5], requires_grad=True)
    log = []
    w.register_hook(lambda g: log.append(("hook", g.detach().numpy().tolist())))
    w.register_post_accumulate_grad_hook(lambda t: log.append(("post", t.grad.numpy().tolist())))

    def step(x, index):
        w.grad = None
        (w * x).sum().backward()  # its hooks run and .grad is set before the failing op
        loss = xgrad.gather(w * w, 0, index).sum()
        loss.backward()
        return loss

    run = xgrad.compile(step) if mode == "compile" else step
    x = f64([3.0, 4.0, 5.0])
    np.testing.assert_allclose(run(x, xgrad.tensor([2, 0])).detach().numpy(), [1.25])
    assert [e[0] for e in log] == ["hook", "post", "hook", "post"]
    np.testing.assert_allclose(w.grad.numpy(), [5.0, 4.0, 6.0])
    del log[:]
    with pytest.raises(IndexError, match=r"^index 3 is out of bounds for dimension 0 with size 3$"):
        run(x, xgrad.tensor([0, 3]))
    assert log == [("hook", [3.0, 4.0, 5.0]), ("post", [3.0, 4.0, 5.0])]
    np.testing.assert_allclose(w.grad.numpy(), [3.0, 4.0, 5.0])
    assert w._version == 0


def test_checks_under_a_jax_transformation_inside_the_step_raise_when_the_program_runs():
    # A jax.vmap inside the step is not the step's trace level: its check is a host callback
    # (NOTE [Checks under jax.jit]), whose error JAX reports as a RuntimeError; never a clamped read.
    w = f64([1.0, 2.0, 3.0])

    @xgrad.compile
    def step(rows):
        return jax.vmap(lambda r: xgrad.gather(w, 0, xgrad.Tensor(r)).array)(rows.array)

    np.testing.assert_array_equal(step(xgrad.tensor([[0], [2]])), [[1.0], [3.0]])
    with pytest.raises(RuntimeError, match="index 5 is out of bounds for dimension 0 with size 3"):
        step(xgrad.tensor([[0], [5]]))


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_a_grad_cleared_by_the_step_is_cleared_at_every_call(mode):
    # Traced while .grad was None, the program still clears a .grad set since.
    w = f64([1.0, 2.0], requires_grad=True)
    opt = Optax([w], optax.sgd(0.1))

    def forward(x):
        opt.zero_grad()
        return (w * x).sum()

    run = xgrad.compile(forward) if mode == "compile" else forward
    assert run(f64([1.0, 1.0])).item() == 3.0 and w.grad is None
    for _ in range(2):
        (w * 3).sum().backward()
        assert w.grad is not None
        assert run(f64([1.0, 1.0])).item() == 3.0
        assert w.grad is None
    if mode == "compile":
        assert run.stats()["compiles"] == 1


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_a_grad_accumulated_before_the_failing_op_stays_accumulated(mode):
    w = f64([1.0, -2.0, 0.5], requires_grad=True)
    w.grad = f64([10.0, 20.0, 30.0])
    grad_object = w.grad

    def step(x, index):
        (w * x).sum().backward()  # accumulates into the existing .grad, in place
        return xgrad.gather(w, 0, index).sum()

    run = xgrad.compile(step) if mode == "compile" else step
    x = f64([1.0, 2.0, 3.0])
    with pytest.raises(IndexError, match=r"^index 5 is out of bounds for dimension 0 with size 3$"):
        run(x, xgrad.tensor([5]))
    np.testing.assert_allclose(w.grad.numpy(), [11.0, 22.0, 33.0])
    assert w.grad is grad_object
    assert run(x, xgrad.tensor([2])).item() == 0.5
    np.testing.assert_allclose(w.grad.numpy(), [12.0, 24.0, 36.0])


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_a_step_without_hooks_checks_its_targets_while_its_program_runs(mode):
    """No host calls in the program: it is dispatched before the host check, and a failed check
    drops its outputs, so nothing after the failing op shows (NOTE [Checks in a compiled step])."""
    w = f64(W, requires_grad=True)
    opt = Optax([w], optax.adam(0.1))

    def step(target):
        opt.zero_grad()
        loss = xgrad.cross_entropy(w, target)
        loss.backward()
        opt.step()
        return loss

    run = xgrad.compile(step, fallback="error") if mode == "compile" else step
    good, bad = xgrad.tensor(np.asarray([0, 2, 1, 2])), xgrad.tensor(np.asarray([0, 3, 1, 2]))
    losses = [run(good).item() for _ in range(2)]
    before = w.detach().numpy().copy(), w._version, [np.asarray(x).copy() for x in jax.tree.leaves(opt.state)]
    with pytest.raises(IndexError, match=r"^Target 3 is out of bounds\.$"):
        run(bad)
    assert w.grad is None  # the zero_grad() before the op ran; the backward and the step did not
    np.testing.assert_array_equal(w.detach().numpy(), before[0])
    assert w._version == before[1]
    for x, y in zip(jax.tree.leaves(opt.state), before[2], strict=True):
        np.testing.assert_array_equal(np.asarray(x), y)
    losses.append(run(good).item())
    reference_w = f64(W, requires_grad=True)
    reference_opt = Optax([reference_w], optax.adam(0.1))
    expected = []
    for _ in range(3):
        reference_opt.zero_grad()
        loss = xgrad.cross_entropy(reference_w, good)
        loss.backward()
        reference_opt.step()
        expected.append(loss.item())
    np.testing.assert_allclose(losses, expected, rtol=1e-12)
    if mode == "compile":
        ((entry),) = run._cache.values()
        assert entry.host_checks and not entry.has_host_calls and entry.flags is None

"""``xgrad.compile`` writes the state a step replaces into the memory it replaces (NOTE [Donated state]).

Each test runs the same step eagerly on one copy of the state and compiled on another and
compares them call by call; donation shows as buffers: a new parameter, optimizer state,
buffer, ``.grad`` or generator key array sits where an old one was, which it cannot while
the old array lives. Arrays a user holds are never consumed.
"""

from __future__ import annotations

import weakref

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import xgrad
from xgrad import nn
from xgrad.compile_step import writeback
from xgrad.generator import default_generator

RNG = np.random.default_rng(0)
XS = [xgrad.tensor(RNG.normal(size=(4, 3))) for _ in range(4)]


def make_setup(seed=0):
    """A model with parameters, running statistics and dropout (the generator's key), and Adam."""
    xgrad.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Dropout(0.25), nn.ReLU(), nn.Linear(8, 2))
    model = model.to(jnp.float64)
    return model, xgrad.optim.Adam(model.parameters(), lr=0.1)


def make_step(model, opt, zero_grad=True):
    def step(x):
        if zero_grad:
            opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss
    return step


def state_tensors(model, opt, grads=True):
    """Every Tensor of the step's state: parameters, buffers, ``.grad``s, optimizer state, the generator's key."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [p.grad for p in model.parameters() if p.grad is not None and grads]
    tensors += [t for state in opt.state.values() for t in state.values()]
    return [*tensors, default_generator.data]


def values(model, opt):
    # Read through copies: a jax.Array read by NumPy keeps a view of its buffer, which XLA then never donates.
    return [np.asarray(t.array.copy()) for t in state_tensors(model, opt)]


def buffers(arrays):
    return {a.unsafe_buffer_pointer() for a in arrays}


def assert_same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-8, atol=1e-10)


def eager_values(step_of, calls):
    """The state after each of ``calls`` eager calls of ``step_of(model, opt)``."""
    model, opt = make_setup()
    step = step_of(model, opt)
    found = []
    for x in XS[:calls]:
        step(x)
        found.append(values(model, opt))
    return found


def compiled_setup(step_of):
    model, opt = make_setup()
    return model, opt, xgrad.compile(step_of(model, opt), fallback="error")


@pytest.mark.parametrize("zero_grad", [True, False], ids=["zero_grad", "accumulate"])
def test_a_step_writes_its_state_into_the_memory_it_replaces(zero_grad):
    """Parameters, Adam's moments, running statistics, the generator's key and accumulated ``.grad``s
    are donated: after a call every old buffer holds a new value, and the values are eager's."""
    step_of = lambda model, opt: make_step(model, opt, zero_grad)  # noqa: E731
    expected = eager_values(step_of, len(XS))
    model, opt, step = compiled_setup(step_of)
    for x, eager in zip(XS, expected, strict=True):
        # The group's step counter is one array shared by the moments' states: no one tensor's, not donated.
        # Grads set to None first are not donated but dropped (the next test).
        old = buffers(t.array for t in state_tensors(model, opt, grads=not zero_grad) if t.array.ndim > 0)
        step(x)
        assert_same(values(model, opt), eager)
        assert old <= buffers(t.array for t in state_tensors(model, opt))


def test_each_tensor_keeps_its_own_buffer_and_the_program_copies_no_state():
    """Each parameter and moment takes its new value in its own old buffer, not in another of its
    shape's (JAX pairs donated inputs with outputs by shape and dtype, in order; a pairing other
    than the writes' makes XLA copy the state it still reads), and the program copies fewer
    arrays than it donates."""
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2)).to(jnp.float64)
    opt = xgrad.optim.Adam(model.parameters(), lr=0.1)
    step = xgrad.compile(make_step(model, opt), fallback="error")

    def donated_state():
        return [*model.parameters(), *(t for state in opt.state.values() for t in state.values() if t.array.ndim > 0)]

    step(XS[0])
    for x in XS[1:]:
        old = [t.array.unsafe_buffer_pointer() for t in donated_state()]
        step(x)
        assert [t.array.unsafe_buffer_pointer() for t in donated_state()] == old
    optimized = step.lower(XS[0]).compile().as_text()
    entry = optimized[optimized.index("ENTRY"):]
    assert entry.count(" copy(") < len(donated_state()) // 2


def test_zero_grad_first_lets_go_of_the_old_grads_before_the_program_runs():
    """``zero_grad()`` (``set_to_none``) at the start: last step's ``.grad``s are dropped before the
    program runs, as PyTorch frees them there (an old ``.grad`` dies while its parameter still
    holds its old array), so the new grads may take their memory; a ``.grad`` the user holds
    lives on with its values."""
    expected = eager_values(make_step, 3)
    model, opt, step = compiled_setup(make_step)
    step(XS[0])
    step(XS[1])
    w, held = model[-1].weight, model[0].weight.grad
    kept = np.asarray(held.array.copy())
    old_array = weakref.ref(w.array)
    died_before_writing_back = []
    weakref.finalize(w.grad, lambda: died_before_writing_back.append(w._array is old_array()))
    step(XS[2])
    assert died_before_writing_back == [True]
    assert_same(values(model, opt), expected[2])
    assert held is not model[0].weight.grad
    np.testing.assert_array_equal(np.asarray(held.array), kept)


HOLDERS = {
    "array": lambda model, opt: model[0].weight.array,
    "state": lambda model, opt: opt.state[model[0].weight]["exp_avg"].array,
    "buffer": lambda model, opt: model[1].running_mean.array,
    "grad tensor": lambda model, opt: model[0].weight.grad,
    "grad array": lambda model, opt: model[0].weight.grad.array,
    "detached": lambda model, opt: model[0].weight.detach(),
    "data": lambda model, opt: model[0].weight.data,
    "module state_dict": lambda model, opt: model.state_dict()["1.running_var"],
    "optimizer state_dict": lambda model, opt: opt.state_dict()["state"][0]["exp_avg_sq"],
    "numpy view": lambda model, opt: np.asarray(model[0].weight.array),
    "key": lambda model, opt: default_generator.data.array,
}

HELD_TENSORS = ("grad tensor", "detached", "data", "module state_dict", "optimizer state_dict")


def as_numpy(held):
    """``held``'s values, read through a copy (NumPy reading a jax.Array would keep it from donation)."""
    array = held.array if isinstance(held, xgrad.Tensor) else held
    return np.array(array.copy() if isinstance(array, jax.Array) else array)


@pytest.mark.parametrize("zero_grad", [True, False], ids=["zero_grad", "accumulate"])
@pytest.mark.parametrize("holder", HOLDERS)
def test_an_array_the_user_holds_is_never_consumed(holder, zero_grad):
    """An array taken from the state before a call (``.array``, a ``.grad``'s, a NumPy view) is
    never consumed: it keeps its values through compiled calls, as eagerly, while the state takes
    eager's new values; a Tensor held (a ``.grad``, a ``detach()`` sharing the array) shows what it shows eagerly."""
    take = HOLDERS[holder]

    def held_after_steps(compiled):
        model, opt = make_setup()
        step = make_step(model, opt, zero_grad)
        step = xgrad.compile(step, fallback="error") if compiled else step
        step(XS[0])
        held = take(model, opt)
        kept = as_numpy(held)
        for x in XS[1:]:
            step(x)
        if isinstance(held, jax.Array):
            assert not held.is_deleted()
        return [as_numpy(held), kept, *values(model, opt)]

    eager, compiled = held_after_steps(False), held_after_steps(True)
    assert_same(compiled, eager)  # a held Tensor sees what it sees eagerly (an accumulated .grad: the new values)
    if holder not in HELD_TENSORS:
        np.testing.assert_array_equal(compiled[0], compiled[1])


@pytest.mark.parametrize(
    "make_optimizer", [lambda ps: xgrad.optim.Adam(ps, lr=0.1), lambda ps: xgrad.optim.Optax(ps, optax.adam(0.1))]
)
def test_an_uncommitted_array_two_tensors_share_survives_a_step_that_donates_one(make_optimizer):
    """An optimizer commits an uncommitted parameter's array when it joins; the committed array is a
    buffer of its own, so a compiled step donating it leaves the array the user holds, and another
    tensor made from it, with their values, while the parameter takes eager's new values."""

    values = RNG.normal(size=(4, 3))

    def after_steps(compiled):
        shared = jnp.asarray(values)  # uncommitted
        w = xgrad.tensor(shared, requires_grad=True)
        other = xgrad.tensor(shared)
        opt = make_optimizer([w])

        def step(x):
            opt.zero_grad()
            loss = (x @ w.T).pow(2).mean()
            loss.backward()
            opt.step()
            return loss

        step = xgrad.compile(step, fallback="error") if compiled else step
        for x in XS:
            step(x)
        return w.detach().numpy(), np.asarray(shared), other.numpy(), shared

    eager_w, _, _, _ = after_steps(False)
    compiled_w, held, other, shared = after_steps(True)
    assert not shared.is_deleted()
    np.testing.assert_array_equal(held, other)
    np.testing.assert_allclose(compiled_w, eager_w, rtol=1e-12)
    assert not np.allclose(compiled_w, held)


def test_an_argument_updated_in_place_is_donated_unless_the_user_holds_its_array():
    w = xgrad.tensor(np.arange(4.0), requires_grad=True)

    @xgrad.compile(fallback="error")
    def step(x):
        loss = (w * x).sum()
        loss.backward()
        with xgrad.no_grad():
            x.mul_(0.5)
        return loss

    x = xgrad.tensor(np.ones(4))
    step(x)
    step(x)  # w.grad is set now: traced again, to accumulate
    old = buffers([x.array, w.grad.array])
    step(x)
    assert buffers([x.array, w.grad.array]) == old  # both written in place (XLA picks which goes where)
    held = x.array
    step(x)
    assert not held.is_deleted()
    np.testing.assert_array_equal(np.asarray(held), np.full(4, 0.125))
    np.testing.assert_array_equal(x.numpy(), np.full(4, 0.0625))
    np.testing.assert_array_equal(w.grad.numpy(), np.full(4, 1.875))


def test_a_grad_the_step_replaces_by_a_new_tensor_keeps_its_values_for_the_user():
    """``w.grad = w.grad * 0.5`` gives ``w`` a new ``.grad`` Tensor; one the user still holds keeps
    its array (not donated) and values, as eagerly; unheld, it is donated."""
    w = xgrad.tensor(np.arange(4.0), requires_grad=True)

    @xgrad.compile(fallback="error")
    def halve():
        w.grad = w.grad * 0.5

    (w * w).sum().backward()
    halve()
    old = buffers([w.grad.array])
    halve()
    assert buffers([w.grad.array]) == old
    held = w.grad
    halve()
    assert held is not w.grad and not held.array.is_deleted()
    np.testing.assert_array_equal(held.numpy(), np.arange(4.0) / 2)
    np.testing.assert_array_equal(w.grad.numpy(), np.arange(4.0) / 4)


def test_zero_grad_keeping_zeros_compiles():
    """``zero_grad(set_to_none=False)`` in a compiled step (each ``.grad`` a new Tensor of zeros): eager's state."""
    def step_of(model, opt):
        def step(x):
            opt.zero_grad(set_to_none=False)
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss
        return step

    expected = eager_values(step_of, len(XS))
    model, opt, step = compiled_setup(step_of)
    for x, eager in zip(XS, expected, strict=True):
        step(x)
        assert_same(values(model, opt), eager)


def test_twin_arrays_over_one_buffer_are_donated_once():
    """Two state tensors holding distinct ``jax.Array`` objects over one buffer (``jax.device_put``
    to the device an array is on makes one): the call runs, and both take their new values."""
    a = xgrad.tensor(np.ones(3))
    b = xgrad.Tensor(jax.device_put(a.array, jax.devices()[0]))
    assert b.array is not a.array and b.array.unsafe_buffer_pointer() == a.array.unsafe_buffer_pointer()

    @xgrad.compile(fallback="error")
    def step():
        a.add_(1.0)
        b.mul_(3.0)

    step()
    np.testing.assert_array_equal(a.numpy(), np.full(3, 2.0))
    np.testing.assert_array_equal(b.numpy(), np.full(3, 3.0))


def test_a_call_on_the_arrays_the_last_call_wrote_reads_no_buffer_address(monkeypatch):
    """Reading a buffer's address waits for the program that makes it, so a call whose donated
    arrays are all the ones its last call wrote (distinct buffers of one execution) reads none;
    one that finds an array put there since (a twin of another state array) reads them, and
    donates the shared buffer once, as on a first call."""
    a = xgrad.tensor(np.ones(3))
    b = xgrad.tensor(np.ones(3))

    @xgrad.compile(fallback="error")
    def step():
        a.add_(1.0)
        b.mul_(3.0)

    read = []
    real_buffer_of = writeback._buffer_of
    monkeypatch.setattr(writeback, "_buffer_of", lambda array: read.append(array) or real_buffer_of(array))
    step()
    assert len(read) == 2  # a first call: the arrays come from outside the program
    read.clear()
    step()
    step()
    assert read == []
    np.testing.assert_array_equal(a.numpy(), np.full(3, 4.0))
    np.testing.assert_array_equal(b.numpy(), np.full(3, 27.0))
    b._array = jax.device_put(a.array, jax.devices()[0])  # a twin: another object over a's buffer
    step()
    assert len(read) == 2
    np.testing.assert_array_equal(a.numpy(), np.full(3, 5.0))
    np.testing.assert_array_equal(b.numpy(), np.full(3, 12.0))


def test_an_argument_overwritten_unread_leaves_the_pairing_alone():
    """An argument the step overwrites without reading it (``x.copy_(...)``) is donated but no input
    of the program's computation: kept as one, it still takes its own new value, and the next donated
    array of its shape takes its own (dropped, the next one would take its output). Values as eager's."""
    def run(compiled):
        x, w = xgrad.tensor(np.ones(3)), xgrad.tensor(np.full(3, 2.0))

        def step(x, w):
            x.copy_(w * 3.0)
            w.mul_(2.0)

        step = xgrad.compile(step, fallback="error") if compiled else step
        step(x, w)
        found = []
        for _ in range(2):
            old = buffers([x.array]), buffers([w.array])
            step(x, w)
            found += [as_numpy(x), as_numpy(w)]
            if compiled:
                assert (buffers([x.array]), buffers([w.array])) == old
        return found

    assert_same(run(True), run(False))


def test_two_state_tensors_given_one_new_array():
    """Two state tensors the step reads and leaves holding one new array (``b.copy_(a)``): that
    output goes into one donated input's memory at most (a second one donated would go unused, and JAX
    warns of it), and both show eager's values."""
    def run(compiled):
        a, b = xgrad.tensor(np.full(3, 2.0)), xgrad.tensor(np.full(3, 3.0))

        def step():
            a.mul_(b)
            b.copy_(a)

        step = xgrad.compile(step, fallback="error") if compiled else step
        found = []
        for _ in range(3):
            step()
            found += [a.numpy(), b.numpy()]
        return found

    assert_same(run(True), run(False))


@pytest.mark.parametrize("where", ["before the update", "after the update"])
def test_a_failed_check_leaves_the_state_eager_leaves(where):
    """An index computed in the step, out of range, raises eager's IndexError; the state it leaves
    (updated or not, depending on where the check stands) is eager's, and usable: nothing the
    check leaves alone was donated."""
    def step_of(model, opt):
        table = xgrad.tensor(np.arange(5.0))

        def step(x, k):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            index = (loss * 0).long() + k  # a computed index: checked in the program
            if where == "before the update":
                loss = loss + table[index]
            loss.backward()
            opt.step()
            if where == "after the update":
                loss = loss + table[index]
            return loss
        return step

    results = []
    for compiled in (False, True):
        model, opt = make_setup()
        step = step_of(model, opt)
        step = xgrad.compile(step, fallback="error") if compiled else step
        step(XS[0], xgrad.tensor(1))
        step(XS[1], xgrad.tensor(2))
        with pytest.raises(IndexError):
            step(XS[2], xgrad.tensor(7))
        after_error = values(model, opt)
        step(XS[3], xgrad.tensor(3))
        results.append(after_error + values(model, opt))
    assert_same(results[1], results[0])


@pytest.mark.parametrize("viewed", [False, True], ids=["as given", "viewed"])
def test_a_failed_argument_index_check_leaves_the_state_as_it_was(viewed):
    """Indices given to the step, out of range, are checked before a donating program runs (as
    given: on the host; viewed, ``ids.view(-1)``: by the program's checks alone, run first, as
    nanoGPT's targets are): IndexError, and the state eager leaves, alive. The state is donated."""
    def step_of(model, opt):
        def step(x, ids):
            opt.zero_grad()
            loss = model(x).pow(2).mean() + model[0].weight[ids.view(-1) if viewed else ids].sum()
            loss.backward()
            opt.step()
            return loss
        return step

    ids = [xgrad.tensor(np.array(v).reshape(2, 1) if viewed else v) for v in ([0, 1], [2, 3], [0, 9], [4, 5])]
    results = []
    for compiled in (False, True):
        model, opt = make_setup()
        step = step_of(model, opt)
        step = xgrad.compile(step, fallback="error") if compiled else step
        step(XS[0], ids[0])
        old = buffers(p.array for p in model.parameters())
        step(XS[1], ids[1])
        if compiled:
            assert old <= buffers(t.array for t in state_tensors(model, opt))
        with pytest.raises(IndexError, match="9"):
            step(XS[2], ids[2])
        after_error = values(model, opt)
        step(XS[3], ids[3])
        results.append(after_error + values(model, opt))
    assert_same(results[1], results[0])


def test_observing_hooks_run_on_a_variant_that_donates_nothing():
    """A hook that only observes runs after an observer variant, whose outputs are dropped for the
    exact program once a hook returns a value: the variant must leave its inputs alone. Calls that
    observe, then one whose hook returns a value, then observing again: every call matches eager."""
    def step_of(model, opt):
        calls = []

        def hook(g):
            calls.append(float(g.sum()))
            return g * 2 if len(calls) == 3 else None

        model[0].weight.register_hook(hook)
        return make_step(model, opt)

    expected = eager_values(step_of, len(XS))
    model, opt, step = compiled_setup(step_of)
    for x, eager in zip(XS, expected, strict=True):
        step(x)
        assert_same(values(model, opt), eager)

"""Freeing: saved arrays released after backward, no leaks across steps, deep graphs without recursion."""

import gc
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad import autograd
from xgrad.ops import defprim

DEEP = 100_000

# The identity as a primitive that saves its input: a chain of these is a deep graph
# (each node holds the previous tensor through a SavedTensor) that is cheap to build.
# Its rule reads ``x`` (and so the input is saved) without dispatching anything.
link = defprim("memory_test_link", lambda x: x, [lambda g, out, x: g if x is not None else None], register=False, jit=False)


def live_arrays():
    gc.collect()
    return len(jax.live_arrays())


def model(x):
    """Five layers whose intermediates are new arrays that the backward rules save."""
    h = x
    for _ in range(5):
        h = (h * h).tanh()
    return h.sum()


@pytest.fixture
def x():
    x = xgrad.tensor(np.linspace(0.1, 0.9, 4), requires_grad=True)
    model(x).backward()  # compile everything first: caches must not count as leaks
    x.grad = None
    return x


def test_backward_frees_saved_arrays(x):
    base = live_arrays()
    y = model(x)
    assert live_arrays() - base > 5  # the saved intermediates
    y.backward()
    assert live_arrays() - base == 2  # y itself and x.grad
    del y
    assert live_arrays() - base == 1
    x.grad = None
    assert live_arrays() == base


def test_retain_graph_keeps_saved_arrays_until_the_last_backward(x):
    base = live_arrays()
    y = model(x)
    after_forward = live_arrays()
    y.backward(retain_graph=True)
    assert live_arrays() == after_forward + 1  # only x.grad is new
    y.backward(retain_graph=True)
    assert live_arrays() == after_forward + 1  # the accumulated grad replaced the old one
    y.backward()
    assert live_arrays() - base == 2
    del y
    x.grad = None
    assert live_arrays() == base


def test_grad_frees_saved_arrays(x):
    base = live_arrays()
    y = model(x)
    (g,) = autograd.grad(y, x)
    assert live_arrays() - base == 2  # y and g
    del y, g
    assert live_arrays() == base


def test_training_steps_do_not_leak(x):
    counts = []
    for _ in range(4):
        model(x).backward()
        with xgrad.no_grad():
            x.sub_(x.grad * 0.01)
        x.grad = None
        counts.append(live_arrays())
    assert len(set(counts)) == 1


def test_create_graph_cycle_is_collected(x):
    counts = []
    for _ in range(2):  # the first round also fills the create_graph backward's caches
        x.grad = None
        base = live_arrays()
        with pytest.warns(UserWarning, match="reference cycle"):
            model(x).backward(create_graph=True)
        assert x.grad.grad_fn is not None
        x.grad = None  # breaks the parameter <-> gradient cycle, as the warning advises
        counts.append(live_arrays() - base)
    assert counts[-1] == 0


def test_moderately_deep_real_ops_chain():
    x = xgrad.tensor([0.5, -0.25], dtype=jnp.float64, requires_grad=True)
    y = x
    for _ in range(2000):
        y = y * 1.001 - 0.0005
    y.sum().backward()
    np.testing.assert_allclose(x.grad.detach().numpy(), np.full(2, 1.001 ** 2000), rtol=1e-10)


# -- deep graphs ---------------------------------------------------------------------------------


def chain(x, n=DEEP):
    y = x
    middle = None
    for i in range(n):
        y = link(y)
        if i == n // 2:
            middle = weakref.ref(y)
    return y, middle


@pytest.mark.slow
def test_deep_chain_backward_frees_as_it_goes():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    y, middle = chain(x)
    assert y.grad_fn.topological_nr == DEEP
    (y * y).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0]
    # The saved tensors were the only references to the intermediates: released, they die.
    assert middle() is None
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.sum().backward()


@pytest.mark.slow
def test_deep_chain_grad_with_exec_info_and_retain_graph():
    x = xgrad.tensor(3.0, requires_grad=True)
    y, middle = chain(x)
    (g,) = autograd.grad(y, x, retain_graph=True)
    assert g.item() == 1.0 and middle() is not None
    y.backward()
    assert x.grad.item() == 1.0 and middle() is None


# NOTE [Freeing on a small stack]: CPython frees a chain of objects by nested deallocations until its
# trashcan defers the rest. Python 3.11 defers from the 50th level (64 KiB of stack free DEEP links);
# 3.13 only near its C recursion limit, so freeing DEEP links there needs between 0.9 and 1 MiB (measured;
# about 350 bytes a link below that, a segfault at 512 KiB). A freeing that recursed once per link would
# need some 35 MiB: a 4 MiB stack holds CPython's bounded nesting and still crashes on that.
SMALL_STACK = 4 * 1024 * 1024


def run_in_small_stack_thread(fn):
    """Run ``fn`` on a thread with a small C stack, where recursive freeing would crash first."""
    errors = []

    def target():
        try:
            fn()
        except BaseException as exc:  # re-raised in the test thread
            errors.append(exc)

    previous = threading.stack_size(SMALL_STACK)
    try:
        t = threading.Thread(target=target)
        t.start()
    finally:
        threading.stack_size(previous)
    t.join()
    if errors:
        raise errors[0]


@pytest.mark.slow
def test_dropping_a_deep_chain_does_not_recurse():
    x = xgrad.tensor(1.0, requires_grad=True)
    holder = [chain(x)]
    middle = holder[0][1]

    def drop():
        holder.clear()  # the last reference to the output: the whole chain is freed here

    run_in_small_stack_thread(drop)
    assert middle() is None


@pytest.mark.slow
def test_collecting_a_deep_cyclic_chain_does_not_recurse():
    x = xgrad.tensor(1.0, requires_grad=True)
    holder = [chain(x)]
    y, middle = holder[0]
    y.grad_fn.metadata["output"] = y  # a cycle: only the garbage collector can free it
    del y

    def drop_and_collect():
        holder.clear()
        gc.collect()

    run_in_small_stack_thread(drop_and_collect)
    assert middle() is None


def test_saved_arrays_of_a_device_worker_are_freed():
    cpu1 = jax.devices("cpu")[1]
    w = xgrad.tensor(jnp.linspace(0.1, 0.9, 4), device=cpu1, requires_grad=True)
    model(w).backward()
    w.grad = None
    base = live_arrays()
    y = model(w)
    y.backward()
    assert w.grad.device == cpu1
    assert live_arrays() - base == 2

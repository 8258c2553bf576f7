"""Reentrant backward: a backward started inside a node, at any depth (NOTE [Reentrant backward]).

``Nested.apply(x, depth)`` is ``x`` in the forward; its backward multiplies the incoming
gradient by ``1 + d(inner)/dx`` where ``inner`` is ``Nested.apply(_, depth - 1)``
differentiated by a fresh ``grad`` call from inside the backward. So the gradient at
depth ``d`` is ``d + 1`` exactly, and every level records the thread it ran on.
"""

import threading

import jax
import numpy as np
import pytest

import xgrad
from xgrad.autograd import Function


class Nested(Function):
    ran_on: dict[int, str] = {}

    @staticmethod
    def forward(ctx, x, depth):
        ctx.depth = depth
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        Nested.ran_on[ctx.depth] = threading.current_thread().name
        if ctx.depth == 0:
            return g, None
        inner_x = xgrad.tensor(1.0, device=g.device, requires_grad=True)
        with xgrad.enable_grad():
            inner = Nested.apply(inner_x, ctx.depth - 1)
        (inner_grad,) = xgrad.autograd.grad(inner, inner_x)
        return g * (1.0 + inner_grad), None


def nested_grad(depth, device=None):
    Nested.ran_on = {}
    x = xgrad.tensor(1.0, device=device, requires_grad=True)
    (g,) = xgrad.autograd.grad(Nested.apply(x, depth) * 2.0, x)
    return g


@pytest.fixture
def max_depth():
    """Set ``MAX_REENTRANT_DEPTH`` for one test, restoring the default after it."""
    previous = xgrad.autograd.MAX_REENTRANT_DEPTH

    def set_depth(depth):
        xgrad.autograd.MAX_REENTRANT_DEPTH = depth

    yield set_depth
    xgrad.autograd.MAX_REENTRANT_DEPTH = previous


def test_default_max_depth_is_pytorchs():
    assert xgrad.autograd.MAX_REENTRANT_DEPTH == 60


def test_nesting_200_deep_gives_exact_grads_and_moves_to_pool_threads_past_the_limit():
    depth = 200
    g = nested_grad(depth)
    assert g.item() == 2.0 * (depth + 1)
    ran_on = Nested.ran_on
    assert len(ran_on) == depth + 1
    # Levels 200 .. 140 run on the caller (nesting 0 .. 60); deeper ones on pool threads,
    # each of which nests MAX_REENTRANT_DEPTH more before handing on.
    assert {ran_on[d] for d in range(depth, depth - 61, -1)} == {"MainThread"}
    pool_threads = {ran_on[d] for d in range(depth - 61, -1, -1)}
    assert all(name.startswith("xgrad-autograd-reentrant") for name in pool_threads)
    assert len(pool_threads) == 3  # 200 levels: the caller, then three pool threads
    assert ran_on[depth - 61] != ran_on[depth - 122]


def test_max_reentrant_depth_is_settable(max_depth):
    max_depth(3)
    g = nested_grad(10)
    assert g.item() == 22.0
    assert [Nested.ran_on[d] for d in (10, 7)] == ["MainThread", "MainThread"]
    assert Nested.ran_on[6].startswith("xgrad-autograd-reentrant")
    with pytest.raises(ValueError, match="MAX_REENTRANT_DEPTH must be at least 1, got 0"):
        xgrad.autograd.MAX_REENTRANT_DEPTH = 0
    assert xgrad.autograd.MAX_REENTRANT_DEPTH == 3


def pool_thread_names():
    return {t.name for t in threading.enumerate() if t.name.startswith("xgrad-autograd-reentrant")}


def test_pool_threads_are_reused(max_depth):
    max_depth(2)
    nested_grad(8)
    pool = pool_thread_names()
    assert pool
    for _ in range(3):
        nested_grad(8)
        assert set(Nested.ran_on.values()) - {"MainThread"} <= pool
    assert pool_thread_names() == pool  # idle pool threads took the work: none was added


def test_reentrant_backward_on_a_device_worker_reuses_its_queue(max_depth):
    # The nodes are on device 1: levels run on its worker, and past the limit a pool
    # thread drives the worker's queue while the worker waits.
    dev1 = jax.devices()[1]
    max_depth(2)
    g = nested_grad(6, device=dev1)
    assert g.item() == 14.0 and g.device == dev1
    worker = f"xgrad-autograd-cpu:{dev1.id}"
    assert [Nested.ran_on[d] for d in (6, 5, 4)] == [worker] * 3
    assert Nested.ran_on[3].startswith("xgrad-autograd-reentrant")


def test_reentrant_backward_from_a_tensor_hook():
    x = xgrad.tensor(np.array([1.0, 2.0]), requires_grad=True)
    inner_grads = []

    def hook(g):
        w = xgrad.tensor(3.0, requires_grad=True)
        with xgrad.enable_grad():  # hooks run with grad mode off, as in PyTorch
            w_squared = w * w
        (gw,) = xgrad.autograd.grad(w_squared, w)  # d(w^2)/dw = 6
        inner_grads.append(gw.item())
        return g * gw

    y = x * x
    y.register_hook(hook)
    y.sum().backward()
    assert inner_grads == [6.0]
    np.testing.assert_array_equal(x.grad.numpy(), 6.0 * 2.0 * np.array([1.0, 2.0]))


def test_inner_task_runs_before_the_outer_tasks_other_ready_nodes():
    # The inner graph is built first, so its nodes have lower sequence numbers than the
    # outer branch b that is ready in the same queue: only the inner task's greater
    # reentrant depth makes it run before b.
    events = []
    w = xgrad.tensor(1.0, requires_grad=True)
    v = w * 5.0
    inner_out = v * 4.0
    v.register_hook(lambda gv: events.append("inner"))
    a = xgrad.tensor(1.0, requires_grad=True)
    b = xgrad.tensor(1.0, requires_grad=True)
    yb = b * 3.0
    ya = a * 2.0  # created last: its node pops first

    def reentrant_hook(g):
        events.append("outer a")
        (gw,) = xgrad.autograd.grad(inner_out, w)
        events.append(("outer a done", gw.item()))

    ya.register_hook(reentrant_hook)
    yb.register_hook(lambda g: events.append("outer b"))
    (ya + yb).backward()
    assert events == ["outer a", "inner", ("outer a done", 20.0), "outer b"]
    assert (a.grad.item(), b.grad.item()) == (2.0, 3.0)


class FailingAtZero(Nested):
    @staticmethod
    def backward(ctx, g):
        if ctx.depth == 0:
            raise ArithmeticError("innermost level failed")
        inner_x = xgrad.tensor(1.0, requires_grad=True)
        with xgrad.enable_grad():
            inner = FailingAtZero.apply(inner_x, ctx.depth - 1)
        xgrad.autograd.grad(inner, inner_x)
        return g, None


def test_error_deep_inside_reaches_the_outer_caller(max_depth):
    max_depth(2)  # the error crosses pool threads too
    x = xgrad.tensor(1.0, requires_grad=True)
    with pytest.raises(ArithmeticError, match="innermost level failed"):
        FailingAtZero.apply(x, 5).backward()
    assert nested_grad(5).item() == 12.0  # the engine is healthy afterwards

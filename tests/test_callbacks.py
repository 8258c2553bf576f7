"""``queue_callback``: final callbacks run once per graph task, after its last node, before backward returns."""

import numpy as np
import pytest

import xgrad
from tests._backward_modes import every_backward_mode  # noqa: F401  (a fixture)
from tests._helpers import leaf
from xgrad.autograd import Function, queue_callback

pytestmark = pytest.mark.usefixtures("every_backward_mode")  # every test: eager, compiled, each backward a compiled step

X0 = (1.0, 2.0)


def test_callback_runs_once_after_every_node_before_backward_returns():
    x = leaf(X0)
    events = []
    y = x * 3.0

    def hook(g):
        events.append("y-hook")
        queue_callback(lambda: events.append(("callback", x.grad.tolist())))

    y.register_hook(hook)
    x.register_post_accumulate_grad_hook(lambda t: events.append("x-accumulated"))
    y.sum().backward()
    assert events == ["y-hook", "x-accumulated", ("callback", [3.0, 3.0])]


def test_callbacks_run_in_order_and_callbacks_queued_by_callbacks_run_too():
    x = leaf(X0)
    events = []

    def second():
        events.append("second")
        queue_callback(lambda: events.append("queued-by-second"))

    def hook(g):
        queue_callback(lambda: events.append("first"))
        queue_callback(second)

    x.register_hook(hook)
    x.sum().backward()
    assert events == ["first", "second", "queued-by-second"]


def test_callback_outside_backward_raises():
    with pytest.raises(RuntimeError, match=r"^Final callbacks can only be installed during backward pass\.$"):
        queue_callback(lambda: None)


def test_each_backward_runs_its_own_callbacks():
    x = leaf(X0)
    events = []
    x.register_hook(lambda g: queue_callback(lambda: events.append("done")))
    y = (x * x).sum()
    y.backward(retain_graph=True)
    assert events == ["done"]
    y.backward()
    assert events == ["done", "done"]


def test_callback_during_grad():
    x = leaf(X0)
    events = []
    x.register_hook(lambda g: queue_callback(lambda: events.append("done")))
    (g,) = xgrad.autograd.grad((x * x).sum(), x)
    assert events == ["done"]
    assert g.tolist() == [2.0, 4.0]


def test_callback_of_reentrant_backward_runs_when_the_inner_task_finishes():
    events = []

    class Reentrant(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            inner = xgrad.tensor(np.array([1.0]), requires_grad=True)
            inner.register_hook(lambda g: queue_callback(lambda: events.append("inner-callback")))
            with xgrad.enable_grad():
                (inner * 2.0).sum().backward()
            events.append("inner-backward-returned")
            queue_callback(lambda: events.append("outer-callback"))
            return g

    x = leaf(X0)
    Reentrant.apply(x).sum().backward()
    assert events == ["inner-callback", "inner-backward-returned", "outer-callback"]


def test_failing_callback_raises_from_backward_and_engine_recovers():
    x = leaf(X0)
    handle = x.register_hook(lambda g: queue_callback(lambda: 1 / 0))
    with pytest.raises(ZeroDivisionError):
        x.sum().backward()
    handle.remove()
    x.grad = None
    x.sum().backward()
    assert x.grad.tolist() == [1.0, 1.0]

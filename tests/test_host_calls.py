"""Hooks run on the host from a traced program (NOTE [Host calls] in ``xgrad/engine/host_call.py``).

Each test runs with the eager engine and with every backward compiled (``eager_and_compiled``),
and on each traced route: the engine inside a plain ``jax.jit`` (``loss.backward()`` in the jitted
function), ``jax.jit(jax.grad(...))`` where JAX's AD runs the hook, and an ``xgrad.compile`` step.
The reference is the same code run eagerly, whose meaning is PyTorch's.
"""

from __future__ import annotations

import functools
import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from tests._backward_modes import eager_and_compiled  # noqa: F401
from xgrad.autograd import compiled

pytestmark = pytest.mark.usefixtures("eager_and_compiled")

ROUTES = ["eager", "backward under jax.jit", "jax.jit(jax.grad)", "xgrad.compile"]
X = np.array([0.5, -1.5, 2.0])


class HookRefused(LookupError):
    """The user's own exception type, neither a RuntimeError nor anything JAX knows."""


@pytest.fixture(autouse=True)
def quiet_jax_callback_log():
    """JAX logs a callback's exception before reporting it; the tests check what reaches the caller."""
    logger = logging.getLogger("jax._src.callback")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def _gradient_through(route, hook):
    """A function of an array giving ``d sum(3 * x**2) / dx`` with ``hook`` on the gradient of ``x**2``, by ``route``."""
    def with_hook(x):
        y = x * x
        y.register_hook(hook)
        return (3.0 * y).sum()

    if route == "jax.jit(jax.grad)":
        return jax.jit(jax.grad(lambda a: with_hook(xgrad.Tensor(a)).array))

    def backward(a):
        x = xgrad.Tensor(a, requires_grad=True)
        with_hook(x).backward()
        return x.grad.array

    if route == "backward under jax.jit":
        return jax.jit(backward)
    if route == "xgrad.compile":
        step = xgrad.compile(lambda x: (with_hook(x).backward(), x.grad)[1])
        return lambda a: step(xgrad.tensor(np.asarray(a), requires_grad=True)).array
    return backward


@pytest.mark.parametrize("route", ROUTES)
def test_a_hook_raising_on_the_host_reaches_the_caller_with_its_own_type_and_message(route):
    refuse = [True]
    calls = []

    def hook(g):
        calls.append(1)  # an effect: the hook runs on the host, at every call
        if refuse[0]:
            raise HookRefused("the hook refused a gradient")
        return g * 2.0

    run = _gradient_through(route, hook)
    # Its own message (JAX adds a line on the frames it filters out of a traceback passing through it).
    with pytest.raises(HookRefused, match=f"^{re.escape('the hook refused a gradient')}"):
        run(jnp.asarray(X))
    # Nothing of the failed call is left behind: the next call runs, with eager's gradient.
    refuse[0] = False
    np.testing.assert_allclose(np.asarray(run(jnp.asarray(X))), 12.0 * X)
    assert len(calls) == 2


def test_a_hook_raising_under_a_plain_jit_stops_the_program_there():
    """As eagerly: the hooks after a raising one are not called."""
    log = []

    def raising(g):
        log.append("z")
        raise HookRefused("z")

    def backward(a):
        x = xgrad.Tensor(a, requires_grad=True)
        y = x * x
        y.register_hook(lambda g: log.append("y"))
        z = y * 3.0
        z.register_hook(raising)
        z.sum().backward()
        return x.grad.array

    for run in (backward, jax.jit(backward)):
        log.clear()
        with pytest.raises(HookRefused):
            run(jnp.asarray(X))
        assert log == ["z"]  # the backward reaches z's hook first, and y's never


class Product(xgrad.nn.Module):
    def forward(self, a, b):
        return a * b


@pytest.mark.parametrize("route", ["eager", "backward under jax.jit", "xgrad.compile"])
def test_a_module_backward_hook_returning_none_for_one_input_gives_that_input_no_gradient(route):
    # PyTorch: an entry of a full backward hook's result that is None is no gradient for that input (torch 2.x leaves
    # a.grad None when that was its only path). Here ``a`` has a second path, so its gradient is that path's alone.
    seen = []

    def hook(module, grad_input, grad_output):
        seen.append(len(grad_input))  # an effect: on the host under a trace
        return (None, grad_input[1] * 10.0)

    model = Product()
    model.register_full_backward_hook(hook)
    a0, b0 = np.array([1.0, 2.0]), np.array([3.0, -4.0])

    def step(a, b):
        (model(a, b).sum() + (a * 3.0).sum()).backward()
        return a.grad, b.grad

    if route == "eager":
        a, b = xgrad.tensor(a0, requires_grad=True), xgrad.tensor(b0, requires_grad=True)
        grads = [g.numpy() for g in step(a, b)]
    elif route == "xgrad.compile":
        compiled_step = xgrad.compile(step)
        for _ in range(2):  # the first call traces, the second runs the cached program
            a, b = xgrad.tensor(a0, requires_grad=True), xgrad.tensor(b0, requires_grad=True)
            grads = [g.numpy() for g in compiled_step(a, b)]
    else:
        def jitted(a, b):
            ga, gb = step(xgrad.Tensor(a, requires_grad=True), xgrad.Tensor(b, requires_grad=True))
            return ga.array, gb.array

        grads = [np.asarray(g) for g in jax.jit(jitted)(jnp.asarray(a0), jnp.asarray(b0))]
    np.testing.assert_allclose(grads[0], np.full(2, 3.0))  # d(sum(3a))/da only
    np.testing.assert_allclose(grads[1], a0 * 10.0)
    assert seen and set(seen) == {2}


def test_a_host_hook_result_of_the_wrong_shape_raises_naming_the_hook():
    def hook(g):
        return xgrad.ones(5)

    run = _gradient_through("backward under jax.jit", compiled.host_hook(hook))
    with pytest.raises(RuntimeError, match=r"a Tensor of shape \[3\]"):
        run(jnp.asarray(X))


@pytest.mark.parametrize("route", ["eager", "xgrad.compile"])
def test_a_host_hook_sees_the_grads_eager_would_have_set_by_then_and_what_it_sets_flows_on(route):
    """A host hook reads a retained grad of a tensor made in the step and a leaf's accumulated ``.grad``, and
    rebinds that ``.grad``, as it would eagerly: the values it saw and the step's result are eager's."""
    from xgrad.autograd.compiled import host_hook

    w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    v = xgrad.tensor([0.5, -1.0], requires_grad=True)
    seen = []

    def step(x):
        h = w * x
        h.retain_grad()
        y = h.sin()

        def before(grad_outputs):  # y's node runs before h's: h has no grad yet
            seen.append(("before", None if h.grad is None else h.grad.tolist()))

        def after(grad_inputs, grad_outputs):  # h's node ran: its retained grad and v's .grad are set
            seen.append(("after", h.grad.tolist(), v.grad.tolist()))
            v.grad = v.grad * 10.0

        y.grad_fn.register_prehook(host_hook(before))
        h.grad_fn.register_hook(host_hook(after))
        loss = (y * 2.0).sum() + (v * v * x).sum() * 0.0 + (v * 3.0).sum()
        loss.backward()
        return loss

    fn = xgrad.compile(step, fallback="error") if route == "xgrad.compile" else step
    fn(xgrad.tensor([0.5, 0.25]))
    x = np.array([0.5, 0.25])
    h_grad = 2.0 * np.cos(np.array([1.0, 2.0]) * x)
    assert seen[0] == ("before", None)
    assert seen[1][0] == "after"
    np.testing.assert_allclose(seen[1][1], h_grad, rtol=1e-6)
    np.testing.assert_allclose(seen[1][2], [3.0, 3.0], rtol=1e-6)
    np.testing.assert_allclose(v.grad.numpy(), [30.0, 30.0], rtol=1e-6)
    np.testing.assert_allclose(w.grad.numpy(), h_grad * x, rtol=1e-6)


class _Scaler:
    """Holds a tensor the step makes; its bound ``scale`` is a host hook that reads it through ``self``."""

    def __init__(self):
        self.factor = None

    def scale(self, grad):
        return grad * self.factor


def _scale_by_first(factors, grad):
    return grad * factors[0].factor


@pytest.mark.parametrize("holder", ["bound self", "object in closure", "partial argument", "list in closure"])
@pytest.mark.parametrize("route", ["eager", "xgrad.compile"])
def test_a_host_hook_reads_a_tensor_of_the_step_through_what_it_holds(route, holder):
    """A host hook that reads a tensor made in the step not from a closure cell but through what it holds (a bound
    method's ``self``, an object in its closure, a ``partial``'s argument, a list in its closure) sees that tensor's
    value at every call, as eagerly."""
    scaler = _Scaler()
    scalers = [scaler]

    def in_closure(grad):
        return grad * scaler.factor

    def in_list(grad):
        return grad * scalers[0].factor

    hooks = {"bound self": scaler.scale, "object in closure": in_closure,
             "partial argument": functools.partial(_scale_by_first, scalers), "list in closure": in_list}
    w = xgrad.tensor([1.0, 2.0], requires_grad=True)

    def step(x):
        h = w * x
        scaler.factor = h.detach() + 1.0
        h.register_hook(compiled.host_hook(hooks[holder]))
        (h * 2.0).sum().backward()
        return h

    fn = xgrad.compile(step, fallback="error") if route == "xgrad.compile" else step
    for x in ([0.5, 0.25], [3.0, -1.0]):
        w.grad = None
        fn(xgrad.tensor(x))
        x = np.array(x)
        np.testing.assert_allclose(w.grad.numpy(), 2.0 * (np.array([1.0, 2.0]) * x + 1.0) * x, rtol=1e-6)

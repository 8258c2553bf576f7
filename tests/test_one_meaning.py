"""One meaning for gradients: what changes a gradient in eager xgrad changes it on every route.

Each case is a function of one Tensor written once; each route computes its gradient
(eager ``backward()``, the compiled backward, ``xgrad.compile``, ``jax.grad``/``jax.vjp``
and ``jax.jit(jax.grad)`` over the same code, ``xgrad.func``'s transforms and
``eqx.filter_grad``), and every route must give the reference: the same math written
on ``jax.numpy`` with ``lax.stop_gradient``/``jax.custom_vjp``, as torch.func computes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad import func, nn

X = np.array([0.7, -1.3, 2.1], dtype=np.float32)


def _np(t: Any) -> np.ndarray:
    """A gradient as NumPy (a grad tree from ``jax.grad`` keeps its parameter's flags)."""
    return np.asarray(t.detach().numpy() if isinstance(t, xgrad.Tensor) else t)


def _tensor(x: np.ndarray) -> xgrad.Tensor:
    return xgrad.tensor(x, requires_grad=True)


def _batched(f: Callable[[xgrad.Tensor], xgrad.Tensor], x: np.ndarray) -> np.ndarray:
    rows = func.vmap(func.grad(f))(xgrad.tensor(np.stack([x, 2 * x])))
    return _np(rows)[0]


def _compiled_step(f: Callable[[xgrad.Tensor], xgrad.Tensor], x: np.ndarray) -> np.ndarray:
    t = _tensor(x)

    @xgrad.compile
    def step(t: xgrad.Tensor) -> None:
        f(t).backward()

    step(t)
    return _np(t.grad)


def _eager(f: Callable[[xgrad.Tensor], xgrad.Tensor], x: np.ndarray, compiled: bool) -> np.ndarray:
    t = _tensor(x)
    f(t).backward(compiled=compiled)
    return t.grad.numpy()


ROUTES: dict[str, Callable[[Callable[[xgrad.Tensor], xgrad.Tensor], np.ndarray], Any]] = {
    "backward": lambda f, x: _eager(f, x, compiled=False),
    "compiled backward": lambda f, x: _eager(f, x, compiled=True),
    "xgrad.compile": _compiled_step,
    "jax.grad": lambda f, x: _np(jax.grad(lambda t: f(t).array)(_tensor(x))),
    "jax.jit(jax.grad)": lambda f, x: _np(jax.jit(jax.grad(lambda t: f(t).array))(_tensor(x))),
    "jax.vjp": lambda f, x: _np(jax.vjp(lambda t: f(t).array, _tensor(x))[1](jnp.float32(1.0))[0]),
    "func.grad": lambda f, x: _np(func.grad(f)(xgrad.tensor(x))),
    "func.vjp": lambda f, x: _np(func.vjp(f, xgrad.tensor(x))[1](xgrad.tensor(1.0))[0]),
    "func.jacrev": lambda f, x: _np(func.jacrev(f)(xgrad.tensor(x))),
    "func.vmap(func.grad)": _batched,
    "eqx.filter_grad": lambda f, x: _np(eqx.filter_grad(lambda t: f(t).array)(_tensor(x))),
}


# -- the cases: xgrad code, and the same math on jax.numpy --------------------------------------------


def detach_case(x: xgrad.Tensor) -> xgrad.Tensor:
    return (x * x.detach()).sum()


def detach_ref(x: jax.Array) -> jax.Array:
    return (x * jax.lax.stop_gradient(x)).sum()


def data_case(x: xgrad.Tensor) -> xgrad.Tensor:
    return (x.sin() * x.data).sum()


def data_ref(x: jax.Array) -> jax.Array:
    return (jnp.sin(x) * jax.lax.stop_gradient(x)).sum()


def _switched_off(switch: Callable[[], Any]) -> Callable[[xgrad.Tensor], xgrad.Tensor]:
    def case(x: xgrad.Tensor) -> xgrad.Tensor:
        with switch():
            baseline = (x * 2).exp()  # a target network, a baseline: a constant of the loss
        # Added, not multiplied: an inference tensor cannot be saved for backward (PyTorch's rule).
        return (x.sin() + baseline * baseline).sum()

    return case


def switched_off_ref(x: jax.Array) -> jax.Array:
    baseline = jax.lax.stop_gradient(jnp.exp(x * 2))
    return (jnp.sin(x) + baseline * baseline).sum()


class StraightThrough(xgrad.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: xgrad.Tensor) -> xgrad.Tensor:
        return x.round()

    @staticmethod
    def backward(ctx: Any, g: xgrad.Tensor) -> xgrad.Tensor:
        return g


def function_case(x: xgrad.Tensor) -> xgrad.Tensor:
    return (StraightThrough.apply(x * 1.5) * x).sum()


def function_ref(x: jax.Array) -> jax.Array:
    y = x * 1.5
    return ((y + jax.lax.stop_gradient(jnp.round(y) - y)) * x).sum()


class ScaledSquare(xgrad.autograd.Function):
    """``setup_context``, a saved tensor, a non-tensor input and ``needs_input_grad``."""

    @staticmethod
    def forward(x: xgrad.Tensor, scale: float) -> xgrad.Tensor:
        return x * x * scale

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        x, scale = inputs
        ctx.save_for_backward(x)
        ctx.scale = scale

    @staticmethod
    def backward(ctx: Any, g: xgrad.Tensor) -> tuple[Any, None]:
        (x,) = ctx.saved_tensors
        assert ctx.needs_input_grad == (True, False)
        return 3 * ctx.scale * x * g, None  # deliberately not the derivative: the user's rule wins


def setup_context_case(x: xgrad.Tensor) -> xgrad.Tensor:
    return ScaledSquare.apply(x, 0.5).sum()


def setup_context_ref(x: jax.Array) -> jax.Array:
    @jax.custom_vjp
    def scaled_square(x: jax.Array) -> jax.Array:
        return x * x * 0.5

    scaled_square.defvjp(lambda x: (scaled_square(x), x), lambda x, g: (3 * 0.5 * x * g,))
    return scaled_square(x).sum()


def hook_case(x: xgrad.Tensor) -> xgrad.Tensor:
    y = x * 2
    y.register_hook(lambda g: g * 10)
    y.register_hook(lambda g: g + 1)  # after the first: (g * 10) + 1
    return (y * y).sum()


def hook_ref(x: jax.Array) -> jax.Array:
    @jax.custom_vjp
    def hooked(y: jax.Array) -> jax.Array:
        return y

    hooked.defvjp(lambda y: (y, None), lambda _, g: (g * 10 + 1,))
    y = hooked(x * 2)
    return (y * y).sum()


CASES = {
    "detach": (detach_case, detach_ref),
    ".data": (data_case, data_ref),
    "no_grad": (_switched_off(xgrad.no_grad), switched_off_ref),
    "inference_mode": (_switched_off(xgrad.inference_mode), switched_off_ref),
    "set_grad_enabled(False)": (_switched_off(lambda: xgrad.set_grad_enabled(False)), switched_off_ref),
    "Function (straight-through)": (function_case, function_ref),
    "Function (setup_context)": (setup_context_case, setup_context_ref),
    "tensor hooks": (hook_case, hook_ref),
}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("case", CASES)
def test_every_route_gives_the_reference(case: str, route: str) -> None:
    f, ref = CASES[case]
    expected = np.asarray(jax.grad(ref)(jnp.asarray(X)))
    got = ROUTES[route](f, X)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6, err_msg=f"{case} on {route}")


def test_no_grad_around_a_transformation_does_not_reach_into_it() -> None:
    """As ``torch.func.grad`` ignores a ``no_grad`` around it, so do ``jax.grad`` and ``xgrad.func.grad``."""
    x = xgrad.tensor(X)
    with xgrad.no_grad():
        by_func = func.grad(lambda t: (t * t).sum())(x)
        by_jax = jax.grad(lambda t: (t * t).sum().array)(x)
    np.testing.assert_allclose(_np(by_func), 2 * X)
    np.testing.assert_allclose(_np(by_jax), 2 * X)


# -- models: parameter hooks, frozen parameters and buffers on jax.grad(loss)(model) ---------------------


def _model() -> nn.Module:
    model = nn.Sequential(nn.Linear(3, 4, key=0), nn.Tanh(), nn.Linear(4, 2, key=1))
    model[0].weight.register_hook(lambda g: g.clamp(-0.05, 0.05))
    model[2].bias.requires_grad_(False)
    return model


def _loss(model: nn.Module, x: xgrad.Tensor) -> xgrad.Tensor:
    return (model(x) ** 2).sum()


MODEL_ROUTES = {
    "jax.grad": lambda m, x: jax.grad(lambda m: _loss(m, x).array)(m),
    "jax.jit(jax.grad)": lambda m, x: jax.jit(jax.grad(lambda m, x: _loss(m, x).array))(m, x),
    "eqx.filter_grad": lambda m, x: eqx.filter_grad(lambda m: _loss(m, x).array)(m),
}


@pytest.mark.parametrize("route", MODEL_ROUTES)
def test_parameter_hooks_and_frozen_parameters_hold_for_a_model(route: str) -> None:
    x = xgrad.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
    eager = _model()
    _loss(eager, x).backward()
    grads = MODEL_ROUTES[route](_model(), x)
    for (name, p), (_, g) in zip(eager.named_parameters(), grads.named_parameters(), strict=True):
        if p.grad is None:  # frozen: eager gives none, JAX's routes zeros (an optimizer leaves it as it is)
            np.testing.assert_array_equal(_np(g), 0.0, err_msg=name)
        else:
            np.testing.assert_allclose(_np(g), p.grad.numpy(), rtol=1e-5, atol=1e-7, err_msg=name)
    assert np.abs(_np(grads[0].weight)).max() <= 0.05 + 1e-7  # the clamp ran


def test_a_buffer_gets_no_gradient_on_jax_routes() -> None:
    """An eval-mode BatchNorm reads its running statistics: eager gives them no grad, nor may jax.grad."""
    model = nn.Sequential(nn.Linear(3, 3, key=0), nn.BatchNorm1d(3)).eval()
    x = xgrad.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
    grads = eqx.filter_grad(lambda m: _loss(m, x).array)(model)
    np.testing.assert_array_equal(_np(grads[1].running_mean), 0.0)
    np.testing.assert_array_equal(_np(grads[1].running_var), 0.0)


# -- results of transformations used in an eager loss ----------------------------------------------------


def test_a_plain_jit_result_in_a_loss_that_requires_grad_raises_with_the_fix() -> None:
    t = xgrad.tensor([1.0, 2.0], requires_grad=True)
    piece = jax.jit(lambda a: (a * a).sum())(t)
    with pytest.raises(RuntimeError, match=r"plain JAX transformation .* xgrad\.compile\(fn\)"):
        piece + (t * 3).sum()
    # As a value it is fine, and so is the same call under no_grad
    assert piece.item() == 5.0
    with xgrad.no_grad():
        piece = jax.jit(lambda a: (a * a).sum())(t)
    loss = piece + (t * 3).sum()
    loss.backward()
    np.testing.assert_allclose(t.grad.numpy(), [3.0, 3.0])  # the jitted piece is a constant, as asked


def test_func_transform_results_keep_their_history() -> None:
    """torch.func's force-matching example: the force term's gradient reaches the positions."""
    r_np = np.array([[0.5, 1.0, 1.5], [1.0, 2.0, 0.3]], dtype=np.float32)

    def energy(x: Any) -> Any:
        return (x**3).sum() + (x[..., 0] * x[..., 1]).sum()

    r = xgrad.tensor(r_np, requires_grad=True)
    force = -func.vmap(func.jacrev(energy))(r)
    (energy(r) + (force**2).sum()).backward()

    def loss_ref(x: jax.Array) -> jax.Array:
        return energy(x) + ((-jax.vmap(jax.jacrev(energy))(x)) ** 2).sum()

    np.testing.assert_allclose(r.grad.numpy(), jax.grad(loss_ref)(jnp.asarray(r_np)), rtol=1e-5)


def test_maml_inner_step_differentiates_through_the_inner_gradient() -> None:
    w = xgrad.tensor([1.0, -2.0], requires_grad=True)

    def inner(v: Any) -> Any:
        return ((v * 3.0 - 1.0) ** 2).sum()

    adapted = w - 0.1 * func.grad(inner)(w)
    (adapted**2).sum().backward()
    expected = jax.grad(lambda v: ((v - 0.1 * jax.grad(inner)(v)) ** 2).sum())(jnp.array([1.0, -2.0]))
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-6)

"""What the checks of ``xgrad.testing`` accept as the function and the inputs to check.

A function of xgrad Tensors is checked as it is. A function of ``jax.Array``s (a
``jax.custom_vjp`` or ``custom_jvp``, a jitted function, any ``jnp`` code) is checked
through ``xgrad.from_jax``, whose backward is the function's own ``jax.vjp`` (custom
rules included): the checks then test the function's JAX derivative.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import jax
import numpy as np

from xgrad.bounded_cache import BoundedCache
from xgrad.ops.jaxop import from_jax
from xgrad.tensor import Tensor

__all__ = ["ACCEPTED_FUNCTIONS", "ACCEPTED_INPUTS", "check_inputs", "is_jax_function", "jax_op", "memoized", "tensor_function"]

ACCEPTED_FUNCTIONS = (
    "{who}: fn must be a function of xgrad Tensors returning a Tensor (or a tuple or pytree of them), or a function "
    "of jax.Arrays returning jax.Arrays, such as a jax.custom_vjp (checked through xgrad.from_jax); got {what}"
)
ACCEPTED_INPUTS = (
    "{who}: inputs must be a Tensor, an array (jax.Array or NumPy), or a tuple or list of them (other items, "
    "such as Python numbers, are passed to fn unchanged); got {what}"
)
_ARRAYS = (Tensor, jax.Array, np.ndarray)


def is_jax_function(fn: Any) -> bool:
    """Whether ``fn`` is a JAX function by its type: ``jax.custom_vjp``, ``jax.custom_jvp`` or jitted.

    >>> import jax
    >>> from xgrad.testing.functions import is_jax_function
    >>> is_jax_function(jax.custom_vjp(lambda x: x)), is_jax_function(lambda x: x)
    (True, False)
    """
    return isinstance(fn, (jax.custom_vjp, jax.custom_jvp, jax.stages.Wrapped))


V = TypeVar("V")


def memoized(cache: BoundedCache[Any, V], key: Any, make: Callable[[], V]) -> V:
    """``cache[key]``, made by ``make()`` the first time; under an unhashable key, made afresh.

    >>> from xgrad.bounded_cache import BoundedCache
    >>> from xgrad.testing.functions import memoized
    >>> cache = BoundedCache(4)
    >>> memoized(cache, "k", list) is memoized(cache, "k", list), memoized(cache, ["k"], list) is memoized(cache, ["k"], list)
    (True, False)
    """
    try:
        value = cache.get(key)
    except TypeError:
        return make()
    if value is None:
        value = cache[key] = make()
    return value


# NOTE [One op per checked function]
# A property test calls a check with the same function hundreds of times (every example,
# and every step of shrinking a failure). A fresh ``from_jax`` op per call is a fresh
# primitive, whose forward and vjp programs XLA compiles again (about 0.3 s a call, so
# minutes of shrinking); one op per function compiles once per input shape.
_JAX_OPS: BoundedCache[Any, Callable[..., Any]] = BoundedCache(256)


def jax_op(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``xgrad.from_jax(fn)``, the same op for the same function (NOTE [One op per checked function]).

    >>> import jax.numpy as jnp
    >>> from xgrad.testing.functions import jax_op
    >>> jax_op(jnp.sin) is jax_op(jnp.sin)
    True
    """
    return memoized(_JAX_OPS, fn, lambda: from_jax(fn, name=getattr(fn, "__name__", type(fn).__name__)))


def check_inputs(inputs: Any, who: str) -> None:
    """Raise ``TypeError`` naming what is accepted when ``inputs`` holds nothing a check can differentiate.

    >>> from xgrad.testing.functions import check_inputs
    >>> check_inputs({"x": 1.0}, "gradcheck")
    Traceback (most recent call last):
    ...
    TypeError: gradcheck: inputs must be a Tensor, an array (jax.Array or NumPy), or a tuple or list of them (other items, such as Python numbers, are passed to fn unchanged); got dict
    """
    items = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
    if isinstance(inputs, _ARRAYS) or any(isinstance(x, (*_ARRAYS, list)) for x in items):
        return
    raise TypeError(ACCEPTED_INPUTS.format(who=who, what=_describe(inputs)))


def _describe(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {', '.join(sorted({type(x).__name__ for x in value})) or 'nothing'}"
    return type(value).__name__


class _TensorFunction:
    """``fn`` as a function of Tensors: itself, or ``from_jax(fn)`` once its first call shows it takes arrays."""

    def __init__(self, fn: Callable[..., Any], who: str) -> None:
        self.fn = fn
        self.who = who
        self.jax_op: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> Any:
        if self.jax_op is not None:
            return self.jax_op(*args)
        try:
            result = self.fn(*args)
        except Exception as exc:
            if not self._runs_on_arrays(args):
                raise
            self.jax_op = jax_op(self.fn)
            try:
                return self.jax_op(*args)
            except Exception:
                raise exc from None
        leaves = jax.tree_util.tree_leaves(result, is_leaf=lambda x: isinstance(x, Tensor))
        if any(isinstance(x, Tensor) for x in leaves):
            return result
        if leaves and all(isinstance(x, jax.Array) for x in leaves) and self._runs_on_arrays(args):
            # Arrays out of Tensors in: a JAX function, which read the Tensors as plain arrays.
            self.jax_op = jax_op(self.fn)
            return self.jax_op(*args)
        raise TypeError(ACCEPTED_FUNCTIONS.format(who=self.who, what=f"a function that returned {_describe(result)}"))

    def _runs_on_arrays(self, args: tuple[Any, ...]) -> bool:
        arrays = jax.tree_util.tree_map(lambda x: x.array if isinstance(x, Tensor) else x, args,
                                        is_leaf=lambda x: isinstance(x, Tensor))
        try:
            jax.eval_shape(self.fn, *arrays)
        except Exception:
            return False
        return True


def tensor_function(fn: Any, who: str) -> Callable[..., Any]:
    """``fn`` as a function of Tensors (see the module docstring), or ``TypeError`` saying what is accepted.

    >>> import jax, jax.numpy as jnp, xgrad
    >>> from xgrad.testing.functions import tensor_function
    >>> f = tensor_function(lambda x: jnp.sin(x) * 2, "gradcheck")
    >>> x = xgrad.tensor([0.0, 1.0], requires_grad=True)
    >>> f(x).sum().backward()
    >>> x.grad.tolist()
    [2.0, 1.0806045532226562]
    """
    if not callable(fn):
        raise TypeError(ACCEPTED_FUNCTIONS.format(who=who, what=type(fn).__name__))
    if is_jax_function(fn):
        return jax_op(fn)
    return _TensorFunction(fn, who)

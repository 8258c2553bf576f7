"""Random keys that are state: the default generator and a module's own key.

# NOTE [Random state]
# A random op without ``key=`` draws from a ``KeyState``: the default one
# (``manual_seed`` reseeds it) or a module's own (``nn.Dropout(key=...)``). A draw
# splits the key, keeps one half and returns the other. The key lives in a Tensor
# (its raw data), so inside ``xgrad.compile`` it is state of the step like a
# parameter: the program reads it at every call and writes the split key back, and
# each call draws fresh numbers, the same ones eager draws after the same
# ``manual_seed``. Tracing leaves the key as it was (the step's snapshot), so no tracer
# is ever left in a generator. Under a plain ``jax.jit``/``vmap``/``grad`` nothing can
# write the key back: a draw there raises ``ERR_DRAW_UNDER_JAX`` instead of baking one
# draw into the program.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import jax
from jax.extend.core import get_opaque_trace_state

from xgrad import step_trace
from xgrad.tensor import Tensor

__all__ = [
    "ERR_DRAW_UNDER_JAX", "ERR_GENERATOR_TYPE", "KeyState", "default_generator", "default_key_data", "default_key_threaded",
    "generator_key", "manual_seed", "next_key", "set_default_key_data",
]

ERR_GENERATOR_TYPE = (
    "generator must be None (the default generator), a jax.random key, an int seed or an xgrad KeyState, got {name}"
)

ERR_DRAW_UNDER_JAX = (
    "a random op without key= ran under a JAX transformation (jax.jit, jax.vmap, jax.grad): it would draw from "
    "xgrad's default generator, or a module's own key, once at trace time and reuse that draw on every call. Pass "
    "key= (a jax.random key given to the transformed function), or compile the step with xgrad.compile, which "
    "threads the generators through the program."
)

_NOT_TRACING = get_opaque_trace_state(convention="xgrad")  # the same in every thread outside any JAX trace


class KeyState:
    """A ``jax.random`` key that random ops split on every draw (NOTE [Random state]).

    Args:
        key: a typed ``jax.random`` key (``jax.random.key(seed)``), or an int seed,
            made into a key at the first draw (no JAX work at import).

    >>> import jax
    >>> state = KeyState(jax.random.key(0))
    >>> a, b = state.draw(), state.draw()
    >>> bool((jax.random.key_data(a) != jax.random.key_data(b)).any())
    True
    """

    def __init__(self, key: Any) -> None:
        self.lock = threading.Lock()
        self.data: Tensor | None = None  # the key's raw data
        self.impl: Any = None
        self.seed = 0
        if isinstance(key, int):
            self.seed = key
        else:
            self.set(key)

    def __deepcopy__(self, memo: dict[int, Any]) -> KeyState:
        return KeyState(self.get())  # a copied module draws what the original would, from its own state

    def _tensor(self) -> Tensor:
        if self.data is None:
            # Made outside any step being traced, from concrete values: a Tensor that outlives the step is its state.
            with step_trace.outside(), jax.ensure_compile_time_eval():
                key = jax.random.key(self.seed)
                self.impl = jax.random.key_impl(key)
                self.data = Tensor(_committed(jax.random.key_data(key)))
        return self.data

    def set(self, key: Any) -> None:
        """Make ``key`` (a typed key) the state; the same Tensor keeps it (a compiled step reads that one)."""
        data = self._tensor()
        self.impl = jax.random.key_impl(key)
        trace = step_trace.current()
        if trace is not None:  # NOTE [The step-trace seam]
            trace.write(data)
        data._array = _committed(jax.random.key_data(key))

    def get(self) -> Any:
        """The key now (a typed key)."""
        data = self._tensor()
        trace = step_trace.current()
        if trace is not None:
            trace.read(data)
        return jax.random.wrap_key_data(data._array, impl=self.impl)

    def draw(self) -> Any:
        """Split the key: keep one half, return the other."""
        with self.lock:
            data = self._tensor()
            if get_opaque_trace_state(convention="xgrad") != _NOT_TRACING:  # under jit, vmap, grad or a step
                trace = step_trace.current()
                if trace is None:
                    if not (self is default_generator and _DEFAULT_KEY_THREADED.get()):
                        raise RuntimeError(ERR_DRAW_UNDER_JAX)
                elif not trace.at_step_level():
                    raise RuntimeError(ERR_DRAW_UNDER_JAX)
                else:
                    trace.read(data)  # the key is state of the step, threaded through it
                    trace.write(data)
            new, sub = jax.random.split(jax.random.wrap_key_data(data._array, impl=self.impl))
            data._array = jax.random.key_data(new)
            return sub


_DEFAULT_KEY_THREADED: ContextVar[bool] = ContextVar("xgrad_default_key_threaded", default=False)


@contextlib.contextmanager
def default_key_threaded(data: Any) -> Iterator[list[Any]]:
    """For the body, the default generator's key data is ``data`` (an input of a program being traced:
    ``xgrad.func``'s cached transforms), and random ops without ``key=`` split it there. Yields a list
    whose one item is the key data after the body (an output of that program); the key is restored after."""
    state = default_generator._tensor()
    saved = state._array
    state._array = data
    token = _DEFAULT_KEY_THREADED.set(True)
    after = [data]
    try:
        yield after
        after[0] = state._array
    finally:
        _DEFAULT_KEY_THREADED.reset(token)
        state._array = saved


def default_key_data() -> Any:
    """The default generator's key data now (the input ``default_key_threaded`` stands for)."""
    return default_generator._tensor()._array


def set_default_key_data(data: Any) -> None:
    """Make ``data`` (what a program threading the key returned) the default generator's key data."""
    default_generator._tensor()._array = data


def _committed(data: Any) -> Any:
    """``data`` committed to a device, as a compiled step's outputs are: else the step's first hit compiles again."""
    if isinstance(data, jax.core.Tracer) or getattr(data, "committed", True):
        return data
    device = getattr(jax.config, "jax_default_device", None) or jax.devices()[0]
    return jax.device_put(data, device)


#: The generator random ops draw from when given no ``key=``.
default_generator = KeyState(0)


def manual_seed(seed: int) -> None:
    """Reseed the default key used by ``rand``/``randn``/``dropout`` when no key is given.

    >>> import xgrad
    >>> xgrad.manual_seed(0); a = xgrad.randn(3)
    >>> xgrad.manual_seed(0); b = xgrad.randn(3)
    >>> a.tolist() == b.tolist()
    True
    """
    generator = default_generator
    with generator.lock:
        generator.set(jax.random.key(int(seed)))


def next_key() -> Any:
    """A fresh key from the default generator."""
    return default_generator.draw()


def generator_key(generator: Any) -> Any:
    """The key a random fill draws from: the default generator's next, a ``KeyState``'s next
    (it advances as a ``torch.Generator`` does), a key as given, or an int seed's key."""
    if generator is None:
        return next_key()
    if isinstance(generator, KeyState):
        return generator.draw()
    if isinstance(generator, int):
        return jax.random.key(generator)
    if isinstance(generator, jax.Array):
        return generator
    raise TypeError(ERR_GENERATOR_TYPE.format(name=type(generator).__name__))

"""Tensor factories, devices and the default random key.

Default dtypes (the rule, as PyTorch's where JAX's ``jax_enable_x64`` switch allows):

* Python floats, and lists/tuples of them, become the default dtype (``float32`` unless
  ``set_default_dtype`` chose another; NOTE [Default dtype] in ``xgrad/tensor/dtypes.py``),
  with x64 on or off: ``tensor(1.0)``, ``full((2,), 1.5)``, ``arange(0.0, 1.0, 0.5)``,
  ``zeros``, ``ones``, ``eye``, ``rand``, ``randn``, ``empty`` and ``linspace`` all agree.
  Python complex numbers become the matching complex dtype (``complex64``).
* Python ints become JAX's default integer: ``int64`` with x64 on (PyTorch's), ``int32``
  with it off. Python bools become ``bool``.
* NumPy and JAX arrays (and NumPy scalars) keep their dtype: ``tensor(np.float64 array)``
  is ``float64`` with x64 on. With x64 off JAX has no 64-bit types: a ``float64`` or
  ``complex128`` array becomes ``float32``/``complex64`` with a ``UserWarning`` naming
  ``jax_enable_x64`` (integers narrow silently, as in JAX: index arrays are routinely
  ``int64``). Asking for ``dtype=xgrad.float64`` with x64 off raises instead.
* ``dtype=`` always wins; ``*_like`` factories keep the source's dtype.

Random factories draw from ``generator=`` (see ``xgrad.generator.generator_key``:
an ``xgrad.Generator``, a key or an int seed) or ``key=``, else from the default generator.

>>> import xgrad
>>> xgrad.tensor(1.0).dtype, xgrad.full((2,), 1.5).dtype, xgrad.zeros(2).dtype
(dtype('float32'), dtype('float32'), dtype('float32'))
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.generator import KeyState, generator_key, manual_seed
from xgrad.generator import next_key as next_key  # users draw keys as xgrad.creation.next_key()
from xgrad.ops._util import check_int, check_nonnegative_shape
from xgrad.tensor import Tensor
from xgrad.tensor.devices import resolve_device
from xgrad.tensor.dtypes import default_complex, default_float, resolve_dtype, x64_enabled
from xgrad.tensor.pytorch_methods import placement_of

__all__ = [
    "Generator", "arange", "bernoulli", "device", "empty", "empty_like", "eye", "from_numpy", "full", "full_like",
    "linspace", "manual_seed", "multinomial", "ones", "ones_like", "rand", "rand_like", "randint", "randint_like",
    "randn", "randn_like", "randperm", "tensor", "zeros", "zeros_like",
]


_builtin_type = type  # ``device.__new__`` takes an argument named ``type``, as PyTorch's


class device(str):  # noqa: N801  (PyTorch's name)
    """PyTorch's device handle: ``device("cuda:0")``, ``device("cuda", 0)``, ``device("cpu")``.

    A string (``"cuda:0"``), so it goes wherever a device name does (``.to``, ``device=``,
    ``Module.to``); ``type`` and ``index`` as PyTorch's. It names a JAX device: ``"cuda"``
    is JAX's ``gpu`` platform. It compares equal to the ``jax.Device`` it names
    (``t.device == xgrad.device("cpu")``).

    >>> import xgrad
    >>> d = xgrad.device("cuda", 1)
    >>> d, d.type, d.index, str(xgrad.device("cpu"))
    (device(type='cuda', index=1), 'cuda', 1, 'cpu')
    """

    type: str
    index: int | None  # type: ignore[assignment]  # PyTorch's attribute, over ``str.index``

    def __new__(cls, type: Any, index: int | None = None) -> device:  # noqa: A002  (PyTorch's argument name)
        if isinstance(type, device):
            return type
        if isinstance(type, jax.Device):
            type, index = {"gpu": "cuda"}.get(type.platform, type.platform), type.id
        if not isinstance(type, str):
            raise TypeError(f"device(): argument 'type' must be str, not {_builtin_type(type).__name__}")
        name, _, number = type.partition(":")
        if number and index is not None:
            raise RuntimeError(f"type (string) must not include an index because index was passed explicitly: {type}")
        if number:
            if not number.isdigit():
                raise RuntimeError(f"Invalid device string: '{type}'")
            index = int(number)
        if index is not None and index < 0:
            raise RuntimeError(f"Device index must not be negative, got {index}")
        self = super().__new__(cls, name if index is None else f"{name}:{index}")
        self.type, self.index = name, index
        return self

    def __repr__(self) -> str:
        return f"device(type='{self.type}')" if self.index is None else f"device(type='{self.type}', index={self.index})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, jax.Device):
            return self.type == {"gpu": "cuda"}.get(other.platform, other.platform) and self.index in (None, other.id)
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = str.__hash__

    def __reduce__(self) -> tuple[Any, ...]:
        return (device, (self.type, self.index))


def _place(array: Any, device: Any) -> Any:
    target = resolve_device(device)
    return array if target is None else jax.device_put(array, target)


ERR_X64_NARROWED = (
    "xgrad.tensor: {src} data became {dst} because jax_enable_x64 is off (JAX has no 64-bit types then). "
    'Turn it on at startup with jax.config.update("jax_enable_x64", True), or pass dtype= to choose.'
)


def _python_dtype(value: Any) -> Any:
    """The dtype a Python float or complex scalar takes by the rule above; None to let JAX infer."""
    if isinstance(value, np.generic):  # np.float64 is a float subclass, but NumPy data keeps its dtype
        return None
    if isinstance(value, float):
        return default_float()
    if isinstance(value, complex):
        return default_complex()
    return None


def _infer_array(data: Any) -> Any:
    """``data`` as a ``jax.Array`` under the default-dtype rule (module docstring)."""
    if isinstance(data, (list, tuple, float, int, complex)) and not isinstance(data, np.generic):
        host = np.asarray(data)
        if host.dtype == np.float64:
            return jnp.asarray(host, dtype=default_float())
        if host.dtype == np.complex128:
            return jnp.asarray(host, dtype=default_complex())
        return jnp.asarray(host)
    if isinstance(data, (np.ndarray, np.generic)) and data.dtype in (np.float64, np.complex128) and not x64_enabled():
        narrow = jnp.dtype(jnp.float32 if data.dtype == np.float64 else jnp.complex64)
        warnings.warn(ERR_X64_NARROWED.format(src=data.dtype, dst=narrow), UserWarning, stacklevel=3)
        return jnp.asarray(data, dtype=narrow)
    return jnp.asarray(data)


def tensor(data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A new leaf tensor from a list, scalar, NumPy array, ``jax.Array`` (no copy) or Tensor.

    Args:
        data: the values.
        dtype: a NumPy/JAX dtype; by default Python floats give ``float32`` and arrays
            keep theirs (the rule in this module's docstring).
        device: a ``jax.Device``, a ``Sharding`` or a name such as ``"cpu:1"``.
        requires_grad: whether autograd records ops on it.

    >>> import xgrad
    >>> xgrad.tensor([[1, 2], [3, 4]]).shape
    (2, 2)
    """
    if isinstance(data, Tensor):
        data = data._array
    if data is None:
        raise RuntimeError("Could not infer dtype of NoneType")
    if isinstance(data, jax.Array) and (dtype is None or data.dtype == dtype):
        array = data
    elif dtype is None:
        array = _infer_array(data)
    else:
        array = jnp.asarray(data, dtype=resolve_dtype(dtype, "xgrad.tensor"))
    return Tensor(_place(array, device), requires_grad=requires_grad)


def _float_dtype(dtype: Any) -> Any:
    """``dtype``, or the default float dtype when it is None."""
    return default_float() if dtype is None else resolve_dtype(dtype, "dtype=")


def _shape(shape: tuple[Any, ...], size: Any = None, name: str = "") -> tuple[int, ...]:
    """A factory's sizes: given as ints, one sequence, or PyTorch's ``size=`` keyword (not both)."""
    if size is not None:
        if shape:
            raise TypeError(f"{name}() takes its sizes either as positional ints or as size=, not both: "
                            f"got {shape} and size={size}")
        shape = (size,)
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return check_nonnegative_shape(shape)


def zeros(*shape: Any, size: Any = None, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor of zeros (float32 unless ``dtype`` says otherwise).

    >>> import xgrad
    >>> xgrad.zeros(2, 3).shape, xgrad.zeros(2).tolist()
    ((2, 3), [0.0, 0.0])
    """
    return Tensor(_place(jnp.zeros(_shape(shape, size, "zeros"), _float_dtype(dtype)), device), requires_grad=requires_grad)


def ones(*shape: Any, size: Any = None, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor of ones (float32 unless ``dtype`` says otherwise).

    >>> import xgrad
    >>> xgrad.ones(2).tolist(), xgrad.ones((2, 2)).shape
    ([1.0, 1.0], (2, 2))
    """
    return Tensor(_place(jnp.ones(_shape(shape, size, "ones"), _float_dtype(dtype)), device), requires_grad=requires_grad)


def full(size: Any, fill_value: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor filled with ``fill_value``.

    >>> import xgrad
    >>> xgrad.full((2,), 1.5).tolist()
    [1.5, 1.5]
    """
    shape = _shape((size,))
    dtype = _python_dtype(fill_value) if dtype is None else resolve_dtype(dtype, "full")
    return Tensor(_place(jnp.full(shape, fill_value, dtype), device), requires_grad=requires_grad)


def arange(start: Any, end: Any = None, step: Any = 1, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """``start, start + step, …`` below ``end`` (``0..start`` when ``end`` is omitted).

    >>> import xgrad
    >>> xgrad.arange(3).tolist(), xgrad.arange(1.0, 2.0, 0.5).tolist()
    ([0, 1, 2], [1.0, 1.5])
    """
    if dtype is None and any(isinstance(_python_dtype(v), np.dtype) for v in (start, end, step)):
        dtype = default_float()
    if end is None:
        start, end = 0, start
    if not all(math.isfinite(v) for v in (start, end) if isinstance(v, float)):
        raise RuntimeError(f"unsupported range: {start} -> {end}")
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if (end - start) * step < 0:
        raise RuntimeError("upper bound and larger bound inconsistent with step sign")
    array = jnp.arange(start, end, step, dtype=resolve_dtype(dtype, "arange"))
    return Tensor(_place(array, device), requires_grad=requires_grad)


def eye(n: int, m: int | None = None, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """The ``n × m`` identity matrix.

    >>> import xgrad
    >>> xgrad.eye(2).tolist()
    [[1.0, 0.0], [0.0, 1.0]]
    """
    n = check_int(n, "eye", "n", 1)
    m = None if m is None else check_int(m, "eye", "m", 2)
    if n < 0 or m is not None and m < 0:
        raise RuntimeError(f"n and m must be greater or equal to 0, got n={n}, m={m}")
    return Tensor(_place(jnp.eye(n, m, dtype=_float_dtype(dtype)), device), requires_grad=requires_grad)


def _check_like(name: str, t: Any) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}(): argument 'input' (position 1) must be Tensor, not {type(t).__name__}")


def _like(t: Tensor, array: Any, device: Any, requires_grad: bool) -> Tensor:
    """``array`` (made with ``t``'s shape) on ``device``, else where ``t`` is."""
    placement = placement_of(t._array) if device is None else device
    return Tensor(_place(array, placement), requires_grad=requires_grad)


def zeros_like(t: Tensor, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Zeros with ``t``'s shape, dtype and placement.

    >>> import xgrad
    >>> xgrad.zeros_like(xgrad.tensor([1.0, 2.0])).tolist()
    [0.0, 0.0]
    """
    _check_like("zeros_like", t)
    return _like(t, jnp.zeros(t.shape, t.dtype if dtype is None else resolve_dtype(dtype, "dtype=")), device, requires_grad)


def ones_like(t: Tensor, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Ones with ``t``'s shape, dtype and placement.

    >>> import xgrad
    >>> xgrad.ones_like(xgrad.tensor([1.0, 2.0])).tolist()
    [1.0, 1.0]
    """
    _check_like("ones_like", t)
    return _like(t, jnp.ones(t.shape, t.dtype if dtype is None else resolve_dtype(dtype, "dtype=")), device, requires_grad)


def full_like(t: Tensor, fill_value: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """``fill_value`` with ``t``'s shape, dtype and placement.

    >>> import xgrad
    >>> xgrad.full_like(xgrad.tensor([1, 2]), 7).tolist()
    [7, 7]
    """
    _check_like("full_like", t)
    return _like(t, jnp.full(t.shape, fill_value, t.dtype if dtype is None else resolve_dtype(dtype, "dtype=")), device, requires_grad)


def empty(*shape: Any, size: Any = None, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """PyTorch's uninitialised tensor: zeros here (a ``jax.Array`` always holds values).

    >>> import xgrad
    >>> xgrad.empty(2, 3).shape, xgrad.empty(size=(2, 3)).shape
    ((2, 3), (2, 3))
    """
    return zeros(*_shape(shape, size, "empty"), dtype=dtype, device=device, requires_grad=requires_grad)


def empty_like(t: Tensor, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """``empty`` with ``t``'s shape, dtype and placement (zeros).

    >>> import xgrad
    >>> xgrad.empty_like(xgrad.ones(2)).shape
    (2,)
    """
    _check_like("empty_like", t)
    return zeros_like(t, dtype=dtype, device=device, requires_grad=requires_grad)


def _key(key: Any, generator: Any) -> Any:
    return generator_key(generator) if key is None else key


def randn(*shape: Any, size: Any = None, generator: Any = None, key: Any = None, dtype: Any = None, device: Any = None,
          requires_grad: bool = False) -> Tensor:
    """Standard normal samples; ``generator``/``key`` as in the module docstring.

    >>> import xgrad
    >>> import jax
    >>> xgrad.randn(2, 3, key=jax.random.key(0)).shape
    (2, 3)
    """
    array = jax.random.normal(_key(key, generator), _shape(shape, size, "randn"), _float_dtype(dtype))
    return Tensor(_place(array, device), requires_grad=requires_grad)


def rand(*shape: Any, size: Any = None, generator: Any = None, key: Any = None, dtype: Any = None, device: Any = None,
         requires_grad: bool = False) -> Tensor:
    """Uniform samples in ``[0, 1)``; ``generator``/``key`` as in the module docstring.

    >>> import xgrad
    >>> import jax
    >>> x = xgrad.rand(4, key=jax.random.key(0))
    >>> x.shape, all(0.0 <= v < 1.0 for v in x.tolist())
    ((4,), True)
    """
    array = jax.random.uniform(_key(key, generator), _shape(shape, size, "rand"), _float_dtype(dtype))
    return Tensor(_place(array, device), requires_grad=requires_grad)


def rand_like(t: Tensor, dtype: Any = None, device: Any = None, requires_grad: bool = False, *, generator: Any = None) -> Tensor:
    """``rand`` with ``t``'s shape, dtype and placement."""
    _check_like("rand_like", t)
    array = jax.random.uniform(generator_key(generator), t.shape, t.dtype if dtype is None else resolve_dtype(dtype, "dtype="))
    return _like(t, array, device, requires_grad)


def randn_like(t: Tensor, dtype: Any = None, device: Any = None, requires_grad: bool = False, *, generator: Any = None) -> Tensor:
    """``randn`` with ``t``'s shape, dtype and placement."""
    _check_like("randn_like", t)
    array = jax.random.normal(generator_key(generator), t.shape, t.dtype if dtype is None else resolve_dtype(dtype, "dtype="))
    return _like(t, array, device, requires_grad)


def _int64() -> Any:
    return jax.dtypes.canonicalize_dtype(jnp.int64)


def randint(*args: Any, size: Any = None, generator: Any = None, key: Any = None, dtype: Any = None, device: Any = None,
            requires_grad: bool = False) -> Tensor:
    """``randint(high, size)`` or ``randint(low, high, size)``: integers uniform in ``[low, high)`` (int64).

    >>> import xgrad
    >>> x = xgrad.randint(3, 7, (100,), generator=0)
    >>> x.dtype.name, 3 <= int(x.min()) and int(x.max()) < 7
    ('int64', True)
    """
    if size is not None:
        args = (*args, size)
    if len(args) == 2:
        (high, size), low = args, 0
    elif len(args) == 3:
        low, high, size = args
    else:
        raise TypeError(f"randint() takes (high, size) or (low, high, size), got {len(args)} positional arguments")
    if not low < high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    dtype = _int64() if dtype is None else resolve_dtype(dtype, "randint")
    array = jax.random.randint(_key(key, generator), _shape((size,)), low, high, _int64()).astype(dtype)
    return Tensor(_place(array, device), requires_grad=requires_grad)


def randint_like(t: Tensor, low: int = 0, high: int | None = None, *, dtype: Any = None, device: Any = None,
                 requires_grad: bool = False, generator: Any = None) -> Tensor:
    """``randint`` with ``t``'s shape, dtype and placement: ``randint_like(t, high)`` or ``(t, low, high)``."""
    _check_like("randint_like", t)
    if high is None:
        low, high = 0, low
    array = jax.random.randint(generator_key(generator), t.shape, low, high, _int64()).astype(t.dtype if dtype is None else resolve_dtype(dtype, "dtype="))
    return _like(t, array, device, requires_grad)


def randperm(n: int, *, generator: Any = None, key: Any = None, dtype: Any = None, device: Any = None,
             requires_grad: bool = False) -> Tensor:
    """A random permutation of ``0..n-1`` (int64).

    >>> import xgrad
    >>> sorted(xgrad.randperm(5, generator=0).tolist())
    [0, 1, 2, 3, 4]
    """
    if check_int(n, "randperm", "n", 1) < 0:
        raise RuntimeError(f"n must be non-negative, got{n}")
    array = jax.random.permutation(_key(key, generator), n).astype(_int64() if dtype is None else resolve_dtype(dtype, "randperm"))
    return Tensor(_place(array, device), requires_grad=requires_grad)


def linspace(start: Any, end: Any, steps: int, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """``steps`` evenly spaced values from ``start`` to ``end`` inclusive (the default float dtype).

    >>> import xgrad
    >>> xgrad.linspace(0, 1, 5).tolist()
    [0.0, 0.25, 0.5, 0.75, 1.0]
    """
    if check_int(steps, "linspace", "steps", 3) < 0:
        raise RuntimeError("number of steps must be non-negative")
    array = jnp.linspace(start, end, steps, dtype=_float_dtype(dtype))
    return Tensor(_place(array, device), requires_grad=requires_grad)


def from_numpy(ndarray: np.ndarray) -> Tensor:
    """A Tensor with ``ndarray``'s values and dtype (a copy: JAX arrays never share NumPy memory).

    PyTorch's shares the memory, so writes to ``ndarray`` afterwards do not show here.

    >>> import numpy as np, xgrad
    >>> xgrad.from_numpy(np.arange(3, dtype=np.int16)).dtype
    dtype('int16')
    """
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(ndarray).__name__})")
    return tensor(ndarray)


def bernoulli(input: Tensor, p: float | None = None, *, generator: Any = None) -> Tensor:  # noqa: A002  (PyTorch's name)
    """Draws 1 with probability ``input`` (or ``p``) and 0 otherwise, in ``input``'s dtype; not differentiable.

    >>> import xgrad
    >>> xgrad.bernoulli(xgrad.tensor([0.0, 1.0])).tolist()
    [0.0, 1.0]
    """
    probs = input._array if p is None else jnp.full(input.shape, p, input.dtype)
    return Tensor(jax.random.bernoulli(generator_key(generator), probs).astype(input.dtype))


ERR_MULTINOMIAL_COUNT = "cannot sample n_sample > prob_dist.size(-1) samples without replacement"


def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *, generator: Any = None) -> Tensor:  # noqa: A002
    """Indices drawn from the rows of ``input`` (unnormalised non-negative weights), int64.

    Without replacement an index is drawn at most once per row (``num_samples`` at most
    the number of categories), as PyTorch's.

    >>> import xgrad
    >>> xgrad.multinomial(xgrad.tensor([0.0, 1.0, 0.0]), 2, replacement=True).tolist()
    [1, 1]
    """
    weights = input._array
    if weights.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > weights.shape[-1]:
        raise RuntimeError(ERR_MULTINOMIAL_COUNT)
    if bool(jnp.any(weights < 0)) or not bool(jnp.all(jnp.isfinite(weights))):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if bool(jnp.any(weights.sum(-1) <= 0)):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    logits = jnp.log(weights.astype(jnp.result_type(weights.dtype, jnp.float32)))
    key = generator_key(generator)
    if replacement:
        draws = jax.random.categorical(key, logits, axis=-1, shape=(num_samples, *weights.shape[:-1]))
        draws = jnp.moveaxis(draws, 0, -1)
    else:
        # Gumbel top-k: the k largest of log w + Gumbel noise are a draw without replacement.
        noisy = logits + jax.random.gumbel(key, logits.shape, logits.dtype)
        draws = jax.lax.top_k(noisy, num_samples)[1]
    return Tensor(draws.astype(_int64()))


class Generator(KeyState):
    """PyTorch's ``torch.Generator``: a random state to pass as ``generator=``.

    ``manual_seed(seed)`` reseeds it (and returns it, so ``Generator().manual_seed(0)``
    works); every draw advances it.

    >>> import xgrad
    >>> g = xgrad.Generator().manual_seed(0)
    >>> a = xgrad.randperm(4, generator=g); b = xgrad.randperm(4, generator=g.manual_seed(0))
    >>> a.tolist() == b.tolist(), g.initial_seed()
    (True, 0)
    """

    DEFAULT_SEED = 67280421310721  # PyTorch's

    def __init__(self, device: Any = "cpu") -> None:
        super().__init__(self.DEFAULT_SEED)
        self.device = device

    def manual_seed(self, seed: int) -> Generator:
        self.seed = int(seed)
        self.set(jax.random.key(self.seed))
        return self

    def initial_seed(self) -> int:
        return self.seed

"""``Module``, ``Parameter``, buffers, containers and the layers PyTorch users reach for first.

A module's state lives in its attributes, as in PyTorch: an ``nn.Parameter`` attribute
is a parameter, a ``register_buffer`` name is a buffer, a ``Module`` attribute is a
submodule, and so is every Module inside a list, tuple or dict attribute (named
``attr.0``, ``attr.key``, as ``ModuleList``/``ModuleDict`` would name them), so a
submodule is never silently left out. Containers (``Sequential``, ``ModuleList``,
``ModuleDict``) hold their children by key, so ``state_dict`` keys are PyTorch's:
``0.weight`` in a ``Sequential``, and a PyTorch checkpoint saved as safetensors loads
without renaming.

>>> import xgrad
>>> model = xgrad.nn.MLP([4, 8, 3], key=0)
>>> [name for name, _ in model.named_parameters()]
['0.weight', '0.bias', '2.weight', '2.bias']
>>> model(xgrad.ones(2, 4)).shape
(2, 3)
"""

from __future__ import annotations

import copy
import math
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from xgrad import ops
from xgrad.creation import next_key, resolve_device
from xgrad.grad_mode import no_grad
from xgrad.ops._util import check_nonnegative_shape
from xgrad.tensor import Tensor

__all__ = [
    "GELU", "MLP", "BatchNorm1d", "BatchNorm2d", "Conv2d", "Dropout", "Embedding", "Identity", "LayerNorm", "Linear",
    "Module", "ModuleDict", "ModuleList", "MultiheadAttention", "Parameter", "ReLU", "Sequential", "SiLU", "Sigmoid",
    "Tanh", "TransformerEncoderLayer",
]

ERR_PLAIN_TENSOR_ATTRIBUTE = (
    "cannot assign a leaf Tensor that requires grad to attribute '{name}' of {module}: a module does not train "
    "plain Tensors. Wrap it, self.{name} = nn.Parameter(tensor), to make it a parameter, or call "
    "self.register_buffer('{name}', tensor) for state that is saved but not trained."
)


def _key(key: Any) -> jax.Array:
    """A ``jax.random`` key from a key, an int seed, or the default key when ``None``."""
    if key is None:
        return next_key()
    if isinstance(key, int):
        return jax.random.key(key)
    return key


def clear_grads(params: Iterable[Tensor], set_to_none: bool) -> None:
    """Set each ``.grad`` to ``None`` or, with ``set_to_none=False``, to zeros."""
    for p in params:
        if set_to_none or p.grad is None:
            p.grad = None
        else:
            p.grad = Tensor(jnp.zeros_like(p.grad.array))


# -- Parameter ------------------------------------------------------------------------

# NOTE [Parameter is a Tensor]
# ``Parameter(data)`` returns a plain leaf ``Tensor`` that requires grad and is marked as
# a parameter; ``isinstance(t, nn.Parameter)`` reads the mark. A real subclass would be
# its own pytree node type, so a tree of parameters and the tree of their grads (plain
# Tensors) would not match and ``optax.apply_updates(params, updates)`` or
# ``tx.update(grads, state, params)`` would fail on the structure (see NOTE [Tensor as a
# pytree] in tensor.py). The mark is a weak registry by id, so a parameter that is
# dropped leaves nothing behind.
_PARAMETER_IDS: dict[int, weakref.ref[Tensor]] = {}


def _mark_parameter(t: Tensor) -> None:
    key = id(t)
    _PARAMETER_IDS[key] = weakref.ref(t, lambda _ref: _PARAMETER_IDS.pop(key, None))


def _is_parameter(obj: Any) -> bool:
    ref = _PARAMETER_IDS.get(id(obj))
    return ref is not None and ref() is obj


class _ParameterMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return _is_parameter(obj)


class Parameter(Tensor, metaclass=_ParameterMeta):
    """A leaf Tensor that a ``Module`` registers as a parameter when set as an attribute.

    ``Parameter(data)`` shares ``data``'s array (a Tensor, ``jax.Array``, NumPy array or
    list) and requires grad unless ``requires_grad=False``. The result's type is
    ``Tensor``; ``isinstance(p, nn.Parameter)`` tells a parameter apart (see NOTE
    [Parameter is a Tensor]).

    >>> import xgrad
    >>> w = xgrad.nn.Parameter(xgrad.ones(2))
    >>> isinstance(w, xgrad.nn.Parameter), isinstance(w, xgrad.Tensor), w.requires_grad, w.is_leaf
    (True, True, True, True)
    """

    __slots__ = ()

    def __new__(cls, data: Any = None, requires_grad: bool = True) -> Tensor:  # type: ignore[misc]
        if data is None:
            array = jnp.zeros((0,), jnp.float32)
        elif isinstance(data, Tensor):
            array = data.array
        else:
            array = jnp.asarray(data)
        t = Tensor(array, requires_grad=requires_grad)
        _mark_parameter(t)
        return t


# -- Module ---------------------------------------------------------------------------

# Attributes that hold a module's own bookkeeping, never its state.
_INTERNAL = frozenset({"_buffers", "_modules", "training"})


def _contained(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    """``(name, item)`` for each Module or Parameter inside nested lists, tuples and dicts."""
    stack: list[tuple[str, Any]] = [(prefix, value)]
    while stack:
        name, item = stack.pop()
        if isinstance(item, (Module, Tensor)):
            if isinstance(item, Module) or _is_parameter(item):
                yield name, item
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed([(f"{name}.{i}", v) for i, v in enumerate(item)]))
        elif isinstance(item, dict):
            stack.extend(reversed([(f"{name}.{k}", v) for k, v in item.items()]))
        elif isinstance(item, (set, frozenset)) and any(isinstance(v, (Module, Tensor)) for v in item):
            raise TypeError(
                f"attribute '{prefix}' is a set holding Modules or Tensors: a set has no order, so they cannot be "
                "named. Use nn.ModuleList or a list."
            )


class _Parameters(list[Tensor]):
    """What ``Module.parameters()`` returns: a list, so it can be reused, indexed and measured.

    PyTorch returns a generator, and ``next(model.parameters())`` is a common way to
    reach the first parameter; ``next()`` here steps through the list the same way.
    """

    _next_index = 0

    def __next__(self) -> Tensor:
        if self._next_index >= len(self):
            raise StopIteration
        self._next_index += 1
        return self[self._next_index - 1]


class _IncompatibleKeys(NamedTuple):
    missing_keys: list[str]
    unexpected_keys: list[str]


class Module:
    """Base class: parameters, buffers and submodules are found among the attributes.

    Subclasses set attributes in ``__init__`` (calling ``super().__init__()`` is optional)
    and define ``forward``; calling the module calls ``forward``.

    >>> import xgrad
    >>> class Scale(xgrad.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.weight = xgrad.nn.Parameter(xgrad.tensor([2.0]))
    ...         self.register_buffer("calls", xgrad.tensor(0))
    ...     def forward(self, x):
    ...         return x * self.weight
    >>> m = Scale()
    >>> [name for name, _ in m.named_parameters()], list(m.state_dict()), m(xgrad.tensor([3.0])).tolist()
    (['weight'], ['weight', 'calls'], [6.0])
    """

    training: bool
    _buffers: dict[str, bool]
    _modules: dict[str, Module | None]

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # The bookkeeping exists before any subclass __init__ runs, whether or not it
        # calls super().__init__().
        self = super().__new__(cls)
        object.__setattr__(self, "_buffers", {})  # buffer name -> persistent
        object.__setattr__(self, "_modules", {})  # children held by key (containers, add_module)
        object.__setattr__(self, "training", True)
        return self

    def __init__(self) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    # -- attributes ------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' (Tensor or None expected)")
        elif name in self._modules:
            if value is not None and not isinstance(value, Module):
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' (Module or None expected)")
            self._modules[name] = value
            return
        elif isinstance(value, Tensor) and value.is_leaf and value.requires_grad and not _is_parameter(value):
            raise TypeError(ERR_PLAIN_TENSOR_ATTRIBUTE.format(name=name, module=type(self).__name__))
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: children held by key (ModuleDict keys,
        # add_module names).
        modules = self.__dict__.get("_modules")
        if modules is not None and name in modules:
            return modules[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        if name in self._modules:
            del self._modules[name]
            return
        self._buffers.pop(name, None)
        object.__delattr__(self, name)

    def _check_new_name(self, kind: str, name: Any) -> None:
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
        if not name:
            raise KeyError(f'{kind} name can\'t be empty string ""')
        if "." in name:
            raise KeyError(f'{kind} name can\'t contain ".", got: {name}')
        if (name in self.__dict__ or hasattr(type(self), name)) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Add a buffer: state that ``state_dict`` saves (unless ``persistent=False``) and ``.to`` moves, but not a parameter.

        >>> import xgrad
        >>> m = xgrad.nn.Module()
        >>> m.register_buffer("mask", xgrad.ones(2))
        >>> m.register_buffer("cache", xgrad.zeros(2), persistent=False)
        >>> list(m.state_dict()), [n for n, _ in m.named_buffers()], list(m.parameters())
        (['mask'], ['mask', 'cache'], [])
        """
        self._check_new_name("buffer", name)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' (Tensor or None required)")
        self._buffers[name] = bool(persistent)
        object.__setattr__(self, name, tensor)

    def register_parameter(self, name: str, param: Tensor | None) -> None:
        """Add a parameter (an ``nn.Parameter``, or ``None`` for an absent one such as ``bias=False``)."""
        self._check_new_name("parameter", name)
        if param is not None and not _is_parameter(param):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' (nn.Parameter or None required)")
        object.__setattr__(self, name, param)

    def add_module(self, name: str, module: Module | None) -> None:
        """Add a child module under ``name`` (any string without dots, such as ``"0"``)."""
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        if name not in self._modules:
            self._check_new_name("module", name)
        self._modules[name] = module

    register_module = add_module

    # -- discovery -------------------------------------------------------------------
    def _entries(self) -> Iterator[tuple[str, Any]]:
        """Every named Module or Parameter this module holds directly, duplicates included."""
        for name, value in self.__dict__.items():
            if name in _INTERNAL or name in self._buffers:
                continue
            if isinstance(value, Module) or _is_parameter(value):
                yield name, value
            elif isinstance(value, (list, tuple, dict, set, frozenset)):
                yield from _contained(name, value)
        for name, module in self._modules.items():
            if module is not None:
                yield name, module

    def _own_buffers(self) -> Iterator[tuple[str, Tensor, bool]]:
        for name, persistent in self._buffers.items():
            value = self.__dict__.get(name)
            if value is not None:
                yield name, value, persistent

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """The direct submodules as ``(name, module)``, each module once."""
        seen: set[int] = set()
        for name, value in self._entries():
            if isinstance(value, Module) and id(value) not in seen:
                seen.add(id(value))
                yield name, value

    def children(self) -> Iterator[Module]:
        """The direct submodules."""
        for _, module in self.named_children():
            yield module

    def named_modules(self, memo: set[int] | None = None, prefix: str = "", remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
        """This module and every submodule, depth first, with dotted names.

        >>> import xgrad
        >>> [name for name, _ in xgrad.nn.MLP([2, 3, 1], key=0).named_modules()]
        ['', '0', '1', '2']
        """
        seen = memo if memo is not None else set()
        stack: list[tuple[str, Module]] = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if remove_duplicate:
                if id(module) in seen:
                    continue
                seen.add(id(module))
            yield name, module
            entries = module.named_children() if remove_duplicate else (
                (n, m) for n, m in module._entries() if isinstance(m, Module))
            children = [(f"{name}.{n}" if name else n, m) for n, m in entries]
            stack.extend(reversed(children))

    def modules(self) -> Iterator[Module]:
        """This module and every submodule."""
        for _, module in self.named_modules():
            yield module

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        """Every parameter as ``(dotted name, tensor)``, each tensor once.

        >>> import xgrad
        >>> [n for n, _ in xgrad.nn.Linear(2, 3, key=0).named_parameters()]
        ['weight', 'bias']
        """
        seen: set[int] = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else iter([(prefix, self)])
        for module_name, module in modules:
            for name, value in module._entries():
                if isinstance(value, Tensor) and (not remove_duplicate or id(value) not in seen):
                    seen.add(id(value))
                    yield (f"{module_name}.{name}" if module_name else name), value

    def parameters(self, recurse: bool = True) -> _Parameters:
        """The parameters, in ``named_parameters`` order: a list that ``next()`` also walks, as PyTorch's iterator.

        >>> import xgrad
        >>> model = xgrad.nn.Linear(2, 3, key=0)
        >>> next(model.parameters()).shape, len(model.parameters())
        ((3, 2), 2)
        """
        return _Parameters(p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        """Every buffer (persistent or not) as ``(dotted name, tensor)``."""
        seen: set[int] = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else iter([(prefix, self)])
        for module_name, module in modules:
            for name, value, _ in module._own_buffers():
                if not remove_duplicate or id(value) not in seen:
                    seen.add(id(value))
                    yield (f"{module_name}.{name}" if module_name else name), value

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        """The buffers, in ``named_buffers`` order."""
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's ``.grad`` (to ``None``, or to zeros)."""
        clear_grads(self.parameters(), set_to_none)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        """Set ``requires_grad`` on every parameter (freeze with ``False``); returns ``self``."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def apply(self, fn: Callable[[Module], Any]) -> Module:
        """Call ``fn`` on every submodule (children first) and then on ``self``; returns ``self``.

        >>> import xgrad
        >>> seen = []
        >>> _ = xgrad.nn.Sequential(xgrad.nn.ReLU(), xgrad.nn.Tanh()).apply(lambda m: seen.append(type(m).__name__))
        >>> seen
        ['ReLU', 'Tanh', 'Sequential']
        """
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    # -- modes -----------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        """Set training mode (``Dropout`` active, ``BatchNorm`` on batch statistics) here and below."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> Module:
        """``train(False)``."""
        return self.train(False)

    # -- placement -------------------------------------------------------------------
    def to(self, *args: Any, device: Any = None, dtype: Any = None) -> Module:
        """Move parameters and buffers to a device and/or cast the floating ones to a dtype, in place.

        ``to(device)``, ``to(dtype)``, ``to(device, dtype)`` or keywords, as in PyTorch:
        a device is a ``jax.Device``, a ``Sharding`` or a name (``"cpu"``, ``"cuda:1"``);
        integer buffers keep their dtype. The same Tensor objects are kept (optimizers
        holding them stay valid); their ``.grad`` moves with them.

        >>> import xgrad, jax.numpy as jnp
        >>> layer = xgrad.nn.Linear(2, 2, key=0).to(jnp.float16)
        >>> layer.weight.dtype, layer.weight.requires_grad
        (dtype('float16'), True)
        """
        for arg in args:
            if isinstance(arg, (str, jax.Device, jax.sharding.Sharding)):
                device = arg
            else:
                dtype = arg
        target = resolve_device(device)
        if dtype is not None:
            dtype = jnp.dtype(dtype)
            if not jnp.issubdtype(dtype, jnp.inexact):
                raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, but got desired dtype={dtype}")

        def convert(array: Any) -> Any:
            if dtype is not None and jnp.issubdtype(array.dtype, jnp.inexact):
                array = array.astype(dtype)
            return array if target is None else jax.device_put(array, target)

        seen: set[int] = set()
        tensors = [t for _, t in self.named_parameters()] + [t for _, t in self.named_buffers()]
        for t in tensors:
            if id(t) in seen:
                continue
            seen.add(id(t))
            _replace_storage(t, convert(t.array))
            if t.grad is not None:
                t._grad = Tensor(convert(t.grad.array))
        return self

    # -- state -----------------------------------------------------------------------
    def _state_items(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """``state_dict``'s entries: parameters, then persistent buffers, then children; shared ones under each name."""
        stack: list[tuple[str, Module]] = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            dotted = f"{name}." if name else ""
            children = []
            for entry, value in module._entries():
                if isinstance(value, Module):
                    children.append((dotted + entry, value))
                else:
                    yield dotted + entry, value
            for entry, buffer, persistent in module._own_buffers():
                if persistent:
                    yield dotted + entry, buffer
            stack.extend(reversed(children))

    def state_dict(self, *, prefix: str = "", keep_vars: bool = False) -> dict[str, Tensor]:
        """Parameters and persistent buffers by PyTorch's dotted names (``0.weight`` in a ``Sequential``).

        Values are detached Tensors sharing the arrays (``keep_vars=True`` gives the
        parameters themselves). Arrays are immutable, so a later in-place update of the
        module does not change a state dict taken before it.

        >>> import xgrad
        >>> list(xgrad.nn.Sequential(xgrad.nn.Linear(2, 3, key=0), xgrad.nn.BatchNorm1d(3)).state_dict())
        ['0.weight', '0.bias', '1.weight', '1.bias', '1.running_mean', '1.running_var', '1.num_batches_tracked']
        """
        return {name: t if keep_vars else t.detach() for name, t in self._state_items(prefix)}

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> _IncompatibleKeys:
        """Copy values from ``state_dict`` into the parameters and buffers, in place (under ``no_grad``).

        Nothing is copied unless every entry fits: shapes are checked first, and with
        ``strict`` (the default) missing and unexpected keys raise PyTorch's error.
        Values are cast to each target's dtype and placed on its device.

        Args:
            state_dict: dotted name → Tensor, ``jax.Array`` or NumPy array (a PyTorch
                checkpoint converted to safetensors loads as it is).
            strict: raise when keys are missing or unexpected.

        Returns:
            ``(missing_keys, unexpected_keys)``, a named tuple.

        >>> import xgrad
        >>> a, b = xgrad.nn.Linear(2, 2, key=0), xgrad.nn.Linear(2, 2, key=1)
        >>> b.load_state_dict(a.state_dict())
        _IncompatibleKeys(missing_keys=[], unexpected_keys=[])
        >>> b.weight.tolist() == a.weight.tolist()
        True
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict).__name__}.")
        targets = dict(self._state_items())
        missing = [k for k in targets if k not in state_dict]
        unexpected = [k for k in state_dict if k not in targets]
        errors = []
        if strict:  # PyTorch's order: missing, unexpected, then size mismatches
            if missing:
                errors.append("Missing key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in missing)))
            if unexpected:
                errors.append("Unexpected key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in unexpected)))
        arrays = {}
        for name, target in targets.items():
            if name not in state_dict:
                continue
            value = state_dict[name]
            array = value.array if isinstance(value, Tensor) else jnp.asarray(np.asarray(value) if not isinstance(value, jax.Array) else value)
            if array.shape != target.shape:
                errors.append(
                    f"size mismatch for {name}: copying a param with shape {list(array.shape)} from checkpoint, "
                    f"the shape in current model is {list(target.shape)}."
                )
            arrays[name] = array
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t" + "\n\t".join(errors))
        with no_grad():
            for name, array in arrays.items():
                target = targets[name]
                target.copy_(Tensor(jax.device_put(array.astype(target.dtype), target.sharding)))
        return _IncompatibleKeys(missing, unexpected)

    # -- copying ---------------------------------------------------------------------
    def __deepcopy__(self, memo: dict[int, Any]) -> Module:
        """``copy.deepcopy(model)``: new parameters (still parameters) and buffers, a separate graph.

        Arrays are immutable, so the copies share them; each parameter and buffer is a
        new leaf (with its ``.grad`` copied) whose gradients accumulate on itself.
        """
        for t in [*self.parameters(), *self.buffers()]:
            if id(t) not in memo:
                fresh = Tensor(t.array, requires_grad=t.requires_grad)
                if t.grad is not None:
                    fresh._grad = Tensor(t.grad.array)
                if _is_parameter(t):
                    _mark_parameter(fresh)
                memo[id(t)] = fresh
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            object.__setattr__(new, name, copy.deepcopy(value, memo))
        return new

    # -- printing --------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        children = list(self.named_children())
        if not children:
            return f"{type(self).__name__}({self.extra_repr()})"
        body = "\n".join(f"  ({name}): " + repr(m).replace("\n", "\n  ") for name, m in children)
        return f"{type(self).__name__}(\n{body}\n)"


def _replace_storage(t: Tensor, array: Any) -> None:
    """Give ``t`` a new array (possibly another dtype or device) as an in-place op would: the version moves on."""
    if array is t.array:
        return
    t._array = array
    t._version += 1


# -- containers -----------------------------------------------------------------------


class Sequential(Module):
    """Modules applied one after the other, named ``"0"``, ``"1"``, … (or by an ``OrderedDict``'s keys).

    >>> import xgrad
    >>> net = xgrad.nn.Sequential(xgrad.nn.Linear(2, 4, key=0), xgrad.nn.Tanh())
    >>> net(xgrad.ones(1, 2)).shape, list(net.state_dict())
    ((1, 4), ['0.weight', '0.bias'])
    """

    def __init__(self, *args: Any) -> None:
        items = list(args[0].items()) if len(args) == 1 and isinstance(args[0], OrderedDict) else list(enumerate(args))
        for key, layer in items:
            if not isinstance(layer, Module):
                raise TypeError(f"Sequential takes Modules, got {type(layer).__name__}")
            self.add_module(str(key), layer)

    def forward(self, x: Any) -> Any:
        for layer in self._modules.values():
            if layer is not None:
                x = layer(x)
        return x

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return type(self)(OrderedDict(list(self._modules.items())[index]))
        return _at(self._modules, index)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(m for m in self._modules.values() if m is not None)

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self


def _at(modules: dict[str, Any], index: int) -> Any:
    """The entry at a position (negative counts from the end), with PyTorch's IndexError."""
    n = len(modules)
    if not -n <= index < n:
        raise IndexError(f"index {index} is out of range")
    return list(modules.values())[index % n]


class ModuleList(Module):
    """A list of submodules, registered as ``"0"``, ``"1"``, …

    >>> import xgrad
    >>> blocks = xgrad.nn.ModuleList([xgrad.nn.Linear(2, 2, key=i) for i in range(2)])
    >>> _ = blocks.append(xgrad.nn.ReLU()); len(blocks), [n for n, _ in blocks.named_parameters()][:2]
    (3, ['0.weight', '0.bias'])
    """

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        if modules is not None:
            self.extend(modules)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return ModuleList([m for m in list(self._modules.values())[index] if m is not None])
        return _at(self._modules, index)

    def __setitem__(self, index: int, module: Module) -> None:
        _at(self._modules, index)
        self.add_module(str(index % len(self)), module)

    def __delitem__(self, index: int | slice) -> None:
        values = list(self._modules.values())
        del values[index]
        self._modules.clear()
        self.extend(values)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())  # type: ignore[arg-type]

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        values = list(self._modules.values())
        values.insert(index, module)
        self._modules.clear()
        self.extend(values)  # type: ignore[arg-type]


class ModuleDict(Module):
    """A dict of submodules, registered under their keys.

    >>> import xgrad
    >>> heads = xgrad.nn.ModuleDict({"cls": xgrad.nn.Linear(2, 3, key=0)})
    >>> list(heads.state_dict()), "cls" in heads
    (['cls.weight', 'cls.bias'], True)
    """

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None) -> None:
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        module = self._modules[key]
        assert module is not None
        return module

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: object) -> bool:
        return key in self._modules

    def keys(self) -> Iterable[str]:
        return self._modules.keys()

    def values(self) -> Iterable[Module]:
        return self._modules.values()  # type: ignore[return-value]

    def items(self) -> Iterable[tuple[str, Module]]:
        return self._modules.items()  # type: ignore[return-value]

    def pop(self, key: str) -> Module:
        module = self[key]
        del self[key]
        return module

    def clear(self) -> None:
        self._modules.clear()

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        for key, module in (modules.items() if isinstance(modules, Mapping) else modules):
            self[key] = module


class Linear(Module):
    """``y = x @ weight.T + bias`` with ``weight`` of shape ``(out_features, in_features)``.

    Initialised as PyTorch does: uniform in ``±1/sqrt(in_features)``.

    Args:
        in_features, out_features: sizes.
        bias: whether to add a bias.
        key: a ``jax.random`` key or int seed (the default key when ``None``).
        dtype: parameter dtype (float32 by default).

    >>> import xgrad
    >>> xgrad.nn.Linear(3, 2, key=0)(xgrad.ones(5, 3)).shape
    (5, 2)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, key: Any = None, dtype: Any = jnp.float32) -> None:
        check_nonnegative_shape((out_features, in_features))  # PyTorch's error, before JAX's
        kw, kb = jax.random.split(_key(key))
        bound = 1.0 / math.sqrt(in_features) if in_features else 0.0
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(jax.random.uniform(kw, (out_features, in_features), dtype, -bound, bound))
        self.bias = Parameter(jax.random.uniform(kb, (out_features,), dtype, -bound, bound)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return ops.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class MLP(Sequential):
    """``Linear`` layers of the given sizes with an activation between them (none after the last).

    Args:
        sizes: ``[in, hidden..., out]``.
        activation: a module class or factory for the nonlinearity (``ReLU`` by default).
        key: a ``jax.random`` key or int seed, split once per layer.

    >>> import xgrad
    >>> mlp = xgrad.nn.MLP([2, 4, 1], activation=xgrad.nn.Tanh, key=0)
    >>> mlp(xgrad.ones(3, 2)).shape, len(mlp)
    ((3, 1), 3)
    """

    def __init__(self, sizes: Sequence[int], activation: Callable[[], Module] | None = None, *, key: Any = None, dtype: Any = jnp.float32) -> None:
        if len(sizes) < 2:
            raise ValueError(f"MLP needs at least an input and an output size, got sizes={list(sizes)}")
        make_activation = activation or ReLU
        keys = jax.random.split(_key(key), len(sizes) - 1)
        layers: list[Module] = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            layers.append(Linear(fan_in, fan_out, key=keys[i], dtype=dtype))
            if i < len(sizes) - 2:
                layers.append(make_activation())
        super().__init__(*layers)


class LayerNorm(Module):
    """Layer normalisation over the trailing ``normalized_shape`` dims, with a learned scale and shift.

    >>> import xgrad
    >>> xgrad.nn.LayerNorm(2)(xgrad.tensor([[1.0, 3.0]])).shape
    (1, 2)
    """

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True, *, dtype: Any = jnp.float32) -> None:
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = Parameter(jnp.ones(self.normalized_shape, dtype)) if elementwise_affine else None
        self.bias = Parameter(jnp.zeros(self.normalized_shape, dtype)) if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        return ops.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class Embedding(Module):
    """A lookup table of ``num_embeddings`` vectors of size ``embedding_dim``, initialised N(0, 1).

    >>> import xgrad
    >>> emb = xgrad.nn.Embedding(10, 3, key=0)
    >>> emb(xgrad.tensor([[1, 2], [3, 4]])).shape
    (2, 2, 3)
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *, key: Any = None, dtype: Any = jnp.float32) -> None:
        self.weight = Parameter(jax.random.normal(_key(key), (num_embeddings, embedding_dim), dtype))

    def forward(self, indices: Any) -> Tensor:
        return ops.embedding(indices, self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}"


class Dropout(Module):
    """Zero elements with probability ``p`` while training; identity in eval mode.

    Args:
        p: drop probability.
        key: a ``jax.random`` key or int seed for the first call; later calls split it.
            ``None`` uses the default key.

    >>> import xgrad
    >>> drop = xgrad.nn.Dropout(0.5, key=0)
    >>> drop.eval()(xgrad.ones(3)).tolist()
    [1.0, 1.0, 1.0]
    """

    def __init__(self, p: float = 0.5, *, key: Any = None) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self._rng = None if key is None else _key(key)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        key = None
        if self._rng is not None:
            self._rng, key = jax.random.split(self._rng)
        return ops.dropout(x, self.p, key=key, training=True)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class _Activation(Module):
    fn: Callable[[Tensor], Tensor]

    def forward(self, x: Tensor) -> Tensor:
        return type(self).fn(x)


class ReLU(_Activation):
    """``max(x, 0)``.

    >>> import xgrad
    >>> xgrad.nn.ReLU()(xgrad.tensor([-1.0, 2.0])).tolist()
    [0.0, 2.0]
    """

    fn = staticmethod(ops.relu)


class Tanh(_Activation):
    """``tanh(x)``.

    >>> import xgrad
    >>> xgrad.nn.Tanh()(xgrad.tensor([0.0])).tolist()
    [0.0]
    """

    fn = staticmethod(ops.tanh)


class GELU(_Activation):
    """Gaussian error linear unit.

    >>> import xgrad
    >>> xgrad.nn.GELU()(xgrad.tensor([0.0])).tolist()
    [0.0]
    """

    fn = staticmethod(ops.gelu)


class SiLU(_Activation):
    """``x * sigmoid(x)``.

    >>> import xgrad
    >>> xgrad.nn.SiLU()(xgrad.tensor([0.0])).tolist()
    [0.0]
    """

    fn = staticmethod(ops.silu)


class Sigmoid(_Activation):
    """``1 / (1 + exp(-x))``.

    >>> import xgrad
    >>> xgrad.nn.Sigmoid()(xgrad.tensor([0.0])).tolist()
    [0.5]
    """

    fn = staticmethod(ops.sigmoid)


class Identity(Module):
    """Returns its input.

    >>> import xgrad
    >>> xgrad.nn.Identity()(xgrad.tensor([1.0, 2.0])).tolist()
    [1.0, 2.0]
    """

    def forward(self, x: Any) -> Any:
        return x


def _pair(value: Any) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


class Conv2d(Module):
    """2-D convolution over NCHW input with an OIHW ``weight`` (``F.conv2d``), initialised as PyTorch does.

    Args:
        in_channels, out_channels: channel counts.
        kernel_size, stride, dilation: an int or a pair.
        padding: an int, a pair, ``"same"`` or ``"valid"`` (zeros padding).
        groups: channel groups; both channel counts must divide by it.
        bias: whether to add a bias.
        key: a ``jax.random`` key or int seed (the default key when ``None``).

    >>> import xgrad
    >>> conv = xgrad.nn.Conv2d(3, 4, 3, padding=1, key=0)
    >>> conv(xgrad.ones(2, 3, 5, 5)).shape, conv.weight.shape
    ((2, 4, 5, 5), (4, 3, 3, 3))
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
        groups: int = 1, bias: bool = True, padding_mode: str = "zeros", *, key: Any = None, dtype: Any = jnp.float32,
    ) -> None:
        if groups <= 0 or in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by groups ({groups})")
        if padding_mode != "zeros":
            raise ValueError(f"Conv2d supports padding_mode='zeros' only, got {padding_mode!r}; pad the input with xgrad.pad first")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.dilation = _pair(kernel_size), _pair(stride), _pair(dilation)
        self.padding = padding if isinstance(padding, str) else _pair(padding)
        kh, kw = self.kernel_size
        # kaiming_uniform_(a=sqrt(5)) as PyTorch's reset_parameters: bound 1/sqrt(fan_in), for the bias too.
        bound = 1.0 / math.sqrt(in_channels // groups * kh * kw)
        k_weight, k_bias = jax.random.split(_key(key))
        self.weight = Parameter(jax.random.uniform(k_weight, (out_channels, in_channels // groups, kh, kw), dtype, -bound, bound))
        self.bias = Parameter(jax.random.uniform(k_bias, (out_channels,), dtype, -bound, bound)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return ops.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, groups={self.groups}, bias={self.bias is not None}")


class _BatchNorm(Module):
    _input_dims: tuple[int, ...]

    def __init__(
        self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
        track_running_stats: bool = True, *, dtype: Any = jnp.float32,
    ) -> None:
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(jnp.ones((num_features,), dtype)) if affine else None
        self.bias = Parameter(jnp.zeros((num_features,), dtype)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", Tensor(jnp.zeros((num_features,), dtype)))
            self.register_buffer("running_var", Tensor(jnp.ones((num_features,), dtype)))
            # int64 where x64 is on, int32 otherwise (JAX has no int64 then).
            self.register_buffer("num_batches_tracked", Tensor(jnp.zeros((), jax.dtypes.canonicalize_dtype(jnp.int64))))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim not in self._input_dims:
            expected = " or ".join(f"{d}D" for d in self._input_dims)
            raise ValueError(f"expected {expected} input (got {x.ndim}D input)")
        if x.shape[1] != self.num_features:
            raise ValueError(f"expected input with {self.num_features} channels in dim 1, got shape {list(x.shape)}")
        dims = (0, *range(2, x.ndim))
        stat_shape = (1, self.num_features) + (1,) * (x.ndim - 2)
        use_batch_stats = self.training or self.running_mean is None
        if use_batch_stats:
            count = x.numel() // self.num_features
            if self.training and count <= 1:
                raise ValueError(f"Expected more than 1 value per channel when training, got input size {list(x.shape)}")
            mean = ops.mean(x, dim=dims, keepdim=True)
            var = ops.var(x, dim=dims, keepdim=True, correction=0)
            if self.training and self.running_mean is not None:
                self._update_running_stats(mean.array.reshape(-1), var.array.reshape(-1) * (count / (count - 1)))
        else:
            mean = self.running_mean.reshape(stat_shape)
            var = self.running_var.reshape(stat_shape)
        y = (x - mean) * ops.rsqrt(var + self.eps)
        if self.weight is not None and self.bias is not None:
            y = y * self.weight.reshape(stat_shape) + self.bias.reshape(stat_shape)
        return y

    def _update_running_stats(self, batch_mean: jax.Array, unbiased_var: jax.Array) -> None:
        # PyTorch: running = (1 - factor) * running + factor * batch, the factor being
        # momentum, or 1/num_batches_tracked (a cumulative average) when momentum is None.
        with no_grad():
            tracked = self.num_batches_tracked
            tracked.copy_(Tensor(tracked.array + 1))
            factor = 1.0 / float(tracked.array) if self.momentum is None else self.momentum
            for buffer, batch in ((self.running_mean, batch_mean), (self.running_var, unbiased_var)):
                buffer.copy_(Tensor(((1 - factor) * buffer.array + factor * batch).astype(buffer.dtype)))

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch normalisation over ``(N, C)`` or ``(N, C, L)`` input, with running statistics as buffers.

    Training normalises with the batch's mean and biased variance and updates
    ``running_mean``/``running_var`` (with the unbiased variance) by ``momentum``, or by a
    cumulative average when ``momentum=None``; eval mode normalises with the running
    statistics. ``num_batches_tracked`` counts the training batches. As PyTorch.

    >>> import xgrad
    >>> bn = xgrad.nn.BatchNorm1d(2)
    >>> _ = bn(xgrad.tensor([[0.0, 1.0], [2.0, 3.0]], dtype="float32"))
    >>> bn.running_mean.tolist(), bn.running_var.tolist(), bn.num_batches_tracked.item()
    ([0.10000000149011612, 0.20000000298023224], [1.100000023841858, 1.100000023841858], 1)
    """

    _input_dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalisation over ``(N, C, H, W)`` input; see ``BatchNorm1d``.

    >>> import xgrad
    >>> xgrad.nn.BatchNorm2d(3)(xgrad.randn(2, 3, 4, 4)).shape
    (2, 3, 4, 4)
    """

    _input_dims = (4,)


def _additive_mask(mask: Any, dtype: Any) -> Any:
    """A mask as something to add to attention scores: boolean True (masked out) becomes -inf."""
    if mask is None:
        return None
    array = mask.array if isinstance(mask, Tensor) else jnp.asarray(mask)
    if array.dtype == jnp.bool_:
        return Tensor(jnp.where(array, -jnp.inf, 0.0).astype(dtype))
    return mask if isinstance(mask, Tensor) else Tensor(array.astype(dtype))


class MultiheadAttention(Module):
    """Multi-head attention with PyTorch's parameters: ``in_proj_weight`` (3E × E), ``in_proj_bias``, ``out_proj``.

    ``forward(query, key, value, key_padding_mask=None, need_weights=True,
    attn_mask=None, average_attn_weights=True, is_causal=False)`` returns
    ``(attn_output, attn_weights)`` as PyTorch does: inputs ``(L, N, E)``, or
    ``(N, L, E)`` with ``batch_first=True``, or unbatched ``(L, E)``; a boolean mask marks
    positions *not* attended to with True, a float mask is added to the scores; the weights
    are averaged over heads unless ``average_attn_weights=False``, and ``None`` when
    ``need_weights=False``.

    Args:
        embed_dim, num_heads: model width and head count (``embed_dim`` divisible by it).
        dropout: dropout on the attention weights while training.
        bias: biases on the input and output projections.
        batch_first: inputs and outputs are ``(N, L, E)``.
        key: a ``jax.random`` key or int seed for the initialisation and the dropout.

    >>> import xgrad
    >>> mha = xgrad.nn.MultiheadAttention(8, 2, batch_first=True, key=0)
    >>> out, weights = mha(xgrad.ones(3, 5, 8), xgrad.ones(3, 4, 8), xgrad.ones(3, 4, 8))
    >>> out.shape, weights.shape, [n for n, _ in mha.named_parameters()]
    ((3, 5, 8), (3, 5, 4), ['in_proj_weight', 'in_proj_bias', 'out_proj.weight', 'out_proj.bias'])
    """

    def __init__(
        self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True, add_bias_kv: bool = False,
        add_zero_attn: bool = False, kdim: int | None = None, vdim: int | None = None, batch_first: bool = False,
        *, key: Any = None, dtype: Any = jnp.float32,
    ) -> None:
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got embed_dim={embed_dim} and num_heads={num_heads} instead")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim must be divisible by num_heads, got embed_dim={embed_dim} and num_heads={num_heads}")
        if add_bias_kv or add_zero_attn or kdim not in (None, embed_dim) or vdim not in (None, embed_dim):
            raise ValueError(
                "xgrad's MultiheadAttention supports key and value of width embed_dim, without add_bias_kv or "
                "add_zero_attn; project key and value to embed_dim first"
            )
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.batch_first = batch_first
        k_in, k_out, k_drop = jax.random.split(_key(key), 3)
        # xavier_uniform_ on the (3E, E) in-projection, zero biases: PyTorch's _reset_parameters.
        bound = math.sqrt(6.0 / (embed_dim + 3 * embed_dim))
        self.in_proj_weight = Parameter(jax.random.uniform(k_in, (3 * embed_dim, embed_dim), dtype, -bound, bound))
        self.in_proj_bias = Parameter(jnp.zeros((3 * embed_dim,), dtype)) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, key=k_out, dtype=dtype)
        if bias:
            self.out_proj.bias = Parameter(jnp.zeros((embed_dim,), dtype))
        self.dropout = dropout
        self._dropout = Dropout(dropout, key=k_drop)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Any = None, need_weights: bool = True,
        attn_mask: Any = None, average_attn_weights: bool = True, is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        batched = query.ndim == 3
        if not batched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = jnp.asarray(key_padding_mask)[None]
        elif not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        n, tgt_len, e = query.shape
        src_len = key.shape[1]
        h, d = self.num_heads, self.head_dim
        w, b = self.in_proj_weight, self.in_proj_bias

        def project(x: Tensor, i: int) -> Tensor:
            y = x @ w[i * e:(i + 1) * e].T
            if b is not None:
                y = y + b[i * e:(i + 1) * e]
            return y.reshape(n, x.shape[1], h, d).transpose(1, 2)  # (N, H, len, D)

        q, k, v = project(query, 0), project(key, 1), project(value, 2)
        scores = (q @ k.mT) * (1.0 / math.sqrt(d))  # (N, H, L, S)
        if attn_mask is None and is_causal:
            attn_mask = jnp.triu(jnp.ones((tgt_len, src_len), jnp.bool_), 1)
        mask = _additive_mask(attn_mask, scores.dtype)
        if mask is not None:
            scores = scores + (mask.reshape(n, h, tgt_len, src_len) if mask.ndim == 3 else mask)
        padding = _additive_mask(key_padding_mask, scores.dtype)
        if padding is not None:
            scores = scores + padding.reshape(n, 1, 1, src_len)
        weights = ops.softmax(scores, dim=-1)
        if self.training and self.dropout > 0.0:
            weights = self._dropout(weights)
        out = (weights @ v).transpose(1, 2).reshape(n, tgt_len, e)
        out = self.out_proj(out)
        if not batched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = weights.mean(dim=1)
        return out, (weights if batched else weights.squeeze(0))

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"


_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": ops.relu, "gelu": ops.gelu}


class TransformerEncoderLayer(Module):
    """Self-attention and a feed-forward block, each with a residual and a LayerNorm, as PyTorch's.

    Parameters are named as PyTorch names them (``self_attn.in_proj_weight``,
    ``linear1.weight``, ``norm1.weight``, …), so its checkpoints load as they are.
    ``norm_first=True`` normalises before each block (pre-LN) instead of after.

    Args:
        d_model, nhead: width and attention heads.
        dim_feedforward: hidden width of the feed-forward block.
        dropout: dropout after attention, inside and after the feed-forward block.
        activation: ``"relu"``, ``"gelu"`` or a callable on Tensors.
        layer_norm_eps, batch_first, norm_first, bias: as PyTorch.
        key: a ``jax.random`` key or int seed for every initialisation and dropout.

    >>> import xgrad
    >>> layer = xgrad.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True, key=0)
    >>> layer(xgrad.ones(2, 5, 8)).shape
    (2, 5, 8)
    """

    def __init__(
        self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1, activation: Any = "relu",
        layer_norm_eps: float = 1e-5, batch_first: bool = False, norm_first: bool = False, bias: bool = True,
        *, key: Any = None, dtype: Any = jnp.float32,
    ) -> None:
        keys = jax.random.split(_key(key), 6)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, key=keys[0], dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, key=keys[1], dtype=dtype)
        self.dropout = Dropout(dropout, key=keys[2])
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, key=keys[3], dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, dtype=dtype)
        self.dropout1 = Dropout(dropout, key=keys[4])
        self.dropout2 = Dropout(dropout, key=keys[5])
        if isinstance(activation, str):
            if activation not in _ACTIVATIONS:
                raise RuntimeError(f"activation should be relu/gelu, not {activation}")
            activation = _ACTIVATIONS[activation]
        self.activation = activation

    def forward(self, src: Tensor, src_mask: Any = None, src_key_padding_mask: Any = None, is_causal: bool = False) -> Tensor:
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x: Tensor, attn_mask: Any, key_padding_mask: Any, is_causal: bool) -> Tensor:
        out, _ = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False, is_causal=is_causal)
        return self.dropout1(out)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

"""``Module`` and ``Parameter``: state found among a module's attributes, buffers, hooks, ``state_dict``."""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.grad_mode import no_grad
from xgrad.grads import clear_grads
from xgrad.nn.hooks import HOOK_DICTS, ModuleHooks
from xgrad.nn.module_placement import ModulePlacement
from xgrad.nn.module_pytree import register_module_pytree
from xgrad.step_trace import current as current_step
from xgrad.tensor import Tensor
from xgrad.tensor.parameters import is_parameter, mark_parameter

ERR_PLAIN_TENSOR_ATTRIBUTE = (
    "cannot assign a leaf Tensor that requires grad to attribute '{name}' of {module}: a module does not train "
    "plain Tensors. Wrap it, self.{name} = nn.Parameter(tensor), to make it a parameter, or call "
    "self.register_buffer('{name}', tensor) for state that is saved but not trained."
)


# -- Parameter ------------------------------------------------------------------------

# ``Parameter`` is a mark on a plain Tensor, kept in tensor/parameters.py (NOTE [Parameter is a Tensor]).


class _ParameterMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return is_parameter(obj)


class Parameter(Tensor, metaclass=_ParameterMeta):
    """A leaf Tensor that a ``Module`` registers as a parameter when set as an attribute.

    ``Parameter(data)`` shares ``data``'s array (a Tensor, ``jax.Array``, NumPy array or
    list) and requires grad unless ``requires_grad=False``. The result's type is
    ``Tensor``; ``isinstance(p, nn.Parameter)`` tells a parameter apart (see NOTE
    [Parameter is a Tensor] in ``tensor/parameters.py``).

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
        mark_parameter(t)
        return t


# -- Module ---------------------------------------------------------------------------

# Attributes that hold a module's own bookkeeping, never its state.
_INTERNAL = frozenset({"_buffers", "_modules", "training", *HOOK_DICTS})


def _contained(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    """``(name, item)`` for each Module or Parameter inside nested lists, tuples and dicts."""
    stack: list[tuple[str, Any]] = [(prefix, value)]
    while stack:
        name, item = stack.pop()
        if isinstance(item, (Module, Tensor)):
            if isinstance(item, Module) or is_parameter(item):
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


def _key_name(key: Any) -> str:
    for field in ("name", "idx", "key"):  # GetAttrKey, SequenceKey, DictKey
        if hasattr(key, field):
            return str(getattr(key, field))
    return str(key)


def _in_foreign_pytree(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    """``(name, item)`` for each Module or Parameter among a foreign pytree's leaves (an Equinox
    module whose arrays were made Parameters): NOTE [Foreign pytrees in a module]."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(value, is_leaf=lambda x: isinstance(x, (Module, Tensor)))
    for path, leaf in leaves:
        if isinstance(leaf, Module) or (isinstance(leaf, Tensor) and is_parameter(leaf)):
            yield ".".join([prefix, *(_key_name(k) for k in path)]), leaf


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


class Module(ModuleHooks, ModulePlacement):
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
        for name in HOOK_DICTS:
            object.__setattr__(self, name, OrderedDict())
        return self

    def __init__(self) -> None:
        pass

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register_module_pytree(cls)  # NOTE [Module as a pytree]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        trace = current_step()
        if trace is not None:  # NOTE [The step-trace seam]: the mode and hooks a compiled step depends on
            trace.module_called(self)
        if self._has_hooks():
            return self._call_with_hooks(args, kwargs)
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
        elif isinstance(value, Tensor) and value.is_leaf and value.requires_grad and not is_parameter(value):
            raise TypeError(ERR_PLAIN_TENSOR_ATTRIBUTE.format(name=name, module=type(self).__name__))
        current = self.__dict__.get(name)
        if current is not None and value is not None:
            # As PyTorch: a parameter or child module is replaced only by its own kind (or
            # None); anything else would silently drop it from parameters() and state_dict().
            if is_parameter(current) and not is_parameter(value):
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' (Parameter or None expected)")
            if isinstance(current, Module) and not isinstance(value, Module):
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' (Module or None expected)")
        if isinstance(value, Tensor) and is_parameter(value):
            mark_parameter(value, f"{type(self).__name__}.{name}")
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
        if param is not None and not is_parameter(param):
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
            if isinstance(value, Module) or is_parameter(value):
                yield name, value
            elif isinstance(value, (list, tuple, dict, set, frozenset)):
                yield from _contained(name, value)
            elif not isinstance(value, (bool, int, float, str, type, Tensor)) and value is not None:
                yield from _in_foreign_pytree(name, value)
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

    def get_submodule(self, target: str) -> Module:
        """The submodule at dotted path ``target`` (``""`` is ``self``), with PyTorch's errors.

        >>> import xgrad
        >>> xgrad.nn.Sequential(xgrad.nn.Linear(2, 2, key=0), xgrad.nn.ReLU()).get_submodule("1")
        ReLU()
        """
        found = dict(self.named_modules(remove_duplicate=False)).get(target)
        if found is not None:
            return found
        module: Any = self
        for item in target.split("."):
            if not hasattr(module, item):
                raise AttributeError(f"{type(module).__name__} has no attribute `{item}`")
            module = getattr(module, item)
            if not isinstance(module, Module):
                raise AttributeError(f"`{item}` is not an nn.Module")
        return module  # type: ignore[no-any-return]

    def get_parameter(self, target: str) -> Tensor:
        """The parameter at dotted path ``target`` (``"0.weight"``), with PyTorch's errors."""
        return self._get_tensor(target, dict(self.named_parameters(remove_duplicate=False)), "an nn.Parameter")

    def get_buffer(self, target: str) -> Tensor:
        """The buffer at dotted path ``target`` (``"1.running_mean"``), with PyTorch's errors."""
        return self._get_tensor(target, dict(self.named_buffers(remove_duplicate=False)), "a buffer")

    def _get_tensor(self, target: str, named: dict[str, Tensor], kind: str) -> Tensor:
        if target in named:
            return named[target]
        module_path, _, name = target.rpartition(".")
        module = self.get_submodule(module_path)
        if not hasattr(module, name):
            raise AttributeError(f"{type(module).__name__} has no attribute `{name}`")
        raise AttributeError(f"`{name}` is not {kind}")

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
        trace = current_step()
        for module in self.modules():
            if trace is not None:
                trace.module_mode(module)
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> Module:
        """``train(False)``."""
        return self.train(False)

    # -- state -----------------------------------------------------------------------
    def _state_items(self) -> Iterator[tuple[str, Tensor]]:
        """``state_dict``'s entries: parameters, then persistent buffers, then children; shared ones under each name."""
        stack: list[tuple[str, Module]] = [("", self)]
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

    def state_dict(self, *, destination: dict[str, Any] | None = None, prefix: str = "", keep_vars: bool = False) -> dict[str, Any]:
        """Parameters and persistent buffers by PyTorch's dotted names (``0.weight`` in a ``Sequential``).

        Values are detached Tensors sharing the arrays (``keep_vars=True`` gives the
        parameters themselves). Arrays are immutable, so a later in-place update of the
        module does not change a state dict taken before it.

        >>> import xgrad
        >>> list(xgrad.nn.Sequential(xgrad.nn.Linear(2, 3, key=0), xgrad.nn.BatchNorm1d(3)).state_dict())
        ['0.weight', '0.bias', '1.weight', '1.bias', '1.running_mean', '1.running_var', '1.num_batches_tracked']
        """
        entries = destination if destination is not None else {}
        # As PyTorch's, ``prefix`` is prepended as it is (``"encoder."``).
        entries.update((prefix + name, t if keep_vars else t.detach()) for name, t in self._state_items())
        return entries

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> _IncompatibleKeys:
        """Copy values from ``state_dict`` into the parameters and buffers, in place (under ``no_grad``).

        Nothing is copied unless every entry fits: shapes are checked first, and with
        ``strict`` (the default) missing and unexpected keys raise PyTorch's error.
        Values are cast to each target's dtype and placed on its device.

        Args:
            state_dict: dotted name → Tensor, ``jax.Array`` or NumPy array (a PyTorch
                checkpoint converted to safetensors loads as it is).
            strict: raise when keys are missing or unexpected.
            assign: PyTorch's option to take the state dict's Tensors themselves; ``True`` raises.

        Returns:
            ``(missing_keys, unexpected_keys)``, a named tuple.

        >>> import xgrad
        >>> a, b = xgrad.nn.Linear(2, 2, key=0), xgrad.nn.Linear(2, 2, key=1)
        >>> b.load_state_dict(a.state_dict())
        _IncompatibleKeys(missing_keys=[], unexpected_keys=[])
        >>> b.weight.tolist() == a.weight.tolist()
        True
        """
        if assign:
            raise NotImplementedError(
                "load_state_dict(assign=True) is not supported: load with assign=False (the default), which copies the "
                "values into the module's own Tensors, keeping their dtypes and devices; cast or move the module first "
                "with .to() if it should take the state dict's"
            )
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
            if not isinstance(value, (Tensor, jax.Array, np.ndarray, np.generic)) or value.dtype.kind not in "biufc":
                # PyTorch's words; a list or number would be taken for an array silently, a string fail in JAX.
                errors.append(f'While copying the parameter named "{name}", expected torch.Tensor or Tensor-like '
                              f"object from checkpoint but received {type(value)}")
                continue
            array = value.array if isinstance(value, Tensor) else jnp.asarray(value)
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
                if is_parameter(t):
                    mark_parameter(fresh)
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
        # PyTorch's layout: the extra_repr lines, then one line per child, indented.
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self.named_children()]
        if len(extra_lines) == 1 and not child_lines:
            return f"{type(self).__name__}({extra_lines[0]})"
        lines = extra_lines + child_lines
        body = "\n  " + "\n  ".join(lines) + "\n" if lines else ""
        return f"{type(self).__name__}({body})"


register_module_pytree(Module)


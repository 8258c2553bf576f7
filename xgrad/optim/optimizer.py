"""``Optimizer``: PyTorch's optimizer base, with parameter groups, per-parameter state and state dicts.

# NOTE [PyTorch optimizers]
# ``param_groups`` is a list of dicts as in PyTorch; users and schedulers set their
# entries between steps. The entries an update reads as numbers (``lr``, ``betas``,
# ``weight_decay``, ...; the class's ``_hyper``) are also held, packed in one flat array,
# by one Tensor per group that setting an entry rebinds (``_ParamGroup``), and ``step``
# passes its array to the jitted update: a new rate is a new input, not a new program,
# and inside ``xgrad.compile`` the Tensor is one program input read at every call
# (NOTE [Optimizer state in Tensors]; one input, not one per entry, as ``jax.jit``'s
# dispatch pays per input). Entries that choose code (``nesterov``, ``maximize``, ``amsgrad``)
# are static arguments of the update. ``state[p]`` holds Tensors too, made when the
# parameter joins the optimizer rather than at its first step (PyTorch's moment), so a
# compiled step makes state only when traced again for an entry set since that calls for
# more (``momentum`` turned on); ``state_dict()`` lists only parameters that have
# stepped, as PyTorch's does. Each step checks, eagerly, that a parameter's state sits
# where the parameter does and moves it along when the parameter was moved or resharded.
"""

from __future__ import annotations

import functools
import math
import sys
import warnings
from collections import defaultdict
from collections.abc import Callable, ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from xgrad import step_trace
from xgrad.fast_compile import FastJit
from xgrad.grad_mode import enable_grad
from xgrad.grads import clear_grads
from xgrad.optim.optax_optimizer import _writing, scalar_sharding
from xgrad.optim.written import WrittenArrays
from xgrad.step_trace import array_of
from xgrad.tensor import Tensor

# State kept in PyTorch's scalar type, not the parameter's dtype: counters, each a function of
# itself and the group's hyperparameters only (NOTE [Shared counters]).
_OWN_DTYPE = ("step", "mu_product")


_ABSENT = object()
#: The types of the entries an update takes as code choices (static arguments of its program), not numbers.
_OPTION = (bool, str, type(None))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_))


def _sign(value: Any) -> tuple[bool, bool] | None:
    """What an update's choice of code reads of a number: whether it is non-zero, whether positive (``None``: not a
    number, whose every set counts as a change)."""
    return (bool(value != 0), bool(value > 0)) if _is_number(value) else None


def _hyper_piece(value: Any) -> Any:
    """A hyperparameter as the update reads it, in the default float type: a NumPy array for a number, a Tensor's
    own array (reported read to a step being traced) otherwise."""
    dtype = jnp.result_type(float)
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        return value.array.reshape(()).astype(dtype)
    return np.asarray(value, dtype=dtype)


class _ParamGroup(dict):
    """A parameter group: a dict whose numeric entries named in ``hyper`` are mirrored in one Tensor (NOTE [PyTorch optimizers]).

    ``hyper_tensor`` holds them packed, one after another in ``hyper``'s order, as one
    flat array (``None`` while the group has none); ``hyper_layout`` says where each lies:
    ``(key, start, shape)``. One array, not one per entry: a compiled step takes it as one
    program input, and ``jax.jit``'s dispatch pays per input. Setting an entry writes its
    slot of the array the Tensor holds then, which a compiled step may have written (a rate
    set inside it): inside a step being traced as an op of the step, so that the other
    entries stay the program's input, not the values they had when it was traced. Each of
    dict's read paths tells a step being traced what its own code read (NOTE [Param groups
    in a compiled step] in compile_step).
    """

    def __init__(self, hyper: tuple[str, ...], entries: Mapping[str, Any], signed: tuple[str, ...]) -> None:
        super().__init__()
        self._hyper = hyper
        self._signed = signed
        self.hyper_tensor: Tensor | None = None
        self.hyper_layout: tuple[tuple[str, int, tuple[int, ...]], ...] = ()
        # Counts the changes of what chooses code: the options, the entries an update takes as code choices
        # (``nesterov``); the sign of an entry in ``signed`` (``momentum``: whether a ``momentum_buffer`` exists);
        # which keys the group has. A compiled step checks them by this one number (NOTE [Param groups in a
        # compiled step] in compile_step).
        self.options_version = 0
        self.update(entries)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle's default for a dict subclass sets the items before ``__init__``'s attributes exist.
        self._report(_reading_step(), dict.keys(self), key_set=True)  # ``copy.copy`` or ``pickle`` in a step
        return (type(self), (self._hyper, dict(dict.items(self)), self._signed))

    # -- reads: dict's read paths, each telling a step being traced what its own code read ------------

    def _report(self, trace: Any, keys: Iterable[str] = (), key_set: bool = False) -> None:
        """Tell ``trace`` (``None``: no one) that the step read the entries ``keys``; an absent one, or ``key_set``,
        is a read of which keys the group has, which ``options_version`` counts."""
        if trace is None:
            return
        for key in keys:
            if not dict.__contains__(self, key):
                key_set = True
            elif key != "params":
                trace.entry_read(self, key, dict.__getitem__(self, key))
        if key_set:
            trace.entry_read(self, None, self.options_version)

    def __getitem__(self, key: str) -> Any:
        self._report(_reading_step(), (key,))
        return dict.__getitem__(self, key)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self._report(_reading_step(), (key,))
        return dict.get(self, key, default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._report(_reading_step(), (key,))
        if not dict.__contains__(self, key):
            self[key] = default
        return dict.__getitem__(self, key)

    def __contains__(self, key: object) -> bool:
        self._report(_reading_step(), key_set=True)
        return dict.__contains__(self, key)

    def __len__(self) -> int:
        self._report(_reading_step(), key_set=True)
        return dict.__len__(self)

    def __iter__(self) -> Iterator[str]:
        # Defined, so ``**group``, ``dict(group)``, ``copy()`` and ``|`` read through ``keys`` and ``[]`` (CPython copies
        # a dict whose iteration is dict's own without them).
        self._report(_reading_step(), key_set=True)
        return dict.__iter__(self)

    def __reversed__(self) -> Iterator[str]:
        self._report(_reading_step(), key_set=True)
        return dict.__reversed__(self)

    def keys(self) -> KeysView[str]:  # type: ignore[override]
        self._report(_reading_step(), key_set=True)
        return dict.keys(self)

    def values(self) -> ValuesView[Any]:  # type: ignore[override]
        self._report(_reading_step(), dict.keys(self), key_set=True)
        return dict.values(self)

    def items(self) -> ItemsView[str, Any]:  # type: ignore[override]
        self._report(_reading_step(), dict.keys(self), key_set=True)
        return dict.items(self)

    # -- writes ---------------------------------------------------------------------------------------

    def __setitem__(self, key: str, value: Any) -> None:
        trace = step_trace.current()
        if trace is not None:
            trace.entry_written(self, key, value)
        self.set_entry(key, value)
        if key not in self._hyper:
            return
        if not (_is_number(value) or isinstance(value, Tensor) or isinstance(value, tuple) and all(map(_is_number, value))):
            raise TypeError(f"param group entry {key!r} must be a number (or a tuple of numbers), got {value!r}")
        piece = _hyper_piece(value)
        slot = next((entry for entry in self.hyper_layout if entry[0] == key), None)
        tensor = self.hyper_tensor
        if tensor is None or slot is None or slot[2] != piece.shape:
            self._pack()
            return
        _, start, shape = slot
        stop = start + math.prod(shape)
        if step_trace.current() is None and isinstance(piece, np.ndarray):
            host = np.array(tensor._array)  # one read and one transfer, no op dispatched
            host[start:stop] = piece.reshape(-1)
            array = jnp.asarray(host)
        else:
            array = array_of(tensor).at[start:stop].set(piece.reshape(-1))
        _writing([tensor])
        tensor._array = array

    def set_entry(self, key: str, value: Any) -> None:
        """Set ``key`` in the dict alone, counting a change of what chooses code (``options_version``); a packed slot
        stays (a compiled step's program writes it)."""
        old = dict.get(self, key, _ABSENT)
        dict.__setitem__(self, key, value)
        if old is _ABSENT:  # a key added
            changed = True
        elif key in self._hyper:  # a number the update reads packed: a choice by its sign alone, if signed
            sign = _sign(value)
            changed = key in self._signed and (sign is None or sign != _sign(old))
        else:
            changed = (isinstance(old, _OPTION) or isinstance(value, _OPTION)) and not (
                type(old) is type(value) and old == value)
        if changed:
            self.options_version += 1

    def __delitem__(self, key: str) -> None:
        dict.__delitem__(self, key)
        self.options_version += 1

    def pop(self, key: str, *default: Any) -> Any:  # type: ignore[override]
        self._report(_reading_step(), (key,))
        if dict.__contains__(self, key):
            self.options_version += 1
        return dict.pop(self, key, *default)

    def _pack(self) -> None:
        """Lay the entries out anew, packed from their values (a new Tensor if the length changed)."""
        pieces = [(key, _hyper_piece(dict.__getitem__(self, key))) for key in self._hyper if key in self]
        layout, start = [], 0
        for key, piece in pieces:
            layout.append((key, start, piece.shape))
            start += piece.size
        flat = [piece.reshape(-1) for _, piece in pieces]
        if all(isinstance(piece, np.ndarray) for piece in flat):
            array = jnp.asarray(np.concatenate(flat))  # one transfer, no op dispatched
        else:
            array = jnp.concatenate(flat)
        self.hyper_layout = tuple(layout)
        tensor = self.hyper_tensor
        if tensor is None or tensor.shape != array.shape:
            self.hyper_tensor = Tensor(array)
        else:
            _writing([tensor])
            tensor._array = array

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def hyper_array(self) -> Any:
        """The packed hyperparameters' array (``None``: none), reported read to a step being traced."""
        tensor = self.hyper_tensor
        if tensor is None:
            return None
        trace = step_trace.current()
        if trace is not None:
            trace.read(tensor)
        return tensor._array


def _reading_step() -> Any:
    """The step being traced when the caller of the group's method calling this is the step's own code, else ``None``:
    what that code reads of the group becomes a guard of the program (NOTE [Param groups in a compiled step])."""
    trace = step_trace.current()
    return None if trace is None or _library_frame(sys._getframe(2)) else trace


def _library_frame(frame: Any) -> bool:
    """Whether ``frame`` runs xgrad's own code: its reads of a group's entries are the packed hyperparameters'
    (a program input), the update's options (``options_version``) or a scheduler's, on the host."""
    return str(frame.f_globals.get("__name__", "")).partition(".")[0] == "xgrad"


def unpacked_hyper(layout: tuple[tuple[str, int, tuple[int, ...]], ...], packed: Any) -> dict[str, Any]:
    """The hyperparameters packed in ``packed`` as ``_ParamGroup.hyper_layout`` places them, by name (inside the update's program)."""
    return {key: packed[start:start + math.prod(shape)].reshape(shape) for key, start, shape in layout}


def _param_list(params: Any) -> list[Any]:
    """PyTorch's reading of one group's ``params``: a tensor, or an ordered collection of them."""
    if isinstance(params, Tensor):
        return [params]
    if isinstance(params, set):
        raise TypeError(
            "optimizer parameters need to be organized in ordered collections, but the ordering of tensors in sets "
            "will change between runs. Please use a list instead."
        )
    if isinstance(params, Mapping):
        return list(params.values())
    return [p[1] if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) else p for p in params]


def _placed_like(array: Any, param: Tensor) -> jax.Array:
    """``array`` on the parameter's devices: sharded as the parameter if it has its shape, else replicated."""
    sharding = param._array.sharding
    array = jnp.asarray(array)
    if array.shape != param.shape:
        sharding = scalar_sharding(sharding)
        if sharding is None:
            return array
    return jax.device_put(array, sharding)


def _group_step(
    update: Callable[..., tuple[Any, dict[str, Any]]], options: tuple[tuple[str, Any], ...],
    layout: tuple[tuple[str, int, tuple[int, ...]], ...], packed: Any, params: list[Any], grads: list[Any],
    states: list[dict[str, Any]], counters: dict[str, Any],
) -> tuple[list[Any], list[dict[str, Any]], dict[str, Any]]:
    """One group's update, parameter by parameter, as one jitted program.

    ``packed`` holds its hyperparameters, placed by ``layout`` (``_ParamGroup.hyper_layout``);
    ``counters`` are the group's shared counters (NOTE [Shared counters]), each passed once
    for all parameters and returned once: the first parameter's new value."""
    opts = dict(options)
    hyper = unpacked_hyper(layout, packed)
    results = [update(opts, hyper, p, g, {**s, **counters}) for p, g, s in zip(params, grads, states, strict=True)]
    new_counters = {key: results[0][1][key] for key in counters}
    return [r[0] for r in results], [{k: v for k, v in r[1].items() if k not in counters} for r in results], new_counters


@functools.cache
def _jitted_group_step() -> FastJit:
    """``_group_step`` jitted, made at the first step: its compiler options are asked of XLA (NOTE [Fast compiles])."""
    return FastJit(_group_step, static_argnums=(0, 1, 2))


class Optimizer:
    """``torch.optim.Optimizer``: parameter groups, per-parameter ``state``, ``step``, ``zero_grad``, state dicts.

    A subclass names its numeric hyperparameters (``_hyper``), makes a parameter's
    initial state (``_init_state``) and gives the update of one parameter
    (``_update(options, hyper, param, grad, state) -> (param, state)``, a pure JAX
    function: ``hyper`` holds arrays, ``options`` the other group entries).
    """

    _hyper: ClassVar[tuple[str, ...]] = ()
    # Those of ``_hyper`` whose sign also chooses code (``momentum``: whether a ``momentum_buffer`` exists).
    _signed_hyper: ClassVar[tuple[str, ...]] = ()
    _hidden_state: ClassVar[frozenset[str]] = frozenset()  # state kept for the update that PyTorch does not save

    def __init__(self, params: Any, defaults: dict[str, Any]) -> None:
        if defaults.get("differentiable"):
            raise NotImplementedError(
                "differentiable=True is not supported: differentiate through an update with xgrad.func or jax.grad "
                "of a pure function instead"
            )
        self.defaults = defaults
        self.state: defaultdict[Tensor, dict[str, Tensor]] = defaultdict(dict)
        self._fresh_counters: dict[tuple[Any, ...], jax.Array] = {}
        self._written = WrittenArrays()  # per parameter, keyed by id (NOTE [Unmoved parameters] in written.py)
        self.param_groups: list[_ParamGroup] = []
        if isinstance(params, Tensor):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or dicts, but got "
                f"{type(params).__module__}.{type(params).__name__}"
            )
        groups = list(params)  # a dict gives its keys, which add_param_group refuses, as PyTorch does
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def __getstate__(self) -> dict[str, Any]:
        # The caches keyed by the ids of arrays and parameters mean nothing in a copy (and hold weak references).
        state = self.__dict__.copy()
        state["_fresh_counters"], state["_written"] = {}, WrittenArrays()
        return state

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {key}: {group[key]}" for key in sorted(group) if key != "params"]
        return "\n".join([*lines, ")"])

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters with its own hyperparameters (the defaults fill in the rest)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = _param_list(param_group["params"])
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but one of the params is {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        entries = dict(param_group, params=params)
        for name, default in self.defaults.items():
            entries.setdefault(name, default)
        if len({id(p) for p in params}) != len(params):
            warnings.warn(
                "optimizer contains a parameter group with duplicate parameters; in future, this will cause an error; "
                "see github.com/pytorch/pytorch/issues/40967 for more information",
                stacklevel=3,
            )
        known = {id(p) for group in self.param_groups for p in group["params"]}
        if any(id(p) in known for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        group = _ParamGroup(self._hyper, entries, self._signed_hyper)
        self.param_groups.append(group)
        for p in params:
            # Committed to the device it is on, as the update's outputs are: an uncommitted
            # parameter (``jax.random``, a factory on the default device) made every op of
            # the second step compile again, for committed inputs (the demo's Adam: 0.9 s).
            # A buffer of its own: a committed twin of the array would let a compiled step
            # donating it consume the array the user, or another tensor, still holds.
            if not getattr(p._array, "committed", True):
                p._array = jax.device_put(p._array, p._array.sharding, may_alias=False)
            self._ensure_state(p, group)

    # -- state --------------------------------------------------------------------------

    def _state_keys(self, group: dict[str, Any]) -> set[str]:
        """The state entries a parameter of ``group`` has (some depend on the group's entries)."""
        return set()

    def _init_state(self, param: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        """The state of ``param`` before its first step (arrays): PyTorch's names and initial values."""
        return {}

    def _ensure_state(self, param: Tensor, group: dict[str, Any]) -> None:
        """Give ``param`` the state entries its group's entries call for (made when they change). An entry they no
        longer call for (momentum set to zero) stays as it is, unread, and resumes when called for again, as in
        PyTorch."""
        state = self.state[param]
        keys = self._state_keys(group)
        if keys <= state.keys():
            return
        # Outside a step being traced, from concrete values (one traced again for a changed ``momentum``): state
        # the program reads and writes, as eager's, not a constant of it.
        with step_trace.outside(), jax.ensure_compile_time_eval():
            for key, value in self._init_state(param, group).items():
                if key in keys and key not in state:
                    array = _placed_like(value, param)
                    if key in _OWN_DTYPE:  # one array for the group's fresh counters of this value (NOTE [Shared counters])
                        fresh = (id(group), key, float(value), array.dtype, array.sharding)  # ``value``: local, readable
                        array = self._fresh_counters.setdefault(fresh, array)
                    state[key] = Tensor(array)

    def _follow_param(self, param: Tensor, state: dict[str, Tensor]) -> None:
        """Move ``param``'s state to where ``param`` now is, in its dtype (``module.to`` since the state was made)."""
        sharding = param._array.sharding
        for key, t in state.items():
            if key not in _OWN_DTYPE and t.shape == param.shape and t.dtype != param.dtype:
                t._array = t._array.astype(param.dtype)
            target = sharding if t.shape == param.shape else scalar_sharding(sharding)
            if target is not None and not t._array.sharding.is_equivalent_to(target, t.ndim):
                t._array = jax.device_put(t._array, target)

    # -- the step -----------------------------------------------------------------------

    @staticmethod
    def _update(options: dict[str, Any], hyper: dict[str, Any], param: Any, grad: Any, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        raise NotImplementedError

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a ``.grad``; returns ``closure()``'s loss (called first, with grad enabled)."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        trace = step_trace.current()
        for group in self.param_groups:
            stepped = []
            for p in group["params"]:
                if trace is not None:  # a step being traced finds the parameters and grads here (NOTE [The step-trace seam])
                    trace.grad_read(p)
                    trace.read(p)
                if p._grad is None or not p.requires_grad:
                    continue
                self._ensure_state(p, group)
                state = self.state[p]
                if trace is None:
                    if not self._written.unchanged(id(p), [p._array, *(t._array for t in state.values())]):
                        self._follow_param(p, state)
                else:
                    if not any(isinstance(t._array, jax.core.Tracer) for t in (p, *state.values())):
                        # Eagerly, as an eager step moves it: a traced step starts from the moved state.
                        with jax.ensure_compile_time_eval():
                            self._follow_param(p, state)
                    trace.read(p._grad)
                    for t in state.values():
                        trace.read(t)
                stepped.append(p)
            if stepped:
                self._step_group(group, stepped)
        return loss

    def _step_group(self, group: _ParamGroup, params: list[Tensor]) -> None:
        options = tuple(sorted((k, v) for k, v in group.items() if isinstance(v, _OPTION)))
        trace = step_trace.current()
        if trace is not None:  # the options are static arguments: a compiled step checks them at every call
            trace.entry_read(group, None, group.options_version)
        # The entries this update reads and writes: a state holds them all (``_ensure_state``), and more only after
        # its group stopped calling for one, which stays as it is.
        active = self._state_keys(group)
        states = [self.state[p] for p in params]
        states = [s if len(s) == len(active) else {k: t for k, t in s.items() if k in active} for s in states]
        # NOTE [Shared counters]
        # The parameters of a group step together, so their step counts (and NAdam's
        # ``mu_product``) usually hold one value: they start as one array per group (groups
        # may step apart), and counters that hold one array before this update hold the
        # first one's result after it (each is a function of itself and the group's
        # hyperparameters, so all results are equal). The update takes and gives such a
        # counter once, not once per parameter (the demo's Adam: 5 fewer outputs, each an
        # allocation), and a compiled step reads and writes one counter. One set apart (a
        # loaded state dict, an in-place change) just keeps its own array.
        shared = [
            key for key in _OWN_DTYPE
            if key in states[0] and all(key in s and s[key]._array is states[0][key]._array for s in states)
        ]
        program = _jitted_group_step()
        new_params, new_states, new_counters = (program.plain if trace is not None else program)(
            type(self)._update, options, group.hyper_layout, group.hyper_array(), [p._array for p in params],
            [p._grad._array for p in params],  # type: ignore[union-attr]
            [{k: t._array for k, t in s.items() if k not in shared} for s in states],
            {key: states[0][key]._array for key in shared},
        )
        # A direct rebind of each parameter and state Tensor: no op recorded, as under no_grad.
        _writing(params)
        for p, new in zip(params, new_params, strict=True):
            p._array = new
            p._version += 1
        for state, new_state in zip(states, new_states, strict=True):
            _writing(list(state.values()))
            for key, t in state.items():
                t._array = new_counters[key] if key in new_counters else new_state[key]
        if trace is None:
            for p in params:
                self._written.record(id(p), [p._array, *(t._array for t in self.state[p].values())])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's ``.grad`` (to ``None``, or to zeros)."""
        clear_grads([p for group in self.param_groups for p in group["params"]], set_to_none)

    # -- state dicts --------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's layout: ``{"state": {index: {name: Tensor}}, "param_groups": [{..., "params": [index, ...]}]}``.

        Parameters are numbered in group order; a parameter that never stepped has no
        entry, as in PyTorch. The Tensors are snapshots: later steps do not change them.
        """
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            ids = [index.setdefault(id(p), len(index)) for p in group["params"]]
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        state: dict[int, dict[str, Tensor]] = {}
        for group in self.param_groups:
            for p in group["params"]:
                saved = {k: _snapshot(v) for k, v in self.state.get(p, {}).items() if k not in self._hidden_state}
                if saved and self._has_stepped(self.state[p]):
                    state[index[id(p)]] = saved
        return {"state": state, "param_groups": groups}

    def _has_stepped(self, state: dict[str, Tensor]) -> bool:
        return "step" not in state or float(state["step"]._array) > 0

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a state dict in PyTorch's layout (from ``state_dict()``, or PyTorch's with arrays for tensors).

        Each state array is cast to its parameter's dtype (``step`` keeps its own) and
        placed on the parameter's devices, sharded as the parameter for arrays of its shape.
        """
        saved_groups = list(state_dict["param_groups"])
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for group, saved in zip(self.param_groups, saved_groups, strict=True):
            if len(group["params"]) != len(saved["params"]):
                raise ValueError(
                    "loaded state dict contains a parameter group that doesn't match the size of optimizer's group"
                )
        saved_state = {int(k): v for k, v in state_dict["state"].items()}
        for group, saved in zip(self.param_groups, saved_groups, strict=True):
            group.update({k: tuple(v) if isinstance(v, list) else v for k, v in saved.items() if k != "params"})
            for p, i in zip(group["params"], saved["params"], strict=True):
                self._load_param_state(p, group, saved_state.get(int(i), {}))

    def _load_param_state(self, param: Tensor, group: dict[str, Any], saved: Mapping[str, Any]) -> None:
        self.state.pop(param, None)
        self._ensure_state(param, group)  # entries the dict lacks start fresh, as a parameter that never stepped
        state = self.state[param]
        for key, value in saved.items():
            if key not in state or value is None:
                continue
            array = loaded_value(value)
            dtype = state[key].dtype if key in _OWN_DTYPE else param.dtype
            state[key]._array = _placed_like(jnp.asarray(array, dtype=dtype), param)
        self._loaded(state, saved)

    def _loaded(self, state: dict[str, Tensor], saved: Mapping[str, Any]) -> None:
        """Set state PyTorch does not save from what it does (SGD's step count)."""


# -- argument checks shared by the optimizers, in PyTorch's words ------------------------------


def _snapshot(value: Any) -> Any:
    """A state value as a state dict holds it: Tensors that later steps leave alone."""
    if isinstance(value, Tensor):
        return Tensor(value._array)
    if isinstance(value, jax.Array):
        return Tensor(value)
    if isinstance(value, list):
        return [_snapshot(v) for v in value]
    return value


def loaded_value(value: Any) -> Any:
    """A state dict's value as state holds it: arrays for Tensors and NumPy arrays, lists item by item."""
    if isinstance(value, Tensor):
        return value._array
    if isinstance(value, np.ndarray):
        return jnp.asarray(value)
    if isinstance(value, list):
        return [loaded_value(v) for v in value]
    return value


def check_nonnegative(name: str, value: Any) -> None:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"Tensor {'lr' if name == 'learning rate' else name} must be 1-element")
        value = value.item()
    if not value >= 0.0:
        raise ValueError(f"Invalid {name}: {value}")


def check_betas(betas: tuple[float, float]) -> None:
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {beta}")


def step_of(state: dict[str, Any], dtype: Any) -> tuple[Any, Any]:
    """The incremented step count (kept in its own dtype) and its value in ``dtype`` for the update."""
    step = state["step"] + 1
    return step, step.astype(dtype)


def scalar_state(dtype: Any = jnp.float32) -> jax.Array:
    """A fresh per-parameter scalar (``step``), float32 as PyTorch's default scalar type."""
    return jnp.zeros((), dtype)


"""Whole-object checkpoints (``xgrad.save(model, "model.pt")``) read back by an allow-list unpickler.

# NOTE [Restricted pickles]
# PyTorch programs save whole models and load them with ``torch.load(f, weights_only=True)``
# under ``torch.serialization.safe_globals([MyModel])``. xgrad writes such an object as a
# zip archive: ``data.pkl``, a pickle of the object in which every Tensor (a Parameter
# marked as such), ``jax.Array`` and random-key state is a persistent id naming an array
# stored beside it as an ``.npy`` member. The pickle itself then needs no NumPy or JAX
# globals. ``RestrictedUnpickler`` runs the pickle's opcodes itself (those of protocols
# 2 to 5 that build data and objects; any other opcode is refused) and resolves a name
# only from a fixed table, never by importing it: container builtins, xgrad's dtypes,
# xgrad's own ``nn.Module`` subclasses (found among ``Module``'s subclasses) and the
# classes the user allow-listed (``add_safe_globals``/``safe_globals``). Anything else
# (``os.system``, ``builtins.eval``, a class nobody listed, a module nobody imported) is
# refused with PyTorch's advice before anything of it is imported or called.
# A class is never called (its ``__init__`` never runs): ``REDUCE`` or ``NEWOBJ`` of a
# class makes ``cls.__new__(cls, *args)`` (``copyreg.__newobj__``), and ``BUILD`` then
# gives it its state (``__setstate__``, else its ``__dict__``), as pickle restores any
# object; so ``REDUCE TransformerEncoder(layer, 100000)`` builds no layer at all. (A
# user's class whose ``__reduce__`` needs its constructor: allow-list a function that
# builds one instead; a function the user allow-listed is called, as PyTorch's loader
# calls one.) BUILD reaches only objects the file made (not a class, nor the shared
# ``xgrad.float32``). A
# builtin is called only with arguments whose cost the file's size bounds (``bytes`` is
# never given a size, ``list``/``set`` never a lazy ``range``), and dict keys and set
# items must hash in time linear in their size (strings, bytes, integers below the hash
# modulus, objects hashed by identity, flat tuples of these): a nested tuple can hash in
# time exponential in its depth, and crafted integers can all land in one hash bucket.
# A memo lets a pickle name one large collection over and over for a few bytes each:
# the items builtins copy, tuple keys hash and BUILDs set are charged to a budget of
# one per byte of the pickle, so that work stays linear in the file too.
#
# NOTE [Loader limits]
# What a file can make ``load_pickled`` allocate is bounded by the file's size. Before
# reading a member, the archive's members may declare together at most
# ``MAX_EXPANSION`` times the file's size (plus ``EXPANSION_ALLOWANCE``) uncompressed:
# xgrad stores members uncompressed, and a zip bomb inflates a thousandfold. The pickle
# member may declare at most ``MAX_PICKLE_BYTES`` (it holds structure only: a module
# costs 100 to 200 bytes of it, so 4 MiB holds some 20,000 modules). Each of its bytes
# can make an object of up to about 70 bytes (an empty list on the stack), in about 2 µs
# with the cyclic GC's passes: a hostile 4 MiB pickle costs some 300 MB and 8 s at most
# (CPython's C unpickler takes 3 s over the same bytes). Members are read in chunks
# against their declared sizes, never beyond them (``zipfile`` stops there and checks
# the CRC-32); a member that holds fewer bytes than it declares, or an ``.npy`` whose
# header describes another size, is refused before its array is allocated.
# ``xgrad.load`` reports every refusal, and every corrupt or truncated archive, as
# ``xgrad.serialization.RestrictedUnpicklingError`` naming the file.
"""

from __future__ import annotations

import _compat_pickle
import collections
import contextlib
import io
import math
import os
import pickle
import struct
import sys
import zipfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

import jax
import numpy as np

from xgrad.generator import KeyState
from xgrad.tensor import Tensor
from xgrad.tensor.dtypes import DTYPES
from xgrad.tensor.dtypes import dtype as xgrad_dtype

__all__ = [
    "ERR_UNSAFE_GLOBAL", "EXPANSION_ALLOWANCE", "MAX_EXPANSION", "MAX_PICKLE_BYTES", "PICKLE_MEMBER",
    "RestrictedUnpickler", "add_safe_globals", "clear_safe_globals", "get_safe_globals", "load_pickled",
    "safe_globals", "save_pickled",
]

PICKLE_MEMBER = "xgrad_archive/data.pkl"
_ARRAYS = "xgrad_archive/arrays/"

#: The most bytes the pickle member of a whole-object checkpoint may hold (NOTE [Loader limits]).
MAX_PICKLE_BYTES = 4 * 2**20
#: The archive's members may hold at most this many times the file's size uncompressed, plus ``EXPANSION_ALLOWANCE``.
MAX_EXPANSION = 8
EXPANSION_ALLOWANCE = 2**20
_CHUNK = 16 * 2**20  # an array member is read this much at a time

ERR_UNSAFE_GLOBAL = (
    "Weights only load failed: xgrad.load rebuilds only allow-listed classes (it never runs arbitrary pickled "
    "code). Unsupported global: GLOBAL {name} was not an allowed global by default. Please use "
    "`xgrad.serialization.add_safe_globals([{name}])` or the `xgrad.serialization.safe_globals([{name}])` context "
    "manager to allowlist this global if you trust this class/function."
)
ERR_NOT_ARCHIVE = (
    "it is not a whole-object checkpoint that xgrad.save wrote ({why}); for the other formats the file name must end "
    "in .npz or .safetensors. A PyTorch .pt file is neither: save its state_dict as safetensors in PyTorch and load that"
)

# Builtins a pickle of plain containers and numbers may name, and the argument types each may be called with:
# none whose cost the file's size does not bound (NOTE [Restricted pickles]).
_SCALARS: tuple[type, ...] = (type(None), bool, int, float, complex, str, bytes, bytearray)
_COLLECTIONS: tuple[type, ...] = (list, tuple, dict, collections.OrderedDict, set, frozenset)
_ARGUMENTS: dict[Any, tuple[type, ...]] = {
    **dict.fromkeys((bool, int, float, complex, str), _SCALARS),
    **dict.fromkeys((bytes, bytearray), (str, bytes, bytearray, list, tuple)),  # never an int: a size
    **dict.fromkeys((list, tuple, set, frozenset, dict, collections.OrderedDict), _COLLECTIONS),
    slice: (type(None), int),
    range: (int,),
}
_HASHED_ARGUMENTS = (set, frozenset, dict, collections.OrderedDict)
_SIZED = frozenset({str, bytes, bytearray, *_COLLECTIONS})
_NAMED: dict[tuple[str, str], Any] = {
    **{("builtins", f.__name__): f for f in _ARGUMENTS if f.__module__ == "builtins"},
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("xgrad.tensor.dtypes", "dtype"): xgrad_dtype,
}
_NAMED.update({  # the Python 2 names that protocol 2 writes (``__builtin__.xrange``), as pickle maps them
    _compat_pickle.REVERSE_NAME_MAPPING.get(key, (_compat_pickle.REVERSE_IMPORT_MAPPING.get(key[0], key[0]), key[1])): f
    for key, f in list(_NAMED.items())
})
_INT_HASH_MODULUS = sys.hash_info.modulus  # 2**61 - 1 on 64-bit builds: below it an int hashes to itself

_user_safe_globals: list[Any] = []


def add_safe_globals(safe_globals: list[Any]) -> None:
    """Allow ``xgrad.load`` to rebuild these classes (or functions), as PyTorch's ``add_safe_globals``."""
    _user_safe_globals.extend(safe_globals)


def get_safe_globals() -> list[Any]:
    return list(_user_safe_globals)


def clear_safe_globals() -> None:
    _user_safe_globals.clear()


@contextlib.contextmanager
def safe_globals(safe_globals: list[Any]) -> Iterator[None]:
    """Within the block, also allow these classes (as PyTorch's ``torch.serialization.safe_globals``)."""
    count = len(_user_safe_globals)
    _user_safe_globals.extend(safe_globals)
    try:
        yield
    finally:
        del _user_safe_globals[count:]


def _qualified(obj: Any) -> tuple[str, str]:
    return getattr(obj, "__module__", ""), getattr(obj, "__qualname__", getattr(obj, "__name__", ""))


class _Pickler(pickle.Pickler):
    """Pickles ``obj`` with its arrays out of band (NOTE [Restricted pickles])."""

    def __init__(self, file: BinaryIO) -> None:
        super().__init__(file, protocol=4)
        self.arrays: dict[str, np.ndarray] = {}
        self.ids: dict[int, Any] = {}  # an object met twice (a tied parameter) is one stored object

    def persistent_id(self, obj: Any) -> Any:
        if id(obj) in self.ids:
            return self.ids[id(obj)][0]
        pid = self._persistent_id(obj)
        if pid is not None:
            self.ids[id(obj)] = (pid, obj)  # obj held, so its id stays its own while pickling
        return pid

    def _store(self, array: Any) -> str:
        name = f"{len(self.arrays)}.npy"
        self.arrays[name] = np.asarray(array)
        return name

    def _persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Tensor):
            from xgrad.nn.module import Parameter

            kind = "parameter" if isinstance(obj, Parameter) else "tensor"
            return (kind, self._store(obj.array), obj.requires_grad)
        if isinstance(obj, jax.Array) and not jax.dtypes.issubdtype(obj.dtype, jax.dtypes.prng_key):
            return ("array", self._store(obj))
        if isinstance(obj, KeyState):
            key = obj.get()
            return ("keystate", self._store(jax.random.key_data(key)), str(jax.random.key_impl(key)))
        if isinstance(obj, np.ndarray) and obj.dtype.kind not in "OV":
            return ("ndarray", self._store(obj))
        return None


def save_pickled(obj: Any, f: Any) -> None:
    """Write ``obj`` (a model, an optimizer state, any picklable object of allow-listable classes) to ``f``."""
    stream = io.BytesIO()
    pickler = _Pickler(stream)
    pickler.dump(obj)
    with zipfile.ZipFile(f, "w") as archive:
        archive.writestr(PICKLE_MEMBER, stream.getvalue())
        for name, array in pickler.arrays.items():
            buffer = io.BytesIO()
            np.save(buffer, array, allow_pickle=False)
            archive.writestr(_ARRAYS + name, buffer.getvalue())


def _xgrad_module_classes() -> dict[tuple[str, str], type]:
    """xgrad's own ``nn.Module`` classes by the name a pickle gives them, found without importing anything."""
    from xgrad.nn.module import Module

    found: dict[tuple[str, str], type] = {}
    todo: list[type] = [Module]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("xgrad."):
            found[(cls.__module__, cls.__qualname__)] = cls
        todo.extend(cls.__subclasses__())
    return found


def _cheap_to_hash(key: Any, nested: bool = True) -> bool:
    """Whether hashing ``key`` takes time linear in its size and cannot be made to collide (NOTE [Restricted pickles])."""
    kind = type(key)
    if kind in (str, bytes, bool, type(None), xgrad_dtype) or kind.__hash__ is object.__hash__:
        return True
    if kind is int:
        return bool(-_INT_HASH_MODULUS < key < _INT_HASH_MODULUS)
    return nested and kind in (tuple, frozenset) and all(_cheap_to_hash(item, nested=False) for item in key)


class RestrictedUnpickler:
    """Runs a pickle, rebuilding only allow-listed classes, never by calling them (NOTE [Restricted pickles]).

    ``arrays(name)`` reads the stored array that a persistent id names. With ``tensors=False``
    stored Tensors come back as their ``jax.Array``s (``xgrad.load(..., arrays=True)``): made
    here, not by a pass over the result, which could visit an object shared in a file
    exponentially many times.
    """

    def __init__(self, data: bytes, arrays: Callable[[str], np.ndarray], device: Any, tensors: bool = True) -> None:
        self.data = data
        self.pos = 0
        self.arrays = arrays
        self.device = device
        self.tensors = tensors  # False: a stored Tensor comes back as its jax.Array
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []  # the stacks that MARK set aside
        self.memo: dict[int, Any] = {}
        self.loaded: dict[str, Any] = {}
        self.made: dict[int, Any] = {}  # what NEWOBJ made, by id: only these get a state (BUILD)
        self.work = len(data)  # items that builtins may copy and BUILDs set, in all (NOTE [Restricted pickles])
        self.module_classes: dict[tuple[str, str], type] | None = None

    # -- reading the pickle ------------------------------------------------------------
    def _read(self, count: int) -> bytes:
        end = self.pos + count
        if count < 0 or end > len(self.data):
            raise pickle.UnpicklingError("the pickle is truncated")
        chunk = self.data[self.pos:end]
        self.pos = end
        return chunk

    def _uint(self, size: int) -> int:
        return int.from_bytes(self._read(size), "little")

    def _line(self) -> str:
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            raise pickle.UnpicklingError("the pickle is truncated")
        return self._read(end + 1 - self.pos)[:-1].decode("utf-8")

    def _spend(self, values: Iterable[Any]) -> None:
        """Charge the items of the collections among ``values`` to the pickle's work budget."""
        self.work -= sum(len(value) for value in values if type(value) in _SIZED)
        if self.work < 0:
            raise pickle.UnpicklingError(
                "the pickle makes builtins copy, or objects take as their state, more items than it holds (one "
                "collection over and over)")

    def _check_keys(self, keys: Iterable[Any]) -> None:
        """Dict keys and set items must hash in linear time, and a tuple's hash (never cached) is paid for."""
        for key in keys:
            if not _cheap_to_hash(key):
                raise pickle.UnpicklingError(
                    f"a dict key or set item of type {type(key).__name__} is refused: keys must be strings, bytes, "
                    f"integers below {_INT_HASH_MODULUS}, objects hashed by identity, or flat tuples of these")
            if type(key) is tuple:
                self._spend((key,))

    def _check_arguments(self, func: Any, args: tuple[Any, ...]) -> None:
        """``func`` (a builtin of ``_ARGUMENTS``) may be called with ``args`` at a cost the file's size bounds."""
        allowed = _ARGUMENTS[func]
        self._spend(args)
        for arg in args:
            if type(arg) not in allowed:
                raise pickle.UnpicklingError(f"{func.__name__}() of a {type(arg).__name__} is refused")
            if func in _HASHED_ARGUMENTS and not isinstance(arg, (dict, set, frozenset)):
                self._check_keys(item[0] if isinstance(item, (tuple, list)) and func not in (set, frozenset) else item
                                 for item in arg)

    def _pop_mark(self) -> list[Any]:
        items = self.stack
        self.stack = self.marks.pop()
        return items

    def load(self) -> Any:
        ops, data, end = _OPS, self.data, len(self.data)
        while True:
            if self.pos >= end:
                raise pickle.UnpicklingError("the pickle is truncated")
            code = data[self.pos]
            self.pos += 1
            op = ops.get(code)
            if op is None:
                raise pickle.UnpicklingError(f"pickle opcode {bytes([code])!r} at byte {self.pos - 1} is not supported")
            if op is _stop:
                return self.stack.pop()
            op(self)

    # -- names and objects -------------------------------------------------------------
    def find_class(self, module: str, name: str) -> Any:
        """The allowed object a pickle names ``module.name``; nothing is imported (NOTE [Restricted pickles])."""
        if not isinstance(module, str) or not isinstance(name, str):
            raise pickle.UnpicklingError("a global's module and name must be strings")
        if (module, name) in _NAMED:
            return _NAMED[(module, name)]
        for allowed in _user_safe_globals:
            if _qualified(allowed) == (module, name):
                return allowed
        if self.module_classes is None:
            self.module_classes = _xgrad_module_classes()
        if (module, name) in self.module_classes:
            return self.module_classes[(module, name)]
        raise pickle.UnpicklingError(ERR_UNSAFE_GLOBAL.format(name=f"{module}.{name}"))

    def _new(self, cls: Any, args: Any, kwargs: Any) -> Any:
        """``cls.__new__(cls, *args, **kwargs)``: an object the way pickle restores one, its constructor never run."""
        if not isinstance(cls, type) or not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise pickle.UnpicklingError("NEWOBJ needs a class, a tuple of arguments and a dict of keywords")
        if cls is xgrad_dtype:
            return self._call(cls, args)
        if cls in _ARGUMENTS:
            self._check_arguments(cls, (*args, *kwargs.values()))
        obj: Any = cls.__new__(cls, *args, **kwargs)
        self.made[id(obj)] = obj
        return obj

    def _call(self, func: Any, args: Any) -> Any:
        """REDUCE: a builtin called with bounded arguments, a class made as by ``_new``, or an allow-listed function."""
        if not isinstance(args, tuple):
            raise pickle.UnpicklingError("REDUCE needs a tuple of arguments")
        if func is xgrad_dtype:
            if len(args) != 1 or not isinstance(args[0], str) or args[0] not in DTYPES:
                raise pickle.UnpicklingError("xgrad.dtype() of anything but a dtype's name is refused")
            return DTYPES[args[0]]
        if func in _ARGUMENTS:
            self._check_arguments(func, args)
            return func(*args)
        if isinstance(func, type):
            return self._new(func, args, {})
        return func(*args)  # a function the user allow-listed

    def _build(self, obj: Any, state: Any) -> None:
        """BUILD: ``obj`` gets ``state`` as pickle gives it (``__setstate__``, else its ``__dict__`` and slots).

        Only an object this pickle made: else a file could set attributes of a class, or of ``xgrad.float32``.
        """
        if self.made.get(id(obj)) is not obj:
            raise pickle.UnpicklingError(f"BUILD of a {type(obj).__name__} the pickle did not make is refused")
        setstate = getattr(type(obj), "__setstate__", None)
        if setstate is not None:
            setstate(obj, state)
            return
        slots = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slots = state
        self._spend((state, slots))
        for part in (state, slots):
            if part is not None and not (isinstance(part, dict) and all(type(k) is str for k in part)):
                raise pickle.UnpicklingError(f"the state of a {type(obj).__name__} must be a dict of attribute names")
        if state:
            vars(obj).update(state)
        for name, value in (slots or {}).items():
            setattr(obj, name, value)

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) >= 2 and isinstance(pid[1], str)):
            raise pickle.UnpicklingError(f"a persistent id must be a tuple (kind, name, ...), not a {type(pid).__name__}")
        name = pid[1]
        if name not in self.loaded:
            self.loaded[name] = self._rebuild(*pid)
        return self.loaded[name]

    def _rebuild(self, kind: Any, name: str, *rest: Any) -> Any:
        extras = {"ndarray": 0, "array": 0, "keystate": 1, "parameter": 1, "tensor": 1}
        if not isinstance(kind, str) or extras.get(kind) != len(rest):
            raise pickle.UnpicklingError(f"stored object {name[:80]!r} has an unknown kind or the wrong fields")
        values = self.arrays(name)
        if kind == "ndarray":
            return values
        array = jax.device_put(values, self.device) if self.device is not None else jax.numpy.asarray(values)
        if kind == "array" or (kind != "keystate" and not self.tensors):
            return array
        if kind == "keystate":
            return KeyState(jax.random.wrap_key_data(array, impl=rest[0]))
        if not isinstance(rest[0], bool):
            raise pickle.UnpicklingError(f"requires_grad of {name!r} is not a bool")
        if kind == "parameter":
            from xgrad.nn.module import Parameter

            return Parameter(array, requires_grad=rest[0])
        return Tensor(array, requires_grad=rest[0])


# -- the opcodes RestrictedUnpickler runs -------------------------------------------------
Op = Callable[[RestrictedUnpickler], None]


def _stop(u: RestrictedUnpickler) -> None:
    """STOP: ``load`` returns the top of the stack."""


def _push(value: Callable[[RestrictedUnpickler], Any]) -> Op:
    return lambda u: u.stack.append(value(u))


def _target(u: RestrictedUnpickler, kind: type) -> Any:
    obj = u.stack[-1]
    if not isinstance(obj, kind):
        raise pickle.UnpicklingError(f"cannot add items of a {kind.__name__} to a {type(obj).__name__}")
    return obj


def _mark(u: RestrictedUnpickler) -> None:
    u.marks.append(u.stack)
    u.stack = []


def _tuple_of(count: int) -> Op:
    def op(u: RestrictedUnpickler) -> None:
        if len(u.stack) < count:
            raise pickle.UnpicklingError("the pickle's stack is shorter than a tuple it builds")
        items = tuple(u.stack[len(u.stack) - count:])
        del u.stack[len(u.stack) - count:]
        u.stack.append(items)

    return op


def _tuple(u: RestrictedUnpickler) -> None:
    items = u._pop_mark()  # before u.stack is read: it is the stack below the mark from here on
    u.stack.append(tuple(items))


def _frozenset(u: RestrictedUnpickler) -> None:
    items = u._pop_mark()
    u._check_keys(items)
    u.stack.append(frozenset(items))


def _append(u: RestrictedUnpickler) -> None:
    value = u.stack.pop()
    _target(u, list).append(value)


def _appends(u: RestrictedUnpickler) -> None:
    items = u._pop_mark()
    _target(u, list).extend(items)


def _set_items(u: RestrictedUnpickler, items: list[Any]) -> None:
    u._check_keys(items[::2])
    target = _target(u, dict)
    for key, value in zip(items[::2], items[1::2], strict=True):
        target[key] = value


def _add_items(u: RestrictedUnpickler) -> None:
    items = u._pop_mark()
    u._check_keys(items)
    _target(u, set).update(items)


def _get(size: int) -> Op:
    def op(u: RestrictedUnpickler) -> None:
        key = u._uint(size)
        if key not in u.memo:
            raise pickle.UnpicklingError(f"the pickle reads memo entry {key}, which it never stored")
        u.stack.append(u.memo[key])

    return op


def _put(size: int) -> Op:
    return lambda u: u.memo.__setitem__(u._uint(size), u.stack[-1])


def _stack_global(u: RestrictedUnpickler) -> None:
    name = u.stack.pop()
    module = u.stack.pop()
    u.stack.append(u.find_class(module, name))


def _reduce(u: RestrictedUnpickler) -> None:
    args = u.stack.pop()
    u.stack[-1] = u._call(u.stack[-1], args)


def _newobj(u: RestrictedUnpickler) -> None:
    args = u.stack.pop()
    u.stack.append(u._new(u.stack.pop(), args, {}))


def _newobj_ex(u: RestrictedUnpickler) -> None:
    kwargs = u.stack.pop()
    args = u.stack.pop()
    u.stack.append(u._new(u.stack.pop(), args, kwargs))


def _build(u: RestrictedUnpickler) -> None:
    state = u.stack.pop()
    u._build(u.stack[-1], state)


def _proto(u: RestrictedUnpickler) -> None:
    version = u._uint(1)
    if version > pickle.HIGHEST_PROTOCOL:
        raise pickle.UnpicklingError(f"unsupported pickle protocol {version}")


def _text(size: int) -> Callable[[RestrictedUnpickler], Any]:
    return lambda u: str(u._read(u._uint(size)), "utf-8", "surrogatepass")


def _signed(u: RestrictedUnpickler, size: int) -> int:
    return int.from_bytes(u._read(size), "little", signed=True)


_OPS: dict[int, Op] = {code[0]: op for code, op in {
    pickle.PROTO: _proto,
    pickle.FRAME: lambda u: u._read(8) and None,  # frames only help a streaming reader; the pickle is in memory
    pickle.STOP: _stop,
    pickle.MARK: _mark,
    pickle.POP: lambda u: u.stack.pop() if u.stack else u._pop_mark(),
    pickle.POP_MARK: lambda u: u._pop_mark() and None,
    pickle.DUP: _push(lambda u: u.stack[-1]),
    pickle.NONE: _push(lambda u: None),
    pickle.NEWTRUE: _push(lambda u: True),
    pickle.NEWFALSE: _push(lambda u: False),
    pickle.BININT: _push(lambda u: _signed(u, 4)),
    pickle.BININT1: _push(lambda u: u._uint(1)),
    pickle.BININT2: _push(lambda u: u._uint(2)),
    pickle.LONG1: _push(lambda u: _signed(u, u._uint(1))),
    pickle.LONG4: _push(lambda u: _signed(u, _signed(u, 4))),
    pickle.BINFLOAT: _push(lambda u: struct.unpack(">d", u._read(8))[0]),
    pickle.SHORT_BINUNICODE: _push(_text(1)),
    pickle.BINUNICODE: _push(_text(4)),
    pickle.BINUNICODE8: _push(_text(8)),
    pickle.SHORT_BINBYTES: _push(lambda u: u._read(u._uint(1))),
    pickle.BINBYTES: _push(lambda u: u._read(u._uint(4))),
    pickle.BINBYTES8: _push(lambda u: u._read(u._uint(8))),
    pickle.BYTEARRAY8: _push(lambda u: bytearray(u._read(u._uint(8)))),
    pickle.EMPTY_TUPLE: _push(lambda u: ()),
    pickle.TUPLE1: _tuple_of(1),
    pickle.TUPLE2: _tuple_of(2),
    pickle.TUPLE3: _tuple_of(3),
    pickle.TUPLE: _tuple,
    pickle.EMPTY_LIST: _push(lambda u: []),
    pickle.APPEND: _append,
    pickle.APPENDS: _appends,
    pickle.EMPTY_DICT: _push(lambda u: {}),
    pickle.SETITEM: lambda u: _set_items(u, [u.stack.pop(-2), u.stack.pop()]),
    pickle.SETITEMS: lambda u: _set_items(u, u._pop_mark()),
    pickle.EMPTY_SET: _push(lambda u: set()),
    pickle.ADDITEMS: _add_items,
    pickle.FROZENSET: _frozenset,
    pickle.MEMOIZE: lambda u: u.memo.__setitem__(len(u.memo), u.stack[-1]),
    pickle.BINPUT: _put(1),
    pickle.LONG_BINPUT: _put(4),
    pickle.BINGET: _get(1),
    pickle.LONG_BINGET: _get(4),
    pickle.GLOBAL: _push(lambda u: u.find_class(u._line(), u._line())),
    pickle.STACK_GLOBAL: _stack_global,
    pickle.REDUCE: _reduce,
    pickle.NEWOBJ: _newobj,
    pickle.NEWOBJ_EX: _newobj_ex,
    pickle.BUILD: _build,
    pickle.BINPERSID: _push(lambda u: u.persistent_load(u.stack.pop())),
}.items()}


# -- reading an archive -------------------------------------------------------------------
def _file_size(f: Any) -> int:
    if isinstance(f, (str, os.PathLike)):
        return os.path.getsize(f)
    here = f.tell()
    end = f.seek(0, os.SEEK_END)
    f.seek(here)
    return int(end)


def _check_sizes(archive: zipfile.ZipFile, file_size: int) -> None:
    """Refuse an archive whose members declare more than the file's size allows (NOTE [Loader limits])."""
    declared = sum(info.file_size for info in archive.infolist())
    allowed = MAX_EXPANSION * file_size + EXPANSION_ALLOWANCE
    if declared > allowed:
        raise pickle.UnpicklingError(
            f"its members declare {declared:,} bytes uncompressed, more than {MAX_EXPANSION} times the file's "
            f"{file_size:,} bytes (plus {EXPANSION_ALLOWANCE:,}) that xgrad.load inflates: a zip bomb, or a checkpoint "
            "recompressed after xgrad.save wrote it (xgrad.save stores members uncompressed). If you trust the file, "
            "raise xgrad.restricted_pickle.MAX_EXPANSION")
    info = archive.NameToInfo.get(PICKLE_MEMBER)
    if info is None:
        raise pickle.UnpicklingError(ERR_NOT_ARCHIVE.format(why=f"it holds no {PICKLE_MEMBER}"))
    if info.file_size > MAX_PICKLE_BYTES:
        raise pickle.UnpicklingError(
            f"its pickle {PICKLE_MEMBER} declares {info.file_size:,} bytes, more than MAX_PICKLE_BYTES "
            f"({MAX_PICKLE_BYTES:,}); if you trust the file, raise xgrad.restricted_pickle.MAX_PICKLE_BYTES")


def _short(info: zipfile.ZipInfo, got: int) -> pickle.UnpicklingError:
    return pickle.UnpicklingError(f"member {info.filename!r} declares {info.file_size:,} bytes and holds {got:,}")


def _read_array(archive: zipfile.ZipFile, name: str) -> np.ndarray:
    """The ``.npy`` member ``name``, read in chunks once its header agrees with its declared size."""
    info = archive.getinfo(_ARRAYS + name)
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version not in ((1, 0), (2, 0)):
            raise pickle.UnpicklingError(f"member {info.filename!r} is an .npy of unsupported version {version}")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(member)
        if dtype.hasobject:
            raise pickle.UnpicklingError(f"member {info.filename!r} holds Python objects, which xgrad never unpickles")
        size = math.prod(shape) * dtype.itemsize
        if member.tell() + size != info.file_size:
            raise pickle.UnpicklingError(
                f"member {info.filename!r} declares {info.file_size:,} bytes but its .npy header describes "
                f"{member.tell() + size:,}")
        array = np.empty(shape[::-1] if fortran_order else shape, dtype)
        if size:
            flat = array.reshape(-1).view(np.uint8)
            filled = 0
            while filled < size:
                chunk = member.read(min(_CHUNK, size - filled))
                if not chunk:
                    raise _short(info, member.tell())
                flat[filled:filled + len(chunk)] = np.frombuffer(chunk, np.uint8)
                filled += len(chunk)
    return array.T if fortran_order else array


def load_pickled(f: Any, device: Any, arrays: bool = False) -> Any:
    """Read what ``save_pickled`` wrote, rebuilding only allow-listed classes (NOTE [Restricted pickles]).

    ``arrays``: stored Tensors come back as their ``jax.Array``s. A file that is no such archive, is
    corrupt, or exceeds NOTE [Loader limits] raises ``pickle.UnpicklingError`` (``zipfile``'s, NumPy's
    or Python's errors for some corruptions); ``xgrad.load`` names the file in one error.
    """
    file_size = _file_size(f)
    try:
        archive = zipfile.ZipFile(f)
    except zipfile.BadZipFile as exc:
        raise pickle.UnpicklingError(ERR_NOT_ARCHIVE.format(why=exc)) from None
    with archive:
        _check_sizes(archive, file_size)
        info = archive.getinfo(PICKLE_MEMBER)
        with archive.open(info) as member:
            data = member.read(info.file_size)
        if len(data) != info.file_size:
            raise _short(info, len(data))
        return RestrictedUnpickler(data, lambda name: _read_array(archive, name), device, tensors=not arrays).load()

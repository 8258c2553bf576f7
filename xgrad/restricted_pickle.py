"""Whole-object checkpoints (``xgrad.save(model, "model.pt")``) read back by an allow-list unpickler.

# NOTE [Restricted pickles]
# PyTorch programs save whole models and load them with ``torch.load(f, weights_only=True)``
# under ``torch.serialization.safe_globals([MyModel])``. xgrad writes such an object as a
# zip archive: ``data.pkl``, a pickle of the object in which every Tensor (a Parameter
# marked as such), ``jax.Array`` and random-key state is a persistent id naming an array
# stored beside it as an ``.npy`` member (read with ``allow_pickle=False``). The pickle
# itself then needs no NumPy or JAX globals, and ``RestrictedUnpickler.find_class``
# resolves only: container builtins, xgrad's own ``nn.Module`` subclasses and dtypes, and
# the classes the user allow-listed (``add_safe_globals``/``safe_globals``). Anything else
# (``os.system``, ``builtins.eval``, a class nobody listed) raises ``UnpicklingError``
# with PyTorch's advice, before anything of it is called. ``REDUCE`` can only call what
# ``find_class`` returned, so no code outside that list runs.
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import io
import pickle
import zipfile
from collections.abc import Iterator
from typing import Any, BinaryIO

import jax
import numpy as np

from xgrad.generator import KeyState
from xgrad.tensor import Tensor
from xgrad.tensor.dtypes import dtype as xgrad_dtype

__all__ = [
    "ERR_UNSAFE_GLOBAL", "PICKLE_MEMBER", "RestrictedUnpickler", "add_safe_globals", "clear_safe_globals",
    "get_safe_globals", "is_restricted_pickle", "load_pickled", "safe_globals", "save_pickled",
]

PICKLE_MEMBER = "xgrad_archive/data.pkl"
_ARRAYS = "xgrad_archive/arrays/"

ERR_UNSAFE_GLOBAL = (
    "Weights only load failed: xgrad.load rebuilds only allow-listed classes (it never runs arbitrary pickled "
    "code). Unsupported global: GLOBAL {name} was not an allowed global by default. Please use "
    "`xgrad.serialization.add_safe_globals([{name}])` or the `xgrad.serialization.safe_globals([{name}])` context "
    "manager to allowlist this global if you trust this class/function."
)

# Builtins a pickle of plain containers and numbers may name.
_BUILTINS = {
    ("builtins", name): getattr(builtins, name)
    for name in ("dict", "list", "tuple", "set", "frozenset", "int", "float", "complex", "bool", "str", "bytes",
                 "bytearray", "slice", "range")
}
_BUILTINS[("collections", "OrderedDict")] = collections.OrderedDict
_BUILTINS[("xgrad.tensor.dtypes", "dtype")] = xgrad_dtype

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


def _is_xgrad_module_class(obj: Any) -> bool:
    from xgrad.nn.module import Module

    return isinstance(obj, type) and issubclass(obj, Module) and obj.__module__.startswith("xgrad.")


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


class RestrictedUnpickler(pickle.Unpickler):
    """Rebuilds only allow-listed classes; arrays come from the archive (NOTE [Restricted pickles])."""

    def __init__(self, file: BinaryIO, archive: zipfile.ZipFile, device: Any) -> None:
        super().__init__(file)
        self.archive = archive
        self.device = device
        self.loaded: dict[str, Any] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _BUILTINS:
            return _BUILTINS[(module, name)]
        for allowed in _user_safe_globals:
            if _qualified(allowed) == (module, name):
                return allowed
        if module.startswith("xgrad."):
            found = super().find_class(module, name)
            if _is_xgrad_module_class(found):
                return found
        raise pickle.UnpicklingError(ERR_UNSAFE_GLOBAL.format(name=f"{module}.{name}"))

    def _array(self, name: str) -> np.ndarray:
        with self.archive.open(_ARRAYS + name) as member:
            return np.load(io.BytesIO(member.read()), allow_pickle=False)

    def persistent_load(self, pid: Any) -> Any:
        name = pid[1]
        if name not in self.loaded:
            self.loaded[name] = self._rebuild(*pid)
        return self.loaded[name]

    def _rebuild(self, kind: str, name: str, *rest: Any) -> Any:
        values = self._array(name)
        if kind == "ndarray":
            return values
        array = jax.device_put(values, self.device) if self.device is not None else jax.numpy.asarray(values)
        if kind == "array":
            return array
        if kind == "keystate":
            return KeyState(jax.random.wrap_key_data(array, impl=rest[0]))
        if kind == "parameter":
            from xgrad.nn.module import Parameter

            return Parameter(array, requires_grad=rest[0])
        if kind == "tensor":
            return Tensor(array, requires_grad=rest[0])
        raise pickle.UnpicklingError(f"xgrad.load: unknown stored object kind {kind!r}")


def is_restricted_pickle(f: Any) -> bool:
    """Whether ``f`` (a path or a seekable binary file) is an archive ``save_pickled`` wrote."""
    if not zipfile.is_zipfile(f):
        return False
    if hasattr(f, "seek"):
        f.seek(0)
    with zipfile.ZipFile(f) as archive:
        found = PICKLE_MEMBER in archive.namelist()
    if hasattr(f, "seek"):
        f.seek(0)
    return found


def load_pickled(f: Any, device: Any) -> Any:
    """Read what ``save_pickled`` wrote, rebuilding only allow-listed classes."""
    with zipfile.ZipFile(f) as archive, archive.open(PICKLE_MEMBER) as data:
        return RestrictedUnpickler(io.BytesIO(data.read()), archive, device).load()

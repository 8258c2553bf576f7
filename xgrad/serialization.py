"""``save``/``load`` for tensors and (nested) state dicts, as ``.npz`` or ``.safetensors``.

Files hold plain arrays plus one JSON description of the structure (which entries
are tensors, their dtypes and ``requires_grad``, how dicts nest). Nothing is ever
pickled: ``.npz`` files are read with ``allow_pickle=False``, so loading a file
cannot run code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.creation import resolve_device
from xgrad.tensor import Tensor

__all__ = ["load", "save"]

FORMATS = (".npz", ".safetensors")
META_KEY = "__xgrad__"  # the npz entry / safetensors metadata field holding the structure
SEP = "/"

ERR_SUFFIX = "xgrad.save/load: cannot tell the format of {path!r}: the file name must end in .npz or .safetensors"
ERR_PICKLE = (
    "xgrad.load: {path!r} contains pickled objects, which xgrad never unpickles (loading a pickle can "
    "run arbitrary code). Re-save the data as plain numeric arrays."
)


def _format(path: str | os.PathLike[str]) -> str:
    suffix = os.path.splitext(os.fspath(path))[1]
    if suffix not in FORMATS:
        raise ValueError(ERR_SUFFIX.format(path=os.fspath(path)))
    return suffix


def _storable(array: np.ndarray) -> np.ndarray:
    """Extension dtypes (bfloat16, float8…) have no NumPy file type: store their bits."""
    if array.dtype.kind == "V":
        return array.view(np.dtype(f"u{array.dtype.itemsize}"))
    return array


def _flatten(obj: Any, path: str, arrays: dict[str, np.ndarray]) -> Any:
    """The structure description of ``obj``; its arrays go into ``arrays`` under their paths."""
    if isinstance(obj, Mapping):
        tree = {}
        for key, value in obj.items():
            if not isinstance(key, str) or SEP in key or not key:
                raise ValueError(f"xgrad.save: dict keys must be non-empty strings without {SEP!r}, got {key!r} at {path or 'the top level'}")
            tree[key] = _flatten(value, f"{path}{SEP}{key}" if path else key, arrays)
        return {"dict": tree}
    array: Any
    if isinstance(obj, Tensor):
        array, requires_grad = obj.array, obj.requires_grad
    elif isinstance(obj, (jax.Array, np.ndarray)):
        array, requires_grad = obj, False
    else:
        raise TypeError(f"xgrad.save: can save Tensors, arrays and dicts of them, got {type(obj).__name__} at {path or 'the top level'}")
    host = np.asarray(array)
    name = path or "tensor"
    arrays[name] = np.require(_storable(host), requirements="C")  # keeps 0-d arrays 0-d
    return {"tensor": name, "dtype": host.dtype.name, "requires_grad": requires_grad}


def save(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write a Tensor, an array, or a (nested) dict of them to ``path``.

    Args:
        obj: a ``Tensor``/``jax.Array``/``np.ndarray`` or a dict of these (a
            ``state_dict``); dicts may nest.
        path: ends in ``.npz`` or ``.safetensors``, which picks the format.

    >>> import os, tempfile, xgrad
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> xgrad.save({"w": xgrad.tensor([1.0, 2.0], requires_grad=True)}, path)
    >>> loaded = xgrad.load(path)
    >>> loaded["w"].tolist(), loaded["w"].requires_grad
    ([1.0, 2.0], True)
    """
    fmt = _format(path)
    arrays: dict[str, np.ndarray] = {}
    tree = _flatten(obj, "", arrays)
    meta = json.dumps({"version": 1, "tree": tree})
    if fmt == ".npz":
        if META_KEY in arrays:
            raise ValueError(f"xgrad.save: the key {META_KEY!r} is reserved")
        with open(path, "wb") as f:
            np.savez(f, **{**arrays, META_KEY: np.array(meta)})  # type: ignore[arg-type]
    else:
        from safetensors.numpy import save_file

        save_file(arrays, os.fspath(path), metadata={META_KEY: meta})


def _read(path: str | os.PathLike[str], fmt: str) -> tuple[dict[str, np.ndarray], str | None]:
    if fmt == ".npz":
        try:
            with np.load(path, allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
        except ValueError as exc:
            if "pickle" in str(exc).lower():
                raise ValueError(ERR_PICKLE.format(path=os.fspath(path))) from None
            raise
        meta = arrays.pop(META_KEY, None)
        return arrays, None if meta is None else str(meta)
    from safetensors import safe_open

    with safe_open(os.fspath(path), "np") as f:
        arrays = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118  (safe_open is no Mapping)
        metadata = f.metadata() or {}
    return arrays, metadata.get(META_KEY)


def load(path: str | os.PathLike[str], device: Any = None) -> Any:
    """Read what ``save`` wrote: a Tensor or a (nested) dict of Tensors.

    Args:
        path: an ``.npz`` or ``.safetensors`` file. A file written by other tools
            (no xgrad structure inside) loads as a flat dict of Tensors.
        device: where to put the arrays (a ``jax.Device``, a ``Sharding`` or a name
            such as ``"cpu:1"``); the default device when ``None``.

    >>> import os, tempfile, xgrad
    >>> path = os.path.join(tempfile.mkdtemp(), "x.npz")
    >>> xgrad.save(xgrad.arange(3), path)
    >>> xgrad.load(path).tolist()
    [0, 1, 2]
    """
    arrays, meta = _read(path, _format(path))
    target = resolve_device(device)

    def tensor(array: np.ndarray, dtype: str | None = None, requires_grad: bool = False) -> Tensor:
        if dtype is not None and array.dtype.name != dtype:
            array = array.view(jnp.dtype(dtype))
        placed = jax.device_put(array, target) if target is not None else jnp.asarray(array)
        return Tensor(placed, requires_grad=requires_grad)

    if meta is None:
        return {name: tensor(a) for name, a in arrays.items()}

    def build(node: dict[str, Any]) -> Any:
        if "dict" in node:
            return {key: build(child) for key, child in node["dict"].items()}
        return tensor(arrays[node["tensor"]], node["dtype"], node["requires_grad"])

    return build(json.loads(meta)["tree"])

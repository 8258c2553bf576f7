"""``save``/``load`` for tensors and (nested) state dicts, as ``.npz`` or ``.safetensors``.

Files hold plain arrays plus one JSON description of the structure (which entries
are tensors, their dtypes, shapes, shardings and ``requires_grad``, how dicts nest).
Nothing is ever pickled: ``.npz`` files are read with ``allow_pickle=False``, so
loading a file cannot run code.

# NOTE [Atomic saves]
# A save writes a temporary file next to the destination, flushes it to disk and
# renames it over the destination (``os.replace`` is atomic on POSIX and Windows). A
# failure or a kill mid-save leaves the previous checkpoint as it was; a failure
# removes the temporary file. A kill cannot: the writer holds an exclusive ``flock``
# on its temporary file while writing, which the kernel releases when the process
# dies, so the next save of the same target removes every temporary of it that it
# can lock (a live writer's, in another process, stays locked and is left alone),
# empty ones included. A cleaner may lock and remove a temporary in the instant
# between its creation and its writer's ``flock``: the writer, once it holds the lock,
# checks that its name still leads to its file, and otherwise starts on a new name.
#
# NOTE [Checksums]
# A safetensors file stores a CRC-32 of each entry's bytes in its structure record;
# ``load`` verifies each entry it reads, so a flipped bit raises instead of loading a
# changed value. An npz archive already has one per member, which ``zipfile`` checks.

# NOTE [Sharded checkpoints]
# An array that spans devices of other processes (``jax.distributed``) is never
# gathered onto one host. ``save`` is then collective: every process calls it with the
# same path, and process ``p`` of ``n`` writes the shards it holds (one copy of each:
# replica 0) to ``<stem>.shard<p>-of-<n><ext>``, each with its index into the global
# array. After a barrier, process 0 writes ``path`` itself: the structure, the global
# shape, dtype and sharding (mesh axes, mesh shape, device ids, partition spec) of
# each sharded entry, and its own values of the process-local entries. A random id
# shared by all files of one save makes ``load`` refuse shards left by another save.
# ``load`` reads the structure, then each process reads only the pieces of the shard
# files that its devices need, and builds the arrays on the saved mesh (or on the
# sharding passed as ``device``). This is the format Orbax would give, at this scale
# without its dependency; see benchmarks/RESULTS.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import re
import secrets
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.jax_internals import single_device_sharding
from xgrad.restricted_pickle import (
    add_safe_globals,
    clear_safe_globals,
    get_safe_globals,
    load_pickled,
    safe_globals,
    save_pickled,
)
from xgrad.tensor import Tensor
from xgrad.tensor.devices import resolve_device

__all__ = ["CorruptCheckpointError", "RestrictedUnpicklingError", "add_safe_globals", "clear_safe_globals",
           "get_safe_globals", "load", "safe_globals", "save"]


class CorruptCheckpointError(RuntimeError, ValueError):
    """A checkpoint file whose bytes are not what was written (truncated, edited, a flipped bit).

    The message names the file. A ``RuntimeError``, as PyTorch's ``torch.load`` raises
    for a damaged file, and a ``ValueError``, as xgrad raised for one before this class.
    Raised by ``xgrad.load`` and ``xgrad.distributed.CheckpointManager.restore``.
    """


class RestrictedUnpicklingError(CorruptCheckpointError, pickle.UnpicklingError):
    """The ``CorruptCheckpointError`` of a whole-object checkpoint (``xgrad.save(model, "m.pt")``).

    Raised for an archive that is corrupt or truncated, that exceeds the loader's limits
    (NOTE [Loader limits] in ``xgrad/restricted_pickle.py``: a zip bomb), that names a
    class nobody allow-listed or asks what the restricted unpickler refuses, or that is
    no archive ``xgrad.save`` wrote; the message names the file. Also a
    ``pickle.UnpicklingError``, as PyTorch's weights-only ``torch.load`` raises.
    """


FORMATS = (".npz", ".safetensors")
META_KEY = "__xgrad__"  # the npz entry / safetensors metadata field holding the structure
SEP = "/"
FORMAT_VERSION = 2  # 2 added shapes, shardings and sharded checkpoints to version 1
READABLE_VERSIONS = (1, 2)

ERR_SUFFIX = (
    "xgrad.load: cannot tell the format of {path!r}: the file name must end in .npz or .safetensors, or the file be "
    "a whole-object checkpoint that xgrad.save wrote (a PyTorch .pt file is not one: save its state_dict as "
    "safetensors in PyTorch and load that)"
)
ERR_PICKLE = (
    "xgrad.load: {path!r} contains pickled objects, which xgrad never unpickles (loading a pickle can "
    "run arbitrary code). Re-save the data as plain numeric arrays."
)
ERR_NOT_ZIP = (
    "xgrad.load: {path!r} is not an .npz file: an .npz is a zip archive and this file is not one (it may be "
    "truncated, or another format with an .npz name)"
)
ERR_CORRUPT = "xgrad.load: {path!r} is not a valid xgrad checkpoint: {why}"
WHY_CHECKSUM = "entry {name!r} does not match its checksum: the file changed after it was written (a flipped bit?)"
ERR_NO_MESH = (
    "xgrad.load: {name!r} was saved sharded over devices {ids} and this process sees neither them all nor as many "
    "devices; pass device= (a Sharding or a device) to load it onto another placement"
)


def _format(path: str | os.PathLike[str]) -> str:
    suffix = os.path.splitext(os.fspath(path))[1]
    if suffix not in FORMATS:
        raise ValueError(ERR_SUFFIX.format(path=os.fspath(path)))
    return suffix


def _shard_path(path: str, process: int, count: int) -> str:
    stem, ext = os.path.splitext(path)
    return f"{stem}.shard{process}-of-{count}{ext}"


def _storable(array: np.ndarray) -> np.ndarray:
    """Extension dtypes (bfloat16, float8…) have no NumPy file type: store their bits."""
    if array.dtype.kind == "V":
        array = array.view(np.dtype(f"u{array.dtype.itemsize}"))
    return np.require(array, requirements="C")  # keeps 0-d arrays 0-d


def _crc32(array: np.ndarray) -> int:
    """CRC-32 of the bytes a file stores for ``array`` (NOTE [Checksums])."""
    return zlib.crc32(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)


def _verified(path: str, name: str, array: np.ndarray, checksums: Mapping[str, int] | None) -> np.ndarray:
    """``array`` as read for entry ``name``, or a ``CorruptCheckpointError`` when its recorded checksum disagrees."""
    expected = None if checksums is None else checksums.get(name)
    if expected is not None and _crc32(array) != expected:
        raise CorruptCheckpointError(ERR_CORRUPT.format(path=path, why=WHY_CHECKSUM.format(name=name)))
    return array


# -- shardings as JSON ---------------------------------------------------------------
def _describe_sharding(sharding: Any) -> dict[str, Any] | None:
    """A multi-device ``NamedSharding`` as JSON; ``None`` for anything that fits one device."""
    if not isinstance(sharding, jax.sharding.NamedSharding) or len(sharding.device_set) < 2:
        return None
    mesh = sharding.mesh
    spec = [list(s) if isinstance(s, tuple) else s for s in sharding.spec]
    return {"axes": list(mesh.axis_names), "mesh_shape": list(mesh.devices.shape),
            "device_ids": [int(d.id) for d in mesh.devices.flat], "spec": spec}


def _rebuild_sharding(desc: dict[str, Any], devices: list[Any]) -> jax.sharding.NamedSharding | None:
    """The saved sharding on ``devices`` (picked by id); ``None`` when some of its devices are not among them."""
    by_id = {d.id: d for d in devices}
    if not all(i in by_id for i in desc["device_ids"]):
        return None
    mesh = np.array([by_id[i] for i in desc["device_ids"]], dtype=object).reshape(desc["mesh_shape"])
    spec = jax.sharding.PartitionSpec(*(tuple(s) if isinstance(s, list) else s for s in desc["spec"]))
    return jax.sharding.NamedSharding(jax.sharding.Mesh(mesh, tuple(desc["axes"])), spec)


def _equivalent_sharding(desc: dict[str, Any], devices: list[Any]) -> jax.sharding.NamedSharding | None:
    """The saved mesh's shape and axes on ``devices``, when there are as many: the saved devices in id order
    become ``devices`` in their order (a checkpoint of 2 processes × 2 devices read by 1 process × 4)."""
    saved_ids = desc["device_ids"]
    if len(devices) != len(saved_ids):
        return None
    by_rank = dict(zip(sorted(saved_ids), (d.id for d in devices), strict=True))
    return _rebuild_sharding({**desc, "device_ids": [by_rank[i] for i in saved_ids]}, devices)


def _bounds(index: tuple[slice, ...], shape: tuple[int, ...]) -> list[list[int]]:
    return [list(s.indices(n)[:2]) for s, n in zip(index, shape, strict=True)]


# -- save ----------------------------------------------------------------------------
class _Collected:
    """What ``_flatten`` finds: whole arrays for ``path``, shards for this process's file."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.shards: dict[str, np.ndarray] = {}
        self.shard_index: dict[str, list[Any]] = {}


def _flatten(obj: Any, path: str, out: _Collected) -> Any:
    """The structure description of ``obj``; its arrays go into ``out`` under their paths."""
    if isinstance(obj, Mapping):
        tree = {}
        for key, value in obj.items():
            if not isinstance(key, str) or SEP in key or not key:
                raise ValueError(f"xgrad.save: dict keys must be non-empty strings without {SEP!r}, got {key!r} at {path or 'the top level'}")
            tree[key] = _flatten(value, f"{path}{SEP}{key}" if path else key, out)
        return {"dict": tree}
    array: Any
    if isinstance(obj, Tensor):
        array, requires_grad = obj.array, obj.requires_grad
    elif isinstance(obj, (jax.Array, np.ndarray)):
        array, requires_grad = obj, False
    else:
        raise TypeError(f"xgrad.save: can save Tensors, arrays and dicts of them, got {type(obj).__name__} at {path or 'the top level'}")
    name = path or "tensor"
    node: dict[str, Any] = {"tensor": name, "dtype": np.dtype(array.dtype).name, "shape": list(array.shape),
                            "requires_grad": requires_grad}
    sharding = _describe_sharding(getattr(array, "sharding", None))
    if sharding is not None:
        node["sharding"] = sharding
    if isinstance(array, jax.Array) and not array.is_fully_addressable:
        # One copy of each piece (replica 0), written by the process that holds it.
        pieces = []
        for k, shard in enumerate(s for s in array.addressable_shards if s.replica_id == 0):
            key = f"{name}@{k}"
            out.shards[key] = _storable(np.asarray(shard.data))
            pieces.append([_bounds(shard.index, array.shape), key])
        out.shard_index[name] = pieces
        node["sharded"] = True
        return node
    out.arrays[name] = _storable(np.asarray(array))
    return node


def _serialize(fmt: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> Callable[[BinaryIO], None]:
    """A writer of one file in ``fmt`` holding ``arrays`` and the JSON ``meta``."""
    if fmt == ".npz":
        if META_KEY in arrays:
            raise ValueError(f"xgrad.save: the key {META_KEY!r} is reserved")
        text = json.dumps(meta)
        return lambda f: np.savez(f, **{**arrays, META_KEY: np.array(text)})  # type: ignore[arg-type]
    from safetensors.numpy import save as to_bytes

    text = json.dumps({**meta, "crc32": {name: _crc32(a) for name, a in arrays.items()}})

    def write_safetensors(f: BinaryIO) -> None:
        f.write(to_bytes(arrays, metadata={META_KEY: text}))

    return write_safetensors





def _temporary_name(base: str) -> str:
    return f".{base}.{secrets.token_hex(8)}.tmp"


def _lock(fd: int, wait: bool) -> bool:
    """An exclusive ``flock`` on ``fd``; False when another process holds one (or locks are not supported)."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): no temporary is ever taken for stale
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _remove_stale_temporaries(folder: str, base: str) -> None:
    """Remove the temporaries of ``base`` that saves killed mid-write left behind (NOTE [Atomic saves])."""
    pattern = re.compile(re.escape(f".{base}.") + r"[0-9a-f]{16}\.tmp")
    try:
        names = [n for n in os.listdir(folder) if pattern.fullmatch(n)]
    except OSError:
        return
    for name in names:
        tmp = os.path.join(folder, name)
        try:
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:
            continue  # gone meanwhile: its save finished
        try:
            if not _lock(fd, wait=False):
                continue  # a live writer holds it
            with contextlib.suppress(OSError):
                if _names_file(tmp, fd):  # still that file, not a new save's
                    os.unlink(tmp)
        finally:
            os.close(fd)


def _names_file(name: str, fd: int) -> bool:
    """Whether ``name`` is the file open as ``fd`` (not removed, nor replaced by another)."""
    try:
        return os.stat(name).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _locked_temporary(folder: str, base: str) -> tuple[str, int]:
    """A new temporary file for ``base`` in ``folder``, locked, as ``(path, fd)`` (NOTE [Atomic saves])."""
    while True:
        tmp = os.path.join(folder, _temporary_name(base))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open()
        # Held until the file is renamed or removed, or this process dies.
        if not _lock(fd, wait=True) or _names_file(tmp, fd):
            return tmp, fd
        os.close(fd)  # another save's cleaner took it for stale before we locked it


def _write_atomic(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Run ``write`` on a temporary file next to ``path``, then rename it over ``path`` (NOTE [Atomic saves])."""
    folder, base = os.path.split(os.path.abspath(path))
    _remove_stale_temporaries(folder, base)
    tmp, fd = _locked_temporary(folder, base)
    try:
        with open(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)  # still locked: a cleaner never sees it unlocked under its temporary name
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _is_pickle_target(path: Any) -> bool:
    """A file object, or a name not ending in ``.npz``/``.safetensors`` (``model.pt``): NOTE [Restricted pickles]."""
    return not isinstance(path, (str, os.PathLike)) or os.path.splitext(os.fspath(path))[1] not in FORMATS


def save(obj: Any, path: Any) -> None:
    """Write a Tensor, an array, or a (nested) dict of them to ``path``, atomically; or a whole object.

    ``path`` ending in ``.npz`` or ``.safetensors`` picks that format (arrays and dicts
    only). Any other name (``"model.pt"``) or a binary file object gets a whole-object
    checkpoint, as ``torch.save(model, f)`` writes: ``load`` rebuilds it with allow-listed
    classes only (NOTE [Restricted pickles] in ``xgrad/restricted_pickle.py``).

    The file is written next to ``path`` under a temporary name and renamed over it,
    so a failure mid-save leaves any previous file at ``path`` intact. Arrays sharded
    over several devices keep their sharding in the file. When some array spans
    devices of other processes (``jax.distributed``), every process must call
    ``save`` with the same path: each writes the shards it holds to
    ``<stem>.shard<p>-of-<n><ext>`` and process 0 writes ``path``; nothing is
    gathered onto one host.

    Args:
        obj: a ``Tensor``/``jax.Array``/``np.ndarray`` or a dict of these (a
            ``state_dict``); dicts may nest. For a whole-object checkpoint, any object
            of allow-listable classes (a model).
        path: ends in ``.npz`` or ``.safetensors``, which picks the format; else a
            whole-object checkpoint (a name or a binary file object).

    >>> import os, tempfile, xgrad
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> xgrad.save({"w": xgrad.tensor([1.0, 2.0], requires_grad=True)}, path)
    >>> loaded = xgrad.load(path)
    >>> loaded["w"].tolist(), loaded["w"].requires_grad
    ([1.0, 2.0], True)
    """
    if _is_pickle_target(path):
        if isinstance(path, (str, os.PathLike)):
            _write_atomic(os.fspath(path), lambda f: save_pickled(obj, f))
        else:
            save_pickled(obj, path)
        return
    path = os.fspath(path)
    fmt = _format(path)
    collected = _Collected()
    tree = _flatten(obj, "", collected)
    meta: dict[str, Any] = {"version": FORMAT_VERSION, "tree": tree}
    if not collected.shard_index:
        _write_atomic(path, _serialize(fmt, collected.arrays, meta))
        return
    from jax.experimental import multihost_utils

    # All files of one save carry the same id, chosen by process 0.
    save_id = multihost_utils.broadcast_one_to_all(np.frombuffer(os.urandom(8), np.uint8))
    meta["save_id"] = bytes(np.asarray(save_id, np.uint8)).hex()
    process, count = jax.process_index(), jax.process_count()
    meta["num_processes"] = count
    shard_meta = {"version": FORMAT_VERSION, "save_id": meta["save_id"], "shards": collected.shard_index}
    _write_atomic(_shard_path(path, process, count), _serialize(fmt, collected.shards, shard_meta))
    multihost_utils.sync_global_devices(f"xgrad.save shards {path}")
    if process == 0:
        _write_atomic(path, _serialize(fmt, collected.arrays, meta))
    multihost_utils.sync_global_devices(f"xgrad.save done {path}")


# -- load ----------------------------------------------------------------------------
@contextlib.contextmanager
def _open(path: str, fmt: str) -> Iterator[tuple[Callable[[str], np.ndarray], list[str], str | None]]:
    """``(read(name), names, meta)`` of a file, reading each array only when asked."""
    if fmt == ".npz":
        if not zipfile.is_zipfile(path):
            if not os.path.exists(path):
                raise FileNotFoundError(f"xgrad.load: no such file: {path!r}")
            raise CorruptCheckpointError(ERR_NOT_ZIP.format(path=path))
        try:
            npz = np.load(path, allow_pickle=False)
        except (ValueError, zipfile.BadZipFile) as exc:
            raise CorruptCheckpointError(ERR_CORRUPT.format(path=path, why=exc)) from None
        with npz:

            def read_npz(name: str) -> np.ndarray:
                try:
                    return npz[name]
                except zipfile.BadZipFile as exc:  # a member's CRC-32 (NOTE [Checksums]) or its headers
                    raise CorruptCheckpointError(ERR_CORRUPT.format(path=path, why=f"entry {name!r}: {exc}")) from None
                except ValueError as exc:
                    if "pickle" in str(exc).lower():
                        raise ValueError(ERR_PICKLE.format(path=path)) from None
                    raise CorruptCheckpointError(ERR_CORRUPT.format(path=path, why=exc)) from None

            names = [n for n in npz.files if n != META_KEY]
            meta = str(read_npz(META_KEY)) if META_KEY in npz.files else None
            yield read_npz, names, meta
        return
    from safetensors import safe_open

    try:
        handle = safe_open(path, "np")
    except FileNotFoundError:
        raise
    except Exception as exc:  # safetensors raises its own error type for a bad header
        raise CorruptCheckpointError(ERR_CORRUPT.format(path=path, why=exc)) from None
    with handle as f:
        yield f.get_tensor, list(f.keys()), (f.metadata() or {}).get(META_KEY)  # noqa: SIM118  (no Mapping)


def _parse_meta(path: str, text: str) -> dict[str, Any]:
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorruptCheckpointError(ERR_CORRUPT.format(path=path, why=f"its structure record is not JSON ({exc})")) from None
    if not isinstance(meta, dict) or "version" not in meta:
        raise CorruptCheckpointError(ERR_CORRUPT.format(path=path, why="its structure record has no format version"))
    version = meta["version"]
    if version not in READABLE_VERSIONS:
        raise ValueError(
            f"xgrad.load: {path!r} has checkpoint format version {version!r}; this xgrad reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))} (a newer xgrad wrote it: upgrade xgrad to load it)"
        )
    return meta


def _checked(path: str, name: str, array: np.ndarray, node: dict[str, Any]) -> np.ndarray:
    """``array`` as the dtype and shape ``node`` records, or a clear error if it does not fit."""
    try:
        dtype = jnp.dtype(node["dtype"])
    except TypeError:
        raise CorruptCheckpointError(ERR_CORRUPT.format(path=path, why=f"entry {name!r} has unknown dtype {node['dtype']!r}")) from None
    if array.dtype != dtype:
        if array.dtype.itemsize != dtype.itemsize or array.dtype.kind not in "biuf":
            raise CorruptCheckpointError(ERR_CORRUPT.format(
                path=path, why=f"entry {name!r} is stored as {array.dtype} but recorded as {dtype}"))
        array = array.view(dtype)
    shape = node.get("shape")
    if shape is not None:
        if math.prod(shape) != array.size:
            raise CorruptCheckpointError(ERR_CORRUPT.format(
                path=path, why=f"entry {name!r} holds {array.size} elements but its recorded shape {tuple(shape)} has "
                f"{math.prod(shape)}"))
        if tuple(shape) != array.shape:
            raise CorruptCheckpointError(ERR_CORRUPT.format(
                path=path, why=f"entry {name!r} has shape {array.shape} but its recorded shape is {tuple(shape)}"))
    return array


def _sharded_reader(
    path: str, fmt: str, meta: dict[str, Any], stack: contextlib.ExitStack
) -> Callable[[str, dict[str, Any], tuple[slice, ...]], np.ndarray]:
    """``region(name, index)``: the values of a sharded entry at ``index``, read from the shard files."""
    count = int(meta["num_processes"])
    pieces: dict[str, list[tuple[list[list[int]], Callable[[], np.ndarray]]]] = {}

    def reader(shard_file: str, read: Callable[[str], np.ndarray], key: str,
               checksums: Mapping[str, int] | None) -> Callable[[], np.ndarray]:
        return lambda: _verified(shard_file, key, read(key), checksums)

    for process in range(count):
        shard_file = _shard_path(path, process, count)
        if not os.path.exists(shard_file):
            raise CorruptCheckpointError(ERR_CORRUPT.format(path=path, why=f"its shard file {shard_file!r} is missing"))
        read, _, text = stack.enter_context(_open(shard_file, fmt))
        shard_meta = _parse_meta(shard_file, text or "")
        if shard_meta.get("save_id") != meta.get("save_id"):
            raise CorruptCheckpointError(ERR_CORRUPT.format(
                path=path, why=f"its shard file {shard_file!r} belongs to another save (an interrupted save left files "
                "of two checkpoints); save again"))
        checksums = shard_meta.get("crc32")
        for name, entries in shard_meta["shards"].items():
            for bounds, key in entries:
                pieces.setdefault(name, []).append((bounds, reader(shard_file, read, key, checksums)))

    def region(name: str, node: dict[str, Any], index: tuple[slice, ...]) -> np.ndarray:
        shape = tuple(node["shape"])
        want = _bounds(index, shape)
        out = np.empty([b - a for a, b in want], jnp.dtype(node["dtype"]))
        filled = 0
        for bounds, read in pieces.get(name, []):
            overlap = [(max(a, c), min(b, d)) for (a, b), (c, d) in zip(want, bounds, strict=True)]
            if any(lo >= hi for lo, hi in overlap):
                continue
            piece = _checked(path, name, read(), {"dtype": node["dtype"], "shape": [d - c for c, d in bounds]})
            src = tuple(slice(lo - c, hi - c) for (lo, hi), (c, _) in zip(overlap, bounds, strict=True))
            dst = tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(overlap, want, strict=True))
            out[dst] = piece[src]
            filled += math.prod(hi - lo for lo, hi in overlap)
        if filled != out.size:
            raise CorruptCheckpointError(ERR_CORRUPT.format(path=path, why=f"the shard files do not cover all of {name!r}"))
        return out

    return region


def load(path: Any, device: Any = None, *, arrays: bool = False, weights_only: bool | None = None,
         map_location: Any = None, mmap: bool | None = None) -> Any:
    """Read what ``save`` wrote: a Tensor or a (nested) dict of Tensors (of ``jax.Array``s with ``arrays=True``).

    Checks what it reads against the recorded dtypes, shapes and element counts, and
    raises ``CorruptCheckpointError`` (a ``RuntimeError`` and a ``ValueError``) naming
    the path and the entry when they disagree, or when the file's bytes changed after
    it was written (a flipped bit: each entry of a safetensors file carries a CRC-32,
    each member of an npz archive one of its own). A format version newer than this
    xgrad reads raises ``ValueError``.
    Arrays saved sharded come back on their saved sharding when this run has those
    devices; a checkpoint written by several processes is read by each of them,
    every process reading only the pieces its devices hold. When this run lacks some
    of the saved devices but has as many in all (a checkpoint of 2 processes × 2
    devices read by 1 process with 4), the saved mesh's shape and axis names are
    rebuilt on ``jax.devices()``: the saved devices in id order become this run's
    devices in their order. Otherwise pass ``device=``.

    Args:
        path: an ``.npz`` or ``.safetensors`` file. A file written by other tools
            (no xgrad structure inside) loads as a flat dict of Tensors.
        device: where to put the arrays (a ``jax.Device``, a ``Sharding`` or a name
            such as ``"cpu:1"``); ``None``: each array's saved sharding where this
            run has its devices, else the default device.
        arrays: return plain ``jax.Array``s in place of Tensors, for JAX code (optax,
            orbax, a Flax or Equinox model's parameters).
        weights_only: accepted for PyTorch's signature; loading is always restricted:
            a whole-object checkpoint rebuilds only xgrad's modules, containers and the
            classes allow-listed with ``safe_globals``/``add_safe_globals``, never by
            calling them, and raises ``RestrictedUnpicklingError`` (a ``CorruptCheckpointError``
            and a ``pickle.UnpicklingError``) naming the file and anything else it names,
            ``weights_only=False`` too; as for a corrupt, truncated or inflating archive
            (NOTE [Loader limits] in ``xgrad/restricted_pickle.py``).
        map_location: ``device`` under PyTorch's name.
        mmap: accepted and ignored.

    >>> import os, tempfile, xgrad
    >>> path = os.path.join(tempfile.mkdtemp(), "x.npz")
    >>> xgrad.save({"w": xgrad.arange(3)}, path)
    >>> xgrad.load(path)["w"].tolist(), type(xgrad.load(path, arrays=True)["w"]).__name__
    ([0, 1, 2], 'ArrayImpl')
    """
    device = map_location if device is None else device
    if _is_pickle_target(path):
        return _load_whole_object(path, resolve_device(device), arrays)
    loaded = _load(path, device)
    if arrays:
        return jax.tree_util.tree_map(lambda t: t.array, loaded, is_leaf=lambda t: isinstance(t, Tensor))
    return loaded


def _load_whole_object(f: Any, device: Any, arrays: bool) -> Any:
    """``load_pickled``, its every failure but a missing or unopenable file raised as one ``RestrictedUnpicklingError``."""
    try:
        return load_pickled(f, device, arrays=arrays)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except Exception as exc:  # whatever a hostile or corrupt file makes zipfile, NumPy or the unpickler raise
        name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", "<file object>")
        raise RestrictedUnpicklingError(f"xgrad.load: cannot load {name!r}: {exc}") from exc


def _load(path: str | os.PathLike[str], device: Any) -> Any:
    path = os.fspath(path)
    fmt = _format(path)
    target = resolve_device(device)

    def fitted(ndim: int) -> Any:
        """``target`` for an array of rank ``ndim``: lower ranks (a step counter) go replicated on its mesh."""
        if isinstance(target, jax.sharding.NamedSharding) and len(target.spec) > ndim:
            return jax.sharding.NamedSharding(target.mesh, jax.sharding.PartitionSpec())
        return target

    def place(array: np.ndarray, sharding: Any) -> Any:
        where = fitted(array.ndim) if target is not None else sharding
        return jax.device_put(array, where) if where is not None else jnp.asarray(array)

    with contextlib.ExitStack() as stack:
        read, names, text = stack.enter_context(_open(path, fmt))
        if text is None:
            return {name: Tensor(place(read(name), None)) for name in names}
        meta = _parse_meta(path, text)
        region = _sharded_reader(path, fmt, meta, stack) if meta.get("num_processes") else None

        def build(node: Any, where: str) -> Any:
            if not isinstance(node, dict):
                raise CorruptCheckpointError(ERR_CORRUPT.format(path=path, why=f"bad structure record at {where or 'the top level'}"))
            if "dict" in node:
                return {key: build(child, f"{where}{SEP}{key}" if where else key) for key, child in node["dict"].items()}
            name = node.get("tensor")
            if name is None or "dtype" not in node:
                raise CorruptCheckpointError(ERR_CORRUPT.format(path=path, why=f"bad structure record at {where or 'the top level'}"))
            desc = node.get("sharding")
            requires_grad = bool(node.get("requires_grad", False))
            if node.get("sharded"):
                saved = None if desc is None else (
                    _rebuild_sharding(desc, jax.devices()) or _equivalent_sharding(desc, jax.devices()))
                sharding = fitted(len(node["shape"])) if target is not None else saved
                if sharding is None:
                    raise ValueError(ERR_NO_MESH.format(name=name, ids=desc["device_ids"] if desc else "?"))
                if isinstance(sharding, jax.Device):
                    sharding = single_device_sharding(sharding)
                assert region is not None
                array = jax.make_array_from_callback(
                    tuple(node["shape"]), sharding, lambda index: region(name, node, tuple(index or ())))
                return Tensor(array, requires_grad=requires_grad)
            if name not in names:
                raise CorruptCheckpointError(ERR_CORRUPT.format(path=path, why=f"entry {name!r} is missing (a truncated or edited file?)"))
            # A whole array goes back on its sharding only if this process holds all of it.
            saved = None if desc is None else _rebuild_sharding(desc, jax.local_devices())
            stored = _verified(path, name, read(name), meta.get("crc32"))
            return Tensor(place(_checked(path, name, stored, node), saved), requires_grad=requires_grad)

        return build(meta.get("tree"), "")

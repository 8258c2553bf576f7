"""``CheckpointManager``: numbered, sharded, atomic checkpoints of a model and its optimizer.

# NOTE [Complete checkpoints]
# A checkpoint of step N is the directory ``step_N`` (N written without leading
# zeros) of the manager's directory, complete when its manifest is: ``checkpoint.manifest``
# lists every other file with its size and SHA-256, and starts with the SHA-256 of the
# rest of itself. A save writes everything into ``step_N.tmp-<id>`` (the id chosen by
# process 0 and shared by all): each process its shards (``xgrad.save``'s sharded
# format, NOTE [Sharded checkpoints] in xgrad/serialization.py), process 0 the structure
# files and the optimizer's non-tensor state as JSON. After a barrier that every
# process reaches only once its files are on disk, process 0 writes the manifest and
# renames the directory to ``step_N``; a second barrier makes ``save`` return in every
# process only once the checkpoint is complete.
#
# Every change of the directory is one rename, so that a kill at any point leaves each
# step's old checkpoint or its new one, complete:
# - an existing ``step_N`` (a rerun from an earlier step) is first renamed
#   ``step_N.old-<id>``, then the new one takes its name. A kill between the two leaves
#   that older copy, which ``all_steps``/``restore`` read as step N while there is no
#   complete ``step_N``, and the next save renames back;
# - what goes (the checkpoints beyond the newest ``max_to_keep``, older copies, torn
#   ``.tmp-`` saves) is renamed ``step_N.trash-<id>`` before it is deleted, so that a
#   kill mid-delete never leaves a half-deleted ``step_N``. Older copies go before any
#   ``step_N``: a step removed never comes back as its older copy.
# No save of this directory is in flight while process 0 tidies (saves are
# collective), so every ``.tmp-`` directory but the current one is a killed save's.
# ``all_steps`` lists a checkpoint only when its manifest is intact and every file it
# lists is there at its size (a stat, not a read); ``restore`` reads every file whole
# against its SHA-256 before loading any, so a changed byte anywhere raises
# ``CorruptCheckpointError`` naming the file, never restores other values. Names
# outside this scheme (``step_07``, ``notes``) are never listed nor removed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import shutil
from typing import Any

import jax
import numpy as np

from xgrad.serialization import CorruptCheckpointError, load, save
from xgrad.tensor import Tensor

__all__ = ["CheckpointManager"]

logger = logging.getLogger(__name__)

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
OPTIMIZER_JSON = "optimizer.json"  # param_groups and the state entries that are not tensors
MANIFEST = "checkpoint.manifest"  # NOTE [Complete checkpoints]
MANIFEST_VERSION = 1
# ``step_N``, or one of its side directories: a save in flight (tmp), an older copy (old), going (trash).
_NAME = re.compile(r"step_(0|[1-9][0-9]*)(?:\.(tmp|old|trash)-([0-9a-f]+))?")
# The files a save of each part writes (besides its shard files), and a shard file's name.
_FILES_OF = {"model": (MODEL_FILE,), "optimizer": (OPTIMIZER_FILE, OPTIMIZER_JSON)}
_SHARD = re.compile(r"(model|optimizer)\.shard[0-9]+-of-([0-9]+)\.safetensors")

ERR_CORRUPT_FILE = (
    "CheckpointManager: {path!r} {why}; the checkpoint is damaged (restore another step: all_steps() lists them)"
)
WHY_NO_MANIFEST = ("is missing: the directory is not a complete checkpoint (a save killed midway, or files copied in "
                   "by hand)")
WARN_NO_MANIFEST = (
    "CheckpointManager: %r, the checkpoint of step %d, was written by an older xgrad and has no manifest: only the "
    "CRC-32 of each tensor is verified, optimizer.json and the files' structure records cannot be. It is restored as "
    "it is; the next save of step %d writes it with a manifest"
)
# The directories whose missing manifest was logged, each once per process.
_warned_without_manifest: set[str] = set()


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _shared_token() -> str:
    """A random hex id, the same in every process (process 0's)."""
    token = np.frombuffer(secrets.token_bytes(8), np.uint8)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        token = np.asarray(multihost_utils.broadcast_one_to_all(token), np.uint8)
    return bytes(token).hex()


def _split_optimizer_state(state_dict: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """An optimizer's ``state_dict()`` as ``(tensors for xgrad.save, JSON of the rest)``."""
    tensors: dict[str, dict[str, Tensor]] = {}
    others: dict[str, dict[str, Any]] = {}
    for index, entries in state_dict["state"].items():
        for name, value in entries.items():
            if isinstance(value, Tensor):
                tensors.setdefault(str(index), {})[name] = value
            else:
                others.setdefault(str(index), {})[name] = value
    try:
        text = json.dumps({"param_groups": state_dict["param_groups"], "state": others})
    except TypeError as exc:
        raise TypeError(
            "CheckpointManager.save: the optimizer's param_groups and non-tensor state must be JSON values "
            f"(numbers, strings, lists, dicts; a Tensor lr: pass a float): {exc}"
        ) from None
    return {"state": tensors}, text


def _joined_optimizer_state(tensors: dict[str, Any], text: str) -> dict[str, Any]:
    """The ``state_dict`` that ``_split_optimizer_state`` split, int keys as PyTorch has them."""
    rest = json.loads(text)
    state: dict[int, dict[str, Any]] = {}
    for part in (rest["state"], tensors.get("state", {})):
        for index, entries in part.items():
            state.setdefault(int(index), {}).update(entries)
    return {"state": state, "param_groups": rest["param_groups"]}


# What save/restore call on each argument: (what it is, its attributes used).
_ARGUMENTS = {"model": ("a module", ("state_dict()", "load_state_dict()")),
              "optimizer": ("an optimizer", ("state_dict()", "load_state_dict()", "param_groups"))}


def _check_arguments(where: str, model: Any, optimizer: Any) -> None:
    """A ``TypeError`` naming the argument that is neither ``None`` nor what ``where`` (save, restore) uses."""
    for argument, obj in (("model", model), ("optimizer", optimizer)):
        kind, attributes = _ARGUMENTS[argument]
        if obj is None or all(hasattr(obj, a.removesuffix("()")) for a in attributes):
            continue
        hint = (" (a state dict: load it into its object with load_state_dict and pass that object, or save the dict "
                "itself with xgrad.save)" if isinstance(obj, dict) else "")
        raise TypeError(f"CheckpointManager.{where}: {argument}= takes {kind}, an object with {', '.join(attributes[:-1])} "
                        f"and {attributes[-1]}; got {type(obj).__name__}{hint}")
    if model is None and optimizer is None:
        raise TypeError(f"CheckpointManager.{where}: nothing to {where}{' into' if where == 'restore' else ''}: pass "
                        "model=, optimizer= or both")


def _file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _write_manifest(folder: str) -> None:
    """List every file of ``folder`` with its size and SHA-256, in a manifest that carries its own checksum."""
    files = {name: {"size": os.path.getsize(os.path.join(folder, name)), "sha256": _file_digest(os.path.join(folder, name))}
             for name in sorted(os.listdir(folder)) if name != MANIFEST}
    body = json.dumps({"version": MANIFEST_VERSION, "files": files}, sort_keys=True).encode()
    with open(os.path.join(folder, MANIFEST), "wb") as f:
        f.write(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
        f.flush()
        os.fsync(f.fileno())


def _read_manifest(folder: str) -> dict[str, Any]:
    """The files a checkpoint's manifest lists; ``CorruptCheckpointError`` when it is missing or damaged."""
    path = os.path.join(folder, MANIFEST)
    try:
        with open(path, "rb") as f:
            digest, _, body = f.read().partition(b"\n")
    except FileNotFoundError:
        raise CorruptCheckpointError(ERR_CORRUPT_FILE.format(path=path, why=WHY_NO_MANIFEST)) from None
    if hashlib.sha256(body).hexdigest().encode() != digest:
        raise CorruptCheckpointError(ERR_CORRUPT_FILE.format(path=path, why="does not match its own checksum"))
    manifest = json.loads(body)
    if manifest["version"] != MANIFEST_VERSION:
        raise ValueError(f"CheckpointManager: {path!r} has manifest version {manifest['version']!r}; this xgrad reads "
                         f"version {MANIFEST_VERSION} (a newer xgrad wrote it: upgrade xgrad to restore it)")
    files: dict[str, Any] = manifest["files"]
    return files


def _missing_without_manifest(folder: str) -> str | None:
    """The first file that ``folder``, a checkpoint without a manifest, lacks (NOTE [Checkpoints without a manifest]).

    ``None`` when it has all an older xgrad's save wrote; the manifest's name when it holds no checkpoint file at all.
    """
    names = set(os.listdir(folder))
    wanted: set[str] = set()
    for name in names:
        shard = _SHARD.fullmatch(name)
        if shard:
            stem: str | None = shard.group(1)
            count = int(shard.group(2))
            wanted |= {f"{stem}.shard{p}-of-{count}.safetensors" for p in range(count)}
        else:
            stem = next((s for s, files in _FILES_OF.items() if name in files), None)
        if stem is not None:
            wanted |= set(_FILES_OF[stem])
    if not wanted:
        return MANIFEST
    missing = sorted(wanted - names)
    return missing[0] if missing else None


def _is_complete(folder: str) -> bool:
    """Whether ``folder``'s manifest is intact and every file it lists is there at its size (no file read)."""
    try:
        if not os.path.lexists(os.path.join(folder, MANIFEST)):
            return _missing_without_manifest(folder) is None
        files = _read_manifest(folder)
        return all(os.path.getsize(os.path.join(folder, name)) == entry["size"] for name, entry in files.items())
    except (OSError, ValueError):  # CorruptCheckpointError is a ValueError
        return False


def _verified_files(folder: str, step: int) -> set[str]:
    """The files of the checkpoint of ``step`` in ``folder``, each read whole against its SHA-256 first.

    One without a manifest (NOTE [Checkpoints without a manifest]) is only checked for missing files, and logged.
    """
    if not os.path.lexists(os.path.join(folder, MANIFEST)):
        missing = _missing_without_manifest(folder)
        if missing is not None:
            why = WHY_NO_MANIFEST if missing == MANIFEST else "is missing"
            raise CorruptCheckpointError(ERR_CORRUPT_FILE.format(path=os.path.join(folder, missing), why=why))
        if folder not in _warned_without_manifest:
            _warned_without_manifest.add(folder)
            logger.warning(WARN_NO_MANIFEST, folder, step, step)
        return set(os.listdir(folder))
    files = _read_manifest(folder)
    for name, entry in files.items():
        path = os.path.join(folder, name)
        try:
            digest = _file_digest(path)
        except FileNotFoundError:
            raise CorruptCheckpointError(ERR_CORRUPT_FILE.format(path=path, why="is missing")) from None
        if digest != entry["sha256"]:
            raise CorruptCheckpointError(ERR_CORRUPT_FILE.format(
                path=path, why="does not match the SHA-256 its checkpoint's manifest records: it changed after it was "
                "written (a flipped bit, an edit, a truncation)"))
    return set(files)


def _read_optimizer_state(folder: str) -> dict[str, Any]:
    """The optimizer's ``state_dict`` saved in ``folder``; ``CorruptCheckpointError`` naming a JSON half that is not one.

    Only a checkpoint without a manifest can get that far with a damaged ``optimizer.json``.
    """
    tensors = load(os.path.join(folder, OPTIMIZER_FILE))
    path = os.path.join(folder, OPTIMIZER_JSON)
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return _joined_optimizer_state(tensors, raw.decode())
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # JSON and UTF-8 errors are ValueErrors
        raise CorruptCheckpointError(ERR_CORRUPT_FILE.format(
            path=path, why=f"is not an optimizer's param_groups and state ({type(exc).__name__}: {exc})")) from None


class CheckpointManager:
    """Numbered checkpoints of a model and its optimizer in ``directory``, the newest ``max_to_keep`` kept.

    ``save(step, model=..., optimizer=...)`` is collective under ``jax.distributed``:
    every process calls it, each writes the shards it holds (nothing is gathered onto
    one host), and the checkpoint becomes complete, in one atomic rename, only after
    all of them have finished. A job killed at any point (mid-save, mid-removal of an
    old checkpoint, or mid-run) and restarted on all its processes resumes with
    ``restore(manager.latest_step(), ...)``: each step is left as its old checkpoint
    or its new one, never torn, never lost (NOTE [Complete checkpoints]). The
    directory must be one filesystem that all processes see.

    Each checkpoint carries a manifest of its files' SHA-256s, which ``restore``
    verifies before loading anything: a damaged file raises
    ``xgrad.serialization.CorruptCheckpointError`` (a ``RuntimeError``) naming it.

    A checkpoint loads onto the parameters' current placement: on the same devices, or
    on as many other ones (one process of four devices reads what two processes of two
    wrote), or on any other sharding the model's parameters have when it is restored.

    >>> import os, tempfile, xgrad
    >>> model = xgrad.nn.Linear(2, 1)
    >>> optimizer = xgrad.optim.Adam(model.parameters(), lr=0.1)
    >>> manager = xgrad.distributed.CheckpointManager(tempfile.mkdtemp(), max_to_keep=2)
    >>> for step in range(1, 4):
    ...     optimizer.zero_grad()
    ...     model(xgrad.ones(4, 2)).sum().backward()
    ...     optimizer.step()
    ...     manager.save(step, model=model, optimizer=optimizer)
    >>> manager.all_steps(), manager.latest_step()
    ([2, 3], 3)
    >>> manager.restore(2, model=model, optimizer=optimizer)
    >>> optimizer.state_dict()["state"][0]["step"].item()
    2.0
    """

    def __init__(self, directory: str | os.PathLike[str], max_to_keep: int | None = None) -> None:
        if max_to_keep is not None and (not isinstance(max_to_keep, int) or max_to_keep < 1):
            raise ValueError(f"CheckpointManager: max_to_keep must be a positive int or None (keep all), got {max_to_keep!r}")
        self.directory = os.fspath(directory)
        self.max_to_keep = max_to_keep

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, f"step_{step}")

    def _names(self) -> list[tuple[str, int, str | None]]:
        """``(name, step, kind)`` of the directory's entries in this manager's naming; kind ``None`` for ``step_N``."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted((n, int(m.group(1)), m.group(2)) for n in names if (m := _NAME.fullmatch(n)))

    def _restorable(self) -> dict[int, str]:
        """The complete checkpoint of each step: ``step_N``, else its older copy a killed re-save left."""
        found: dict[int, str] = {}
        for name, step, kind in self._names():  # sorted: "step_N" comes before "step_N.old-<id>"
            folder = os.path.join(self.directory, name)
            if kind in (None, "old") and step not in found and _is_complete(folder):
                found[step] = folder
        return found

    def all_steps(self) -> list[int]:
        """The steps of the complete checkpoints, oldest first (NOTE [Complete checkpoints])."""
        return sorted(self._restorable())

    def latest_step(self) -> int | None:
        """The step of the newest complete checkpoint, or ``None`` when there is none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def save(self, step: int, *, model: Any = None, optimizer: Any = None) -> None:
        """Write the checkpoint of ``step``: ``model.state_dict()`` and ``optimizer.state_dict()``.

        Collective: every process calls it with the same ``step``. Returns once the
        checkpoint is complete in every process; then only the newest ``max_to_keep``
        complete checkpoints remain. A checkpoint of the same step (a run resumed from
        an earlier one) is replaced; a kill meanwhile leaves the older one.

        Args:
            step: a non-negative int.
            model: a module (anything with ``state_dict``/``load_state_dict``), or ``None``.
            optimizer: an optimizer, or ``None``; at least one of the two is needed.
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"CheckpointManager.save: step must be a non-negative int, got {step!r}")
        _check_arguments("save", model, optimizer)
        # Everything that can fail on the data is checked before any process writes or waits.
        model_state = None if model is None else model.state_dict()
        optimizer_parts = None if optimizer is None else _split_optimizer_state(optimizer.state_dict())
        tmp = os.path.join(self.directory, f"step_{step}.tmp-{_shared_token()}")
        os.makedirs(tmp, exist_ok=True)
        first = jax.process_index() == 0
        if model_state is not None:
            save(model_state, os.path.join(tmp, MODEL_FILE))
        if optimizer_parts is not None:
            tensors, text = optimizer_parts
            save(tensors, os.path.join(tmp, OPTIMIZER_FILE))
            if first:
                with open(os.path.join(tmp, OPTIMIZER_JSON), "w") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
        _barrier(f"xgrad checkpoint {step} written")
        if first:
            _write_manifest(tmp)
            self._tidy(in_flight=tmp)  # no older copy of any step remains: the one this save makes is the only one
            final = self._step_dir(step)
            if os.path.lexists(final):  # a rerun from an earlier step: this step's older checkpoint steps aside
                os.rename(final, f"{final}.old-{secrets.token_hex(8)}")
            os.rename(tmp, final)
            self._tidy(keep=self.max_to_keep)
        _barrier(f"xgrad checkpoint {step} complete")

    def _trash(self, path: str, step: int) -> None:
        """Rename ``path`` out of the listed names, whole, before it is deleted (NOTE [Complete checkpoints])."""
        os.rename(path, os.path.join(self.directory, f"step_{step}.trash-{secrets.token_hex(8)}"))

    def _tidy(self, in_flight: str | None = None, keep: int | None = None) -> None:
        """Process 0's housekeeping, each change one rename (NOTE [Complete checkpoints]).

        An older copy that is its step's only complete checkpoint takes the name
        ``step_N`` back; the other older copies and every ``.tmp-`` directory but
        ``in_flight`` go; then the checkpoints beyond the newest ``keep``; then the trash.
        """
        for step, folder in self._restorable().items():
            final = self._step_dir(step)
            if folder != final:
                if os.path.lexists(final):  # an incomplete step_N: the older copy is the checkpoint
                    self._trash(final, step)
                os.rename(folder, final)
        for name, step, kind in self._names():
            path = os.path.join(self.directory, name)
            if kind in ("tmp", "old") and path != in_flight:
                self._trash(path, step)
        if keep is not None:
            steps = self.all_steps()
            for step in steps[: max(len(steps) - keep, 0)]:
                self._trash(self._step_dir(step), step)
        for name, _, kind in self._names():
            if kind == "trash":
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

    def restore(self, step: int, *, model: Any = None, optimizer: Any = None) -> None:
        """Load the checkpoint of ``step`` into ``model`` and ``optimizer``, in place.

        Collective like ``save`` when the checkpoint is sharded over several
        processes. The model's parameters keep their placement; the optimizer's state
        is placed like its parameter (``Optimizer.load_state_dict``). Every file of the
        checkpoint is checked against its SHA-256 first: a damaged one raises
        ``xgrad.serialization.CorruptCheckpointError`` naming it, before anything loads.
        A checkpoint of an older xgrad, without that manifest, is restored as it is
        (NOTE [Checkpoints without a manifest]), with a warning logged once.
        """
        _check_arguments("restore", model, optimizer)
        folder = self._restorable().get(step, self._step_dir(step))
        if not os.path.isdir(folder):
            raise FileNotFoundError(
                f"CheckpointManager.restore: no complete checkpoint of step {step} in {self.directory!r} "
                f"(complete ones: {self.all_steps()})"
            )
        files = _verified_files(folder, step)  # an incomplete step_N raises here, naming what is wrong
        for wanted, name in ((model, MODEL_FILE), (optimizer, OPTIMIZER_FILE)):
            if wanted is not None and name not in files:
                raise ValueError(f"CheckpointManager.restore: the checkpoint of step {step} in {self.directory!r} holds "
                                 f"no {name.split('.')[0]} state (it was saved without {name.split('.')[0]}=)")
        # Everything is read before anything loads: a damaged file found while reading changes nothing.
        model_state = None if model is None else load(os.path.join(folder, MODEL_FILE))
        optimizer_state = None if optimizer is None else _read_optimizer_state(folder)
        if model is not None:
            model.load_state_dict(model_state)
        if optimizer is not None:
            optimizer.load_state_dict(optimizer_state)

"""``CheckpointManager``: numbered, sharded, atomic checkpoints of a model and its optimizer.

# NOTE [Complete checkpoints]
# A checkpoint of step N is the directory ``step_N`` of the manager's directory. A save
# writes everything into ``step_N.tmp-<id>`` (the id chosen by process 0 and shared by
# all): each process its shards (``xgrad.save``'s sharded format, NOTE [Sharded
# checkpoints] in xgrad/serialization.py), process 0 the structure files and the
# optimizer's non-tensor state as JSON. After a barrier that every process reaches only
# once its files are on disk, process 0 renames the directory to ``step_N`` (one atomic
# rename), removes the checkpoints beyond the newest ``max_to_keep`` and every
# ``.tmp-`` directory (a save killed earlier: no save of this directory is in flight
# then, saves being collective; an older checkpoint of the same step is moved to such a
# name first), and a second barrier makes ``save`` return in every
# process only once the checkpoint is complete. A kill at any point before the rename
# leaves a ``.tmp-`` directory, which ``latest_step`` never reads.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from typing import Any

import jax
import numpy as np

from xgrad.serialization import load, save
from xgrad.tensor import Tensor

__all__ = ["CheckpointManager"]

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
OPTIMIZER_JSON = "optimizer.json"  # param_groups and the state entries that are not tensors
_COMPLETE = re.compile(r"step_(\d+)")
_TORN = re.compile(r"step_\d+\.tmp-[0-9a-f]+(-replaced)?")


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


class CheckpointManager:
    """Numbered checkpoints of a model and its optimizer in ``directory``, the newest ``max_to_keep`` kept.

    ``save(step, model=..., optimizer=...)`` is collective under ``jax.distributed``:
    every process calls it, each writes the shards it holds (nothing is gathered onto
    one host), and the checkpoint becomes complete, in one atomic rename, only after
    all of them have finished. A job killed mid-save (or mid-run) and restarted on
    all its processes resumes with ``restore(manager.latest_step(), ...)`` from the
    newest complete checkpoint; a half-written one is never read (NOTE [Complete
    checkpoints]). The directory must be one filesystem that all processes see.

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

    def all_steps(self) -> list[int]:
        """The steps of the complete checkpoints, oldest first."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for n in names if (m := _COMPLETE.fullmatch(n)))

    def latest_step(self) -> int | None:
        """The step of the newest complete checkpoint, or ``None`` when there is none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def save(self, step: int, *, model: Any = None, optimizer: Any = None) -> None:
        """Write the checkpoint of ``step``: ``model.state_dict()`` and ``optimizer.state_dict()``.

        Collective: every process calls it with the same ``step``. Returns once the
        checkpoint is complete in every process; then only the newest ``max_to_keep``
        complete checkpoints remain. A checkpoint of the same step (a run resumed from
        an earlier one) is replaced.
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"CheckpointManager.save: step must be a non-negative int, got {step!r}")
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
            final = self._step_dir(step)
            if os.path.exists(final):  # a rerun from an earlier step: the older save of this step goes
                os.rename(final, f"{tmp}-replaced")
            os.rename(tmp, final)
            self._remove_old()
        _barrier(f"xgrad checkpoint {step} complete")

    def _remove_old(self) -> None:
        steps = self.all_steps()
        old = steps[: len(steps) - self.max_to_keep] if self.max_to_keep is not None else []
        torn = [n for n in os.listdir(self.directory) if _TORN.fullmatch(n)]
        for path in [self._step_dir(s) for s in old] + [os.path.join(self.directory, n) for n in torn]:
            shutil.rmtree(path, ignore_errors=True)

    def restore(self, step: int, *, model: Any = None, optimizer: Any = None) -> None:
        """Load the checkpoint of ``step`` into ``model`` and ``optimizer``, in place.

        Collective like ``save`` when the checkpoint is sharded over several
        processes. The model's parameters keep their placement; the optimizer's state
        is placed like its parameter (``Optimizer.load_state_dict``).
        """
        folder = self._step_dir(step)
        if not os.path.isdir(folder):
            raise FileNotFoundError(
                f"CheckpointManager.restore: no complete checkpoint of step {step} in {self.directory!r} "
                f"(complete ones: {self.all_steps()})"
            )
        if model is not None:
            model.load_state_dict(load(os.path.join(folder, MODEL_FILE)))
        if optimizer is not None:
            with open(os.path.join(folder, OPTIMIZER_JSON)) as f:
                text = f.read()
            optimizer.load_state_dict(_joined_optimizer_state(load(os.path.join(folder, OPTIMIZER_FILE)), text))

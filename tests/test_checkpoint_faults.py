"""``CheckpointManager`` under kills and damaged files: every step is left old or new, and a changed byte is caught.

Checkpoints that an older xgrad wrote (no manifest) stay listed and restorable, under kills too.

A kill is injected at every point where a save changes the directory (each
``os.rename``/``os.replace``/``os.unlink``/``os.remove``/``os.rmdir``, inside
``shutil.rmtree`` too), before and after the call, in a first save that removes an old
step, in a re-save of an existing step, and in one that replaces and removes steps an
older xgrad wrote; the simulated kill is a ``BaseException`` after which nothing more
reaches the disk, and a few points are also a real SIGKILL of a child process. ``python tests/test_checkpoint_faults.py DIR SCENARIO AT AFTER`` is
that child.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEEP = 2
# name: (steps saved first with version 10 * step, the step saved then, its version, whether an older xgrad saved the first)
SCENARIOS = {"first save, removing step 1": (2, 3, 30, False), "re-save of step 2": (2, 2, 21, False),
             "re-save of step 3 and removal of step 1, both an older xgrad's": (3, 3, 31, True)}
FIRST, RESAVE, _ = SCENARIOS
DISK_CHANGES = ("rename", "replace", "unlink", "remove", "rmdir")


class Killed(BaseException):
    """The process died here: nothing after it reaches the disk (``except Exception`` does not catch it)."""


class KillAt:
    """Patches ``os``'s disk changes; the ``at``-th one (from 0) kills the process, before or after it happens."""

    def __init__(self, at: int | None, after: bool = False, die=None) -> None:
        self.at, self.after, self.calls, self.dead = at, after, [], False
        self.die = die or self._raise

    @staticmethod
    def _raise() -> None:
        raise Killed

    def __enter__(self):
        self.real = {name: getattr(os, name) for name in DISK_CHANGES}
        for name, real in self.real.items():
            setattr(os, name, self._wrap(name, real))
        return self

    def __exit__(self, *exc):
        for name, real in self.real.items():
            setattr(os, name, real)
        return exc[0] is Killed

    def _wrap(self, name, real):
        def call(*args, **kwargs):
            if self.dead:
                raise Killed
            self.calls.append((name, args))
            if len(self.calls) - 1 == self.at:
                self.dead = True
                if self.after:
                    real(*args, **kwargs)
                self.die()
            return real(*args, **kwargs)

        return call


def _pair(version: int):
    """A Linear whose weights are all ``version`` and an Adam whose lr is ``version / 8`` (exact in JSON)."""
    import xgrad

    model = xgrad.nn.Linear(2, 1)
    model.load_state_dict({"weight": xgrad.full((1, 2), float(version)), "bias": xgrad.full((1,), float(version))})
    return model, xgrad.optim.Adam(model.parameters(), lr=version / 8)


def _save(directory, step: int, version: int) -> None:
    import xgrad

    model, optimizer = _pair(version)
    xgrad.distributed.CheckpointManager(directory, max_to_keep=KEEP).save(step, model=model, optimizer=optimizer)


def _write_as_older_xgrad(folder, model=None, optimizer=None) -> None:
    """A checkpoint as xgrad wrote it before manifests: the folder ``step_N`` holding ``model.safetensors`` (the
    model's state_dict), ``optimizer.safetensors`` (``{"state": {"<index>": {its Tensor entries}}}``, indices with no
    Tensor left out) and ``optimizer.json`` (``param_groups``, and the other state entries keyed alike), nothing else."""
    import xgrad

    os.makedirs(folder)
    if model is not None:
        xgrad.save(model.state_dict(), os.path.join(folder, "model.safetensors"))
    if optimizer is not None:
        state_dict = optimizer.state_dict()
        tensors: dict = {}
        others: dict = {}
        for index, entries in state_dict["state"].items():
            for name, value in entries.items():
                (tensors if isinstance(value, xgrad.Tensor) else others).setdefault(str(index), {})[name] = value
        xgrad.save({"state": tensors}, os.path.join(folder, "optimizer.safetensors"))
        with open(os.path.join(folder, "optimizer.json"), "w") as f:
            f.write(json.dumps({"param_groups": state_dict["param_groups"], "state": others}))


def _save_as_older_xgrad(directory, step: int, version: int) -> None:
    _write_as_older_xgrad(os.path.join(directory, f"step_{step}"), *_pair(version))


def _restored_version(manager, step: int, optimizer: bool = True) -> int:
    """The version of the model (and optimizer) that ``step`` restores, checked to be one version throughout."""
    model, fresh_optimizer = _pair(0)
    manager.restore(step, model=model, optimizer=fresh_optimizer if optimizer else None)
    weights = np.concatenate([model.weight.detach().numpy().ravel(), model.bias.detach().numpy()])
    version = int(weights[0])
    assert (weights == version).all(), (step, weights)
    assert not optimizer or fresh_optimizer.param_groups[0]["lr"] == version / 8, step
    return version


def _base(directory, scenario: str) -> None:
    """The checkpoints before the scenario's save: steps 1.. with versions 10, 20, ..."""
    before, _, _, older = SCENARIOS[scenario]
    for step in range(1, before + 1):
        (_save_as_older_xgrad if older else _save)(directory, step, 10 * step)


def _run(directory, scenario: str) -> None:
    _, step, version, _ = SCENARIOS[scenario]
    _save(directory, step, version)


def _check_old_or_new(directory, scenario: str) -> None:
    """Each listed step restores its old or its new values, no step that existed is lost, and the next save works."""
    import xgrad

    before, step, version, _ = SCENARIOS[scenario]
    old = {s: 10 * s for s in range(1, before + 1)}
    new = {s: version if s == step else old[s] for s in sorted(set(old) | {step})[-KEEP:]}
    manager = xgrad.distributed.CheckpointManager(directory, max_to_keep=KEEP)
    steps = manager.all_steps()
    assert set(old) & set(new) <= set(steps) <= set(old) | set(new), steps
    restored = {s: _restored_version(manager, s) for s in steps}
    for s, v in restored.items():
        assert v in (old.get(s), new.get(s)), (s, v)
    assert manager.latest_step() == max(steps)
    # The next save (again of the same step) completes the directory: the newest KEEP, each restorable, nothing else.
    _save(directory, step, version + 1)
    restored[step] = version + 1
    final = sorted(set(steps) | {step})[-KEEP:]
    assert manager.all_steps() == final
    assert sorted(os.listdir(directory)) == sorted(f"step_{s}" for s in final)
    assert {s: _restored_version(manager, s) for s in final} == {s: restored[s] for s in final}


def _kill_points(tmp_path, scenario: str) -> list[tuple[str, tuple]]:
    """The disk changes of the scenario's save, in order, from a run without a kill."""
    directory = tmp_path / "dry"
    _base(directory, scenario)
    with KillAt(None) as spy:
        _run(directory, scenario)
    return spy.calls


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """Each scenario's starting directory, made once and copied for every kill."""
    made = {}
    for k, scenario in enumerate(SCENARIOS):
        made[scenario] = tmp_path_factory.mktemp(f"base{k}") / "ckpt"
        _base(made[scenario], scenario)
    return made


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_kill_at_every_disk_change_leaves_each_step_old_or_new(tmp_path, bases, scenario):
    points = _kill_points(tmp_path, scenario)
    kinds = {name for name, _ in points}
    assert {"rename", "replace", "unlink", "rmdir"} <= kinds  # directory renames, xgrad.save's renames, rmtree
    if scenario.startswith("re-save"):  # the older copy steps aside before the new one takes its name
        assert any(name == "rename" and ".old-" in os.fspath(args[1]) for name, args in points)
    for at in range(len(points)):
        for after in (False, True):
            directory = tmp_path / f"kill{at}{'after' if after else 'before'}"
            shutil.copytree(bases[scenario], directory)
            with KillAt(at, after) as kill:
                _run(directory, scenario)
            assert kill.dead, (at, after)
            try:
                _check_old_or_new(directory, scenario)
            except AssertionError as exc:
                raise AssertionError(f"killed {'after' if after else 'at'} {points[at]}: {exc}") from exc


def _sigkill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def child(directory: str, scenario: str, at: int, after: bool) -> None:  # pragma: no cover - runs in children
    with KillAt(at, after, die=_sigkill):
        _run(directory, scenario)


def test_a_sigkill_mid_save_leaves_each_step_old_or_new(tmp_path, bases):
    """A real SIGKILL at three points: between a re-save's two renames, before a new step's rename, mid-delete."""
    kills = []
    for scenario, after, pick in (
        (RESAVE, True, lambda calls: next(at for at, (name, args) in enumerate(calls)
                                          if name == "rename" and ".old-" in os.fspath(args[1]))),
        (FIRST, False, lambda calls: next(at for at, (name, args) in enumerate(calls)
                                          if name == "rename" and os.fspath(args[1]).endswith("step_3"))),
        (FIRST, False, lambda calls: [at for at, (name, _) in enumerate(calls) if name == "unlink"][1]),  # mid-rmtree
    ):
        kills.append((scenario, pick(_kill_points(tmp_path / f"dry{len(kills)}", scenario)), after))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), "JAX_PLATFORMS": "cpu"}
    children = []
    for k, (scenario, at, after) in enumerate(kills):  # all at once: each child's start is most of the time
        directory = tmp_path / f"kill{k}"
        shutil.copytree(bases[scenario], directory)
        argv = [sys.executable, __file__, str(directory), scenario, str(at), str(int(after))]
        children.append((directory, scenario, subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)))
    for directory, scenario, process in children:
        _, err = process.communicate(timeout=120)
        assert process.returncode == -signal.SIGKILL, err
        _check_old_or_new(directory, scenario)


def test_every_changed_byte_of_a_checkpoint_raises_naming_its_file(tmp_path):
    """Each byte of each file (manifest, safetensors, the optimizer's JSON) changed in turn: restore raises, loads nothing."""
    import xgrad
    from xgrad.serialization import CorruptCheckpointError

    model = xgrad.nn.Linear(2, 1)
    optimizer = xgrad.optim.Adam(model.parameters(), lr=0.1)  # betas (0.9, 0.999)
    model(xgrad.ones(3, 2)).sum().backward()
    optimizer.step()
    manager = xgrad.distributed.CheckpointManager(tmp_path, max_to_keep=1)
    manager.save(1, model=model, optimizer=optimizer)
    folder = tmp_path / "step_1"
    names = sorted(os.listdir(folder))
    assert names == ["checkpoint.manifest", "model.safetensors", "optimizer.json", "optimizer.safetensors"]
    assert b'"betas": [0.9, 0.999]' in (folder / "optimizer.json").read_bytes()
    fresh, fresh_optimizer = _pair(0)
    for name in names:
        path = folder / name
        original = path.read_bytes()
        fd = os.open(path, os.O_WRONLY)
        try:
            for at, byte in enumerate(original):
                os.pwrite(fd, bytes([byte ^ 0x04]), at)  # "0.9" becomes "4.9" at the betas' first byte
                try:  # not pytest.raises: this runs 2,700 times
                    manager.restore(1, model=fresh, optimizer=fresh_optimizer)
                except CorruptCheckpointError as exc:
                    assert repr(str(path)) in str(exc), (name, at, exc)
                else:
                    pytest.fail(f"byte {at} of {name} changed, and the checkpoint restored")
                os.pwrite(fd, bytes([byte]), at)
        finally:
            os.close(fd)
    assert fresh.weight.detach().numpy().tolist() == [[0.0, 0.0]] and fresh_optimizer.param_groups[0]["lr"] == 0.0
    assert fresh_optimizer.state_dict()["state"] == {}  # nothing was loaded from a damaged checkpoint
    manager.restore(1, model=fresh, optimizer=fresh_optimizer)
    assert fresh_optimizer.param_groups[0]["betas"] == (0.9, 0.999)
    np.testing.assert_array_equal(fresh.weight.detach().numpy(), model.weight.detach().numpy())


def _snapshot(directory) -> dict[str, bytes]:
    """Every file under ``directory``, by its path there, with its bytes."""
    return {str(path.relative_to(directory)): path.read_bytes() for path in directory.rglob("*") if path.is_file()}


def test_checkpoints_of_an_older_xgrad_are_listed_restored_and_counted(tmp_path, caplog):
    """Steps an older xgrad wrote complete are listed and restore exactly, unchanged; its torn ones are not listed."""
    import xgrad
    from xgrad.serialization import CorruptCheckpointError

    model = xgrad.nn.Linear(2, 1)
    optimizer = xgrad.optim.Adam(model.parameters(), lr=0.125)
    model(xgrad.ones(3, 2)).sum().backward()
    optimizer.step()  # Tensor state (step, exp_avg, exp_avg_sq) and param_groups to restore
    _write_as_older_xgrad(tmp_path / "step_1", model, optimizer)
    _write_as_older_xgrad(tmp_path / "step_2", _pair(20)[0])  # saved without optimizer=
    # What an older save killed before its rename left, and older removals killed mid-delete:
    _write_as_older_xgrad(tmp_path / "step_3.tmp-0123abcd", *_pair(30))
    _write_as_older_xgrad(tmp_path / "step_0", *_pair(0))
    os.remove(tmp_path / "step_0" / "optimizer.json")
    _write_as_older_xgrad(tmp_path / "step_4", _pair(40)[0])  # a model sharded over 2 processes, one shard gone
    shutil.copy(tmp_path / "step_4" / "model.safetensors", tmp_path / "step_4" / "model.shard0-of-2.safetensors")

    manager = xgrad.distributed.CheckpointManager(tmp_path, max_to_keep=3)
    assert manager.all_steps() == [1, 2] and manager.latest_step() == 2
    before = _snapshot(tmp_path)
    fresh, fresh_optimizer = _pair(0)
    with caplog.at_level(logging.WARNING, logger="xgrad.distributed.checkpoint"):
        manager.restore(1, model=fresh, optimizer=fresh_optimizer)
        manager.restore(1, model=fresh, optimizer=fresh_optimizer)
    assert [r.getMessage() for r in caplog.records] == [  # once per directory
        f"CheckpointManager: {str(tmp_path / 'step_1')!r}, the checkpoint of step 1, was written by an older xgrad "
        "and has no manifest: only the CRC-32 of each tensor is verified, optimizer.json and the files' structure "
        "records cannot be. It is restored as it is; the next save of step 1 writes it with a manifest"]
    assert _snapshot(tmp_path) == before  # restore writes nothing into a checkpoint
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(fresh.state_dict()[name].numpy(), value.numpy())
    restored, saved = fresh_optimizer.state_dict(), optimizer.state_dict()
    assert restored["param_groups"] == saved["param_groups"]
    assert {i: sorted(e) for i, e in restored["state"].items()} == {i: ["exp_avg", "exp_avg_sq", "step"] for i in (0, 1)}
    for index, entries in saved["state"].items():
        for name, value in entries.items():
            np.testing.assert_array_equal(restored["state"][index][name].numpy(), value.numpy())
    assert _restored_version(manager, 2, optimizer=False) == 20
    with pytest.raises(CorruptCheckpointError, match=r"step_0/optimizer.json' is missing; the checkpoint is damaged"):
        manager.restore(0, model=fresh)
    with pytest.raises(CorruptCheckpointError, match=r"step_4/model.shard1-of-2.safetensors' is missing"):
        manager.restore(4, model=fresh)
    with pytest.raises(FileNotFoundError, match=r"no complete checkpoint of step 3 .* \(complete ones: \[1, 2\]\)"):
        manager.restore(3, model=fresh)

    # New saves beside them: the older ones count for max_to_keep=3; a re-save of one writes it anew.
    for step in (5, 6):
        _save(tmp_path, step, 10 * step)
    manager.save(2, model=_pair(21)[0])
    assert manager.all_steps() == [2, 5, 6]
    assert _restored_version(manager, 2, optimizer=False) == 21
    assert "checkpoint.manifest" in os.listdir(tmp_path / "step_2")
    # The torn save went, as an older xgrad's next save removed it; the half-deleted steps are neither listed nor removed.
    assert sorted(os.listdir(tmp_path)) == ["step_0", "step_2", "step_4", "step_5", "step_6"]


@pytest.mark.parametrize("damage", [b'{"param_groups": [', b"\xff\xfe", b"[]", b'{"param_groups": [], "state": {"a": {}}}'])
def test_a_damaged_optimizer_json_without_manifest_raises_naming_it(tmp_path, damage):
    """Nothing checksums an older xgrad's optimizer.json: what does not parse as one raises the documented error."""
    import xgrad
    from xgrad.serialization import CorruptCheckpointError

    _save_as_older_xgrad(tmp_path, 1, 10)
    (tmp_path / "step_1" / "optimizer.json").write_bytes(damage)
    manager = xgrad.distributed.CheckpointManager(tmp_path)
    assert manager.all_steps() == [1]  # listed by its files' names alone
    model, optimizer = _pair(0)
    with pytest.raises(CorruptCheckpointError, match=r"step_1/optimizer.json' is not an optimizer's param_groups"):
        manager.restore(1, model=model, optimizer=optimizer)
    assert model.weight.detach().numpy().tolist() == [[0.0, 0.0]]  # nothing loaded, the model neither


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2], int(sys.argv[3]), bool(int(sys.argv[4])))

"""``CheckpointManager`` under kills and damaged files: every step is left old or new, and a changed byte is caught.

A kill is injected at every point where a save changes the directory (each
``os.rename``/``os.replace``/``os.unlink``/``os.remove``/``os.rmdir``, inside
``shutil.rmtree`` too), before and after the call, in a first save that removes an old
step and in a re-save of an existing step; the simulated kill is a ``BaseException``
after which nothing more reaches the disk, and a few points are also a real SIGKILL of
a child process. ``python tests/test_checkpoint_faults.py DIR SCENARIO AT AFTER`` is
that child.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEEP = 2
# name: (steps saved first with version 10 * step, the step saved then, its version)
SCENARIOS = {"first save, removing step 1": (2, 3, 30), "re-save of step 2": (2, 2, 21)}
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


def _restored_version(manager, step: int) -> int:
    model, optimizer = _pair(0)
    manager.restore(step, model=model, optimizer=optimizer)
    weights = np.concatenate([model.weight.detach().numpy().ravel(), model.bias.detach().numpy()])
    version = int(weights[0])
    assert (weights == version).all() and optimizer.param_groups[0]["lr"] == version / 8, (step, weights)
    return version


def _base(directory, scenario: str) -> None:
    """The checkpoints before the scenario's save: steps 1.. with versions 10, 20, ..."""
    for step in range(1, SCENARIOS[scenario][0] + 1):
        _save(directory, step, 10 * step)


def _run(directory, scenario: str) -> None:
    _, step, version = SCENARIOS[scenario]
    _save(directory, step, version)


def _check_old_or_new(directory, scenario: str) -> None:
    """Each listed step restores its old or its new values, no step that existed is lost, and the next save works."""
    import xgrad

    before, step, version = SCENARIOS[scenario]
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
    first, resave = SCENARIOS
    kills = []
    for scenario, after, pick in (
        (resave, True, lambda calls: next(at for at, (name, args) in enumerate(calls)
                                          if name == "rename" and ".old-" in os.fspath(args[1]))),
        (first, False, lambda calls: next(at for at, (name, args) in enumerate(calls)
                                          if name == "rename" and os.fspath(args[1]).endswith("step_3"))),
        (first, False, lambda calls: [at for at, (name, _) in enumerate(calls) if name == "unlink"][1]),  # mid-rmtree
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


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2], int(sys.argv[3]), bool(int(sys.argv[4])))

"""xgrad.save / xgrad.load: round trips in both formats, atomic writes, checked loads, and no pickle ever."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad.jax_internals import single_device_sharding
from xgrad.serialization import CorruptCheckpointError

FORMATS = ["npz", "safetensors"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_tensor_round_trip_keeps_values_dtype_and_requires_grad(tmp_path, fmt):
    path = tmp_path / f"t.{fmt}"
    for value, requires_grad in [(np.arange(6.0).reshape(2, 3), True), (np.array(3, np.int32), False)]:
        xgrad.save(xgrad.tensor(value, requires_grad=requires_grad), path)
        loaded = xgrad.load(path)
        assert isinstance(loaded, xgrad.Tensor) and loaded.is_leaf
        assert loaded.dtype == value.dtype and loaded.shape == value.shape
        assert loaded.requires_grad is requires_grad
        np.testing.assert_array_equal(loaded.detach().numpy(), value)


@pytest.mark.parametrize("fmt", FORMATS)
def test_nested_state_dict_round_trip(tmp_path, fmt):
    model = xgrad.nn.MLP([3, 4, 2], key=0)
    state = {"model": model.state_dict(), "step": xgrad.tensor(7), "extras": {"bf16": jnp.ones(3, jnp.bfloat16), "np": np.zeros((0, 2))}}
    path = tmp_path / f"ckpt.{fmt}"
    xgrad.save(state, path)
    loaded = xgrad.load(path)
    assert list(loaded) == ["model", "step", "extras"] and list(loaded["model"]) == list(state["model"])
    for name, t in state["model"].items():
        np.testing.assert_array_equal(loaded["model"][name].detach().numpy(), t.detach().numpy())
    assert loaded["step"].item() == 7
    assert loaded["extras"]["bf16"].dtype == jnp.bfloat16 and loaded["extras"]["bf16"].tolist() == [1.0, 1.0, 1.0]
    assert loaded["extras"]["np"].shape == (0, 2)
    fresh = xgrad.nn.MLP([3, 4, 2], key=5)
    fresh.load_state_dict(loaded["model"])
    x = xgrad.randn(2, 3, key=jax.random.key(0))
    np.testing.assert_array_equal(fresh(x).detach().numpy(), model(x).detach().numpy())


def test_load_onto_device(tmp_path):
    path = tmp_path / "t.npz"
    xgrad.save(xgrad.ones(2), path)
    assert xgrad.load(path, device="cpu:1").device == jax.devices("cpu")[1]


def test_foreign_files_load_as_flat_dicts(tmp_path):
    np.savez(tmp_path / "plain.npz", a=np.ones(2), b=np.arange(3))
    loaded = xgrad.load(tmp_path / "plain.npz")
    assert sorted(loaded) == ["a", "b"] and loaded["b"].tolist() == [0, 1, 2]
    from safetensors.numpy import save_file

    save_file({"w": np.full((2, 2), 5.0, np.float32)}, str(tmp_path / "plain.safetensors"))
    assert xgrad.load(tmp_path / "plain.safetensors")["w"].tolist() == [[5.0, 5.0], [5.0, 5.0]]


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_refuses_pickled_npz(tmp_path, capsys):
    path = tmp_path / "evil.npz"
    np.savez(path, payload=np.array([_Evil()], dtype=object))
    with pytest.raises(ValueError, match="contains pickled objects, which xgrad never unpickles"):
        xgrad.load(path)
    assert "must never run" not in capsys.readouterr().out


def test_bad_input_errors(tmp_path):
    (tmp_path / "x.pkl").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="must end in .npz or .safetensors"):
        xgrad.load(tmp_path / "x.pkl")
    with pytest.raises(TypeError, match="got list at a"):
        xgrad.save({"a": [1, 2]}, tmp_path / "x.npz")
    with pytest.raises(ValueError, match="without '/'"):
        xgrad.save({"a/b": xgrad.ones(1)}, tmp_path / "x.npz")
    with pytest.raises(ValueError, match="reserved"):
        xgrad.save({"__xgrad__": xgrad.ones(1)}, tmp_path / "x.npz")


class _DiskFull:
    """A file whose writes fail with ENOSPC after ``budget`` bytes, as a full disk does mid-save."""

    def __init__(self, f, budget):
        self._f, self._budget = f, budget

    def write(self, data):
        if len(data) > self._budget:
            self._f.write(bytes(data)[: self._budget])
            raise OSError(28, "No space left on device")
        self._budget -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_failure_mid_save_leaves_previous_file_intact(tmp_path, fmt, monkeypatch):
    from xgrad import serialization

    path = tmp_path / f"ckpt.{fmt}"
    xgrad.save({"w": xgrad.arange(4.0)}, path)
    before = path.read_bytes()
    real_open = open
    monkeypatch.setattr(serialization, "open", lambda *a, **k: _DiskFull(real_open(*a, **k), 64), raising=False)
    with pytest.raises(OSError, match="No space left"):
        xgrad.save({"w": xgrad.arange(1000.0)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporary file left behind
    assert xgrad.load(path)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    xgrad.save({"w": xgrad.arange(2.0)}, path)  # and the next save replaces it
    assert xgrad.load(path)["w"].tolist() == [0.0, 1.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_saved_file_gets_the_usual_permissions(tmp_path):
    path = tmp_path / "t.npz"
    xgrad.save(xgrad.ones(1), path)
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def _write_npz(path, arrays, meta):
    np.savez(path, **arrays, __xgrad__=np.array(json.dumps(meta)))


def test_load_validates_metadata(tmp_path):
    path = tmp_path / "bad.npz"
    node = {"tensor": "w", "dtype": "float64", "shape": [2, 3], "requires_grad": False}
    good = {"version": 2, "tree": node}
    _write_npz(path, {"w": np.ones((2, 3))}, good)
    assert xgrad.load(path).shape == (2, 3)
    cases = [
        ({"w": np.ones((2, 3))}, {**good, "version": 99}, "format version 99; this xgrad reads versions 1, 2"),
        ({"w": np.ones((2, 3))}, {"tree": node}, "has no format version"),
        ({"w": np.ones((2, 3))}, {**good, "tree": {**node, "dtype": "float77"}}, "'w' has unknown dtype 'float77'"),
        ({"w": np.ones((2, 3))}, {**good, "tree": {**node, "dtype": "int16"}}, "'w' is stored as float64 but recorded as int16"),
        ({"w": np.ones(5)}, good, r"'w' holds 5 elements but its recorded shape \(2, 3\) has 6"),
        ({"w": np.ones((3, 2))}, good, r"'w' has shape \(3, 2\) but its recorded shape is \(2, 3\)"),
        ({"v": np.ones((2, 3))}, good, "entry 'w' is missing"),
        ({"w": np.ones((2, 3))}, {**good, "tree": ["w"]}, "bad structure record at the top level"),
    ]
    for arrays, meta, message in cases:
        _write_npz(path, arrays, meta)
        with pytest.raises(ValueError, match=f"is not a valid xgrad checkpoint: .*{message}|{message}"):
            xgrad.load(path)
    np.savez(path, w=np.ones(2), __xgrad__=np.array("{not json"))
    with pytest.raises(ValueError, match="its structure record is not JSON"):
        xgrad.load(path)


def test_load_validates_safetensors_metadata(tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "bad.safetensors"
    meta = {"version": 2, "tree": {"tensor": "w", "dtype": "float32", "shape": [4], "requires_grad": False}}
    save_file({"w": np.ones(3, np.float32)}, str(path), metadata={"__xgrad__": json.dumps(meta)})
    with pytest.raises(ValueError, match=r"'w' holds 3 elements but its recorded shape \(4,\) has 4"):
        xgrad.load(path)
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header")
    with pytest.raises(ValueError, match="is not a valid xgrad checkpoint"):
        xgrad.load(path)


def test_non_zip_npz_says_so(tmp_path):
    path = tmp_path / "x.npz"
    path.write_bytes(b"certainly not a zip archive")
    with pytest.raises(ValueError, match="is not an .npz file: an .npz is a zip archive and this file is not one"):
        xgrad.load(path)
    np.save(tmp_path / "y.npy", np.ones(2))
    (tmp_path / "y.npy").rename(path)
    with pytest.raises(ValueError, match="is not an .npz file"):
        xgrad.load(path)
    with pytest.raises(FileNotFoundError):
        xgrad.load(tmp_path / "absent.npz")


def test_version_1_files_still_load(tmp_path):
    path = tmp_path / "v1.npz"
    _write_npz(path, {"a": np.arange(3)}, {"version": 1, "tree": {"dict": {"a": {"tensor": "a", "dtype": "int64", "requires_grad": False}}}})
    assert xgrad.load(path)["a"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("fmt", FORMATS)
def test_sharded_arrays_come_back_on_their_sharding(tmp_path, fmt):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    replicated = NamedSharding(mesh, PartitionSpec())
    state = {"w": xgrad.tensor(np.arange(8.0).reshape(4, 2), device=rows, requires_grad=True),
             "b": xgrad.tensor(np.arange(2.0), device=replicated)}
    path = tmp_path / f"s.{fmt}"
    xgrad.save(state, path)
    loaded = xgrad.load(path)
    for name in state:
        assert loaded[name].sharding == state[name].sharding
        np.testing.assert_array_equal(loaded[name].detach().numpy(), state[name].detach().numpy())
    assert loaded["w"].requires_grad
    assert xgrad.load(path, device="cpu:1")["w"].sharding == single_device_sharding(jax.devices()[1])
    # One sharding for everything: entries of lower rank than its spec go replicated on its mesh.
    xgrad.save({**state, "step": xgrad.tensor(5)}, path)
    onto_rows = xgrad.load(path, device=rows)
    assert onto_rows["b"].sharding == rows and onto_rows["step"].sharding == replicated
    assert onto_rows["step"].item() == 5 and onto_rows["b"].tolist() == [0.0, 1.0]


# -- a save killed mid-write, and corruption after the write -----------------------------------
_KILLED_MID_SAVE = """
import sys, time
import numpy as np
import xgrad
from xgrad import serialization

real = serialization._serialize


def part_then_hang(fmt, arrays, meta):
    write = real(fmt, arrays, meta)

    def partial(f):
        import io
        buf = io.BytesIO()
        write(buf)
        data = buf.getvalue()
        f.write(data[: len(data) * int(sys.argv[2]) // 2])  # nothing, or half
        f.flush()
        print("mid-save", flush=True)
        time.sleep(120)  # the test kills us here

    return partial


serialization._serialize = part_then_hang
xgrad.save({"w": xgrad.tensor(np.arange(100000.0))}, sys.argv[1])
"""


def _temporaries(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("halves", [1, 0], ids=["half-written", "empty"])
def test_a_save_killed_mid_write_leaves_a_temporary_the_next_save_removes(tmp_path, halves):
    import signal
    import subprocess
    import sys

    path = tmp_path / "ckpt.safetensors"  # the temporaries are the same for both formats
    xgrad.save({"w": xgrad.arange(3.0)}, path)
    child = subprocess.Popen([sys.executable, "-c", _KILLED_MID_SAVE, str(path), str(halves)], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "mid-save"  # its temporary is half written, or empty
        (stale,) = _temporaries(tmp_path)
        assert ((tmp_path / stale).stat().st_size > 0) == bool(halves)
        xgrad.save({"w": xgrad.arange(4.0)}, path)  # a live writer's temporary is left alone
        assert _temporaries(tmp_path) == [stale]
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=60)
        child.stdout.close()
    assert _temporaries(tmp_path) == [stale]  # SIGKILL runs no cleanup
    assert xgrad.load(path)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    xgrad.save({"w": xgrad.arange(5.0)}, path)  # the next save of the same target removes it, at once
    assert _temporaries(tmp_path) == []
    assert xgrad.load(path)["w"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_only_unlocked_temporaries_of_the_same_target_are_removed(tmp_path):
    path = tmp_path / "a.npz"
    empty = tmp_path / ".a.npz.0123456789abcdef.tmp"  # a save killed before it wrote anything
    written = tmp_path / ".a.npz.00000000aaaaaaaa.tmp"
    other_target = tmp_path / ".b.npz.00000000bbbbbbbb.tmp"
    not_ours = tmp_path / ".a.npz.keep.tmp"
    for p in (empty, written, other_target, not_ours):
        p.write_bytes(b"" if p == empty else b"x" * 100)
    xgrad.save(xgrad.ones(2), path)
    assert _temporaries(tmp_path) == sorted([other_target.name, not_ours.name])


def test_a_temporary_taken_for_stale_before_its_writer_locks_it_is_replaced(tmp_path, monkeypatch):
    """Another save's cleaner may remove a temporary between its creation and its lock: the save goes on, on a new one."""
    from xgrad import serialization

    path = tmp_path / "a.safetensors"
    real_lock, raced = serialization._lock, []

    def cleaner_first(fd, wait):
        if wait and not raced:  # the writer's lock, the first time: another process's cleaner runs just before it
            raced.append(fd)
            serialization._remove_stale_temporaries(str(tmp_path), path.name)
        return real_lock(fd, wait)

    monkeypatch.setattr(serialization, "_lock", cleaner_first)
    xgrad.save({"w": xgrad.arange(3.0)}, path)
    assert raced and _temporaries(tmp_path) == []
    assert xgrad.load(path)["w"].tolist() == [0.0, 1.0, 2.0]


def _flip_a_bit_of(path, array):
    data = bytearray(path.read_bytes())
    at = bytes(data).index(np.ascontiguousarray(array).tobytes()) + 3
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_flipped_bit_raises_naming_the_path(tmp_path, fmt):
    values = np.linspace(0.125, 4.0, 32)
    path = tmp_path / f"ckpt.{fmt}"
    xgrad.save({"layer": {"w": xgrad.tensor(values)}, "b": xgrad.ones(3)}, path)
    _flip_a_bit_of(path, values)
    with pytest.raises(CorruptCheckpointError, match=rf"{path.name}.*(checksum|CRC)") as info:
        xgrad.load(path)
    assert str(path) in str(info.value) and "layer/w" in str(info.value)
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ValueError)  # torch.load's type, and xgrad's


def test_each_safetensors_entry_carries_its_checksum(tmp_path):
    values = np.linspace(0.125, 4.0, 32)
    path = tmp_path / "plain.safetensors"
    xgrad.save({"w": xgrad.tensor(values)}, path)
    meta = json.loads(__import__("safetensors").safe_open(str(path), "np").metadata()["__xgrad__"])
    assert set(meta["crc32"]) == {"w"}  # one checksum per entry, in the structure record

"""Whole-object checkpoints (``xgrad.save(model, "m.pt")``) that an adversary wrote or a disk corrupted.

``xgrad.load`` must bound what such a file makes it allocate and run (a zip bomb, a lying
size, a constructor called with hostile arguments, an import), and report every file it
refuses as ``xgrad.serialization.RestrictedUnpicklingError`` (a ``CorruptCheckpointError``)
naming the file, never a raw zipfile, NumPy or pickle error; files that ``xgrad.save``
wrote must still load exactly.
"""

import collections
import io
import pickle
import struct
import sys
import zipfile

import jax
import numpy as np
import pytest

import xgrad
import xgrad.nn as nn
from xgrad import restricted_pickle, serialization
from xgrad.generator import KeyState

Refused = serialization.RestrictedUnpicklingError
PICKLE = restricted_pickle.PICKLE_MEMBER
ARRAY = "xgrad_archive/arrays/0.npy"


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 4, key=0)
        self.norm = nn.BatchNorm1d(4)  # buffers: running statistics and a step count
        self.body = nn.Sequential(nn.Linear(4, 4, key=1), nn.LayerNorm(4), nn.Tanh(), nn.Linear(4, 3, key=2))
        self.head = nn.Linear(3, 4, key=3)
        self.head.weight = nn.Parameter(self.body[3].weight.detach().T)  # its own parameter, of equal values
        self.tied = self.body[0]  # one module under two names
        self.dtype = xgrad.float32
        self.sizes = (4, 3)

    def forward(self, tokens):
        return self.head(self.body(self.norm(self.embed(tokens))))


class _Calls:
    """Pickles as a REDUCE: a call ``func(*args)``, then a BUILD of ``state`` if one is given."""

    def __init__(self, func, *args, state=None):
        self.func, self.args, self.state = func, args, state

    def __reduce__(self):
        return (self.func, self.args) if self.state is None else (self.func, self.args, self.state)


def _archive(path, pickled, arrays=(), compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression) as archive:
        archive.writestr(PICKLE, pickled)
        for name, data in arrays:
            archive.writestr(name, data)
    return path


def _npy(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _pickle_of_array():
    """A pickle of the stored array ``ARRAY``, referred to as ``xgrad.save`` refers to one."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=4)
    pickler.persistent_id = lambda obj: ("ndarray", "0.npy") if obj is ARRAY else None
    pickler.dump(ARRAY)
    return buffer.getvalue()


def _declare(path, member, size):
    """Make the central directory of ``path`` declare ``size`` uncompressed bytes for ``member``."""
    data = bytearray(path.read_bytes())
    name = member.encode()
    at = data.index(b"PK\x01\x02")
    while data[at + 46:at + 46 + len(name)] != name:
        at = data.index(b"PK\x01\x02", at + 1)
    struct.pack_into("<I", data, at + 24, size)
    path.write_bytes(bytes(data))


def _refused(path, match=None):
    with pytest.raises(Refused, match=match) as info:
        xgrad.load(path)
    assert str(path) in str(info.value)
    return info.value


def test_the_error_is_a_corrupt_checkpoint_error_and_pytorchs_error_types():
    # PyTorch raises RuntimeError for a corrupt archive and pickle.UnpicklingError for a refused class.
    assert issubclass(Refused, serialization.CorruptCheckpointError)
    assert issubclass(Refused, RuntimeError) and issubclass(Refused, pickle.UnpicklingError)


# -- legitimate files --------------------------------------------------------------------
def test_a_saved_model_loads_with_the_same_outputs_and_state(tmp_path):
    model = Model()
    tokens = xgrad.tensor([0, 1, 2, 3, 4, 0])
    model(tokens)  # the running statistics move off their initial values
    model.eval()
    path = tmp_path / "model.pt"
    xgrad.save(model, path)
    with serialization.safe_globals([Model]):
        loaded = xgrad.load(path)
    assert type(loaded) is Model and not loaded.training and loaded.tied is loaded.body[0]
    assert loaded.dtype is xgrad.float32 and loaded.sizes == (4, 3)
    state, loaded_state = model.state_dict(), loaded.state_dict()
    assert list(loaded_state) == list(state)
    for name, value in state.items():
        assert loaded_state[name].dtype == value.dtype
        np.testing.assert_array_equal(loaded_state[name].numpy(), value.numpy())
    np.testing.assert_array_equal(loaded(tokens).detach().numpy(), model(tokens).detach().numpy())
    loaded.train()
    loaded(tokens).sum().backward()  # its parameters are leaves that collect gradients
    assert all(p.grad is not None for p in loaded.body.parameters())


def test_plain_values_round_trip(tmp_path):
    values = {
        "slice": slice(1, None, 2), "range": range(0, 10, 3), "complex": 1 - 2j, "bytearray": bytearray(b"ab"),
        "bytes": b"\x00\xff", "set": {1, "a"}, "frozenset": frozenset({(1, 2)}), "ordered": collections.OrderedDict(b=1, a=2),
        "big": -(2**100), "float": 0.1, "text": "é\u2603", "none": None, "nested": [(1, [2.5]), {"k": (True,)}, (1, 2, 3, (4, 5, 6, 7))],
        "dtype": xgrad.bfloat16, "int_keys": {0: "a", -3: "b"},
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)), "scalar": np.array(7, np.int16),
        "empty": np.zeros((0, 3), np.float32), "array": jax.numpy.arange(4),
        "tensor": xgrad.tensor([1.0, 2.0], requires_grad=True), "key": KeyState(jax.random.key(3)),
    }
    buffer = io.BytesIO()
    xgrad.save(values, buffer)
    buffer.seek(0)
    loaded = xgrad.load(buffer)
    assert list(loaded) == list(values)
    for name in ("slice", "range", "complex", "bytearray", "bytes", "set", "frozenset", "ordered", "big", "float",
                 "text", "none", "nested", "int_keys"):
        assert loaded[name] == values[name] and type(loaded[name]) is type(values[name]), name
    assert loaded["dtype"] is xgrad.bfloat16
    for name in ("fortran", "scalar", "empty"):
        assert loaded[name].dtype == values[name].dtype and loaded[name].flags.f_contiguous == values[name].flags.f_contiguous
        np.testing.assert_array_equal(loaded[name], values[name])
    assert isinstance(loaded["array"], jax.Array) and loaded["array"].tolist() == [0, 1, 2, 3]
    assert loaded["tensor"].requires_grad and loaded["tensor"].tolist() == [1.0, 2.0]
    assert jax.random.key_data(loaded["key"].get()).tolist() == jax.random.key_data(values["key"].get()).tolist()


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_plain_data_of_every_binary_protocol_loads_as_pickle_loads_it(tmp_path, protocol):
    shared = [1.5, {"k": None}]
    value = {
        "numbers": [0, 255, 65535, -1, 2**31, -(2**70), 1e300, True, False, None, 1 + 2j],
        "text": ["", "é" * 300, "x" * 70000], "tuples": [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4, (5,))],
        "containers": [set(), {3, "a"}, frozenset({4}), collections.OrderedDict(a=1), {0: [], "": {}}],
        "shared": [shared, shared], "builtins": [slice(None, 5), range(2, 9, 3)],
    }
    if protocol > 2:  # protocol 2 pickles bytes through _codecs.encode, which no checkpoint needs
        value["bytes"] = [b"", b"\xff" * 300, bytearray(b"ab")]
    path = _archive(tmp_path / f"p{protocol}.pt", pickle.dumps(value, protocol=protocol))
    loaded = xgrad.load(path)
    assert loaded == pickle.loads(pickle.dumps(value, protocol=protocol))
    assert loaded["shared"][0] is loaded["shared"][1]


def test_arrays_true_keeps_what_the_file_shares(tmp_path):
    # Converting Tensors by a pass over the result visited a list shared at each of n levels 2**n times.
    shared = [xgrad.ones(2)]
    for _ in range(3):
        shared = [shared, shared]
    buffer = io.BytesIO()
    xgrad.save(shared, buffer)
    buffer.seek(0)
    loaded = xgrad.load(buffer, arrays=True)
    assert loaded[0] is loaded[1] and loaded[0][0] is loaded[0][1] and loaded[0][0][0] is loaded[1][1][1]
    assert isinstance(loaded[0][0][0][0], jax.Array) and loaded[0][0][0][0].tolist() == [1.0, 1.0]


# -- what a file can make the loader allocate ----------------------------------------------
@pytest.mark.parametrize("member", [PICKLE, ARRAY])
def test_a_zip_bomb_is_refused_before_it_inflates(tmp_path, member):
    zeros = _npy(np.zeros(2**20))  # 8 MiB of zeros deflate to about 8 KiB
    members = {PICKLE: _pickle_of_array(), ARRAY: _npy(np.ones(2))} | {member: zeros}
    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    assert path.stat().st_size < 2**15
    _refused(path, r"declare 8,[\d,]+ bytes uncompressed, more than 8 times the file's")


def test_a_pickle_over_max_pickle_bytes_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "model.pt"
    xgrad.save(nn.Linear(2, 2), path)
    monkeypatch.setattr(restricted_pickle, "MAX_PICKLE_BYTES", 256)
    _refused(path, r"its pickle xgrad_archive/data.pkl declares \d+ bytes, more than MAX_PICKLE_BYTES \(256\)")


def test_a_member_that_inflates_past_its_declared_size_stops_there(tmp_path):
    # Reading stops at the declared 1,000 bytes of a megabyte of zeros; their CRC-32 then fails.
    path = _archive(tmp_path / "liar.pt", bytes(2**20), compression=zipfile.ZIP_DEFLATED)
    _declare(path, PICKLE, 1000)
    _refused(path, "CRC")


def test_a_member_that_holds_less_than_it_declares_is_refused(tmp_path):
    path = tmp_path / "model.pt"
    xgrad.save(nn.Linear(2, 2), path)
    with zipfile.ZipFile(path) as archive:
        size = archive.getinfo(PICKLE).file_size
    _declare(path, PICKLE, size + 100)
    _refused(path, f"declares {size + 100:,} bytes and holds {size:,}")


def test_an_array_header_that_disagrees_with_its_member_size_is_refused_unallocated(tmp_path):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)})
    path = _archive(tmp_path / "header.pt", _pickle_of_array(), [(ARRAY, header.getvalue() + bytes(16))])
    _refused(path, r"declares \d+ bytes but its .npy header describes 8,000,000,000,\d+")


# -- what a file can make the loader run -------------------------------------------------
@pytest.mark.parametrize("opcode", ["REDUCE", "NEWOBJ"])
@pytest.mark.parametrize(("cls", "args"), [(nn.TransformerEncoder, (None, 100000)), (nn.Linear, (100000, 100000))],
                         ids=["TransformerEncoder", "Linear"])
def test_an_allowed_module_class_is_never_constructed_from_file_arguments(tmp_path, monkeypatch, cls, args, opcode):
    calls = []
    monkeypatch.setattr(cls, "__init__", lambda self, *a, **k: calls.append(a))
    pickled = pickle.dumps(_Calls(cls, *args), protocol=4)
    at = pickled.rindex(pickle.REDUCE)  # the last opcode but MEMOIZE and STOP: the call of cls
    if opcode == "NEWOBJ":  # the same stack, class and arguments, read as cls.__new__(cls, *args)
        pickled = pickled[:at] + pickle.NEWOBJ + pickled[at + 1:]
    path = _archive(tmp_path / "hostile.pt", pickled)
    loaded = xgrad.load(path)
    assert calls == []  # rebuilt as pickle restores objects: cls.__new__(cls, *args), then its state
    assert type(loaded) is cls and list(loaded.parameters()) == []


@pytest.mark.parametrize("value", [
    _Calls(bytes, 2**20),  # a size: bytes(10**12) would allocate a terabyte
    _Calls(bytearray, 2**20),
    _Calls(list, range(10)),  # a lazy range: list(range(10**12)) would never finish
    _Calls(str, [[1]]),  # the repr of shared nested lists grows exponentially with their depth
    _Calls(frozenset, [((1,),)]),  # a nested tuple hashes in time exponential in its depth
    {((1,),): 0},
    {2**61 - 1: 0},  # integers past the hash modulus can be made to collide
], ids=["bytes-size", "bytearray-size", "list-range", "str-list", "frozenset-nested", "nested-key", "huge-int-key"])
def test_builtins_are_called_only_with_arguments_the_file_size_bounds(tmp_path, value):
    path = _archive(tmp_path / "hostile.pt", pickle.dumps(value, protocol=4))
    _refused(path, "refused")


@pytest.mark.parametrize("target", ["class", "dtype"])
def test_a_state_is_given_only_to_objects_the_file_made(tmp_path, monkeypatch, target):
    # BUILD with slot state sets attributes: of the class nn.Linear itself, or of the shared xgrad.float32.
    monkeypatch.setattr(nn.Linear, "forward", nn.Linear.forward)  # restored, whatever the load does
    made = {"class": b"c" + nn.Linear.__module__.encode() + b"\nLinear\n",
            "dtype": b"cxgrad.tensor.dtypes\ndtype\n\x8c\x07float32\x85R"}[target]
    state = b"N}\x8c\x07forwardNs\x86"  # (None, {"forward": None})
    path = _archive(tmp_path / "hostile.pt", b"\x80\x02" + made + state + pickle.BUILD + pickle.STOP)
    _refused(path, "the pickle did not make")
    assert nn.Linear.forward is not None and not hasattr(xgrad.float32, "forward")


@pytest.mark.parametrize(("shared", "make"), [
    (list(range(1000)), lambda shared: _Calls(tuple, shared)),  # copies the list
    (dict.fromkeys(map(str, range(1000))), lambda shared: _Calls(nn.Identity, state=shared)),  # sets 1,000 attributes
    (tuple(range(1000)), lambda shared: {shared: 0}),  # hashes the tuple
], ids=["copy", "build", "hash"])
def test_one_collection_named_over_and_over_costs_the_file_its_size(tmp_path, shared, make):
    # 2,000 uses of one 1,000-item collection through the memo: 2,000,000 items of work from 20 kB of pickle.
    pickled = pickle.dumps([make(shared) for _ in range(2000)], protocol=4)
    assert len(pickled) < 40_000
    path = _archive(tmp_path / "hostile.pt", pickled)
    _refused(path, "more items than it holds")


def _probe(folder, name, marker):
    (folder / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Thing: pass\n")


@pytest.mark.parametrize("module", ["xgrad.hostile_probe", "hostile_probe_toplevel"])
def test_a_global_outside_the_allow_list_is_refused_before_its_module_is_imported(tmp_path, monkeypatch, module):
    folder = tmp_path / "modules"
    folder.mkdir()
    marker = tmp_path / "imported"
    _probe(folder, module.rpartition(".")[2], marker)
    monkeypatch.setattr(xgrad, "__path__", [*xgrad.__path__, str(folder)])  # xgrad.hostile_probe is importable
    monkeypatch.syspath_prepend(str(folder))
    path = _archive(tmp_path / "hostile.pt", b"\x80\x02c" + module.encode() + b"\nThing\n.")
    try:
        _refused(path, f"Unsupported global: GLOBAL {module}.Thing")
    finally:
        sys.modules.pop(module, None)
    assert not marker.exists()


# -- corrupt files -----------------------------------------------------------------------
def test_every_byte_flip_or_truncation_of_a_saved_model_loads_exactly_or_raises_the_documented_error(tmp_path):
    model = nn.Sequential(nn.Linear(2, 3, key=0), nn.ReLU())
    good = tmp_path / "good.pt"
    xgrad.save(model, good)
    data = good.read_bytes()
    path = tmp_path / "model.pt"
    outcomes = collections.Counter()
    for position in range(len(data)):
        flipped = bytearray(data)
        flipped[position] ^= 0xFF
        path.write_bytes(bytes(flipped))
        try:
            loaded = xgrad.load(path)
        except Refused as exc:  # anything else fails the test
            assert str(path) in str(exc)
            outcomes["refused"] += 1
            continue
        outcomes["loaded"] += 1  # a flip in what no CRC covers and nothing reads (a timestamp)
        for name, value in model.state_dict().items():
            np.testing.assert_array_equal(loaded.state_dict()[name].numpy(), value.numpy())
    for length in (0, 1, 30, len(data) // 2, len(data) - 22, len(data) - 1):
        path.write_bytes(data[:length])
        _refused(path)
    assert outcomes["refused"] > len(data) // 2


@pytest.mark.parametrize("content", [b"not a zip file", None], ids=["not-zip", "no-pickle-member"])
def test_a_file_that_is_no_xgrad_archive_is_refused_with_advice(tmp_path, content):
    path = tmp_path / "other.pt"
    if content is None:
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("archive/data.pkl", b"\x80\x02}.")  # as PyTorch's torch.save writes
    else:
        path.write_bytes(content)
    _refused(path, "not a whole-object checkpoint that xgrad.save wrote .*PyTorch .pt file is neither: save its state_dict")

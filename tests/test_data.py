"""xgrad.utils.data and whole-model checkpoints, against torch.utils.data's and torch.save/load's behaviour."""

import io
import os
import pickle
import zipfile
from collections import namedtuple

import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
import xgrad.nn as nn
from xgrad.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    Dataset,
    IterableDataset,
    SequentialSampler,
    Subset,
    TensorDataset,
    default_collate,
    random_split,
)


def _dataset(n=10):
    return TensorDataset(xgrad.arange(2.0 * n).reshape(n, 2), xgrad.arange(n))


def test_loader_batches_in_order_with_len_and_dataset():
    ds = _dataset()
    loader = DataLoader(ds, batch_size=4)
    batches = [(data.tolist(), target.tolist()) for batch_idx, (data, target) in enumerate(loader)]
    assert [t for _, t in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert batches[2][0] == [[16.0, 17.0], [18.0, 19.0]]
    assert len(loader) == 3 and len(loader.dataset) == 10
    dropped = DataLoader(ds, batch_size=4, drop_last=True)
    assert len(dropped) == 2 and [t.tolist() for _, t in dropped] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_shuffle_is_a_fresh_permutation_per_epoch_and_seeded_by_generator():
    ds = _dataset()
    epochs = [[int(i) for _, t in DataLoader(ds, batch_size=3, shuffle=True, generator=xgrad.Generator().manual_seed(s))
               for i in t.tolist()] for s in (0, 0, 1)]
    assert sorted(epochs[0]) == list(range(10)) and epochs[0] == epochs[1] != epochs[2]
    loader = DataLoader(ds, batch_size=10, shuffle=True, generator=xgrad.Generator().manual_seed(0))
    first, second = ([t.tolist() for _, t in loader][0] for _ in range(2))
    assert first != second and sorted(second) == list(range(10))
    # features and labels stay paired under shuffling
    for data, target in DataLoader(ds, batch_size=4, shuffle=True):
        assert data[:, 0].tolist() == (2.0 * target).tolist()


def test_default_collate_as_pytorch():
    Point = namedtuple("Point", "x y")
    samples = [{"a": 1.0, "b": 2, "c": "s", "d": np.ones(2, np.float32), "p": Point(1, 2.5)} for _ in range(3)]
    batch = default_collate(samples)
    assert batch["a"].dtype == jnp.float64 and batch["b"].dtype == jnp.int64  # PyTorch's: double and long
    assert batch["c"] == ["s"] * 3 and batch["d"].shape == (3, 2) and batch["d"].dtype == jnp.float32
    assert isinstance(batch["p"], Point) and batch["p"].y.tolist() == [2.5] * 3
    x, y = default_collate([(xgrad.ones(2), 0), (xgrad.zeros(2), 1)])
    assert x.tolist() == [[1.0, 1.0], [0.0, 0.0]] and y.tolist() == [0, 1]
    with pytest.raises(RuntimeError, match="should be of equal size"):
        default_collate([[1, 2], [1]])


def test_custom_dataset_collate_fn_sampler_and_batch_sampler():
    class Squares(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return {"x": xgrad.tensor([float(i)]), "y": i * i}

    batches = list(DataLoader(Squares(), batch_size=2))
    assert [b["y"].tolist() for b in batches] == [[0, 1], [4, 9], [16]] and batches[0]["x"].shape == (2, 1)
    assert list(DataLoader(Squares(), batch_size=2, collate_fn=lambda b: [s["y"] for s in b])) == [[0, 1], [4, 9], [16]]
    reverse = DataLoader(Squares(), batch_size=2, sampler=[4, 3, 2, 1, 0])
    assert [b["y"].tolist() for b in reverse] == [[16, 9], [4, 1], [0]]
    by_batch = DataLoader(Squares(), batch_sampler=[[0, 4], [2]])
    assert [b["y"].tolist() for b in by_batch] == [[0, 16], [4]] and len(by_batch) == 2
    assert list(BatchSampler(SequentialSampler(range(5)), 2, drop_last=True)) == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="mutually exclusive with shuffle"):
        DataLoader(Squares(), sampler=[0], shuffle=True)
    unbatched = list(DataLoader(Squares(), batch_size=None))
    assert unbatched[2]["y"] == 4


def test_iterable_dataset_is_batched_as_it_streams():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(5))

    assert [b.tolist() for b in DataLoader(Stream(), batch_size=2)] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="expected unspecified shuffle"):
        DataLoader(Stream(), shuffle=True)


def test_random_split_subset_and_concat():
    parts = random_split(range(10), [0.5, 0.3, 0.2], generator=xgrad.Generator().manual_seed(0))
    assert [len(p) for p in parts] == [5, 3, 2] and sorted(i for p in parts for i in p) == list(range(10))
    again = random_split(range(10), [5, 3, 2], generator=xgrad.Generator().manual_seed(0))
    assert [list(p) for p in again] == [list(p) for p in parts]
    with pytest.raises(ValueError, match="Sum of input lengths"):
        random_split(range(10), [3, 3])
    sub = Subset(_dataset(), [3, 1])
    assert len(sub) == 2 and sub[0][1].item() == 3
    both = ConcatDataset([range(3), range(10, 12)])
    assert len(both) == 5 and both[3] == 10 and both[-1] == 11
    with pytest.raises(AssertionError, match="Size mismatch"):
        TensorDataset(xgrad.zeros(3), xgrad.zeros(4))


# -- whole-model checkpoints ------------------------------------------------------------
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, key=0)
        self.fc = nn.Linear(4, 3, key=1)
        self.head = nn.Linear(3, 4, key=2)
        self.head.weight = nn.Parameter(self.fc.weight.detach().T)
        self.tied = self.fc  # one module under two names
        self.dropout = nn.Dropout(0.25, key=3)
        self.scale = 0.5

    def forward(self, x):
        return self.fc(self.dropout(self.conv(x).flatten(1))) * self.scale


def test_whole_model_saves_and_loads_under_safe_globals(tmp_path):
    model = Net()
    model.eval()
    path = tmp_path / "model.pt"
    xgrad.save(model, path)
    with pytest.raises(pickle.UnpicklingError, match=r"Unsupported global: GLOBAL tests\.test_data\.Net|"
                       r"Unsupported global: GLOBAL test_data\.Net"):
        xgrad.load(path, weights_only=True)
    with xgrad.serialization.safe_globals([Net]):
        loaded = xgrad.load(path, weights_only=True)
    x = xgrad.ones(2, 1, 4, 3)
    assert type(loaded) is Net and not loaded.training and loaded.scale == 0.5
    np.testing.assert_array_equal(loaded(x).detach().numpy(), model(x).detach().numpy())
    assert [n for n, _ in loaded.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert loaded.tied is loaded.fc and all(p.requires_grad for p in loaded.parameters())
    assert isinstance(loaded.fc.weight, nn.Parameter)
    # training continues: gradients reach the loaded parameters
    loaded.train()
    loaded(x).sum().backward()
    assert loaded.fc.weight.grad is not None
    xgrad.serialization.add_safe_globals([Net])
    try:
        assert type(xgrad.load(path)) is Net
    finally:
        xgrad.serialization.clear_safe_globals()


def test_state_dict_to_pt_and_file_objects(tmp_path):
    model = Net()
    xgrad.save(model.state_dict(), tmp_path / "m.pt")
    state = xgrad.load(tmp_path / "m.pt", map_location="cpu:1")
    assert list(state) == list(model.state_dict()) and state["fc.weight"].device == xgrad.device("cpu:1")
    fresh = Net()
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh.fc.weight.detach().numpy(), model.fc.weight.detach().numpy())
    buffer = io.BytesIO()
    xgrad.save({"step": 3, "w": xgrad.ones(2)}, buffer)
    buffer.seek(0)
    assert xgrad.load(buffer)["step"] == 3


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo this-must-never-run",))


def test_a_malicious_pickle_cannot_run_code(tmp_path, capfd):
    path = tmp_path / "evil.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("xgrad_archive/data.pkl", pickle.dumps(_RunsCode()))
    for weights_only in (True, False):
        with pytest.raises(pickle.UnpicklingError, match="Unsupported global: GLOBAL posix.system|GLOBAL nt.system"):
            xgrad.load(path, weights_only=weights_only)
    with xgrad.serialization.safe_globals([Net]), pytest.raises(pickle.UnpicklingError, match="builtins.eval"):
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("xgrad_archive/data.pkl", pickle.dumps((eval, ("1",))).replace(b"\x85", b"R"))
        xgrad.load(path)
    assert "this-must-never-run" not in capfd.readouterr().out


def test_random_sampler_with_replacement_draws_lazily():
    from xgrad.utils.data import RandomSampler

    sampler = RandomSampler(range(3), replacement=True, num_samples=int(1e10), generator=xgrad.Generator().manual_seed(0))
    assert len(sampler) == int(1e10)
    first = [i for _, i in zip(range(3000), sampler, strict=False)]
    assert set(first) == {0, 1, 2}
    repeated = list(RandomSampler(range(3), num_samples=7))
    assert len(repeated) == 7 and sorted(repeated[:3]) == [0, 1, 2]


@pytest.mark.parametrize("indices", [[0, 10], [-11, 0], [3, 12]])
@pytest.mark.parametrize("wrap", ["plain", "subset"])
def test_an_out_of_range_sampler_index_raises_as_pytorch(indices, wrap):
    # PyTorch indexes each tensor of a TensorDataset, which raises; JAX's gather would clamp silently.
    ds = _dataset()
    ds = ds if wrap == "plain" else Subset(ds, list(range(10)))
    bad = next(i for i in indices if not -10 <= i < 10)
    message = f"^index {bad} is out of bounds for dimension 0 with size 10$" if wrap == "plain" else "list index out of range"
    with pytest.raises(IndexError, match=message):
        next(iter(DataLoader(ds, batch_size=2, sampler=indices)))
    with pytest.raises(IndexError, match=message):
        next(iter(DataLoader(ds, batch_size=None, sampler=[bad])))  # one sample at a time: ds[i]


def test_a_negative_sampler_index_counts_from_the_end_as_pytorch():
    data, target = next(iter(DataLoader(_dataset(), batch_size=2, sampler=[-1, -10])))
    assert target.tolist() == [9, 0] and data.tolist() == [[18.0, 19.0], [0.0, 1.0]]

"""Datasets: ``Dataset``, ``IterableDataset``, ``TensorDataset``, ``Subset``, ``ConcatDataset`` and ``random_split``,
with ``torch.utils.data``'s names and semantics."""

from __future__ import annotations

import bisect
import math
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from xgrad.creation import randperm
from xgrad.tensor import Tensor

__all__ = ["ConcatDataset", "Dataset", "IterableDataset", "Subset", "TensorDataset", "random_split"]


class Dataset:
    """A map-style dataset: subclasses define ``__getitem__(index)`` and usually ``__len__``."""

    def __getitem__(self, index: Any) -> Any:
        raise NotImplementedError("Subclasses of Dataset should implement __getitem__.")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A dataset read as a stream: subclasses define ``__iter__``; a ``DataLoader`` batches what it yields."""

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError("Subclasses of IterableDataset should implement __iter__.")


class TensorDataset(Dataset):
    """Samples ``(t[i] for t in tensors)``: the tensors share their first dimension.

    >>> import xgrad
    >>> ds = TensorDataset(xgrad.arange(6).reshape(3, 2), xgrad.tensor([0, 1, 0]))
    >>> len(ds), [t.tolist() for t in ds[1]]
    (3, [[2, 3], 1])
    """

    def __init__(self, *tensors: Tensor) -> None:
        if any(t.shape[:1] != tensors[0].shape[:1] for t in tensors):
            raise AssertionError("Size mismatch between tensors")
        self.tensors = tensors

    def __getitem__(self, index: Any) -> tuple[Tensor, ...]:
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].shape[0]


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``, in that order."""

    def __init__(self, dataset: Any, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, list):
            return self.dataset[[self.indices[i] for i in index]]
        return self.dataset[self.indices[index]]

    def __len__(self) -> int:
        return len(self.indices)


class ConcatDataset(Dataset):
    """The samples of several datasets, one after another."""

    def __init__(self, datasets: Sequence[Any]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise AssertionError("datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise AssertionError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = []
        total = 0
        for d in self.datasets:
            total += len(d)
            self.cumulative_sizes.append(total)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, index: int) -> Any:
        if index < 0:
            if -index > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            index += len(self)
        which = bisect.bisect_right(self.cumulative_sizes, index)
        start = self.cumulative_sizes[which - 1] if which else 0
        return self.datasets[which][index - start]


def random_split(dataset: Any, lengths: Sequence[int | float], generator: Any = None) -> list[Subset]:
    """Split ``dataset`` into non-overlapping random ``Subset``s of the given lengths (or fractions summing to 1).

    ``generator``: an ``xgrad.Generator``, a key or an int seed (the default generator when omitted).

    >>> import xgrad
    >>> train, test = random_split(range(10), [0.8, 0.2], generator=xgrad.Generator().manual_seed(0))
    >>> len(train), len(test), sorted(list(train) + list(test)) == list(range(10))
    (8, 2, True)
    """
    sizes = [int(n) for n in lengths]
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        counts = [int(math.floor(len(dataset) * frac)) for frac in lengths]
        for i in range(len(dataset) - sum(counts)):  # the remainder, one each, round-robin
            counts[i % len(counts)] += 1
        for i, n in enumerate(counts):
            if n == 0:
                warnings.warn(f"Length of split at index {i} is 0. This might result in an empty dataset.", UserWarning,
                              stacklevel=2)
        sizes = counts
    if sum(sizes) != len(dataset):
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")
    order = randperm(sum(sizes), generator=generator).tolist()
    subsets, start = [], 0
    for n in sizes:
        subsets.append(Subset(dataset, order[start:start + n]))
        start += n
    return subsets

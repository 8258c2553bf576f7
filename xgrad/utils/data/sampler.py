"""Samplers: the order a ``DataLoader`` reads a dataset in, and how it groups indices into batches."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from typing import Any

from xgrad.creation import randint, randperm

__all__ = ["BatchSampler", "RandomSampler", "Sampler", "SequentialSampler", "SubsetRandomSampler"]


class Sampler:
    """Yields dataset indices; subclasses define ``__iter__`` (and ``__len__`` when they can)."""

    def __init__(self, data_source: Any = None) -> None:
        pass

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError


class SequentialSampler(Sampler):
    """``0, 1, …, len(data_source) - 1``."""

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler):
    """A fresh random order at each pass (or ``num_samples`` draws with replacement).

    ``generator``: an ``xgrad.Generator``, a key or an int seed; the default generator
    when omitted (so ``xgrad.manual_seed`` fixes the order of every epoch).
    """

    CHUNK = 1024  # indices drawn at once with replacement

    def __init__(self, data_source: Sized, replacement: bool = False, num_samples: int | None = None,
                 generator: Any = None) -> None:
        if not isinstance(replacement, bool):
            raise TypeError(f"replacement should be a boolean value, but got replacement={replacement}")
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={self.num_samples}")

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        # Drawn lazily, a chunk at a time: ``num_samples`` may be huge (minGPT asks for 1e10 with replacement).
        n, left = len(self.data_source), self.num_samples
        while left > 0:
            if self.replacement:
                chunk = randint(0, n, (min(left, self.CHUNK),), generator=self.generator).tolist()
            else:
                chunk = randperm(n, generator=self.generator).tolist()[:left]
            left -= len(chunk)
            yield from chunk

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """``indices`` in a fresh random order at each pass."""

    def __init__(self, indices: list[int], generator: Any = None) -> None:
        self.indices = indices
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        return iter([self.indices[i] for i in randperm(len(self.indices), generator=self.generator).tolist()])

    def __len__(self) -> int:
        return len(self.indices)


class BatchSampler(Sampler):
    """Groups ``sampler``'s indices into lists of ``batch_size`` (the last one shorter unless ``drop_last``).

    >>> list(BatchSampler(SequentialSampler(range(5)), batch_size=2, drop_last=False))
    [[0, 1], [2, 3], [4]]
    """

    def __init__(self, sampler: Iterable[int], batch_size: int, drop_last: bool) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)  # type: ignore[arg-type]
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

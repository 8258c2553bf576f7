"""``DataLoader`` and ``default_collate``: batches of a dataset, as ``torch.utils.data``'s.

Batches are loaded in the calling process: ``num_workers``, ``pin_memory`` and their
friends are accepted and have no effect (JAX arrays need no pinned staging buffers, and
the ops a batch feeds run asynchronously already).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.creation import tensor
from xgrad.ops._util import check_index_range
from xgrad.ops.shape import stack
from xgrad.tensor import Tensor
from xgrad.utils.data.dataset import IterableDataset, TensorDataset
from xgrad.utils.data.sampler import BatchSampler, RandomSampler, SequentialSampler

__all__ = ["DataLoader", "default_collate", "default_convert"]

ERR_COLLATE_TYPE = "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {name}"


def default_collate(batch: Sequence[Any]) -> Any:
    """One batch from a list of samples, as PyTorch's: tensors and arrays are stacked, Python floats become a
    float64 tensor and ints an int64 one (32-bit with JAX's x64 switch off), strings stay a list, and dicts,
    tuples and lists are collated field by field.

    >>> import xgrad
    >>> x, y = default_collate([(xgrad.tensor([1.0, 2.0]), 0), (xgrad.tensor([3.0, 4.0]), 1)])
    >>> x.tolist(), y.tolist()
    ([[1.0, 2.0], [3.0, 4.0]], [0, 1])
    """
    first = batch[0]
    if isinstance(first, Tensor):
        return stack(list(batch))
    if isinstance(first, (np.ndarray, np.generic)) and first.dtype.kind not in "OSUV":
        return tensor(np.stack(batch))
    if isinstance(first, bool):
        return tensor(list(batch))
    if isinstance(first, (int, float)):
        # float64 and int64 as PyTorch's; with JAX's x64 switch off, float32 and int32 (JAX has no others then).
        return tensor(list(batch), dtype=jax.dtypes.canonicalize_dtype(float if isinstance(first, float) else int))
    if isinstance(first, (str, bytes)):
        return list(batch)
    if isinstance(first, Mapping):
        return {key: default_collate([sample[key] for sample in batch]) for key in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # a namedtuple keeps its type
        return type(first)(*(default_collate(list(field)) for field in zip(*batch, strict=True)))
    if isinstance(first, Sequence):
        if any(len(sample) != len(first) for sample in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        fields = [default_collate(list(field)) for field in zip(*batch, strict=True)]
        return fields if isinstance(first, list) else tuple(fields)
    raise TypeError(ERR_COLLATE_TYPE.format(name=type(first).__name__))


def default_convert(data: Any) -> Any:
    """A sample as PyTorch's loader gives it without batching: NumPy arrays become Tensors, containers recursively."""
    if isinstance(data, np.ndarray) and data.dtype.kind not in "OSUV":
        return tensor(data)
    if isinstance(data, Mapping):
        return {key: default_convert(value) for key, value in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, (list, tuple)):
        return type(data)(default_convert(d) for d in data)
    return data


class DataLoader:
    """Iterates over ``dataset`` in batches, as ``torch.utils.data.DataLoader``.

    Args:
        dataset: a map-style dataset (``__getitem__``, ``__len__``) or an ``IterableDataset``.
        batch_size: samples per batch; ``None`` gives samples one by one (``default_convert``ed).
        shuffle: a new random order each epoch, drawn from ``generator`` (an ``xgrad.Generator``,
            a key or an int seed) or the default generator.
        sampler, batch_sampler: the order of indices, or of lists of indices, instead.
        collate_fn: turns a list of samples into a batch (``default_collate``).
        drop_last: leave out the last batch when it is short.
        num_workers, pin_memory, timeout, worker_init_fn, prefetch_factor, persistent_workers,
            multiprocessing_context, in_order: accepted; batches load in this process.

    >>> import xgrad
    >>> ds = TensorDataset(xgrad.arange(10.0).reshape(5, 2), xgrad.arange(5))
    >>> loader = DataLoader(ds, batch_size=2)
    >>> [(x.shape, y.tolist()) for x, y in loader], len(loader), len(loader.dataset)
    ([((2, 2), [0, 1]), ((2, 2), [2, 3]), ((1, 2), [4])], 3, 5)
    """

    def __init__(
        self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None, sampler: Any = None,
        batch_sampler: Any = None, num_workers: int = 0, collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False, drop_last: bool = False, timeout: float = 0, worker_init_fn: Any = None,
        multiprocessing_context: Any = None, generator: Any = None, *, prefetch_factor: int | None = None,
        persistent_workers: bool = False, pin_memory_device: str = "", in_order: bool = True,
    ) -> None:
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        # PyTorch's checks of the worker options, though batches load in this process here.
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 to "
                             "enable multiprocessing, otherwise set prefetch_factor to None.")
        if prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        self.dataset = dataset
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.generator = generator
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable and (shuffle or sampler is not None or batch_sampler is not None):
            raise ValueError(
                f"DataLoader with IterableDataset: expected unspecified shuffle, sampler or batch_sampler option, "
                f"but got shuffle={shuffle}, sampler={sampler}, batch_sampler={batch_sampler}"
            )
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
        if sampler is None and not self._iterable:
            sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None and not self._iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.collate_fn = collate_fn or (default_collate if batch_size is not None or batch_sampler else default_convert)
        self._auto_collation = batch_sampler is not None or (self._iterable and batch_size is not None)

    def __len__(self) -> int:
        if self._iterable:
            n = len(self.dataset)
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return len(self.batch_sampler if self.batch_sampler is not None else self.sampler)

    def __iter__(self) -> Iterator[Any]:
        if self._iterable:
            return self._iterate_stream()
        if self.batch_sampler is None:
            return (self.collate_fn(self.dataset[i]) for i in self.sampler)
        return (self._fetch(indices) for indices in self.batch_sampler)

    def _fetch(self, indices: list[int]) -> Any:
        if type(self.dataset) is TensorDataset and self.collate_fn is default_collate:
            # One gather per tensor, not one index op per sample: the same batch default_collate would stack.
            # Checked first, as each sample's ``t[i]`` would be (JAX's gather would clamp an index silently).
            size = len(self.dataset)
            check_index_range(indices, size, f"index {{index}} is out of bounds for dimension 0 with size {size}")
            where = jnp.asarray(indices)
            return tuple(Tensor(t.array[where]) for t in self.dataset.tensors)
        if hasattr(self.dataset, "__getitems__"):
            return self.collate_fn(self.dataset.__getitems__(indices))
        return self.collate_fn([self.dataset[i] for i in indices])

    def _iterate_stream(self) -> Iterator[Any]:
        stream: Iterable[Any] = iter(self.dataset)
        if self.batch_size is None:
            yield from (self.collate_fn(sample) for sample in stream)
            return
        batch: list[Any] = []
        for sample in stream:
            batch.append(sample)
            if len(batch) == self.batch_size:
                yield self.collate_fn(batch)
                batch = []
        if batch and not self.drop_last:
            yield self.collate_fn(batch)


# PyTorch's loaders also answer ``collections.abc.Iterable``; registration makes isinstance checks agree.
collections.abc.Iterable.register(DataLoader)

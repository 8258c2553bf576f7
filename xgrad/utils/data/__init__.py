"""``xgrad.utils.data``: datasets, samplers and ``DataLoader``, with ``torch.utils.data``'s names and semantics.

>>> import xgrad
>>> from xgrad.utils.data import DataLoader, TensorDataset
>>> loader = DataLoader(TensorDataset(xgrad.arange(8.0).reshape(4, 2), xgrad.arange(4)), batch_size=2, shuffle=True)
>>> [x.shape for x, _ in loader]
[(2, 2), (2, 2)]
"""

from xgrad.utils.data.dataloader import DataLoader, default_collate, default_convert
from xgrad.utils.data.dataset import ConcatDataset, Dataset, IterableDataset, Subset, TensorDataset, random_split
from xgrad.utils.data.sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler, SubsetRandomSampler

__all__ = [
    "BatchSampler", "ConcatDataset", "DataLoader", "Dataset", "IterableDataset", "RandomSampler", "Sampler",
    "SequentialSampler", "Subset", "SubsetRandomSampler", "TensorDataset", "default_collate", "default_convert",
    "random_split",
]

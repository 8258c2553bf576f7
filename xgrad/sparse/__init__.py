"""``torch.sparse``'s names: ``mm`` and the COO tensor type (NOTE [Sparse tensors] in ``xgrad/ops/sparse.py``).

>>> import xgrad
>>> s = xgrad.tensor([[0.0, 2.0], [3.0, 0.0]]).to_sparse()
>>> xgrad.sparse.mm(s, xgrad.eye(2)).tolist()
[[0.0, 2.0], [3.0, 0.0]]
"""

from xgrad.ops.sparse import SparseTensor
from xgrad.ops.sparse import sparse_mm as mm

__all__ = ["SparseTensor", "mm"]

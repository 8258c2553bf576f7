"""Loss modules: ``nn.CrossEntropyLoss`` and the rest, each the functional loss with PyTorch's constructor.

A class weight (``weight``, ``pos_weight``) is a buffer, as in PyTorch: in ``state_dict`` and moved by ``.to``.
The deprecated ``size_average``/``reduce`` map to ``reduction`` with PyTorch's warning.
"""

from __future__ import annotations

from typing import Any

from xgrad import ops
from xgrad.nn.module import Module
from xgrad.ops._util import legacy_reduction
from xgrad.tensor import Tensor

__all__ = [
    "BCELoss", "BCEWithLogitsLoss", "CosineEmbeddingLoss", "CosineSimilarity", "CrossEntropyLoss", "HuberLoss",
    "KLDivLoss", "L1Loss", "MSELoss", "MarginRankingLoss", "NLLLoss", "SmoothL1Loss",
]


class _Loss(Module):
    def __init__(self, size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean") -> None:
        self.reduction = legacy_reduction(size_average, reduce, reduction)


class _WeightedLoss(_Loss):
    def __init__(
        self, weight: Tensor | None = None, size_average: bool | None = None, reduce: bool | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)


class L1Loss(_Loss):
    """Mean absolute error.

    >>> import xgrad
    >>> xgrad.nn.L1Loss()(xgrad.tensor([1.0, 3.0]), xgrad.tensor([2.0, 1.0])).item()
    1.5
    """

    def forward(self, input: Tensor, target: Any) -> Tensor:
        return ops.l1_loss(input, target, reduction=self.reduction)


class MSELoss(_Loss):
    """Mean squared error.

    >>> import xgrad
    >>> xgrad.nn.MSELoss(reduction="sum")(xgrad.tensor([1.0, 3.0]), xgrad.tensor([2.0, 1.0])).item()
    5.0
    """

    def forward(self, input: Tensor, target: Any) -> Tensor:
        return ops.mse_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    """Squared error below ``beta``, absolute error above.

    >>> import xgrad
    >>> xgrad.nn.SmoothL1Loss()(xgrad.tensor([0.5]), xgrad.tensor([0.0])).item()
    0.125
    """

    def __init__(
        self, size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean", beta: float = 1.0
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input: Tensor, target: Any) -> Tensor:
        return ops.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    """Squared error below ``delta``, ``delta``-scaled absolute error above.

    >>> import xgrad
    >>> xgrad.nn.HuberLoss(delta=2.0)(xgrad.tensor([3.0]), xgrad.tensor([0.0])).item()
    4.0
    """

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction=reduction)
        self.delta = delta

    def forward(self, input: Tensor, target: Any) -> Tensor:
        return ops.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class KLDivLoss(_Loss):
    """KL divergence of ``target`` from log-probabilities ``input`` (``reduction="batchmean"`` is the true KL).

    >>> import xgrad
    >>> p = xgrad.tensor([[0.5, 0.5]])
    >>> xgrad.nn.KLDivLoss(reduction="batchmean")(p.log(), p).item()
    0.0
    """

    def __init__(
        self, size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean",
        log_target: bool = False,
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input: Tensor, target: Any) -> Tensor:
        return ops.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


class NLLLoss(_WeightedLoss):
    """Negative log-likelihood of class indices under log-probabilities.

    >>> import xgrad
    >>> xgrad.nn.NLLLoss()(xgrad.tensor([[-0.5, -1.0]]), xgrad.tensor([1])).item()
    1.0
    """

    def __init__(
        self, weight: Tensor | None = None, size_average: bool | None = None, ignore_index: int = -100,
        reduce: bool | None = None, reduction: str = "mean",
    ) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index

    def forward(self, input: Tensor, target: Any) -> Tensor:
        return ops.nll_loss(input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction)


class CrossEntropyLoss(_WeightedLoss):
    """Cross entropy of logits against class indices or class probabilities.

    >>> import xgrad
    >>> round(xgrad.nn.CrossEntropyLoss()(xgrad.zeros(2, 2), xgrad.tensor([0, 1])).item(), 4)
    0.6931
    """

    def __init__(
        self, weight: Tensor | None = None, size_average: bool | None = None, ignore_index: int = -100,
        reduce: bool | None = None, reduction: str = "mean", label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input: Tensor, target: Any) -> Tensor:
        return ops.cross_entropy(
            input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )


class BCELoss(_WeightedLoss):
    """Binary cross entropy of probabilities.

    >>> import xgrad
    >>> round(xgrad.nn.BCELoss()(xgrad.tensor([0.5]), xgrad.tensor([1.0])).item(), 4)
    0.6931
    """

    def forward(self, input: Tensor, target: Any) -> Tensor:
        return ops.binary_cross_entropy(input, target, self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    """Binary cross entropy of logits; ``pos_weight`` weighs the positive term per class.

    >>> import xgrad
    >>> round(xgrad.nn.BCEWithLogitsLoss()(xgrad.tensor([0.0]), xgrad.tensor([1.0])).item(), 4)
    0.6931
    """

    def __init__(
        self, weight: Tensor | None = None, size_average: bool | None = None, reduce: bool | None = None,
        reduction: str = "mean", pos_weight: Tensor | None = None,
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input: Tensor, target: Any) -> Tensor:
        return ops.binary_cross_entropy_with_logits(
            input, target, self.weight, reduction=self.reduction, pos_weight=self.pos_weight
        )


class CosineSimilarity(Module):
    """Cosine similarity along ``dim``.

    >>> import xgrad
    >>> xgrad.nn.CosineSimilarity(dim=0)(xgrad.tensor([1.0, 0.0]), xgrad.tensor([2.0, 0.0])).item()
    1.0
    """

    def __init__(self, dim: int = 1, eps: float = 1e-8) -> None:
        self.dim = dim
        self.eps = eps

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        return ops.cosine_similarity(x1, x2, self.dim, self.eps)


class CosineEmbeddingLoss(_Loss):
    """``1 - cos`` for target 1, ``max(0, cos - margin)`` for target -1.

    >>> import xgrad
    >>> x = xgrad.tensor([[1.0, 0.0]])
    >>> xgrad.nn.CosineEmbeddingLoss()(x, x, xgrad.tensor([-1.0])).item()
    1.0
    """

    def __init__(
        self, margin: float = 0.0, size_average: bool | None = None, reduce: bool | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input1: Tensor, input2: Tensor, target: Any) -> Tensor:
        return ops.cosine_embedding_loss(input1, input2, target, self.margin, reduction=self.reduction)


class MarginRankingLoss(_Loss):
    """``max(0, -target * (input1 - input2) + margin)``.

    >>> import xgrad
    >>> xgrad.nn.MarginRankingLoss()(xgrad.tensor([2.0]), xgrad.tensor([1.0]), xgrad.tensor([1.0])).item()
    0.0
    """

    def __init__(
        self, margin: float = 0.0, size_average: bool | None = None, reduce: bool | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input1: Tensor, input2: Tensor, target: Any) -> Tensor:
        return ops.margin_ranking_loss(input1, input2, target, self.margin, reduction=self.reduction)

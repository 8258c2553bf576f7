"""The rarer loss modules: ``SoftMarginLoss``, ``HingeEmbeddingLoss``, ``MultiMarginLoss``,
``MultiLabelMarginLoss``, ``MultiLabelSoftMarginLoss``, ``TripletMarginLoss``, ``PairwiseDistance``,
``PoissonNLLLoss``, ``GaussianNLLLoss`` (``xgrad/ops/margin_losses.py``) and ``CTCLoss``
(``xgrad/ops/ctc.py``), each calling the op of its name with the arguments PyTorch's module keeps."""

from __future__ import annotations

from typing import Any

from xgrad import ops
from xgrad.nn.loss import _Loss, _WeightedLoss
from xgrad.nn.module import Module
from xgrad.tensor import Tensor


class SoftMarginLoss(_Loss):
    """``log(1 + exp(-target * input))``, targets 1 or -1.

    >>> import xgrad
    >>> round(xgrad.nn.SoftMarginLoss()(xgrad.tensor([0.0]), xgrad.tensor([-1.0])).item(), 4)
    0.6931
    """

    def forward(self, input: Tensor, target: Any) -> Tensor:
        return ops.soft_margin_loss(input, target, reduction=self.reduction)


class MultiLabelMarginLoss(_Loss):
    """The multi-class multi-label hinge loss; ``target`` lists class indices ended by ``-1``.

    >>> import xgrad
    >>> x = xgrad.tensor([[0.1, 0.2, 0.4, 0.8]])
    >>> round(xgrad.nn.MultiLabelMarginLoss()(x, xgrad.tensor([[3, 0, -1, 1]])).item(), 4)
    0.85
    """

    def forward(self, input: Tensor, target: Any) -> Tensor:
        return ops.multilabel_margin_loss(input, target, reduction=self.reduction)


class _MarginLoss(_Loss):
    def __init__(self, margin: float = 1.0, size_average: bool | None = None, reduce: bool | None = None,
                 reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = margin


class HingeEmbeddingLoss(_MarginLoss):
    """``input`` where ``target`` is 1, ``max(0, margin - input)`` where it is -1.

    >>> import xgrad
    >>> xgrad.nn.HingeEmbeddingLoss()(xgrad.tensor([2.0]), xgrad.tensor([-1.0])).item()
    0.0
    """

    def forward(self, input: Tensor, target: Any) -> Tensor:
        return ops.hinge_embedding_loss(input, target, self.margin, reduction=self.reduction)


class MultiMarginLoss(_WeightedLoss):
    """The multi-class hinge loss ``sum_{i != y} max(0, margin - x[y] + x[i])^p / C``.

    >>> import xgrad
    >>> round(xgrad.nn.MultiMarginLoss()(xgrad.tensor([[0.1, 0.2, 0.4]]), xgrad.tensor([2])).item(), 4)
    0.5
    """

    def __init__(self, p: int = 1, margin: float = 1.0, weight: Tensor | None = None, size_average: bool | None = None,
                 reduce: bool | None = None, reduction: str = "mean") -> None:
        if p not in (1, 2):
            raise ValueError("only p == 1 and p == 2 supported")
        super().__init__(weight, size_average, reduce, reduction)
        self.p, self.margin = p, margin

    def forward(self, input: Tensor, target: Any) -> Tensor:
        return ops.multi_margin_loss(input, target, self.p, self.margin, self.weight, reduction=self.reduction)


class MultiLabelSoftMarginLoss(_WeightedLoss):
    """The mean over classes of each class's logistic loss, targets 0 or 1, ``weight`` per class.

    >>> import xgrad
    >>> round(xgrad.nn.MultiLabelSoftMarginLoss()(xgrad.tensor([[0.0]]), xgrad.tensor([[1.0]])).item(), 4)
    0.6931
    """

    def forward(self, input: Tensor, target: Any) -> Tensor:
        return ops.multilabel_soft_margin_loss(input, target, self.weight, reduction=self.reduction)


class PairwiseDistance(Module):
    """The ``p``-norm distance between rows (``F.pairwise_distance``).

    >>> import xgrad
    >>> round(xgrad.nn.PairwiseDistance()(xgrad.tensor([[3.0, 0.0]]), xgrad.tensor([[0.0, 4.0]])).item(), 4)
    5.0
    """

    def __init__(self, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> None:
        self.norm, self.eps, self.keepdim = p, eps, keepdim

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        return ops.pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)


class TripletMarginLoss(_MarginLoss):
    """``max(0, margin + d(anchor, positive) - d(anchor, negative))``, ``d`` the ``p``-norm distance.

    >>> import xgrad
    >>> a = xgrad.tensor([[0.0, 0.0]])
    >>> xgrad.nn.TripletMarginLoss()(a, a, a).item()
    1.0
    """

    def __init__(self, margin: float = 1.0, p: float = 2.0, eps: float = 1e-6, swap: bool = False,
                 size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean") -> None:
        super().__init__(margin, size_average, reduce, reduction)
        self.p, self.eps, self.swap = p, eps, swap

    def forward(self, anchor: Tensor, positive: Tensor, negative: Tensor) -> Tensor:
        return ops.triplet_margin_loss(anchor, positive, negative, self.margin, self.p, self.eps, self.swap,
                                       reduction=self.reduction)


class PoissonNLLLoss(_Loss):
    """The Poisson negative log-likelihood of ``target`` counts under rate ``exp(input)`` (or ``input``).

    >>> import xgrad
    >>> xgrad.nn.PoissonNLLLoss()(xgrad.tensor([0.0]), xgrad.tensor([2.0])).item()
    1.0
    """

    def __init__(self, log_input: bool = True, full: bool = False, size_average: bool | None = None, eps: float = 1e-8,
                 reduce: bool | None = None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.log_input, self.full, self.eps = log_input, full, eps

    def forward(self, log_input: Tensor, target: Any) -> Tensor:
        return ops.poisson_nll_loss(log_input, target, self.log_input, self.full, eps=self.eps, reduction=self.reduction)


class GaussianNLLLoss(Module):
    """The Gaussian negative log-likelihood of ``target`` under mean ``input`` and variance ``var``.

    >>> import xgrad
    >>> xgrad.nn.GaussianNLLLoss()(xgrad.tensor([1.0]), xgrad.tensor([0.0]), xgrad.tensor([1.0])).item()
    0.5
    """

    def __init__(self, *, full: bool = False, eps: float = 1e-6, reduction: str = "mean") -> None:
        self.full, self.eps, self.reduction = full, eps, reduction

    def forward(self, input: Tensor, target: Any, var: Any) -> Tensor:
        return ops.gaussian_nll_loss(input, target, var, self.full, self.eps, self.reduction)


class CTCLoss(_Loss):
    """The connectionist temporal classification loss (``F.ctc_loss``), with PyTorch's gradient.

    >>> import xgrad
    >>> log_probs = xgrad.tensor([[[0.5, 0.5]], [[0.5, 0.5]]]).log()
    >>> round(xgrad.nn.CTCLoss(reduction="sum")(log_probs, xgrad.tensor([[1]]), [2], [1]).item(), 4)
    0.2877
    """

    def __init__(self, blank: int = 0, reduction: str = "mean", zero_infinity: bool = False) -> None:
        super().__init__(reduction=reduction)
        self.blank, self.zero_infinity = blank, zero_infinity

    def forward(self, log_probs: Tensor, targets: Any, input_lengths: Any, target_lengths: Any) -> Tensor:
        return ops.ctc_loss(log_probs, targets, input_lengths, target_lengths, self.blank, self.reduction, self.zero_infinity)

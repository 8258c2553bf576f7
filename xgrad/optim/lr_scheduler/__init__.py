"""``xgrad.optim.lr_scheduler``: PyTorch's learning-rate schedulers, on the optimizers' parameter groups.

A scheduler sets ``group["lr"]`` of each parameter group of an ``xgrad.optim.Optimizer``;
the next ``optimizer.step()`` reads it without a recompile (NOTE [PyTorch optimizers]
in ``optimizer.py``), also inside ``xgrad.compile``, where a ``step()`` inside the
compiled function runs on the host at every call (NOTE [Python state in a compiled step]). The rates follow PyTorch's
recursive forms (each from the group's current rate), so schedulers chain as PyTorch's
do, and its closed forms where ``step(epoch)`` asks for them. ``state_dict()`` holds the
scheduler's attributes but the optimizer; ``load_state_dict`` restores them (load the
optimizer's own state dict for its rates).

>>> import xgrad
>>> w = xgrad.tensor([1.0], requires_grad=True)
>>> opt = xgrad.optim.SGD([w], lr=1.0)
>>> sched = xgrad.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
>>> rates = []
>>> for epoch in range(5):
...     rates.append(sched.get_last_lr()[0])
...     opt.step(); sched.step()
>>> rates
[1.0, 1.0, 0.5, 0.5, 0.25]
"""

from xgrad.optim.lr_scheduler.cyclic_lr import CyclicLR, OneCycleLR
from xgrad.optim.lr_scheduler.schedulers import (
    ChainedScheduler,
    ConstantLR,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    LRScheduler,
    MultiplicativeLR,
    MultiStepLR,
    PolynomialLR,
    ReduceLROnPlateau,
    SequentialLR,
    StepLR,
)

__all__ = [
    "ChainedScheduler", "ConstantLR", "CyclicLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "ExponentialLR", "LRScheduler",
    "LambdaLR", "LinearLR", "MultiStepLR", "MultiplicativeLR", "OneCycleLR", "PolynomialLR", "ReduceLROnPlateau", "SequentialLR", "StepLR",
]

"""Optimizers: PyTorch's, with parameter groups and state dicts, and any ``optax`` transformation.

``SGD``, ``Adam``, ``AdamW``, ``Adamax``, ``NAdam``, ``RAdam``, ``Adagrad``, ``Adadelta``,
``RMSprop`` and ``LBFGS`` take PyTorch's arguments and follow its update rules
(NOTE [PyTorch optimizers] in ``optimizer.py``); ``xgrad.optim.lr_scheduler`` changes
their groups' entries between steps. ``Optax`` reads the ``.grad`` arrays, runs an optax
transformation's ``update`` and ``optax.apply_updates`` over all parameters as one
``jax.jit`` program (a pytree in, a pytree out). Both rebind each stepped parameter's
storage directly, bumping ``_version`` as any in-place op does.

# NOTE [Optimizer state in Tensors]
# The optimizers' state is held by Tensors (``Optimizer.state[p]`` maps names to
# Tensors; ``Optax.state`` rebuilds the optax pytree from them, a Tensor holding a leaf or
# a buffer of several, NOTE [Packed optimizer state], and assigning a state of the same
# structure rebinds their storage), and so are the numbers of a parameter group
# an update reads. That makes the state what every other piece of training state is, a
# Tensor whose storage is rebound: ``xgrad.compile`` finds the Tensors a step reads and
# rebinds, so an optimizer stepped (or its learning rate set) inside a compiled function
# needs no special case.
"""

from xgrad.optim import lr_scheduler
from xgrad.optim.adam import Adam, Adamax, AdamW, NAdam, RAdam
from xgrad.optim.adaptive import Adadelta, Adagrad, RMSprop
from xgrad.optim.lbfgs import LBFGS
from xgrad.optim.optax_optimizer import Optax, get_lr, set_lr
from xgrad.optim.optimizer import Optimizer
from xgrad.optim.sgd import SGD

__all__ = [
    "LBFGS", "SGD", "Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "NAdam", "Optax", "Optimizer", "RAdam", "RMSprop",
    "get_lr", "lr_scheduler", "set_lr",
]

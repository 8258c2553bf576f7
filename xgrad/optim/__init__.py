"""Optimizers: any ``optax`` gradient transformation, applied to parameters' ``.grad``.

There is no hand-written optimizer here: ``Optax`` reads the ``.grad`` arrays, runs
the transformation's ``update`` and ``optax.apply_updates`` over all parameters as
one ``jax.jit`` program (a pytree in, a pytree out), and rebinds each stepped
parameter's storage directly, bumping ``_version`` as any in-place op does. ``SGD``,
``Adam`` and ``AdamW`` take PyTorch's arguments and build the matching optax chain;
``xgrad.optim.lr_scheduler`` changes their learning rate between steps.

# NOTE [Optimizer state in Tensors]
# The optax state's arrays are held by Tensors (``Optax.state`` rebuilds the optax
# pytree from them; assigning a state of the same structure rebinds their storage).
# That makes the state what every other piece of training state is, a Tensor whose
# storage is rebound: ``xgrad.compile`` finds the Tensors a step reads and rebinds, so
# an optimizer stepped (or its learning rate set) inside a compiled function needs no
# special case.
"""

from xgrad.optim import lr_scheduler
from xgrad.optim.adam import Adam, AdamW
from xgrad.optim.optimizer import Optax, get_lr, set_lr
from xgrad.optim.sgd import SGD

__all__ = ["SGD", "Adam", "AdamW", "Optax", "get_lr", "lr_scheduler", "set_lr"]

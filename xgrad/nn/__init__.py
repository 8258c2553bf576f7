"""``Module``, ``Parameter``, buffers, containers and the layers PyTorch users reach for first.

A module's state lives in its attributes, as in PyTorch: an ``nn.Parameter`` attribute
is a parameter, a ``register_buffer`` name is a buffer, a ``Module`` attribute is a
submodule, and so is every Module inside a list, tuple or dict attribute (named
``attr.0``, ``attr.key``, as ``ModuleList``/``ModuleDict`` would name them), so a
submodule is never silently left out. Containers (``Sequential``, ``ModuleList``,
``ModuleDict``) hold their children by key, so ``state_dict`` keys are PyTorch's:
``0.weight`` in a ``Sequential``, and a PyTorch checkpoint saved as safetensors loads
without renaming.

>>> import xgrad
>>> model = xgrad.nn.MLP([4, 8, 3], key=0)
>>> [name for name, _ in model.named_parameters()]
['0.weight', '0.bias', '2.weight', '2.bias']
>>> model(xgrad.ones(2, 4)).shape
(2, 3)
"""

from typing import TYPE_CHECKING, Any

from xgrad.missing_names import missing_attribute
from xgrad.nn import functional, init, modules, parallel, utils
from xgrad.nn.linear import MLP
from xgrad.nn.module import Parameter

# NOTE [Layer names live at PyTorch's paths]
# Each layer's name is written once, in the ``__all__`` of its PyTorch path under
# ``xgrad.nn.modules`` (``torch.nn.modules.rnn.LSTM``), and this package takes them from
# there, as ``torch.nn`` takes its own from ``torch.nn.modules``; tests/test_nn_module_paths.py
# holds the paths to PyTorch's. ``Module`` alone comes from ``modules.module``, whose global
# hooks stay at that path (as PyTorch's do). A new layer: add it to its path's ``__all__``.
from xgrad.nn.modules.activation import *  # noqa: F403
from xgrad.nn.modules.batchnorm import *  # noqa: F403
from xgrad.nn.modules.container import *  # noqa: F403
from xgrad.nn.modules.conv import *  # noqa: F403
from xgrad.nn.modules.distance import *  # noqa: F403
from xgrad.nn.modules.dropout import *  # noqa: F403
from xgrad.nn.modules.flatten import *  # noqa: F403
from xgrad.nn.modules.linear import *  # noqa: F403
from xgrad.nn.modules.loss import *  # noqa: F403
from xgrad.nn.modules.module import Module
from xgrad.nn.modules.normalization import *  # noqa: F403
from xgrad.nn.modules.pixelshuffle import *  # noqa: F403
from xgrad.nn.modules.pooling import *  # noqa: F403
from xgrad.nn.modules.rnn import *  # noqa: F403
from xgrad.nn.modules.sparse import *  # noqa: F403
from xgrad.nn.modules.transformer import *  # noqa: F403
from xgrad.nn.modules.upsampling import *  # noqa: F403
from xgrad.nn.parallel import DataParallel, DistributedDataParallel

__all__ = [
    "MLP", "DataParallel", "DistributedDataParallel", "Module", "Parameter", "functional", "init", "modules", "parallel",
    "utils",
]
__all__ += modules.activation.__all__
__all__ += modules.batchnorm.__all__
__all__ += modules.container.__all__
__all__ += modules.conv.__all__
__all__ += modules.distance.__all__
__all__ += modules.dropout.__all__
__all__ += modules.flatten.__all__
__all__ += modules.linear.__all__
__all__ += modules.loss.__all__
__all__ += modules.normalization.__all__
__all__ += modules.pixelshuffle.__all__
__all__ += modules.pooling.__all__
__all__ += modules.rnn.__all__
__all__ += modules.sparse.__all__
__all__ += modules.transformer.__all__
__all__ += modules.upsampling.__all__


if not TYPE_CHECKING:  # for type checkers a missing name stays an error, not ``Any``

    def __getattr__(name: str) -> Any:  # reached only for a name this module does not have
        raise missing_attribute("torch.nn", "module 'xgrad.nn'", name)

"""``xgrad.autograd``: ``backward``, ``grad``, custom Functions, anomaly mode, engine settings,
forward mode (``forward_ad``) and ``functional`` (Jacobians, Hessians and their products)."""

from __future__ import annotations

import sys
import types

from xgrad.autograd import compiled, forward_ad, functional, graph
from xgrad.engine import engine as _engine
from xgrad.engine.anomaly import detect_anomaly, is_anomaly_check_nan_enabled, is_anomaly_enabled, set_detect_anomaly
from xgrad.engine.api import backward, grad
from xgrad.engine.engine import queue_callback
from xgrad.engine.function import Function, FunctionCtx, once_differentiable
from xgrad.engine.order import get_execution_order
from xgrad.engine.threads import is_multithreading_enabled, set_multithreading_enabled
from xgrad.profiler import profile

__all__ = [
    "MAX_REENTRANT_DEPTH", "Function", "FunctionCtx", "backward", "compiled", "detect_anomaly", "forward_ad", "functional",
    "get_execution_order", "grad",
    "graph", "is_anomaly_check_nan_enabled", "is_anomaly_enabled", "is_multithreading_enabled", "once_differentiable",
    "profile",
    "queue_callback", "set_detect_anomaly", "set_multithreading_enabled",
]


class _AutogradModule(types.ModuleType):
    """Lets ``xgrad.autograd.MAX_REENTRANT_DEPTH = n`` reach the engine."""

    @property
    def MAX_REENTRANT_DEPTH(self) -> int:  # noqa: N802  (PyTorch's name)
        return _engine.MAX_REENTRANT_DEPTH

    @MAX_REENTRANT_DEPTH.setter
    def MAX_REENTRANT_DEPTH(self, depth: int) -> None:  # noqa: N802
        if depth < 1:
            raise ValueError(f"MAX_REENTRANT_DEPTH must be at least 1, got {depth}")
        _engine.MAX_REENTRANT_DEPTH = int(depth)


sys.modules[__name__].__class__ = _AutogradModule

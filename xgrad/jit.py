"""``torch.jit``: TorchScript has no counterpart here, so ``script``/``trace`` give their argument back.

A scripted or traced function or module computes what the original does, so
returning the original keeps a program's results. For speed compile the training
step with ``xgrad.compile``; to ship a model, save its ``state_dict`` (``xgrad.save``)
or export the function with ``jax.export``. ``jit.save``/``jit.load`` raise and say so.

>>> import xgrad
>>> f = lambda x: x * 2
>>> xgrad.jit.script(f) is f
True
"""

from __future__ import annotations

from typing import Any

__all__ = ["ERR_JIT_SAVE", "ignore", "load", "save", "script", "trace", "unused"]

ERR_JIT_SAVE = (
    "xgrad.jit.{name}: xgrad has no TorchScript archives. Save the weights with "
    "xgrad.save(model.state_dict(), 'model.safetensors') (or the whole model with xgrad.save(model, 'model.pt')) "
    "and rebuild the model in Python; to ship a function without Python, use jax.export."
)


def script(obj: Any, *args: Any, **kwargs: Any) -> Any:
    """``obj`` itself: it runs eagerly, with the same results as the scripted version."""
    return obj


def trace(func: Any, example_inputs: Any = None, *args: Any, **kwargs: Any) -> Any:
    """``func`` itself: it runs eagerly, with the same results as the traced version."""
    return func


def ignore(drop: Any = False, **kwargs: Any) -> Any:
    """The decorator ``@torch.jit.ignore`` (with or without arguments): gives the function back."""
    return drop if callable(drop) else (lambda fn: fn)


unused = ignore


def save(m: Any, f: Any, _extra_files: Any = None) -> None:
    raise RuntimeError(ERR_JIT_SAVE.format(name="save"))


def load(f: Any, map_location: Any = None, _extra_files: Any = None) -> Any:
    raise RuntimeError(ERR_JIT_SAVE.format(name="load"))

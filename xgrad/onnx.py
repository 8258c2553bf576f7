"""``torch.onnx``: xgrad does not write ONNX; ``export`` raises and says what to do instead."""

from __future__ import annotations

from typing import Any

__all__ = ["ERR_ONNX", "export"]

ERR_ONNX = (
    "xgrad.onnx.export: xgrad cannot write ONNX. Save the weights with xgrad.save(model.state_dict(), "
    "'model.safetensors') and load them into the PyTorch model for torch.onnx.export (the state_dict keys are "
    "PyTorch's), or export the forward function with jax.export (StableHLO)."
)


def export(model: Any, args: Any = (), f: Any = None, *more: Any, **kwargs: Any) -> None:
    raise NotImplementedError(ERR_ONNX)

"""Device names resolved to JAX devices: ``"cpu:1"``, ``"cuda"`` (JAX's ``gpu`` platform), a ``jax.Device`` or a ``Sharding``.

It sits with the Tensor, below the factories, the ops and ``nn`` that place arrays, so
that ``Tensor``'s own methods and the legacy tensor types need nothing above them.
"""

from __future__ import annotations

from typing import Any

import jax

__all__ = ["resolve_device"]


def resolve_device(device: Any) -> Any:
    """A ``jax.Device`` (or ``Sharding``) from a device, a sharding, or a name like ``"cpu:1"``/``"cuda"``."""
    if device is None or isinstance(device, (jax.Device, jax.sharding.Sharding)):
        return device
    if isinstance(device, str):
        platform, _, index = device.partition(":")
        platform = {"cuda": "gpu"}.get(platform, platform)
        try:
            devices = jax.devices(platform)
        except RuntimeError as exc:
            raise RuntimeError(f"unknown or unavailable device {device!r}: {exc}") from None
        i = int(index) if index else 0
        if i >= len(devices):
            raise RuntimeError(f"device {device!r} does not exist: there are {len(devices)} {platform} devices")
        return devices[i]
    raise TypeError(f"device must be a jax.Device, a Sharding or a string, got {type(device).__name__}")

"""Test configuration: float64 on, and the host split into two devices so the
multi-device code paths run in every test session."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

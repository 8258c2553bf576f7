"""Doctests see float64 and two host devices, as the test suite does."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

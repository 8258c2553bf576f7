"""Tests and doctests see float64 and two host devices, so the multi-device code paths
run in every test session, and XLA compiles with its fast CPU options (``FAST_COMPILES``: those of
``tests._scripts.FAST_COMPILE_CANDIDATES`` the installed XLA knows, so that no XLA version aborts the suite)."""

import os

from tests._scripts import FAST_COMPILES  # noqa: E402  (JAX only in a subprocess: XLA_FLAGS is read when JAX starts)

# Added to any XLA_FLAGS already set (an empty or unrelated value must not leave one device).
_flags = os.environ.get("XLA_FLAGS", "")
if "--xla_force_host_platform_device_count" not in _flags:
    _flags = f"{_flags} --xla_force_host_platform_device_count=2"
if "--xla_backend_optimization_level" not in _flags:
    _flags = f"{_flags} {FAST_COMPILES}"
os.environ["XLA_FLAGS"] = _flags.strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

# Scripts that regenerate fixtures need libraries the tests do not (PyTorch): never collected.
collect_ignore = ["tests/fixtures"]

# xgrad's own suite opts in to its hypothesis profiles (dev unless asked otherwise).
pytest_plugins = ["xgrad.testing.pytest_plugin"]


def pytest_collection_modifyitems(config, items):
    from tests._backward_modes import drop_variants_that_do_not_apply

    items[:] = drop_variants_that_do_not_apply(items)

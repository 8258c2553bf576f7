"""pytest plugin: hypothesis profiles ``dev``, ``ci`` and ``thorough`` for xgrad's test harness.

Opt-in. Load it with ``pytest -p xgrad.testing.pytest_plugin`` (or ``pytest_plugins =
["xgrad.testing.pytest_plugin"]`` in a conftest) for the ``dev`` profile, or name a
profile with ``--xgrad-profile NAME`` or ``XGRAD_HYPOTHESIS_PROFILE=NAME``; the option
wins. What xgrad installs into every pytest run of the environment is only the entry
point ``_xgrad_pytest``, which adds that option and does nothing until it is used.
Importing this module needs no hypothesis; loading a profile does.
"""

from __future__ import annotations

from typing import Any

from _xgrad_pytest import PROFILES, load_profile, requested_profile

__all__ = ["PROFILES", "load_profile", "requested_profile"]


def pytest_configure(config: Any) -> None:
    load_profile(requested_profile(config) or "dev")

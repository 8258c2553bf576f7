"""xgrad's pytest entry point: the ``--xgrad-profile`` option, and nothing else unless asked.

pytest loads this module in every run of an environment where xgrad is installed, so it
imports neither xgrad nor hypothesis and changes no setting until ``--xgrad-profile`` or
``XGRAD_HYPOTHESIS_PROFILE`` asks for one of xgrad's hypothesis profiles, or
``xgrad.testing.pytest_plugin`` is loaded (``-p`` or a conftest's ``pytest_plugins``).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

ENV_VAR = "XGRAD_HYPOTHESIS_PROFILE"
PROFILES = ("dev", "ci", "thorough")


def requested_profile(config: Any) -> str | None:
    """The profile named by ``--xgrad-profile`` or ``XGRAD_HYPOTHESIS_PROFILE``, if any."""
    return config.getoption("--xgrad-profile", default=None) or os.environ.get(ENV_VAR) or None


def load_profile(name: str) -> None:
    """Register xgrad's hypothesis profiles and make ``name`` the active one."""
    if name not in PROFILES:
        raise pytest.UsageError(f"unknown xgrad hypothesis profile {name!r}: choose one of {', '.join(PROFILES)}")
    try:
        from hypothesis import HealthCheck, settings
    except ImportError as exc:
        raise pytest.UsageError(
            f"xgrad's hypothesis profile {name!r} was asked for, but hypothesis is not installed: pip install hypothesis"
        ) from exc
    # dev and thorough search randomly even where hypothesis would default to derandomizing
    # (it does when it sees a CI environment): only the ci profile is deterministic.
    settings.register_profile("dev", max_examples=25, deadline=None, derandomize=False)
    settings.register_profile(
        "ci", max_examples=10, deadline=None, derandomize=True, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    settings.register_profile("thorough", max_examples=300, deadline=None, derandomize=False)
    settings.load_profile(name)


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--xgrad-profile", default=None,
                     help="load xgrad's hypothesis profile: dev, ci or thorough (see xgrad.testing.pytest_plugin)")


def pytest_configure(config: Any) -> None:
    profile = requested_profile(config)
    if profile:
        load_profile(profile)

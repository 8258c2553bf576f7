"""pytest plugin (entry point ``xgrad``): hypothesis profiles ``dev``, ``ci`` and ``thorough``."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

# dev and thorough search randomly even where hypothesis would default to derandomizing
# (it does when it sees a CI environment): only the ci profile is deterministic.
settings.register_profile("dev", max_examples=25, deadline=None, derandomize=False)
settings.register_profile(
    "ci", max_examples=10, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("thorough", max_examples=300, deadline=None, derandomize=False)


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--xgrad-profile", default=None, help="hypothesis profile: dev (default), ci or thorough")


def pytest_configure(config: Any) -> None:
    profile = config.getoption("--xgrad-profile") or os.environ.get("XGRAD_HYPOTHESIS_PROFILE") or "dev"
    settings.load_profile(profile)

"""xgrad's pytest entry point: the ``--xgrad-profile`` option, and nothing else unless asked.

pytest loads this module in every run of an environment where xgrad is installed, so it
imports neither xgrad nor hypothesis and changes no setting until ``--xgrad-profile`` or
``XGRAD_HYPOTHESIS_PROFILE`` asks for one of xgrad's hypothesis profiles.
"""

from __future__ import annotations

import os
from typing import Any


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--xgrad-profile", default=None,
                     help="load xgrad's hypothesis profile: dev, ci or thorough (see xgrad.testing.pytest_plugin)")


def pytest_configure(config: Any) -> None:
    if config.getoption("--xgrad-profile") or os.environ.get("XGRAD_HYPOTHESIS_PROFILE"):
        from xgrad.testing.pytest_plugin import load_profile, requested_profile

        load_profile(requested_profile(config) or "dev")

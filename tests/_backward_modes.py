"""A fixture that runs a test module's tests twice: with the eager engine, and again with every
backward compiled (``xgrad.autograd.compiled.enable()``), so any divergence fails CI.

Use it with ``from tests._backward_modes import eager_and_compiled`` and
``pytestmark = pytest.mark.usefixtures("eager_and_compiled")``. A graph the compiled
backward cannot run falls back to eager; its one-time warning is expected here, and so
are recompile warnings (these suites vary their graphs on purpose). A test marked
``eager_engine`` (about the eager engine's own machinery) runs eagerly only.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest

from xgrad.autograd import compiled


@pytest.fixture(params=["eager", "compiled"])
def eager_and_compiled(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "eager":
        yield request.param
        return
    if request.node.get_closest_marker("eager_engine") is not None:
        pytest.skip("about the eager engine's own machinery (its worker threads), which the compiled backward does not use")
    compiled.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=compiled.CompiledFallbackWarning)
        warnings.filterwarnings("ignore", category=compiled.RecompileWarning)  # these suites vary their graphs
        with compiled.enable():
            yield request.param
    compiled.reset()

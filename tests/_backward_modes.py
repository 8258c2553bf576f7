"""A fixture that runs a test module's tests twice: with the eager engine, and again with every
backward compiled (``xgrad.autograd.compiled.enable()``), so any divergence fails CI.

Use it with ``from tests._backward_modes import eager_and_compiled`` and
``pytestmark = pytest.mark.usefixtures("eager_and_compiled")``. A graph the compiled
backward cannot run falls back to eager; its one-time warning is expected here, and so
are recompile warnings (these suites vary their graphs on purpose). A test marked
``eager_engine`` (about the eager engine's own machinery) runs eagerly only: its compiled
variant is not collected (``drop_compiled_variants_of_eager_engine_tests``, called from the
root conftest).
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
    compiled.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=compiled.CompiledFallbackWarning)
        warnings.filterwarnings("ignore", category=compiled.RecompileWarning)  # these suites vary their graphs
        with compiled.enable():
            yield request.param
    compiled.reset()


def drop_compiled_variants_of_eager_engine_tests(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` without the compiled variant of tests marked ``eager_engine``."""
    def wanted(item: pytest.Item) -> bool:
        callspec = getattr(item, "callspec", None)
        compiled_variant = callspec is not None and callspec.params.get("eager_and_compiled") == "compiled"
        return not (compiled_variant and item.get_closest_marker("eager_engine") is not None)

    return [item for item in items if wanted(item)]

"""Fixtures that run a test module's tests in each backward mode, so any divergence fails CI.

``eager_and_compiled`` runs them twice: with the eager engine, and again with every backward
compiled (``xgrad.autograd.compiled.enable()``). ``every_backward_mode`` (the hook, Function and
callback suites) adds a third run, ``step``, in which every backward and ``grad`` call runs as an
``xgrad.compile`` step of its own (``fallback="error"``): the engine traced, its hooks and
Function backwards traced in or called on the host. A test whose later call differentiates what an
earlier backward returned (``create_graph=True``) is marked ``graph_across_steps``: a step's
outputs carry no graph, as ``jax.jit``'s do not, so its ``step`` variant is not collected.

Use one with ``from tests._backward_modes import eager_and_compiled`` (or ``every_backward_mode``)
and ``pytestmark = pytest.mark.usefixtures("eager_and_compiled")``. A graph the compiled
backward cannot run falls back to eager; its one-time warning is expected here, and so
are recompile warnings (these suites vary their graphs on purpose). A test marked
``eager_engine`` (about the eager engine's own machinery) runs eagerly only: its other
variants are not collected (``drop_variants_that_do_not_apply``, called from the root conftest).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import xgrad
from xgrad.autograd import compiled
from xgrad.engine import engine


@contextlib.contextmanager
def _compiled_switch_on() -> Iterator[None]:
    compiled.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=compiled.CompiledFallbackWarning)
        warnings.filterwarnings("ignore", category=compiled.RecompileWarning)  # these suites vary their graphs
        with compiled.enable():
            yield
    compiled.reset()


@pytest.fixture(params=["eager", "compiled"])
def eager_and_compiled(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "eager":
        yield request.param
        return
    with _compiled_switch_on():
        yield request.param


class _InStep(threading.local):
    active = False


def _each_call_a_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run every ``engine.execute`` as an ``xgrad.compile`` step; one inside a step (reentrant) is traced in it."""
    run = engine.execute
    in_step = _InStep()

    def as_a_step(*args: Any) -> Any:
        if in_step.active:
            return run(*args)
        in_step.active = True
        try:
            return xgrad.compile(lambda: run(*args), fallback="error")()
        finally:
            in_step.active = False

    monkeypatch.setattr(engine, "execute", as_a_step)


@pytest.fixture(params=["eager", "compiled", "step"])
def every_backward_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "step":
        _each_call_a_step(monkeypatch)
        yield request.param
        return
    if request.param == "eager":
        yield request.param
        return
    with _compiled_switch_on():
        yield request.param


def drop_variants_that_do_not_apply(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` without the compiled and step variants of ``eager_engine`` tests and the step variant of
    ``graph_across_steps`` tests."""
    def wanted(item: pytest.Item) -> bool:
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            return True
        mode = callspec.params.get("eager_and_compiled", callspec.params.get("every_backward_mode"))
        if mode in ("compiled", "step") and item.get_closest_marker("eager_engine") is not None:
            return False
        return not (mode == "step" and item.get_closest_marker("graph_across_steps") is not None)

    return [item for item in items if wanted(item)]

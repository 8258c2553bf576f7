"""Grad mode: no_grad, enable_grad, set_grad_enabled, inference_mode; thread-local, contexts and decorators."""

import threading

import pytest

import xgrad
from xgrad.grad_mode import is_inference_mode_enabled


@pytest.fixture
def x():
    return xgrad.tensor([1.0, 2.0], requires_grad=True)


def test_no_grad_stops_recording(x):
    with xgrad.no_grad():
        assert not xgrad.is_grad_enabled()
        y = x * 2
    assert xgrad.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None


def test_enable_grad_inside_no_grad(x):
    with xgrad.no_grad():
        with xgrad.enable_grad():
            y = x * 2
        z = x * 2
    assert y.grad_fn is not None and z.grad_fn is None


def test_contexts_restore_on_exception():
    with pytest.raises(ValueError), xgrad.no_grad():
        raise ValueError
    assert xgrad.is_grad_enabled()


def test_decorators(x):
    @xgrad.no_grad()
    def double(t):
        return t * 2, xgrad.is_grad_enabled()

    @xgrad.enable_grad()
    def triple(t):
        return t * 3

    y, enabled = double(x)
    assert not enabled and not y.requires_grad and xgrad.is_grad_enabled()
    scaled, enabled = double(t=x)  # keyword arguments reach the function (minGPT's generate(..., top_k=10))
    assert not enabled and not scaled.requires_grad
    assert double.__name__ == "double"
    with xgrad.no_grad():
        assert triple(x).requires_grad


def test_decorated_generator_runs_its_body_in_the_mode():
    @xgrad.no_grad()
    def gen():
        received = yield xgrad.is_grad_enabled()
        yield received, xgrad.is_grad_enabled()
        return "done"

    it = gen()
    assert next(it) is False
    assert xgrad.is_grad_enabled()  # the caller's mode between steps
    assert it.send(7) == (7, False)
    with pytest.raises(StopIteration) as stop:
        next(it)
    assert stop.value.value == "done" and xgrad.is_grad_enabled()


def test_set_grad_enabled_switches_at_construction():
    ctx = xgrad.set_grad_enabled(False)
    assert not xgrad.is_grad_enabled()
    with ctx:
        assert not xgrad.is_grad_enabled()
    assert xgrad.is_grad_enabled()
    with ctx:  # reusable
        assert not xgrad.is_grad_enabled()
    assert xgrad.is_grad_enabled()
    xgrad.set_grad_enabled(False)
    assert not xgrad.is_grad_enabled()
    xgrad.set_grad_enabled(True)
    assert xgrad.is_grad_enabled()


def test_set_grad_enabled_as_decorator_does_not_leak():
    @xgrad.set_grad_enabled(False)
    def inner():
        return xgrad.is_grad_enabled()

    assert xgrad.is_grad_enabled()
    assert inner() is False
    assert xgrad.is_grad_enabled()


def test_inference_mode(x):
    assert not is_inference_mode_enabled()
    with xgrad.inference_mode():
        assert is_inference_mode_enabled() and not xgrad.is_grad_enabled()
        assert not (x * 2).requires_grad
        with xgrad.enable_grad():
            assert is_inference_mode_enabled() and xgrad.is_grad_enabled()
        with xgrad.inference_mode(False):  # PyTorch: leaves inference mode, enables grad
            assert not is_inference_mode_enabled() and xgrad.is_grad_enabled()
            assert (x * 2).requires_grad
        assert is_inference_mode_enabled() and not xgrad.is_grad_enabled()
    assert not is_inference_mode_enabled() and xgrad.is_grad_enabled()

    @xgrad.inference_mode()
    def f():
        return is_inference_mode_enabled(), xgrad.is_grad_enabled()

    def g():
        return xgrad.is_grad_enabled()

    assert f() == (True, False)
    assert xgrad.inference_mode(False)(g) is g


def test_grad_mode_is_thread_local(x):
    seen = {}
    barrier = threading.Barrier(2)

    def worker():
        seen["start"] = xgrad.is_grad_enabled()
        with xgrad.no_grad():
            barrier.wait()  # main thread checks its mode while this one is in no_grad
            barrier.wait()
            seen["inside"] = xgrad.is_grad_enabled()

    with xgrad.no_grad():
        t = threading.Thread(target=worker)
        t.start()
        barrier.wait()
    assert xgrad.is_grad_enabled() and (x * 2).requires_grad
    barrier.wait()
    t.join()
    assert seen == {"start": True, "inside": False}


def test_no_grad_decorator_is_safe_across_threads():
    @xgrad.no_grad()
    def check(results, i, start):
        start.wait()
        results[i] = xgrad.is_grad_enabled()

    results = [None] * 4
    start = threading.Event()
    threads = [threading.Thread(target=check, args=(results, i, start)) for i in range(4)]
    for t in threads:
        t.start()
    start.set()
    for t in threads:
        t.join()
    assert results == [False] * 4 and xgrad.is_grad_enabled()


def test_decorators_without_parentheses_and_applied_to_a_function(x):
    """PyTorch's no_grad, enable_grad and inference_mode decorate without parentheses
    too, and ``no_grad()(fn)`` wraps like ``@no_grad()``."""

    @xgrad.no_grad
    def double(t):
        return t * 2, xgrad.is_grad_enabled()

    @xgrad.enable_grad
    def triple(t):
        return t * 3

    @xgrad.inference_mode
    def modes():
        return is_inference_mode_enabled(), xgrad.is_grad_enabled()

    @xgrad.no_grad
    def numbers():
        yield xgrad.is_grad_enabled()
        yield xgrad.is_grad_enabled()

    y, enabled = double(x)
    assert not enabled and not y.requires_grad and xgrad.is_grad_enabled()
    scaled, enabled = double(t=x)  # keyword arguments reach the function (minGPT's generate(..., top_k=10))
    assert not enabled and not scaled.requires_grad
    assert double.__name__ == "double"
    with xgrad.no_grad():
        assert triple(x).requires_grad and triple.__name__ == "triple"
    assert modes() == (True, False) and not is_inference_mode_enabled()
    assert list(numbers()) == [False, False] and xgrad.is_grad_enabled()

    def quadruple(t):
        return t * 4

    wrapped = xgrad.no_grad()(quadruple)
    assert not wrapped(x).requires_grad and wrapped.__name__ == "quadruple"
    assert quadruple(x).requires_grad  # the original is left alone
    assert isinstance(xgrad.no_grad(), xgrad.no_grad) and isinstance(xgrad.enable_grad(), xgrad.enable_grad)
    assert isinstance(xgrad.inference_mode(False), xgrad.inference_mode)

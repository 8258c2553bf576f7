"""Compiled backward gives eager's results where eager is exact: custom Functions (higher order,
once_differentiable, reentrant backward, callbacks, side effects, saved tensors), unused and
unreachable inputs, fallbacks, and the cache's hold on the graph.

Each test runs eagerly and compiled (``compiled`` fixture) against the same expected values:
PyTorch's documented behaviour, written out.
"""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

import xgrad
from xgrad.autograd import Function, compiled


@pytest.fixture(autouse=True)
def fresh_cache():
    compiled.reset()
    yield
    compiled.reset()


@pytest.fixture(params=[False, True], ids=["eager", "compiled"])
def flag(request):
    return request.param


class Twenty(Function):
    """Forward ``2x``; a deliberately different backward (``20 g``), so its use is visible."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 20


class SquareViaTwenty(Function):
    """``x * x`` whose backward applies another Function: ``Twenty(x) * g`` (= ``2x g``)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return Twenty.apply(x) * g


def test_second_derivative_keeps_the_backward_of_a_function_applied_inside_a_backward(flag):
    x = xgrad.tensor([1.0, 3.0], requires_grad=True)
    (g,) = xgrad.autograd.grad(SquareViaTwenty.apply(x).sum(), x, create_graph=True, compiled=flag)
    assert g.tolist() == [2.0, 6.0]
    (gg,) = xgrad.autograd.grad(g.sum(), x)
    assert gg.tolist() == [20.0, 20.0]  # Twenty's own backward, as eager (and PyTorch) record it


class OnceSquare(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @xgrad.autograd.once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


def test_once_differentiable_raises_on_double_backward(flag):
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    # The grad reaching OnceSquare's backward depends on x, so its result is connected.
    y = (OnceSquare.apply(x) * (x * x).sum()).sum()
    (g,) = xgrad.autograd.grad(y, x, create_graph=True, compiled=flag)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        xgrad.autograd.grad(g.sum(), x)


def test_allow_unused_with_create_graph_returns_none(flag):
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    unused = xgrad.tensor([3.0], requires_grad=True)
    gx, gu = xgrad.autograd.grad((x * x).sum(), [x, unused], allow_unused=True, create_graph=True, compiled=flag)
    assert gx.tolist() == [2.0, 4.0] and gx.requires_grad
    assert gu is None


def test_no_input_reachable(flag):
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    other = xgrad.tensor([3.0], requires_grad=True)
    assert xgrad.autograd.grad((x * x).sum(), [other * 2], allow_unused=True, compiled=flag) == (None,)
    (x * x).sum().backward(inputs=[other], compiled=flag)
    assert x.grad is None and other.grad is None


class ReentrantSquare(Function):
    """``x * x`` whose backward runs a backward of its own (``autograd.grad``)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with xgrad.enable_grad():
            leaf = x.detach().requires_grad_(True)
            (gx,) = xgrad.autograd.grad((leaf * leaf).sum(), leaf)
        return gx * g


def test_reentrant_backward_inside_function_backward(flag):
    x = xgrad.tensor([1.0, 3.0], requires_grad=True)
    for _ in range(2):  # a miss, then a hit
        x.grad = None
        (ReentrantSquare.apply(x) * 2).sum().backward(compiled=flag)
        assert x.grad.tolist() == [4.0, 12.0]
    assert compiled.stats()["fallbacks"] == {}


class Recording(Function):
    """``3x``; its backward records each call and queues a callback."""

    events: list = []

    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        Recording.events.append("backward")
        xgrad.autograd.queue_callback(lambda: Recording.events.append("callback"))
        return g * 3


def test_function_backward_side_effects_and_callbacks_run_once_per_call(flag):
    Recording.events = []
    x = xgrad.tensor([1.0], requires_grad=True)
    for _ in range(3):
        x.grad = None
        (Recording.apply(x) * x).sum().backward(compiled=flag)
        assert x.grad.tolist() == [6.0]
    assert Recording.events == ["backward", "callback"] * 3


def test_side_effects_run_once_after_a_fallback(flag):
    """A graph that falls back (a hook marked pure that is not traceable) runs its Function once."""
    Recording.events = []
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    y = Recording.apply(x)
    y.register_hook(compiled.pure_hook(lambda g: g * float(g.sum().item())))
    if flag:
        with pytest.warns(compiled.CompiledFallbackWarning, match="not traceable"):
            y.sum().backward(compiled=True)
    else:
        y.sum().backward()
    assert x.grad.tolist() == [6.0, 6.0]
    assert Recording.events == ["backward", "callback"]


class Identity(Function):
    seen: list = []

    @staticmethod
    def forward(ctx, x):
        y = x * 3
        ctx.save_for_backward(x, y)
        ctx.x = x
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        Identity.seen.append((x is ctx.x, x.grad_fn is not None and x.grad_fn.name(), y.grad_fn is not None, y._output_nr))
        return g * 3


def test_saved_tensors_keep_identity_grad_fn_and_output_nr(flag):
    Identity.seen = []
    x = xgrad.tensor([1.0], requires_grad=True)
    Identity.apply(x * 1).sum().backward(compiled=flag)
    # PyTorch: an input comes back as the same tensor; a saved output keeps its grad_fn.
    assert Identity.seen == [(True, "MulBackward", True, 0)]


class PureCount(Function):
    calls = 0

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    @compiled.pure_hook
    def backward(ctx, g):
        PureCount.calls += 1  # a side effect in a backward marked pure: it runs only when traced
        return g * 2


def test_a_pure_function_backward_runs_only_when_traced(flag):
    PureCount.calls = 0
    x = xgrad.tensor([1.0], requires_grad=True)
    for _ in range(3):
        x.grad = None
        PureCount.apply(x).sum().backward(compiled=flag)
        assert x.grad.tolist() == [2.0]
    assert PureCount.calls == (1 if flag else 3)  # as under jax.jit: the body runs once, at the trace


def test_a_fallback_keeps_no_reference_to_the_graph():
    """The cached fallback holds its reason, not the exception's traceback and the graph in its frames."""
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    refs = []
    for _ in range(3):
        y = x * 2
        y.register_hook(compiled.pure_hook(lambda g: g * float(g.sum().item())))
        loss = y.sum()
        refs.append(weakref.ref(loss.grad_fn))
        if not compiled.stats()["fallbacks"]:
            with pytest.warns(compiled.CompiledFallbackWarning):
                loss.backward(compiled=True)
        else:
            loss.backward(compiled=True)
        del y, loss
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    assert x.grad.tolist() == [12.0, 12.0]  # each call: the hook doubles the grad (its sum is 2), times 2


def test_checkpoint_with_a_fresh_function_each_step_compiles_once_and_keeps_none_alive():
    from xgrad.utils import checkpoint

    x = xgrad.tensor([0.5, 1.5], requires_grad=True)
    refs = []
    for _ in range(3):
        x.grad = None

        def block(v):
            return (v.sin() * v).sum()

        refs.append(weakref.ref(block))
        checkpoint(block, x, use_reentrant=True).backward(compiled=True)
        del block
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    assert (compiled.stats()["misses"], compiled.stats()["fallbacks"]) == (1, {})
    expected = [np.sin(v) + v * np.cos(v) for v in (0.5, 1.5)]
    assert x.grad.detach().numpy() == pytest.approx(expected)


def test_leaves_on_different_devices(flag):
    import jax

    d0, d1 = jax.devices()[:2]
    an, bn, cn = np.array([1.0, 2.0]), np.array([3.0, 4.0]), np.array([5.0, 6.0])
    a = xgrad.Tensor(jax.device_put(an, d0), requires_grad=True)
    b = xgrad.Tensor(jax.device_put(bn, d1), requires_grad=True)
    c = xgrad.Tensor(jax.device_put(cn, d1), requires_grad=True)
    for step in (1, 2):  # the second call accumulates into existing grads (a hit, compiled)
        (((a.to(d1) * b).sin() + c * c).to(d0) * a).sum().backward(compiled=flag)
        u = an * bn
        np.testing.assert_allclose(a.grad.detach().numpy(), step * (np.cos(u) * bn * an + np.sin(u) + cn * cn), rtol=1e-6)
        np.testing.assert_allclose(b.grad.detach().numpy(), step * np.cos(u) * an * an, rtol=1e-6)
        np.testing.assert_allclose(c.grad.detach().numpy(), step * 2 * cn * an, rtol=1e-6)
    assert [t.grad.array.devices() for t in (a, b, c)] == [{d0}, {d1}, {d1}]


def test_reading_grad_while_compiled_backwards_accumulate_never_sees_a_deleted_buffer():
    """Another thread may read ``.grad`` at any moment: its buffer is never donated to a program."""
    import threading

    w = xgrad.tensor(np.ones(256, np.float32), requires_grad=True)
    stop = threading.Event()
    errors: list[str] = []

    def reader():
        while not stop.is_set():
            grad = w.grad
            if grad is not None:
                try:
                    grad.detach().numpy()
                except RuntimeError as exc:  # "Array has been deleted"
                    errors.append(str(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(150):
            (w * 2).sum().backward(compiled=True)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert w.grad.detach().numpy() == pytest.approx(np.full(256, 300.0))


def test_a_stable_loop_compiles_once_while_the_previous_loss_is_alive():
    """The key is the graph's structure, not which older graphs still hold the leaves' accumulators."""
    rng = np.random.default_rng(0)
    first, second = xgrad.nn.Linear(3, 4), xgrad.nn.Linear(4, 1)
    params = [*first.parameters(), *second.parameters()]
    x = xgrad.tensor(rng.standard_normal((2, 3)).astype(np.float32))

    def step():
        loss = second(first(x).tanh()).pow(2).mean()  # built while the previous loss is alive
        loss.backward(compiled=True)
        return loss

    losses = []
    for _ in range(4):
        for p in params:
            p.grad = None
        losses.append(step())
    assert (compiled.stats()["misses"], compiled.stats()["hits"]) == (1, 3)
    params[0].grad = xgrad.zeros_like(params[0])  # a .grad left from before: another program, said in words
    for p in params[1:]:
        p.grad = None
    step()
    assert "a leaf's .grad changed between None and a tensor" in compiled.stats()["recompile_reasons"][-1]


class Nested(Function):
    """``2x``; its backward runs, ``levels`` deep, a backward of its own through another ``Nested``, and raises
    ``Deepest`` at the bottom if asked to."""

    levels = 0
    raise_at_bottom = False
    compiled_flag = False
    threads: set = set()

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        Nested.threads.add(threading.get_ident())
        if Nested.levels == 0:
            if Nested.raise_at_bottom:
                raise Deepest("at the bottom")
            return g * 2
        Nested.levels -= 1
        with xgrad.enable_grad():
            leaf = xgrad.tensor([1.0], requires_grad=True)
            Nested.apply(leaf).sum().backward(compiled=Nested.compiled_flag)
        assert leaf.grad.tolist() == [2.0] and not xgrad.is_grad_enabled()
        return g * 2


class Deepest(ValueError):
    pass


def test_backwards_nested_deeper_than_one_thread_holds(flag):
    """Past ``MAX_NESTED_DEPTH`` nested compiled backwards the next runs on a fresh thread (NOTE [Nested compiled
    backwards]): grads as eager's, an exception at the bottom reaches the top with its own type."""
    from xgrad.engine.compiled import MAX_NESTED_DEPTH

    Nested.compiled_flag = flag
    for raise_at_bottom in (False, True):
        Nested.levels, Nested.raise_at_bottom, Nested.threads = MAX_NESTED_DEPTH + 5, raise_at_bottom, set()
        x = xgrad.tensor([1.0], requires_grad=True)
        if raise_at_bottom:
            with pytest.raises(Deepest, match="at the bottom"):
                Nested.apply(x).sum().backward(compiled=flag)
        else:
            Nested.apply(x).sum().backward(compiled=flag)
            assert x.grad.tolist() == [2.0]
        assert Nested.levels == 0 and (len(Nested.threads) > 1) == flag  # eager nests 60 deep on one thread

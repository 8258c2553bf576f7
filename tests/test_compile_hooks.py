"""Hooks registered and callbacks queued inside an ``xgrad.compile`` step, against the same step run eagerly.

Eager (PyTorch) semantics: a hook registered inside the step on a tensor that outlives
it stays, so every call adds one more and they all run; one registered and removed
inside the step runs once per call; a final callback queued during a backward runs once
when that backward ends, after the hooks, with the values of that moment.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import xgrad
from xgrad.compile_step import HOOK_KEPT, CompileFallbackError, CompileFallbackWarning


def f64(data, requires_grad=False):
    return xgrad.tensor(np.asarray(data, np.float64), requires_grad=requires_grad)


def piling_setup(kind):
    w = f64([1.0, -2.0], requires_grad=True)
    log = []

    def step(x):
        w.grad = None
        if kind == "tensor":
            w.register_hook(lambda g: log.append(g.detach().numpy().tolist()))
        else:
            w.register_post_accumulate_grad_hook(lambda t: log.append(t.grad.numpy().tolist()))
        (w * x).sum().backward()

    return w, log, step


@pytest.mark.parametrize("kind", ["tensor", "post_accumulate"])
@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_hooks_registered_inside_the_step_on_a_lasting_tensor_pile_up(mode, kind):
    w, log, step = piling_setup(kind)
    run = xgrad.compile(step) if mode == "compile" else step
    x = f64([3.0, 4.0])
    if mode == "compile":
        # It runs eagerly, after one warning that names the registering line and the fix.
        with pytest.warns(CompileFallbackWarning, match=re.escape(HOOK_KEPT) + r" \(at .*test_compile_hooks\.py:\d+\)"):
            run(x)
    else:
        run(x)
    for _ in range(2):
        run(x)
    assert log == [[3.0, 4.0]] * (1 + 2 + 3)
    hooks = w._backward_hooks if kind == "tensor" else w._post_accumulate_grad_hooks
    assert len(hooks) == 3
    np.testing.assert_allclose(w.grad.numpy(), [3.0, 4.0])


@pytest.mark.parametrize("kind", ["tensor", "post_accumulate"])
def test_a_piling_hook_under_fallback_error_raises_and_leaves_no_hook(kind):
    w, log, step = piling_setup(kind)
    strict = xgrad.compile(step, fallback="error")
    with pytest.raises(CompileFallbackError, match=re.escape(HOOK_KEPT) + r" \(at .*test_compile_hooks\.py:\d+\)"):
        strict(f64([3.0, 4.0]))
    assert not w._backward_hooks and not w._post_accumulate_grad_hooks and w.grad is None and log == []
    (w * 2).sum().backward()  # the next backward works, with no hook
    assert w.grad.tolist() == [2.0, 2.0] and log == []


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_a_hook_registered_and_removed_inside_the_step_runs_once_per_call(mode):
    w = f64([1.0, -2.0], requires_grad=True)
    log = []

    def step(x):
        w.grad = None
        handle = w.register_hook(lambda g: log.append(g.detach().numpy().tolist()) or g * 2)
        (w * x).sum().backward()
        handle.remove()

    run = xgrad.compile(step, fallback="error") if mode == "compile" else step
    for i in range(3):
        run(f64([3.0, 4.0 + i]))
    assert log == [[3.0, 4.0], [3.0, 5.0], [3.0, 6.0]]
    np.testing.assert_allclose(w.grad.numpy(), [6.0, 12.0])
    assert not w._backward_hooks
    if mode == "compile":
        assert run.stats()["compiles"] == 1


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_final_callbacks_queued_by_hooks_run_once_per_call_after_the_hooks_with_that_moments_values(mode):
    w = f64([1.0, -2.0], requires_grad=True)
    b = f64([0.5, 0.5], requires_grad=True)
    opt = xgrad.optim.SGD([w, b], lr=0.1)
    log = []

    def scale_grads():
        log.append(("callback", w.grad.numpy().tolist(), b.grad.numpy().tolist(), w.detach().numpy().tolist()))
        with xgrad.no_grad():
            w.grad.mul_(0.5)  # a callback may change state: the step goes on from there
        xgrad.autograd.queue_callback(lambda: log.append(("queued by a callback", w.grad.numpy().tolist())))

    def on_grad(g):
        log.append(("hook", g.detach().numpy().tolist()))
        xgrad.autograd.queue_callback(scale_grads)

    w.register_hook(on_grad)
    b.register_post_accumulate_grad_hook(lambda t: log.append(("post", t.grad.numpy().tolist())))

    def step(x):
        opt.zero_grad()
        loss = ((w * x).sum() + (b * x).sum()) ** 2
        loss.backward()
        opt.step()
        return loss

    run = xgrad.compile(step, fallback="error") if mode == "compile" else step
    x = f64([1.0, 2.0])
    expected_w, expected_b = np.array([1.0, -2.0]), np.array([0.5, 0.5])
    for _ in range(3):
        del log[:]
        s = float((expected_w + expected_b) @ x.detach().numpy())
        grad = 2 * s * x.detach().numpy()
        run(x)
        # The hooks in either order (the engine's accumulation order), then the callbacks, in queue order.
        assert sorted(entry[0] for entry in log[:2]) == ["hook", "post"]
        assert [entry[0] for entry in log[2:]] == ["callback", "queued by a callback"]
        entries = dict((entry[0], entry[1:]) for entry in log)
        np.testing.assert_allclose(entries["hook"][0], grad)
        np.testing.assert_allclose(entries["post"][0], grad)
        np.testing.assert_allclose(entries["callback"][0], grad)  # .grad at the end of the backward, concrete
        np.testing.assert_allclose(entries["callback"][1], grad)
        np.testing.assert_allclose(entries["callback"][2], expected_w)  # parameters before opt.step()
        np.testing.assert_allclose(entries["queued by a callback"][0], grad / 2)
        expected_w = expected_w - 0.1 * grad / 2  # the optimizer saw the halved .grad
        expected_b = expected_b - 0.1 * grad
        np.testing.assert_allclose(w.detach().numpy(), expected_w, rtol=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), grad / 2, rtol=1e-12)
        np.testing.assert_allclose(b.detach().numpy(), expected_b, rtol=1e-12)
    if mode == "compile":
        assert run.stats()["compiles"] == 1


@pytest.mark.parametrize("held", [True, False])
@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_node_hooks_registered_inside_the_step_pile_up_only_on_a_node_that_lives_on(mode, held):
    # A leaf's AccumulateGrad lives while something holds it: here the test, or nothing.
    w = f64([1.0, -2.0], requires_grad=True)
    kept = [xgrad.autograd.graph.get_gradient_edge(w).node] if held else []
    log = []

    def step(x):
        w.grad = None
        node = xgrad.autograd.graph.get_gradient_edge(w).node
        node.register_prehook(lambda grads: log.append(grads[0].detach().numpy().tolist()))
        (w * x).sum().backward()

    run = xgrad.compile(step) if mode == "compile" else step
    x = f64([3.0, 4.0])
    if mode == "compile" and held:
        with pytest.warns(CompileFallbackWarning, match=re.escape(HOOK_KEPT)):
            run(x)
    else:
        run(x)
    run(x)
    assert log == [[3.0, 4.0]] * (1 + 2 if held else 2)
    assert len(kept) == held
    if mode == "compile" and not held:
        assert run.stats()["compiles"] == 1 and run.stats()["fallbacks"] == 0


class Logged(xgrad.autograd.Function):
    """A Function whose backward queues a final callback (run on the host in a compiled step)."""

    log: list = []
    weight: xgrad.Tensor

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        Logged.log.append(("backward",))
        xgrad.autograd.queue_callback(
            lambda: Logged.log.append(("callback", Logged.weight.grad.numpy().tolist()))
            or xgrad.autograd.queue_callback(lambda: Logged.log.append(("queued by a callback",)))
        )
        return g * 2


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_a_callback_queued_by_traced_code_runs_once_per_call_with_that_moments_values(mode):
    w = f64([1.0, -2.0], requires_grad=True)
    Logged.weight, Logged.log = w, []

    def step(x):
        w.grad = None
        (Logged.apply(w) * x).sum().backward()

    run = xgrad.compile(step, fallback="error") if mode == "compile" else step
    for i in range(3):
        run(f64([3.0, 4.0 + i]))
    # The backward runs on the host at every call under xgrad.compile too, and so does its callback.
    assert len([e for e in Logged.log if e[0] == "backward"]) == 3
    expected = []
    for i in range(3):
        expected += [("callback", [6.0, 8.0 + 2 * i]), ("queued by a callback",)]
    assert [e for e in Logged.log if e[0] != "backward"] == expected


def test_a_final_callback_changing_a_tensor_the_step_left_alone_raises_under_compile():
    # Such a tensor stays on the device while callbacks run (NOTE [Whole-step compile]): a clear error, not a lost update.
    w = f64([1.0, -2.0], requires_grad=True)

    def clip():
        with xgrad.no_grad():
            w.clamp_(-1.0, 1.0)

    w.register_hook(lambda g: xgrad.autograd.queue_callback(clip))

    @xgrad.compile
    def step(x):
        w.grad = None
        (w * x).sum().backward()

    with pytest.raises(RuntimeError, match=r"a final callback cannot change a tensor \(shape \[2\]\) that the step had not"):
        step(f64([3.0, 4.0]))
    # Raised where the callback ran, as any exception of a callback: the backward before it had accumulated.
    assert w.tolist() == [1.0, -2.0] and w.grad.tolist() == [3.0, 4.0]

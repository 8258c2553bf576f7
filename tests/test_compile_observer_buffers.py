"""The observer variant's memory (NOTE [Spare buffers] in ``xgrad/compile_step/observers.py``).

A step with observer hooks runs a variant of its program that cannot donate the state
it replaces (a hook that stops observing sends the call to the exact program, which
reads that state). The arrays one call replaced are donated to the next call instead,
unless someone else holds them. Each test runs the same step eagerly and compiled and
compares the hooks' values and the state.
"""

from __future__ import annotations

import numpy as np

import xgrad

STEPS = 6
X = np.array([[1.0, 2.0], [-0.5, 1.5], [2.0, -1.0]])
# A fused float64 tanh differs from eager's by a few ulp (NOTE [A fused float64 tanh] in test_compile_observers.py).
RTOL, ATOL = 1e-12, 2e-13


def setup(mode):
    """A two-parameter model stepped with Adam, with an observer hook on each parameter; its step and the hooks' log."""
    w = xgrad.tensor(np.array([[0.3, -0.2], [0.1, 0.4]]), requires_grad=True)
    b = xgrad.tensor(np.array([0.05, -0.1]), requires_grad=True)
    opt = xgrad.optim.Adam([w, b], lr=0.1)
    log = []
    w.register_hook(lambda g: log.append(g.norm()))
    b.register_hook(lambda g: log.append(g * 2.0))

    def step(x):
        opt.zero_grad()
        loss = (xgrad.tanh(x @ w + b) ** 2).sum()
        loss.backward()
        opt.step()
        return loss

    return w, b, (xgrad.compile(step, fallback="error") if mode == "compile" else step), log


def run(mode, between=lambda i, w, step: None):
    """``STEPS`` steps, ``between(i, w, step)`` after each; the losses, the hooks' values, the final state, the step."""
    w, b, step, log = setup(mode)
    losses = []
    for i in range(STEPS):
        losses.append(step(xgrad.tensor(X * (1 + i))).item())
        between(i, w, step)
    return losses, [t.numpy() for t in log], [w.detach().numpy(), b.detach().numpy(), w.grad.numpy(), b.grad.numpy()], step


def assert_like_eager(compiled, eager):
    for got, expected in zip(compiled[:3], eager[:3], strict=True):
        assert len(got) == len(expected)
        for a, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL)


def test_the_state_a_hooked_call_replaced_is_donated_to_its_next_call():
    kept = []

    def between(i, w, step):
        if i >= 1:  # the observer variant runs from the second call on
            if kept:  # what the last call kept was donated to this one
                assert all(a.is_deleted() for a in kept[-1])
            ((entry),) = step._cache.values()
            kept.append(list(entry.observing.spares._arrays))  # what this call replaced

    compiled = run("compile", between)
    assert_like_eager(compiled, run("eager"))
    assert compiled[3].stats()["variants"] == 1
    # w, b and Adam's two moments of each: none held elsewhere, each kept, then consumed.
    assert len(kept) == STEPS - 1 and all(len(arrays) == 6 and None not in arrays for arrays in kept)


def test_an_array_the_user_holds_is_not_donated_by_a_hooked_step():
    held = {}

    def between(i, w, step):
        if i in (1, 2, 3):  # before the variant, as it runs, and a call before the last
            held[i] = (w.array, w.detach().numpy().copy(), w.grad.array, w.grad.numpy().copy())

    compiled = run("compile", between)
    assert_like_eager(compiled, run("eager"))
    for array, value, grad_array, grad_value in held.values():
        assert not array.is_deleted() and not grad_array.is_deleted()
        np.testing.assert_array_equal(np.asarray(array), value)
        np.testing.assert_array_equal(np.asarray(grad_array), grad_value)


def test_a_hook_that_stops_observing_after_donating_calls_gets_eagers_results():
    """The spares a call donated are gone; the exact program still reads the state it needs."""

    def make(mode):
        w, b, step, log = setup(mode)
        scale = [None]
        calls = []

        def hook(g):
            calls.append(1)  # an effect: the hook runs on the host, an observer while it returns None
            return None if scale[0] is None else g * scale[0]

        w.register_hook(hook)
        losses = []
        for i in range(STEPS):
            scale[0] = 3.0 if i == 4 else None  # observes, then replaces w's gradient once, then observes again
            losses.append(step(xgrad.tensor(X * (1 + i))).item())
        return losses, [t.numpy() for t in log], [w.detach().numpy(), b.detach().numpy(), w.grad.numpy()], len(calls)

    compiled, eager = make("compile"), make("eager")
    assert compiled[3] == eager[3] == STEPS
    assert_like_eager(compiled, eager)

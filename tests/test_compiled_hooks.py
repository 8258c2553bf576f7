"""Compiled backward: every hook kind with eager's calls, order and values; Functions; fallbacks."""

from __future__ import annotations

import numpy as np
import pytest

import xgrad
from xgrad.autograd import compiled
from xgrad.engine import compiled as compiled_engine
from xgrad.utils import checkpoint


@pytest.fixture(autouse=True)
def fresh_cache():
    compiled.reset()
    yield
    compiled.reset()


def hooked_step(flag: bool, kinds: set[str], scale: float = 1.0) -> tuple[list, dict]:
    """One backward with the hooks in ``kinds`` recording (name, value) events."""
    events: list = []
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    w = xgrad.tensor([3.0 * scale, -1.0], requires_grad=True)
    h = x * w
    z = h.sin()
    out = (z * z.cos()).sum()
    if "tensor" in kinds:
        x.register_hook(lambda g: events.append(("x", g.tolist())))
        h.register_hook(lambda g: events.append(("h", g.tolist())) or g * 2)
    if "retain" in kinds:
        h.retain_grad()
    if "pre" in kinds:
        z.grad_fn.register_prehook(lambda go: events.append(("pre", go[0].tolist())))
    if "post" in kinds:
        z.grad_fn.register_hook(lambda gi, go: events.append(("post", gi[0].tolist(), go[0].tolist())))
    if "post_accumulate" in kinds:
        w.register_post_accumulate_grad_hook(lambda t: events.append(("w acc", t.grad.tolist())))
        x.register_post_accumulate_grad_hook(lambda t: events.append(("x acc", t.grad.tolist())))
    if "callback" in kinds:
        w.register_hook(lambda g: xgrad.autograd.queue_callback(lambda: events.append(("final", w.grad.tolist()))))
    out.backward(compiled=flag)
    grads = {"x": x.grad.tolist(), "w": w.grad.tolist(), "h": h.grad.tolist() if h.retains_grad else None}
    return events, grads


ALL = {"tensor", "retain", "pre", "post", "post_accumulate", "callback"}


@pytest.mark.parametrize("kinds", [{"tensor"}, {"retain"}, {"pre"}, {"post"}, {"post_accumulate"}, {"callback"}, ALL],
                         ids=lambda k: "+".join(sorted(k)))
def test_hook_events_match_eager(kinds):
    eager = hooked_step(False, kinds)
    assert eager[0] or kinds == {"retain"}
    for scale in (1.0, 1.0, 2.0):  # a miss, a hit, a hit with other values
        assert hooked_step(True, kinds, scale) == hooked_step(False, kinds, scale)
    assert compiled.stats()["hits"] >= 2


def branch_order_step(flag: bool, y_first: bool) -> tuple[list, list]:
    """Two branches of one structure, recorded in either order: eager runs the later-recorded first."""
    events: list = []
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    if y_first:
        y = x * 2.0
        z = x * 3.0
    else:
        z = x * 3.0
        y = x * 2.0
    y.register_hook(lambda g: events.append("y") or g + 1.0)
    z.register_hook(lambda g: events.append("z") or g * 3.0)
    x.register_hook(lambda g: events.append(("x", g.tolist())))
    ((y * y).sum() + (z * z * z).sum()).backward(compiled=flag)
    return events, x.grad.tolist()


def test_creation_order_decides_hook_order_as_in_eager():
    """The structure is the same, the sequence_nr order is not: it must be part of the key."""
    orders = {y_first: branch_order_step(False, y_first) for y_first in (True, False)}
    assert orders[True][0][:2] != orders[False][0][:2]  # the workload does tell the orders apart
    for y_first in (True, False, True, False):
        assert branch_order_step(True, y_first) == orders[y_first]
    s = compiled.stats()
    assert (s["misses"], s["hits"]) == (2, 2)


def test_side_effect_hooks_run_every_backward_with_concrete_values():
    seen = []
    w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    w.register_hook(lambda g: seen.append(g.detach().numpy().copy()))
    for k in range(1, 4):
        (w * float(k)).sum().backward(compiled=True)
    assert [s.tolist() for s in seen] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert compiled.stats()["misses"] == 3  # the constant is part of the key


def test_host_hook_splits_the_program_and_its_result_feeds_the_rest():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    for _ in range(2):
        x.grad = None
        h = x.exp()
        h.register_hook(lambda g: g * 10)
        (h * h).sum().backward(compiled=True)
        np.testing.assert_allclose(x.grad.numpy(), 10 * 2 * np.exp([2.0, 4.0]))
    (program,) = compiled_engine.cache.programs.values()
    assert len(program.segments) == 2


def test_pure_hooks_are_traced_into_one_program():
    calls = []

    def double(g):
        calls.append(1)  # runs while tracing only
        return g * 2

    def add_one(grad_outputs):
        return (grad_outputs[0] + 1,)

    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    for _ in range(3):
        x.grad = None
        h = x.sin()
        h.register_hook(compiled.pure_hook(double))
        h.grad_fn.register_prehook(compiled.pure_hook(add_one))
        (h * 3).sum().backward(compiled=True)
        np.testing.assert_allclose(x.grad.numpy(), (3 * 2 + 1) * np.cos([1.0, 2.0]))
    (program,) = compiled_engine.cache.programs.values()
    assert len(program.segments) == 1
    assert len(calls) == 1
    hlo = program.hlo_text().lower()
    assert "callback" not in hlo and "custom-call" not in hlo.replace("custom_call_target=\"sharding\"", "")


def test_pure_hook_runs_normally_in_eager():
    x = xgrad.tensor([1.0], requires_grad=True)
    x.register_hook(compiled.pure_hook(lambda g: g * 5))
    (x * 2).sum().backward()
    assert x.grad.tolist() == [10.0]


def test_removing_a_hook_changes_the_key():
    x = xgrad.tensor([1.0], requires_grad=True)

    def step():
        x.grad = None
        (x * 2).sum().backward(compiled=True)

    handle = x.register_hook(lambda g: g * 3)
    step()
    assert x.grad.tolist() == [6.0]
    handle.remove()
    step()
    assert x.grad.tolist() == [2.0]
    assert "hooks on" in compiled.stats()["recompile_reasons"][-1]


def test_hook_error_propagates_and_next_backward_works():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    h = x * 2
    h.register_hook(lambda g: xgrad.ones(3))
    with pytest.raises(RuntimeError, match="returned a gradient of shape"):
        h.sum().backward(compiled=True)
    (x * 3).sum().backward(compiled=True)
    assert x.grad.tolist() == [3.0, 3.0]


# -- custom Functions and fallbacks ------------------------------------------------------


class ScaledCube(xgrad.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.save_for_backward(x)
        ctx.k = k
        return x ** 3 * k

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * ctx.k * x ** 2 * g, None


class PureScaledCube(ScaledCube):
    backward = staticmethod(compiled.pure_hook(ScaledCube.backward))


class ItemBackward(xgrad.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * float(x.sum().item())


class PureItemBackward(ItemBackward):
    """Marked pure, wrongly: its backward concretizes a traced value."""

    backward = staticmethod(compiled.pure_hook(ItemBackward.backward))


def test_function_backward_runs_on_the_host_and_its_ctx_is_not_keyed():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    for k in (2.0, 2.0, 5.0):
        x.grad = None
        ScaledCube.apply(x, k).sum().backward(compiled=True)
        np.testing.assert_allclose(x.grad.numpy(), 3 * k * np.array([1.0, 4.0]))
    s = compiled.stats()
    assert (s["misses"], s["hits"], s["fallbacks"]) == (1, 2, {})


def test_pure_function_is_traced_and_keys_its_ctx():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    for k in (2.0, 2.0, 5.0):
        x.grad = None
        PureScaledCube.apply(x, k).sum().backward(compiled=True)
        np.testing.assert_allclose(x.grad.numpy(), 3 * k * np.array([1.0, 4.0]))
    s = compiled.stats()
    assert (s["misses"], s["hits"], s["fallbacks"]) == (2, 1, {})
    assert "stored on ctx for PureScaledCubeBackward changed (ctx.k = 2.0 -> ctx.k = 5.0)" in s["recompile_reasons"][-1]


def test_function_that_concretizes_runs_on_the_host_without_fallback():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    for _ in range(2):
        x.grad = None
        ItemBackward.apply(x).sum().backward(compiled=True)
        assert x.grad.tolist() == [3.0, 3.0]
    assert compiled.stats()["fallbacks"] == {}


def test_untraceable_pure_function_falls_back_once_with_a_warning():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    with pytest.warns(compiled.CompiledFallbackWarning, match="custom Function PureItemBackward is not traceable"):
        PureItemBackward.apply(x).sum().backward(compiled=True)
    assert x.grad.tolist() == [3.0, 3.0]
    x.grad = None
    PureItemBackward.apply(x).sum().backward(compiled=True)  # warned once: no second warning
    assert x.grad.tolist() == [3.0, 3.0]
    assert compiled.stats()["fallbacks"] == {"untraceable Function": 2}


def test_fallback_error_mode_raises():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    with compiled.enable(fallback="error"), pytest.raises(compiled.CompiledFallbackError, match="PureItemBackward"):
        PureItemBackward.apply(x).sum().backward()
    assert x.grad is None
    with compiled.enable(fallback="error"):
        (x * 2).sum().backward()  # compilable graphs still run
    assert x.grad.tolist() == [2.0, 2.0]


def test_anomaly_mode_falls_back():
    x = xgrad.tensor([1.0], requires_grad=True)
    with xgrad.autograd.detect_anomaly(), pytest.warns(compiled.CompiledFallbackWarning, match="anomaly mode"):
        (x * 2).sum().backward(compiled=True)
    assert x.grad.tolist() == [2.0]


def test_reentrant_checkpoint_runs_on_the_host_and_matches_eager():
    def block(v):
        return (v.sin() * v).sum()

    grads = []
    for flag in (False, True):
        x = xgrad.tensor([0.5, 1.5], requires_grad=True)
        checkpoint(block, x, use_reentrant=True).backward(compiled=flag)  # warnings are errors: no fallback
        grads.append(x.grad.numpy())
    np.testing.assert_allclose(grads[0], grads[1])
    np.testing.assert_allclose(grads[1], np.sin([0.5, 1.5]) + np.array([0.5, 1.5]) * np.cos([0.5, 1.5]))
    assert compiled.stats()["fallbacks"] == {}


def test_non_reentrant_checkpoint_compiles():
    def block(v):
        return (v.sin() * v).sum()

    x = xgrad.tensor([0.5, 1.5], requires_grad=True)
    checkpoint(block, x, use_reentrant=False).backward(compiled=True)
    np.testing.assert_allclose(x.grad.numpy(), np.sin([0.5, 1.5]) + np.array([0.5, 1.5]) * np.cos([0.5, 1.5]))


def test_unknown_node_kind_falls_back():
    from xgrad.engine.node import Edge, InputMetadata, Node

    class Doubler(Node):
        __slots__ = ()

        def apply(self, grads):
            return [grads[0] * 2]

    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1.0
    node = Doubler((Edge(y.grad_fn, 0),), (InputMetadata.of(y.array),))
    z = xgrad.Tensor._from_graph(y.array, node, 0)
    with pytest.warns(compiled.CompiledFallbackWarning, match="node of kind Doubler"):
        z.sum().backward(compiled=True)
    assert x.grad.tolist() == [2.0, 2.0]

"""Anomaly mode: forward tracebacks on nodes, errors re-raised with them, NaN checks."""

import numpy as np
import pytest

import xgrad
from tests._helpers import leaf
from xgrad.autograd import (
    Function,
    detect_anomaly,
    is_anomaly_check_nan_enabled,
    is_anomaly_enabled,
    set_detect_anomaly,
)
from xgrad.engine.anomaly import TRACE_HEADER, TRACEBACK_KEY

X0 = (0.5, 1.5)


class Fails(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        raise ValueError("bad backward")


def forward_site_of_fails(x):
    return Fails.apply(x)


def test_off_by_default_and_nodes_record_nothing():
    assert not is_anomaly_enabled()
    y = leaf(X0).exp()
    assert y.grad_fn._metadata is None


def test_nodes_created_in_anomaly_mode_store_the_forward_trace():
    x = leaf(X0)
    with detect_anomaly():
        y = x.exp()
        z = Fails.apply(y)
    for node in (y.grad_fn, z.grad_fn):
        trace = node.metadata[TRACEBACK_KEY]
        assert "test_nodes_created_in_anomaly_mode_store_the_forward_trace" in trace
    assert "z = Fails.apply(y)" in z.grad_fn.metadata[TRACEBACK_KEY]


def test_error_in_backward_is_reraised_with_forward_trace_and_same_type():
    x = leaf(X0)
    with detect_anomaly():
        y = forward_site_of_fails(x).sum()
        with pytest.raises(ValueError, match="bad backward") as info:
            y.backward()
    message = str(info.value)
    assert TRACE_HEADER.strip() in message
    assert "forward_site_of_fails" in message
    assert "FailsBackward" in message


def test_without_anomaly_mode_the_error_is_unchanged():
    y = forward_site_of_fails(leaf(X0)).sum()
    with pytest.raises(ValueError) as info:
        y.backward()
    assert str(info.value) == "bad backward"


def test_nodes_recorded_outside_anomaly_mode_add_no_trace():
    y = forward_site_of_fails(leaf(X0)).sum()
    with detect_anomaly(), pytest.raises(ValueError) as info:
        y.backward()
    assert str(info.value) == "bad backward"


def test_nan_check_names_node_and_output():
    x = leaf((0.0, 1.0))
    with detect_anomaly():
        y = (x.sqrt() * 0.0).sum()
        with pytest.raises(RuntimeError, match=r"Function 'SqrtBackward' returned nan values in its 0th output\.") as info:
            y.backward()
    assert TRACE_HEADER.strip() in str(info.value)


def test_nan_check_for_custom_function():
    class NanGrad(Function):
        @staticmethod
        def forward(ctx, x, w):
            return x * w

        @staticmethod
        def backward(ctx, g):
            return g, g * float("nan")

    x, w = leaf(X0), leaf(X0)
    with detect_anomaly(), pytest.raises(RuntimeError, match="Function 'NanGradBackward' returned nan values in its 1th output."):
        NanGrad.apply(x, w).sum().backward()


def test_check_nan_false_lets_nan_through():
    x = leaf((0.0, 1.0))
    with detect_anomaly(check_nan=False):
        (x.sqrt() * 0.0).sum().backward()
    assert np.isnan(x.grad.detach().numpy()[0])


def test_set_detect_anomaly_function_and_context():
    set_detect_anomaly(True)
    try:
        assert is_anomaly_enabled()
        assert xgrad.autograd.is_anomaly_check_nan_enabled()
    finally:
        set_detect_anomaly(False)
    assert not is_anomaly_enabled()
    with set_detect_anomaly(True, check_nan=False):
        assert is_anomaly_enabled() and not xgrad.autograd.is_anomaly_check_nan_enabled()
    assert not is_anomaly_enabled() and xgrad.autograd.is_anomaly_check_nan_enabled()


def test_after_an_anomaly_error_the_next_backward_works():
    x = leaf((0.0, 4.0))
    with detect_anomaly():
        with pytest.raises(RuntimeError, match="returned nan values"):
            (x.sqrt() * 0.0).sum().backward()
        x.grad = None
        (x * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad.detach().numpy(), [3.0, 3.0])


def test_error_inside_reentrant_backward_carries_the_inner_trace_once():
    class Outer(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            inner = x.detach().requires_grad_()
            with xgrad.enable_grad():
                forward_site_of_fails(inner).sum().backward()
            return g

    with detect_anomaly():
        y = Outer.apply(leaf(X0)).sum()
        with pytest.raises(ValueError, match="bad backward") as info:
            y.backward()
    assert str(info.value).count(TRACE_HEADER.strip()) == 1


class NanBackward(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        return g * float("nan")


def test_nested_detect_anomaly_restores_the_outer_check_nan():
    """PyTorch's test_anomaly_mode_no_check_nan: the inner context's check_nan holds
    inside it, and the outer setting is back after it."""
    with detect_anomaly(check_nan=False):
        x = leaf(X0)
        out = NanBackward.apply(x).sum()
        out.backward(retain_graph=True)  # NaN allowed
        with detect_anomaly(check_nan=True):
            with pytest.raises(RuntimeError, match=r"Function 'NanBackwardBackward' returned nan values in its 0th output\."):
                out.backward(retain_graph=True)
        assert is_anomaly_enabled() and not is_anomaly_check_nan_enabled()
        out.backward()
    assert not is_anomaly_enabled() and is_anomaly_check_nan_enabled()
    assert np.isnan(x.grad.detach().numpy()).all()


def test_same_detect_anomaly_object_nested_in_itself():
    mode = detect_anomaly(check_nan=False)
    with mode:
        with mode:
            assert is_anomaly_enabled()
        assert is_anomaly_enabled()  # the inner exit restored the outer entry, not the default
    assert not is_anomaly_enabled()


def _outer_forward_site(x, fail_0th):
    return OuterFn.apply(x, fail_0th)


def _inner_forward_site(a, b, fail_0th):
    return InnerFn.apply(a, b, fail_0th)


class OuterFn(Function):
    """PyTorch's test_nested_anomaly_detect_nan: its backward records InnerFn."""

    @staticmethod
    def forward(ctx, x, fail_0th):
        ctx.fail_0th = fail_0th
        ctx.save_for_backward(x)
        return x.sum(0, keepdim=True)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        g = g.expand(x.shape[0])
        return _inner_forward_site(g * x, g + x, ctx.fail_0th), None


class InnerFn(Function):
    @staticmethod
    def forward(ctx, a, b, fail_0th):
        ctx.fail_0th = fail_0th
        return a * 2.0 + b

    @staticmethod
    def backward(ctx, g):
        nan_first = xgrad.tensor([float("nan"), 1.0])
        return (g * nan_first, g, None) if ctx.fail_0th else (g * 2.0, g * nan_first, None)


@pytest.mark.parametrize("fail_0th", [True, False])
def test_double_backward_error_shows_the_parent_forward_trace(fail_0th):
    """PyTorch's test_nested_anomaly_detect_nan: InnerFn's node was recorded by
    OuterFn's backward, so the error shows InnerFn's forward trace, then "Previous
    calculation was induced by OuterFnBackward" with OuterFn's forward trace."""
    x = leaf(X0)
    with detect_anomaly():
        out = _outer_forward_site(x, fail_0th)
        (gx,) = xgrad.autograd.grad(out, (x,), create_graph=True)
        assert gx.grad_fn.metadata["parent_"] is out.grad_fn
        with pytest.raises(RuntimeError) as info:
            gx.sum().backward()
    message = str(info.value)
    assert message.startswith(f"Function 'InnerFnBackward' returned nan values in its {0 if fail_0th else 1}th output.")
    own, parent = message.split("Previous calculation was induced by OuterFnBackward. ")
    assert TRACE_HEADER in own and "_inner_forward_site" in own and "_outer_forward_site" not in own
    assert parent.startswith("Traceback of forward call that induced the previous calculation:\n")
    assert "_outer_forward_site" in parent and "_inner_forward_site" not in parent
    with detect_anomaly():  # the next backward works
        out = _outer_forward_site(leaf(X0), fail_0th)
        out.sum().backward()


def test_parent_without_a_forward_trace_says_so():
    x = leaf(X0)
    out = OuterFn.apply(x, True)  # recorded outside anomaly mode: no trace
    with detect_anomaly():
        (gx,) = xgrad.autograd.grad(out, (x,), create_graph=True)
        with pytest.raises(RuntimeError, match=r"induced by OuterFnBackward\. No forward pass information available"):
            gx.sum().backward()

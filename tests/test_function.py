"""Custom ``xgrad.autograd.Function``s: ctx API, gradient checks, double and reentrant backward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from tests._backward_modes import every_backward_mode  # noqa: F401  (a fixture)
from tests._helpers import close, leaf
from xgrad.autograd import Function, FunctionCtx, once_differentiable

pytestmark = pytest.mark.usefixtures("every_backward_mode")  # every test: eager, compiled, each backward a compiled step

X0 = np.array([0.5, -1.5, 2.0])
W0 = np.array([1.25, 0.5, -0.75])


class MulSin(Function):
    """``x * sin(w)`` with a backward written in xgrad ops (so it is twice differentiable)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w.sin()

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w.sin(), g * x * w.cos()


def mul_sin(x, w):
    return x * jnp.sin(w)


def test_forward_backward_match_jax_vjp():
    x, w = leaf(X0), leaf(W0)
    y = MulSin.apply(x, w)
    assert y.grad_fn.name() == "MulSinBackward"
    assert not y.is_leaf and y.requires_grad
    ct = np.array([1.0, -2.0, 0.5])
    y.backward(xgrad.tensor(ct))
    out, vjp = jax.vjp(mul_sin, X0, W0)
    close(y.array, out)
    gx, gw = vjp(ct)
    close(x.grad.array, gx)
    close(w.grad.array, gw)


def test_node_edges_point_at_inputs():
    x, w = leaf(X0), leaf(W0)
    y = MulSin.apply(x * 2.0, w)
    (mul_node, _), (acc, _) = y.grad_fn.next_functions
    assert mul_node.name() == "MulBackward"
    assert acc.variable is w


def test_forward_runs_under_no_grad_and_output_gets_node_only_when_needed():
    seen = []

    class Probe(Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(xgrad.is_grad_enabled())
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            return g * 2.0

    x = leaf(X0)
    assert Probe.apply(x).grad_fn is not None
    assert Probe.apply(xgrad.tensor(X0)).grad_fn is None
    with xgrad.no_grad():
        assert Probe.apply(x).grad_fn is None
    assert seen == [False, False, False]


def test_setup_context_variant():
    class Exp(Function):
        @staticmethod
        def forward(x):
            return x.exp()

        @staticmethod
        def setup_context(ctx, inputs, output):
            (x,) = inputs
            ctx.save_for_backward(output)
            ctx.input_shape = x.shape

        @staticmethod
        def backward(ctx, g):
            (out,) = ctx.saved_tensors
            assert ctx.input_shape == (3,)
            return g * out

    x = leaf(X0)
    Exp.apply(x).sum().backward()
    close(x.grad.array, np.exp(X0))


def test_ctx_attributes_needs_input_grad_and_non_tensor_args():
    class Scale(Function):
        @staticmethod
        def forward(ctx, x, factor, w, *, offset=0.0):
            assert isinstance(ctx, FunctionCtx)
            ctx.factor = factor
            ctx.flags = ctx.needs_input_grad
            return x * factor + w + offset

        @staticmethod
        def backward(ctx, g):
            return g * ctx.factor, None, g

    x, w = leaf(X0), xgrad.tensor(W0)
    y = Scale.apply(x, 3.0, w, offset=1.0)
    assert y.grad_fn.ctx.flags == (True, False, False)
    close(y.array, X0 * 3.0 + W0 + 1.0)
    y.sum().backward()  # a grad for w (does not require grad) is ignored
    close(x.grad.array, np.full(3, 3.0))
    assert w.grad is None


def test_tuple_outputs_and_materialized_zero_grads():
    received = []

    class SinCos(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin(), x.cos()

        @staticmethod
        def backward(ctx, gs, gc):
            received.append((gs, gc))
            (x,) = ctx.saved_tensors
            return gs * x.cos() - gc * x.sin()

    x = leaf(X0)
    s, c = SinCos.apply(x)
    assert s.grad_fn is c.grad_fn and (s.output_nr, c.output_nr) == (0, 1)
    s.sum().backward()
    gs, gc = received[0]
    close(gc.array, np.zeros(3))
    close(x.grad.array, np.cos(X0))


def test_set_materialize_grads_false_passes_none():
    received = []

    class Two(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(False)
            return x * 1.0, x * 2.0

        @staticmethod
        def backward(ctx, g1, g2):
            received.append((g1, g2))
            return g1 if g2 is None else g1 + 2.0 * g2

    x = leaf(X0)
    a, _ = Two.apply(x)
    a.sum().backward()
    assert received[0][1] is None
    close(x.grad.array, np.ones(3))


def test_mark_non_differentiable():
    class SortWithIndex(Function):
        @staticmethod
        def forward(ctx, x):
            values = xgrad.tensor(jnp.sort(x.array))
            order = xgrad.tensor(jnp.argsort(x.array).astype(jnp.float64))
            ctx.mark_non_differentiable(order)
            ctx.save_for_backward(order)
            return values, order

        @staticmethod
        def backward(ctx, g, g_order):
            (order,) = ctx.saved_tensors
            close(g_order.array, np.zeros(3))
            idx = order.array.astype(jnp.int32)
            return xgrad.tensor(jnp.zeros(3).at[idx].set(g.array))

    x = leaf(X0)
    values, order = SortWithIndex.apply(x)
    assert values.requires_grad and not order.requires_grad and order.grad_fn is None
    (values * xgrad.tensor([1.0, 2.0, 3.0])).sum().backward()
    ref = jax.grad(lambda v: jnp.sum(jnp.sort(v) * jnp.array([1.0, 2.0, 3.0])))(X0)
    close(x.grad.array, ref)


def test_mark_dirty_rewrites_history_of_in_place_input():
    class AddOneInPlace(Function):
        @staticmethod
        def forward(ctx, x):
            x.add_(1.0)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 1.0

    base = leaf(X0)
    y = base * 3.0
    version = y._version
    z = AddOneInPlace.apply(y)
    assert z is y and y.grad_fn.name() == "AddOneInPlaceBackward" and y._version == version + 1
    close(y.array, X0 * 3.0 + 1.0)
    (y * y).sum().backward()
    close(base.grad.array, 2 * (X0 * 3.0 + 1.0) * 3.0)


def test_mark_dirty_on_leaf_that_requires_grad_raises():
    class Dirty(Function):
        @staticmethod
        def forward(ctx, x):
            x.mul_(2.0)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        Dirty.apply(leaf(X0))


def test_wrong_number_of_gradients_raises_pytorch_error():
    class Bad(Function):
        @staticmethod
        def forward(ctx, x, w):
            return x * w

        @staticmethod
        def backward(ctx, g):
            return (g,)

    x, w = leaf(X0), leaf(W0)
    y = Bad.apply(x, w).sum()
    with pytest.raises(RuntimeError, match=r"function BadBackward returned an incorrect number of gradients \(expected 2, got 1\)"):
        y.backward()


def test_extra_none_gradients_are_allowed():
    class Extra(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            return g * 2.0, None, None

    x = leaf(X0)
    Extra.apply(x).sum().backward()
    close(x.grad.array, np.full(3, 2.0))


def test_gradient_for_non_tensor_input_raises():
    class Bad(Function):
        @staticmethod
        def forward(ctx, x, k):
            return x * k

        @staticmethod
        def backward(ctx, g):
            return g, g

    with pytest.raises(RuntimeError, match="returned a gradient different than None at position 1"):
        Bad.apply(leaf(X0), 2.0).sum().backward()


def test_bad_gradient_shape_comes_from_validate_outputs():
    class Bad(Function):
        @staticmethod
        def forward(ctx, x):
            return x.sum()

        @staticmethod
        def backward(ctx, g):
            return xgrad.ones(2, 4, dtype=jnp.float64)

    x = leaf(X0)
    with pytest.raises(RuntimeError, match=r"Function BadBackward returned an invalid gradient at index 0 - got \[2, 4\] but expected shape compatible with \[3\]"):
        Bad.apply(x).backward()
    # A grad that only broadcasts is summed down, as for any node.
    class Broadcasting(Function):
        @staticmethod
        def forward(ctx, x):
            return x.sum()

        @staticmethod
        def backward(ctx, g):
            return xgrad.ones(2, 3, dtype=jnp.float64) * g

    Broadcasting.apply(x).backward()
    close(x.grad.array, np.full(3, 2.0))


def test_saved_tensors_freed_after_backward_and_version_checked():
    x, w = leaf(X0), leaf(W0)
    y = MulSin.apply(x, w)
    y.sum().backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        y.sum().backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        _ = y.grad_fn.ctx.saved_tensors

    h = x * 1.0
    y = MulSin.apply(h, w)
    with xgrad.no_grad():
        h.add_(1.0)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation.*saved by MulSinBackward"):
        y.sum().backward()


@pytest.mark.graph_across_steps
def test_saved_output_does_not_keep_a_cycle_and_unpacks():
    class Exp(Function):
        @staticmethod
        def forward(ctx, x):
            out = x.exp()
            ctx.save_for_backward(out)
            return out

        @staticmethod
        def backward(ctx, g):
            (out,) = ctx.saved_tensors
            return g * out

    x = leaf(X0)
    y = Exp.apply(x)
    assert y.grad_fn.saved[0]._state == "output"
    (g,) = xgrad.autograd.grad(y.sum(), x, create_graph=True)
    close(g.array, np.exp(X0))
    (gg,) = xgrad.autograd.grad(g.sum(), x)
    close(gg.array, np.exp(X0))


def test_retain_graph_allows_a_second_backward():
    x, w = leaf(X0), leaf(W0)
    y = MulSin.apply(x, w).sum()
    y.backward(retain_graph=True)
    y.backward()
    close(x.grad.array, 2 * np.sin(W0))


@pytest.mark.graph_across_steps
def test_double_backward_through_function_matches_jax():
    x, w = leaf(X0), leaf(W0)
    (gx, gw) = xgrad.autograd.grad(MulSin.apply(x, w).sum(), [x, w], create_graph=True)
    (ggx, ggw) = xgrad.autograd.grad((gx * gw).sum(), [x, w])

    def first(x, w):
        return jax.grad(lambda x, w: jnp.sum(mul_sin(x, w)), argnums=(0, 1))(x, w)

    ref = jax.grad(lambda x, w: jnp.sum(first(x, w)[0] * first(x, w)[1]), argnums=(0, 1))(X0, W0)
    close(ggx.array, ref[0])
    close(ggw.array, ref[1])


class OnceSquare(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        assert not xgrad.is_grad_enabled()
        (x,) = ctx.saved_tensors
        return 2.0 * x * g


@pytest.mark.graph_across_steps
def test_once_differentiable_first_order_and_second_order_error():
    x = leaf(X0)
    OnceSquare.apply(x).sum().backward()
    close(x.grad.array, 2 * X0)
    x.grad = None
    # The grad reaching the backward requires grad (it depends on x): double backward must fail loudly.
    y = OnceSquare.apply(x).sin().sum()
    (g,) = xgrad.autograd.grad(y, x, create_graph=True)
    close(g.array, np.cos(X0 * X0) * 2 * X0)
    assert g.requires_grad
    with pytest.raises(RuntimeError, match="trying to differentiate twice a function that was marked with @once_differentiable"):
        xgrad.autograd.grad(g.sum(), x)


def test_function_node_compute_is_pure_given_values():
    """``compute`` runs the backward on given saved values: nothing is unpacked."""
    x, w = leaf(X0), leaf(W0)
    y = MulSin.apply(x, w)
    node = y.grad_fn
    other = (xgrad.tensor(W0), xgrad.tensor(X0))
    gx, gw = node.compute([xgrad.tensor(np.ones(3))], other)
    close(gx.array, np.sin(X0))
    close(gw.array, W0 * np.cos(X0))
    node.release_variables()
    gx, _ = node.compute([xgrad.tensor(np.ones(3))], other)  # still works: saved values were given
    close(gx.array, np.sin(X0))


# -- reentrant backward -------------------------------------------------------------


class ReentrantSquare(Function):
    """A backward that differentiates a graph it builds itself, as checkpointing does."""

    @staticmethod
    def forward(ctx, x, depth):
        ctx.save_for_backward(x)
        ctx.depth = depth
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        inner = x.detach().requires_grad_()
        with xgrad.enable_grad():
            out = ReentrantSquare.apply(inner, ctx.depth - 1) if ctx.depth > 1 else inner * inner
            (gx,) = xgrad.autograd.grad(out.sum(), inner)
        return gx * g, None


@pytest.mark.parametrize("depth", [1, 5])
def test_reentrant_backward(depth):
    x = leaf(X0)
    ReentrantSquare.apply(x, depth).sum().backward()
    close(x.grad.array, 2 * X0)


@pytest.mark.slow
def test_reentrant_backward_deeper_than_max_reentrant_depth():
    depth = 70
    assert depth > xgrad.autograd.MAX_REENTRANT_DEPTH
    x = leaf(X0)
    ReentrantSquare.apply(x, depth).sum().backward()
    close(x.grad.array, 2 * X0)


def test_reentrant_backward_with_small_max_depth_uses_pool():
    saved = xgrad.autograd.MAX_REENTRANT_DEPTH
    xgrad.autograd.MAX_REENTRANT_DEPTH = 2
    try:
        x = leaf(X0)
        ReentrantSquare.apply(x, 8).sum().backward()
        close(x.grad.array, 2 * X0)
    finally:
        xgrad.autograd.MAX_REENTRANT_DEPTH = saved


def test_error_in_function_backward_leaves_engine_usable():
    class Boom(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            raise ValueError("boom in backward")

    x = leaf(X0)
    with pytest.raises(ValueError, match="boom in backward"):
        Boom.apply(x).sum().backward()
    MulSin.apply(x, leaf(W0)).sum().backward()
    close(x.grad.array, np.sin(W0))


# -- output identity and saved tensors' place in the graph (PyTorch's relations) -----------


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_return_duplicate(compiled):
    """PyTorch's test_return_duplicate: a tensor returned twice is one output object
    (each return sets its history again, so it sits at the last position)."""

    class DoubleDuplicate(Function):
        @staticmethod
        def forward(ctx, x):
            output = x * 2
            return output, output

        @staticmethod
        def backward(ctx, grad1, grad2):
            return grad1 * 2 + grad2 * 2

    x = leaf(X0)
    a, b = DoubleDuplicate.apply(x)
    assert a is b
    assert a.output_nr == 1 and a.grad_fn.name() == "DoubleDuplicateBackward"
    (a + b).sum().backward(compiled=compiled)
    close(x.grad.array, np.full(3, 4.0))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_input_returned_twice_gives_two_outputs(compiled):
    """An input returned as is becomes a new tensor per return (PyTorch returns a view
    each time), at its own position; the input keeps its history."""

    class Twice(Function):
        @staticmethod
        def forward(ctx, x):
            return x, x

        @staticmethod
        def backward(ctx, g1, g2):
            return g1 + 3 * g2

    x = leaf(X0)
    a, b = Twice.apply(x)
    assert a is not b and a is not x
    assert (a.output_nr, b.output_nr) == (0, 1) and a.grad_fn is b.grad_fn
    assert x.is_leaf
    (a + b).sum().backward(compiled=compiled)
    close(x.grad.array, np.full(3, 4.0))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_save_output_nr(compiled):
    """PyTorch's test_save_output_nr: a saved input keeps its output_nr and grad_fn."""

    class MultiOutputFn(Function):
        @staticmethod
        def forward(ctx, x):
            return x[:2], x[2:]

        @staticmethod
        def backward(ctx, *grad):
            return xgrad.cat(grad)

    a = leaf(X0)
    b, c = MultiOutputFn.apply(a)
    assert (b.output_nr, c.output_nr) == (0, 1)
    seen = []

    class TestFn(Function):
        @staticmethod
        def forward(ctx, b):
            ctx.save_for_backward(b)
            return b * 2

        @staticmethod
        def backward(ctx, grad_b):
            (b,) = ctx.saved_tensors
            seen.append((b.output_nr, b.grad_fn is c.grad_fn))
            return grad_b * 2

    TestFn.apply(c).sum().backward(compiled=compiled)
    assert seen == [(1, True)]  # compiled too: a Function's backward runs on the host
    close(a.grad.array, [0.0, 0.0, 2.0])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("hooked", [False, True], ids=["plain", "saved-tensor-hooks"])
def test_saved_output_and_recomputed_input_keep_their_place_in_the_graph(hooked, compiled):
    """An unpacked saved output is an output of the node at its output_nr; an unpacked
    saved non-leaf input (recomputed by an unpack hook) has the input's grad_fn, as
    PyTorch's test_saved_variable_packing_unpacking_*_with_hooks check."""
    seen = []

    class ExpMul(Function):
        @staticmethod
        def forward(ctx, x, w):
            out = x.exp() * w
            ctx.save_for_backward(x, w, out)
            return w * 1.0, out

        @staticmethod
        def backward(ctx, g_w, g_out):
            x, w, out = ctx.saved_tensors
            seen.append((out.grad_fn is node, out.output_nr, x.grad_fn is x_fn, x.output_nr, w.is_leaf))
            return g_out * out, g_w + g_out * out / w

    a = leaf(X0)
    w = leaf(W0)
    x = a * 1.0
    x_fn = x.grad_fn
    if hooked:  # pack keeps a recipe, unpack recomputes a new tensor from it
        with xgrad.autograd.graph.saved_tensors_hooks(lambda t: np.asarray(t.array), lambda v: xgrad.tensor(v)):
            _, out = ExpMul.apply(x, w)
    else:
        _, out = ExpMul.apply(x, w)
    node = out.grad_fn
    assert out.output_nr == 1
    out.sum().backward(compiled=compiled)
    assert seen == [(True, 1, True, 0, True)]
    close(a.grad.array, np.exp(X0) * W0)
    close(w.grad.array, np.exp(X0))


class PowFunction(Function):
    @staticmethod
    def forward(x, y=3):
        return x**y

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, y = inputs
        ctx.save_for_backward(x)
        ctx.y = y

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * ctx.y * x ** (ctx.y - 1), None


class PowFunctionWithClassmethod(Function):
    @classmethod
    def forward(cls, x, y=3):
        return x**y

    @classmethod
    def setup_context(cls, ctx, inputs, output):
        x, y = inputs
        ctx.save_for_backward(x)
        ctx.y = y

    @classmethod
    def backward(cls, ctx, g):
        (x,) = ctx.saved_tensors
        return g * ctx.y * x ** (ctx.y - 1), None


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("fn", [PowFunction, PowFunctionWithClassmethod], ids=["staticmethod", "classmethod"])
def test_setup_context_when_forward_has_default_args(compiled, fn):
    """PyTorch's test_setup_context_when_forward_has_default_args: setup_context gets
    the inputs with forward's defaults filled in; 2 ** 3 = 8, d/dx = 3 * 2 ** 2 = 12."""
    x = xgrad.tensor(2.0, requires_grad=True)
    y = fn.apply(x)
    (gx,) = xgrad.autograd.grad(y, x, compiled=compiled)
    assert (y.item(), gx.item()) == (8.0, 12.0)
    z = fn.apply(x, y=2)  # a keyword binds to its position too
    (gz,) = xgrad.autograd.grad(z, x, compiled=compiled)
    assert (z.item(), gz.item()) == (4.0, 4.0)

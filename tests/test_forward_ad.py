"""Forward-mode AD (``xgrad.autograd.forward_ad``): PyTorch's forward-AD tests (the
``TestAutogradForwardMode`` cases of ``test/test_autograd.py``), ported with their values and
messages, plus forward over reverse and reverse over forward against ``jax``.

Where JAX arrays cannot share memory (``storage().data_ptr()``, a version counter shared
with the tensor ``make_dual`` was given) the ported test checks values instead.
"""

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
import xgrad.autograd.forward_ad as fwAD
from tests._backward_modes import eager_and_compiled  # noqa: F401 - the fixture
from xgrad.autograd import compiled
from xgrad.testing import GradcheckError, gradcheck

pytestmark = pytest.mark.usefixtures("eager_and_compiled")


@pytest.fixture(autouse=True)
def no_level_left():
    """As PyTorch's tearDown: a failing test does not leave a level open for the next."""
    yield
    while fwAD.LEVEL.current is not None:
        fwAD.exit_dual_level()


def close(a, b):
    a = a.detach().numpy() if isinstance(a, xgrad.Tensor) else np.asarray(a)
    b = b.detach().numpy() if isinstance(b, xgrad.Tensor) else np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_forward_level_cleanup():
    foo = xgrad.rand(2)
    with fwAD.dual_level():
        tangent = xgrad.rand(2, requires_grad=True)
        tangent_ref = weakref.ref(tangent)
        dual = fwAD.make_dual(foo, tangent)
        # The tangent given is re-used as is.
        assert fwAD.unpack_dual(dual)[1] is tangent
        # The dual keeps the tangent alive...
        del tangent
        gc.collect()
        assert tangent_ref() is not None
        # ...and the level does not.
        del dual
        gc.collect()
        assert tangent_ref() is None


def test_size_check():
    foo = xgrad.rand(2)
    tangent = xgrad.rand(3)
    with fwAD.dual_level():
        with pytest.raises(RuntimeError, match="Trying to set a forward gradient that has a different size"):
            fwAD.make_dual(foo, tangent)
        fwAD.make_dual(foo, tangent[1:])


def test_size_check_message():
    with fwAD.dual_level(), pytest.raises(RuntimeError) as info:
        fwAD.make_dual(xgrad.rand(2), xgrad.rand(3))
    assert str(info.value) == (
        "Trying to set a forward gradient that has a different size than that of the original Tensor, this is not "
        "supported. Tensor is of size [2] while the given forward gradient is of size [3]."
    )


def test_dtype_checks():
    with fwAD.dual_level():
        with pytest.raises(ValueError, match="Expected primal to be floating point or complex, but got: torch.int64"):
            fwAD.make_dual(xgrad.tensor(np.array([1, 2], np.int64)), xgrad.ones(2))
        with pytest.raises(ValueError, match="Expected tangent to be floating point or complex, but got: torch.int64"):
            fwAD.make_dual(xgrad.ones(2), xgrad.tensor(np.array([1, 2], np.int64)))
        # A tangent of another float dtype is kept as given, as PyTorch keeps it.
        t64 = xgrad.ones(2, dtype=jnp.float64)
        dual = fwAD.make_dual(xgrad.ones(2, dtype=jnp.float32), t64)
        assert fwAD.unpack_dual(dual).tangent is t64
        out = fwAD.unpack_dual(dual * 2).tangent
        assert out.dtype == jnp.float32
        close(out, [2.0, 2.0])


def test_default_level():
    foo = xgrad.rand(2)
    bar = xgrad.rand(2)
    with fwAD.dual_level():
        baz = fwAD.make_dual(foo, bar)
        baz_primal, baz_tangent = fwAD.unpack_dual(baz)
    close(baz_primal, foo)
    assert baz_tangent is bar
    baz_primal, baz_tangent = fwAD.unpack_dual(baz)
    close(baz_primal, foo)
    assert baz_tangent is None


def test_nested_level():
    with fwAD.dual_level() as level:
        assert level == 0  # only level 0 exists
    with fwAD.dual_level():
        with pytest.raises(RuntimeError, match="Nested forward mode AD is not supported at the moment"):
            fwAD.enter_dual_level()


def test_level_errors():
    with pytest.raises(RuntimeError, match="Trying to create a dual Tensor for forward AD but no level exists"):
        fwAD.make_dual(xgrad.ones(2), xgrad.ones(2))
    with pytest.raises(RuntimeError, match="Dual level must be a positive number."):
        fwAD.exit_dual_level()
    with fwAD.dual_level():
        with pytest.raises(RuntimeError, match="Invalid level given to _make_dual"):
            fwAD.make_dual(xgrad.ones(2), xgrad.ones(2), level=3)
        with pytest.raises(RuntimeError, match="Invalid level given to _fw_primal"):
            fwAD.unpack_dual(xgrad.ones(2), level=1)
        with pytest.raises(RuntimeError, match="Trying to exit a forward AD level that was not the last one"):
            fwAD.exit_dual_level(level=1)
    assert fwAD.enter_dual_level() == 0
    fwAD.exit_dual_level(level=0)


def test_print():
    with fwAD.dual_level():
        a = xgrad.rand(3)
        assert "tangent=" not in str(a)
        b = fwAD.make_dual(a, xgrad.rand(3))
        assert "tangent=" not in str(a)
        assert "tangent=" in str(b)
        b_primal, b_tangent = fwAD.unpack_dual(b)
        assert "tangent=" not in str(b_primal)
        assert "tangent=" not in str(b_tangent)


def test_basic_packing_unpacking():
    foo = xgrad.rand(2)
    bar = xgrad.rand(2)
    with fwAD.dual_level():
        baz = fwAD.make_dual(foo, bar)
        baz_primal, baz_tangent = fwAD.unpack_dual(baz)
        close(baz_primal, foo)
        assert baz_tangent is bar
        # Packing/unpacking did not change the input.
        foo_primal, foo_tangent = fwAD.unpack_dual(foo)
        close(foo_primal, foo)
        assert foo_tangent is None


def test_advanced_packing_unpacking():
    foo = xgrad.rand(2)
    bar = xgrad.ones(2)
    with fwAD.dual_level():
        dual = fwAD.make_dual(foo, bar)
        assert foo._version == dual._version
        dual_primal, dual_tangent = fwAD.unpack_dual(dual)
        assert dual_tangent is bar  # re-used as is
        assert foo._version == dual_primal._version

    # Backward mode through packing and unpacking.
    with fwAD.dual_level():
        foo.requires_grad_()
        bar.requires_grad_()
        dual = fwAD.make_dual(foo, bar)
        p, t = fwAD.unpack_dual(dual)
        gfoo, gbar = xgrad.autograd.grad(p.sum(), (foo, bar), retain_graph=True, allow_unused=True)
        close(gfoo, xgrad.ones_like(foo))
        assert gbar is None
        gfoo, gbar = xgrad.autograd.grad(t.sum(), (foo, bar), retain_graph=True, allow_unused=True)
        assert gfoo is None
        close(gbar, xgrad.ones_like(bar))

        # detach() drops the forward grad.
        detached_dual = dual.detach()
        out = detached_dual * 2
        p, t = fwAD.unpack_dual(out)
        assert not p.requires_grad
        close(p, foo * 2)
        assert t is None

        # no_grad does not stop forward grads.
        with xgrad.no_grad():
            out = dual * 3
        p, t = fwAD.unpack_dual(out)
        assert not p.requires_grad
        assert not t.requires_grad
        close(p, foo * 3)
        close(t, bar * 3)

        # detach_() drops it too.
        dual = dual.clone()
        dual.detach_()
        out = dual * 2
        p, t = fwAD.unpack_dual(out)
        assert not p.requires_grad
        close(p, foo * 2)
        assert t is None


def test_view_inplace_non_differentiable_views():
    original_foo = xgrad.rand(2, dtype=jnp.float64)
    original_bar = xgrad.ones(2, dtype=jnp.float64)
    foo = original_foo.clone()
    bar = original_bar.clone()
    with fwAD.dual_level():
        # An in-place op on a dual updates the primal it was made from, not that one's tangent.
        dual = fwAD.make_dual(foo, bar)
        dual *= 2
        assert fwAD.unpack_dual(foo)[1] is None
        close(bar, original_bar * 2)  # the tangent is updated in place
        close(fwAD.unpack_dual(dual)[1], original_bar * 2)
        close(foo, original_foo * 2)
        close(fwAD.unpack_dual(dual)[0], original_foo * 2)
        # The unpacked primal and tangent are views without a tangent of their own.
        dual_primal, dual_tangent = fwAD.unpack_dual(dual)
        assert fwAD.unpack_dual(dual_primal)[1] is None
        assert fwAD.unpack_dual(dual_tangent)[1] is None
        dual_primal *= 2
        close(fwAD.unpack_dual(dual)[0], original_foo * 4)
        close(fwAD.unpack_dual(dual)[1], original_bar * 2)
        dual_tangent *= 2
        close(fwAD.unpack_dual(dual)[0], original_foo * 4)
        close(fwAD.unpack_dual(dual)[1], original_bar * 4)


def test_view_inplace_differentiable_views():
    original_foo = xgrad.rand(2)
    original_bar = xgrad.ones(2)
    foo = original_foo.clone()
    bar = original_bar.clone()
    with fwAD.dual_level():
        dual = fwAD.make_dual(foo, bar)
        view = dual.narrow(0, 0, 1)  # a differentiable view
        view *= 2
        assert fwAD.unpack_dual(foo)[1] is None
        close(fwAD.unpack_dual(dual)[1], [2.0, 1.0])
        close(fwAD.unpack_dual(view)[1], [2.0])

        # A tensor that was not dual takes the tangent of what is written into it.
        baz = xgrad.rand(2)
        baz += dual
        close(fwAD.unpack_dual(baz)[1], fwAD.unpack_dual(dual)[1])
        baz = xgrad.rand(2)
        baz[0] = dual[0]
        close(fwAD.unpack_dual(baz)[1][0], fwAD.unpack_dual(dual)[1][0])
        close(fwAD.unpack_dual(baz)[1][1], 0.0)  # unused values get a zero tangent

        # A detached alias is not forward-differentiable: its writes bring no tangent.
        baz = xgrad.rand(2)
        view = baz.detach()
        view += dual
        assert fwAD.unpack_dual(baz)[1] is None


def test_grad_cleanup():
    foo = xgrad.rand(2)
    bar = xgrad.rand(2)
    baz = xgrad.rand(2)
    with fwAD.dual_level():
        dual = fwAD.make_dual(foo, bar)
        assert fwAD.unpack_dual(foo)[1] is None
        assert fwAD.unpack_dual(dual)[1] is bar
    assert fwAD.unpack_dual(dual)[1] is None
    with fwAD.dual_level():
        assert fwAD.unpack_dual(foo)[1] is None
        new_dual = fwAD.make_dual(foo, baz)
        dual_primal, dual_tangent = fwAD.unpack_dual(dual)
        new_dual_primal, new_dual_tangent = fwAD.unpack_dual(new_dual)
        close(dual_primal, new_dual_primal)
        assert dual_tangent is None  # a dual of the old level has none in the new one
        close(new_dual_tangent, baz)


def test_detach_view_tracking():
    foo = xgrad.rand(2)
    foo_weak = weakref.ref(foo)
    out = foo.detach()  # noqa: F841 - kept alive on purpose
    del foo
    gc.collect()
    assert foo_weak() is None


def test_inplace_zero_and_copy_give_zero_tangents():
    with fwAD.dual_level():
        c = fwAD.make_dual(xgrad.ones(2), xgrad.ones(2))
        c.zero_()
        close(fwAD.unpack_dual(c).tangent, [0.0, 0.0])
        c = fwAD.make_dual(xgrad.ones(2), xgrad.ones(2))
        c.copy_(xgrad.zeros(2))
        close(fwAD.unpack_dual(c).tangent, [0.0, 0.0])
        c = xgrad.ones(2)
        c.mul_(fwAD.make_dual(xgrad.ones(2) * 2, xgrad.ones(2)))
        close(fwAD.unpack_dual(c).tangent, [1.0, 1.0])


def test_non_differentiable_outputs_have_no_tangent():
    with fwAD.dual_level():
        d = fwAD.make_dual(xgrad.tensor([1.0, 3.0, 2.0]), xgrad.ones(3))
        assert fwAD.unpack_dual(d.argmax()).tangent is None
        assert fwAD.unpack_dual(d > 1).tangent is None
        close(fwAD.unpack_dual(d.sum()).tangent, 3.0)


# -- custom Functions -----------------------------------------------------------------


class MulConst(xgrad.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, k):
        ctx.save_for_forward(x, y)
        ctx.seen_tangent = fwAD.unpack_dual(x).tangent
        return x * y * k, x.clone()

    @staticmethod
    def jvp(ctx, xt, yt, kt):
        ctx.jvp_args = (xt, yt, kt, ctx.saved_tensors)
        x, y = ctx.saved_tensors
        return xt * y * 2.0 + yt * x * 2.0, xt

    @staticmethod
    def backward(ctx, g, g2):
        return g, g, None


def test_custom_function_jvp():
    with fwAD.dual_level():
        x = fwAD.make_dual(xgrad.tensor([1.0, 2.0]), xgrad.tensor([3.0, 3.0]))
        y = xgrad.tensor([5.0, 7.0])
        o, o2 = MulConst.apply(x, y, 2.0)
        close(fwAD.unpack_dual(o).tangent, [30.0, 42.0])
        close(fwAD.unpack_dual(o2).tangent, [3.0, 3.0])
        ctx = o.grad_fn.ctx if o.grad_fn is not None else None
        assert ctx is None  # nothing requires grad: no node
    # What jvp and forward saw, from a run that records a node.
    with fwAD.dual_level():
        x = fwAD.make_dual(xgrad.tensor([1.0, 2.0], requires_grad=True), xgrad.tensor([3.0, 3.0]))
        o, _ = MulConst.apply(x, y, 2.0)
        ctx = o.grad_fn.ctx
        assert ctx.seen_tangent is None  # forward sees plain values
        xt, yt, kt, saved = ctx.jvp_args
        close(xt, [3.0, 3.0])
        close(yt, [0.0, 0.0])  # zeros for a tensor without a tangent
        assert kt is None  # None for a non-tensor
        assert len(saved) == 2


def test_custom_function_jvp_errors():
    class NoJvp(xgrad.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g

    class WrongSize(xgrad.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def jvp(ctx, g):
            return g[:1]

    with fwAD.dual_level():
        x = fwAD.make_dual(xgrad.ones(2), xgrad.ones(2))
        with pytest.raises(NotImplementedError, match="You must implement the jvp function for custom autograd.Function"):
            NoJvp.apply(x)
        with pytest.raises(RuntimeError, match="Trying to set a forward gradient that has a different size"):
            WrongSize.apply(x)
        # Without tangents a Function needs no jvp.
        close(NoJvp.apply(xgrad.ones(2)), [2.0, 2.0])


# -- forward over reverse, reverse over forward -----------------------------------------------


def f_xgrad(x, w):
    return ((x @ w).tanh() * x.sum()).exp().sum()


def f_jax(x, w):
    return jnp.exp(jnp.tanh(x @ w) * x.sum()).sum()


X = np.array([[0.3, -0.5], [0.8, 0.1]])
W = np.array([[0.2, -0.4], [0.6, 0.3]])
V = np.array([[1.0, -1.0], [0.5, 2.0]])


def test_forward_over_reverse_hvp():
    expected = jax.jvp(lambda x: jax.grad(f_jax)(x, jnp.asarray(W)), (jnp.asarray(X),), (jnp.asarray(V),))[1]
    x = xgrad.tensor(X, requires_grad=True)
    w = xgrad.tensor(W)
    before = compiled.stats()["fallbacks"]
    for _ in range(2):  # the compiled backward: a miss, then a hit
        with fwAD.dual_level():
            dual = fwAD.make_dual(x, xgrad.tensor(V))
            (g,) = xgrad.autograd.grad(f_xgrad(dual, w), dual)
            hvp = fwAD.unpack_dual(g).tangent
        close(hvp, expected)
    assert compiled.stats()["fallbacks"] == before


def test_forward_over_reverse_through_saved_outputs():
    """Saved outputs that died keep their tangents (exp saves its output)."""
    x0 = np.array([0.5, -1.0, 2.0])
    v0 = np.array([1.0, 2.0, -1.0])
    expected = jax.jvp(jax.grad(lambda x: jnp.sum(jnp.exp(jnp.sin(x)))), (jnp.asarray(x0),), (jnp.asarray(v0),))[1]
    with fwAD.dual_level():
        dual = fwAD.make_dual(xgrad.tensor(x0, requires_grad=True), xgrad.tensor(v0))
        loss = dual.sin().exp().sum()  # the exp output is only held by its node
        gc.collect()
        (g,) = xgrad.autograd.grad(loss, dual)
        close(fwAD.unpack_dual(g).tangent, expected)


def test_reverse_over_forward_hvp():
    expected_x = jax.grad(lambda x: jnp.vdot(jnp.ones(()), jax.jvp(lambda a: f_jax(a, jnp.asarray(W)), (x,), (jnp.asarray(V),))[1]))(
        jnp.asarray(X))
    expected_v = jax.grad(lambda v: jax.jvp(lambda a: f_jax(a, jnp.asarray(W)), (jnp.asarray(X),), (v,))[1])(jnp.asarray(V))
    x = xgrad.tensor(X, requires_grad=True)
    v = xgrad.tensor(V, requires_grad=True)
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(f_xgrad(fwAD.make_dual(x, v), xgrad.tensor(W))).tangent
    gx, gv = xgrad.autograd.grad(tangent, (x, v))
    close(gx, expected_x)
    close(gv, expected_v)


def test_backward_inside_dual_level_accumulates():
    x = xgrad.tensor(X, requires_grad=True)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, xgrad.tensor(V))
        f_xgrad(dual, xgrad.tensor(W)).backward()
        assert fwAD.unpack_dual(x.grad).tangent is None  # .grad is stored detached, as PyTorch's first one
    close(x.grad, jax.grad(f_jax)(jnp.asarray(X), jnp.asarray(W)))


def test_hvp_inside_xgrad_compile():
    """An HVP by forward over reverse in a compiled step equals eager and jax."""
    w = xgrad.tensor(W)

    def hvp_step(x, v):
        with fwAD.dual_level():
            dual = fwAD.make_dual(x.requires_grad_(), v)
            (g,) = xgrad.autograd.grad(f_xgrad(dual, w), dual)
            return fwAD.unpack_dual(g).tangent

    expected = jax.jvp(lambda x: jax.grad(f_jax)(x, jnp.asarray(W)), (jnp.asarray(X),), (jnp.asarray(V),))[1]
    eager = hvp_step(xgrad.tensor(X), xgrad.tensor(V))
    step = xgrad.compile(hvp_step, fallback="error")
    for _ in range(2):
        out = step(xgrad.tensor(X), xgrad.tensor(V))
        close(out, eager)
        close(out, expected)
    assert step.stats()["compiles"] == 1 and step.stats()["hits"] == 1


def test_views_and_inplace_against_jax():
    """Tangents through views and in-place writes equal jax.jvp of the functional program."""
    x0 = np.array([[0.5, -1.0, 2.0], [1.5, 0.3, -0.7]])
    v0 = np.array([[1.0, 0.0, -1.0], [2.0, 0.5, 1.0]])

    def prog(np_, x):
        y = x * 1.0 if np_ is jnp else x.clone()
        if np_ is jnp:
            y = y.at[0, 1:].set(jnp.sin(y[0, 1:]) * 2)
            y = y.at[:, 0].multiply(3.0)
            return jnp.tanh(y.T)
        row = y[0, 1:]
        row.copy_(row.sin() * 2)
        y[:, 0].mul_(3.0)
        return y.T.tanh()

    expected = jax.jvp(lambda x: prog(jnp, x), (jnp.asarray(x0),), (jnp.asarray(v0),))[1]
    with fwAD.dual_level():
        out = prog(xgrad, fwAD.make_dual(xgrad.tensor(x0), xgrad.tensor(v0)))
        close(fwAD.unpack_dual(out).tangent, expected)


@pytest.mark.parametrize("trace", [False, True])
def test_from_jax_ops_carry_tangents(trace):
    """A ``from_jax`` op, run whole or equation by equation (``trace=True``), has forward mode too."""
    def f(x):
        return jnp.sin(x) * jnp.exp(x)

    op = xgrad.from_jax(f, trace=trace)
    x0, v0 = np.array([0.5, 1.0]), np.array([1.0, -2.0])
    expected = jax.jvp(f, (x0,), (v0,))[1]
    with fwAD.dual_level():
        for x in (xgrad.tensor(x0), xgrad.tensor(x0, requires_grad=True)):
            close(fwAD.unpack_dual(op(fwAD.make_dual(x, xgrad.tensor(v0)))).tangent, expected)


def test_gradcheck_checks_forward_mode():
    x = xgrad.tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)
    assert gradcheck(lambda x: (x.sin() * x, x.exp()), (x,), check_forward_ad=True)
    assert gradcheck(lambda x: (x.sin() * x, x.exp()), (x,), check_forward_ad=True, fast_mode=True)

    class WrongJvp(xgrad.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

        @staticmethod
        def jvp(ctx, t):
            return t * 3

    with pytest.raises(GradcheckError, match="Jacobian computed with forward mode mismatch for output 0 with respect to input 0"):
        gradcheck(WrongJvp.apply, (x,), check_forward_ad=True)
    assert gradcheck(WrongJvp.apply, (x,))  # its backward is right

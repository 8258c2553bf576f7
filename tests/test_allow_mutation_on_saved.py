"""``allow_mutation_on_saved_tensors``, ported from PyTorch's ``TestAllowMutationOnSaved``
(test/test_autograd.py), with its values and message phrases; each runs with the eager and the
compiled backward.

PyTorch clones a saved tensor on its first mutation and counts the clones (``ctx.cloned``);
a ``jax.Array`` is immutable, so xgrad keeps the saved array instead and has no clones to
count: the tests that only count them, and those of ``_foreach`` ops, ``out=`` and ``conj``
views, which xgrad does not have, are left out.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from tests._backward_modes import eager_and_compiled  # noqa: F401
from tests._helpers import close
from xgrad.autograd.graph import allow_mutation_on_saved_tensors

pytestmark = pytest.mark.usefixtures("eager_and_compiled")

MODIFIED = "variables needed for gradient computation has been modified by an inplace"


def rand(*shape, requires_grad=False):
    return xgrad.tensor(np.random.default_rng(0).random(shape), dtype=jnp.float64, requires_grad=requires_grad)


def test_basic():
    a = rand(2, 3, requires_grad=True)

    def fn(a):
        b = a.clone()
        out = (b**2).sum()
        b.sin_()
        out.sum().backward()
        return a.grad

    with pytest.raises(RuntimeError, match=MODIFIED):
        fn(a)
    with allow_mutation_on_saved_tensors():
        da = fn(a)
    close(a * 2, da)


def test_views():
    a = rand(2, 3, requires_grad=True)

    def fn(a):
        b = a.clone()
        c = b.view_as(b)
        out = (b**2).sum()
        c.sin_()
        out.sum().backward()
        return a.grad

    with pytest.raises(RuntimeError, match=MODIFIED):
        fn(a)
    with allow_mutation_on_saved_tensors():
        da = fn(a)
    close(a * 2, da)


def test_save_base_and_modify_view():
    with allow_mutation_on_saved_tensors():
        a = rand(2, 3, requires_grad=True)
        b = a.clone()
        c = b[:1]
        out = b**2
        c *= 10  # modify the view
        out.sum().backward()
    close(a * 2, a.grad)


def test_save_view_modify_base():
    with allow_mutation_on_saved_tensors():
        a = rand(2, 3, requires_grad=True)
        b = a.clone()
        c = b[:]
        out = (c**2).sum()
        b *= 2
        out.backward()
        close(a * 2, a.grad)


def test_double_backward():
    with allow_mutation_on_saved_tensors():
        a = rand(2, 3, requires_grad=True)
        b = a.clone()
        out = (b**2).sum()
        b.sin_()
        xgrad.autograd.grad(out, a, create_graph=True)
        (da,) = xgrad.autograd.grad(out, a, create_graph=True)
        (d2a,) = xgrad.autograd.grad(da.sum(), a)
    close(xgrad.ones_like(a) * 2, d2a)


def test_saved_but_not_anymore():
    # a tensor once saved, no longer saved by the time it is changed, then saved again
    with allow_mutation_on_saved_tensors():
        x = xgrad.tensor([[0.5, -1.0, 2.0]], dtype=jnp.float64, requires_grad=True)
        a = x.clone()
        out = (a**2).sum()
        out.backward()
        a.sin_()
        out = (a**2).sum()
        before = a.detach().clone()
        a.sin_()
        (g,) = xgrad.autograd.grad(out, x)  # the value as saved, not the changed one
    close(g, before * 2 * xgrad.cos(x.detach()))


def test_saved_same_tensor_different_versions():
    with allow_mutation_on_saved_tensors():
        x = xgrad.tensor([0.5, -1.0], dtype=jnp.float64, requires_grad=True)
        a = x.clone()
        b = a**2
        v0 = a.detach().clone()
        a.sin_()
        c = a**2
        v1 = a.detach().clone()
        a.sin_()
        (gb,) = xgrad.autograd.grad(b.sum(), x)
        (gc,) = xgrad.autograd.grad(c.sum(), x)
    close(gb, v0 * 2)
    close(gc, 2 * v1 * xgrad.cos(v0))


def test_backward_out_of_context():
    msg = "Trying to backward outside of the 'allow_mutation_on_saved_tensors' context"
    with allow_mutation_on_saved_tensors():
        a = rand(2, 3, requires_grad=True)
        out = (a**2).sum()
    with pytest.raises(AssertionError, match=msg):
        out.backward()
    # a different context
    with allow_mutation_on_saved_tensors():
        a = rand(2, 3, requires_grad=True)
        out = (a**2).sum()
    with allow_mutation_on_saved_tensors():
        with pytest.raises(AssertionError, match=msg):
            out.backward()


def test_disallow_nesting():
    with allow_mutation_on_saved_tensors():
        with pytest.raises(RuntimeError, match="allow_mutation_on_saved_tensors contexts cannot be nested"):
            with allow_mutation_on_saved_tensors():
                pass

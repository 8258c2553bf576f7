"""Saved-tensor hooks: ops and Functions pack through them, backward unpacks, innermost context wins."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from tests._backward_modes import eager_and_compiled  # noqa: F401  (a fixture)
from xgrad.autograd import Function
from xgrad.autograd.graph import save_on_cpu, saved_tensors_hooks

pytestmark = pytest.mark.usefixtures("eager_and_compiled")  # every test, eager and compiled

X0 = np.array([0.3, -0.8, 1.2])


def leaf(values=X0):
    return xgrad.tensor(np.asarray(values, dtype=np.float64), requires_grad=True)


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)


class Recorder:
    def __init__(self, tag, log):
        self.tag, self.log = tag, log

    def pack(self, t):
        self.log.append((f"pack:{self.tag}", t.shape))
        return ("packed", np.asarray(t.array))

    def unpack(self, packed):
        self.log.append((f"unpack:{self.tag}", packed[1].shape))
        return xgrad.tensor(packed[1])


def test_pack_at_save_unpack_at_backward_and_grads_unchanged():
    x, w = leaf(), leaf([1.0, 2.0, 3.0])
    log = []
    rec = Recorder("a", log)
    with saved_tensors_hooks(rec.pack, rec.unpack):
        y = (x * w).tanh()  # mul saves x and w, tanh saves its output
    assert [e[0] for e in log] == ["pack:a"] * 3
    y.sum().backward()
    assert [e[0] for e in log[3:]] == ["unpack:a"] * 3

    gx, gw = jax.grad(lambda x, w: jnp.sum(jnp.tanh(x * w)), argnums=(0, 1))(X0, np.array([1.0, 2.0, 3.0]))
    close(x.grad.array, gx)
    close(w.grad.array, gw)


def test_unpack_runs_only_when_backward_needs_the_value():
    x = leaf()
    log = []
    rec = Recorder("a", log)
    with saved_tensors_hooks(rec.pack, rec.unpack):
        y = x.exp()
    assert [e[0] for e in log] == ["pack:a"]
    (g,) = xgrad.autograd.grad(y.sum(), x)
    assert [e[0] for e in log] == ["pack:a", "unpack:a"]
    close(g.array, np.exp(X0))


def test_nested_contexts_use_the_innermost():
    x = leaf()
    log = []
    outer, inner = Recorder("outer", log), Recorder("inner", log)
    with saved_tensors_hooks(outer.pack, outer.unpack):
        a = x.sin()
        with saved_tensors_hooks(inner.pack, inner.unpack):
            b = a.cos()
        c = b.exp()
    assert [e[0] for e in log] == ["pack:outer", "pack:inner", "pack:outer"]
    c.sum().backward()
    assert sorted(e[0] for e in log[3:]) == ["unpack:inner", "unpack:outer", "unpack:outer"]
    close(x.grad.array, jax.grad(lambda v: jnp.sum(jnp.exp(jnp.cos(jnp.sin(v)))))(X0))


def test_hooks_apply_to_function_saved_tensors():
    class Cube(Function):
        @staticmethod
        def forward(ctx, x):
            out = x * x * x
            ctx.save_for_backward(x, out)
            return out

        @staticmethod
        def backward(ctx, g):
            x, out = ctx.saved_tensors
            return 3.0 * out / x * g

    x = leaf()
    log = []
    rec = Recorder("f", log)
    with saved_tensors_hooks(rec.pack, rec.unpack):
        y = Cube.apply(x)
    assert [e[0] for e in log] == ["pack:f", "pack:f"]
    y.sum().backward()
    assert [e[0] for e in log[2:]] == ["unpack:f", "unpack:f"]
    close(x.grad.array, 3 * X0**2)


def test_unpacked_value_is_what_backward_uses():
    """The hooks own the value: an unpack returning other data changes the gradient accordingly."""
    x = leaf()
    with saved_tensors_hooks(lambda t: t, lambda t: xgrad.tensor(np.asarray(t.array) * 2.0)):
        y = x * x
    y.sum().backward()
    close(x.grad.array, 4 * X0)


def test_double_backward_through_unpacked_tensors():
    x = leaf()
    with saved_tensors_hooks(lambda t: np.asarray(t.array), lambda a: xgrad.tensor(a)):
        y = (x * x * x).sum()
    (g,) = xgrad.autograd.grad(y, x, create_graph=True)
    (gg,) = xgrad.autograd.grad(g.sum(), x)
    close(g.array, 3 * X0**2)
    close(gg.array, 6 * X0)


def test_unpack_returning_non_tensor_raises():
    x = leaf()
    with saved_tensors_hooks(lambda t: t, lambda t: "not a tensor"):
        y = x.exp()
    with pytest.raises(TypeError, match="unpack_hook expected to be a Tensor but got result of type str"):
        y.sum().backward()


def test_version_check_still_applies_with_hooks():
    x = leaf()
    h = x * 1.0
    with saved_tensors_hooks(lambda t: t, lambda t: t):
        y = h.exp() * h
    with xgrad.no_grad():
        h.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_save_on_cpu_moves_to_host_and_back():
    devices = jax.devices()
    target = devices[-1]
    x = xgrad.tensor(X0, device=target, requires_grad=True)
    with save_on_cpu():
        y = (x.exp() * x).sum()
    saved = [s for s in y.grad_fn.next_functions[0][0].saved if hasattr(s, "_packed")]
    assert saved and all(s._packed[1].devices() == {jax.devices("cpu")[0]} for s in saved)
    y.backward()
    assert x.grad.device == target
    close(x.grad.array, np.exp(X0) * (1 + X0))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("accesses", [0, 1, 3])
def test_each_saved_tensors_access_unpacks_again(accesses, compiled):
    """PyTorch unpacks ``ctx.saved_tensors`` at each access: the unpack hook runs once
    per access and per saved tensor, and not at all when backward never reads them."""

    class Scale(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 3.0

        @staticmethod
        def backward(ctx, g):
            for _ in range(accesses):
                (x,) = ctx.saved_tensors
                close(x.array, X0)
            return g * 3.0

    x = leaf()
    log = []
    rec = Recorder("f", log)
    for _ in range(2):  # compiled: a miss, then a hit
        log.clear()
        with saved_tensors_hooks(rec.pack, rec.unpack):
            y = Scale.apply(x)
        y.sum().backward(compiled=compiled)
        assert [e[0] for e in log] == ["pack:f"] + ["unpack:f"] * accesses
    close(x.grad.array, np.full(3, 6.0))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_saved_tensors_access_checks_the_version_each_time(compiled):
    seen = []

    class Peek(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            seen.append(ctx.saved_tensors[0].tolist())
            with xgrad.no_grad():
                h.add_(1.0)  # the saved tensor changes between two accesses
            ctx.saved_tensors  # noqa: B018
            return g

    h = leaf() * 1.0
    y = Peek.apply(h)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation.*saved by PeekBackward"):
        y.sum().backward(compiled=compiled)
    assert len(seen) == 1


@pytest.mark.parametrize("saver", ["op", "function"])
def test_pack_hook_modifying_its_input_in_place_raises(saver):
    """PyTorch's test_pack_hook_with_inplace_modification_should_fail."""

    class Keep(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return g

    def inc(t):
        with xgrad.no_grad():
            t.add_(1.0)
        return t

    a = leaf()
    x = a * 1.0
    with saved_tensors_hooks(inc, lambda t: t):
        with pytest.raises(RuntimeError, match=r"^A saved tensors pack hook is modifying its input in place\. Tensors provided"):
            x.exp() if saver == "op" else Keep.apply(x)
    y = x.exp()  # outside the hooks all is well
    y.sum().backward()
    # exp saves its output, Keep its input x: only then did the hook change x before raising.
    close(a.grad.array, np.exp(X0 + 1.0) if saver == "function" else np.exp(X0))

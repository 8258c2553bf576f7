"""``xgrad.utils.checkpoint``: both variants recompute, match ``jax.grad``, and replay randomness."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from tests._backward_modes import eager_and_compiled  # noqa: F401  (a fixture)
from tests._helpers import close, leaf
from xgrad.autograd import compiled
from xgrad.utils import CheckpointError, checkpoint, set_checkpoint_debug_enabled, set_checkpoint_early_stop

pytestmark = pytest.mark.usefixtures("eager_and_compiled")  # every test, eager and compiled

X0 = np.array([[0.5, -1.0, 0.25], [1.5, 0.75, -0.5]])
W0 = np.array([[0.2, -0.4], [0.6, 0.1], [-0.3, 0.8]])


def block(np_, x, w):
    h = np_.tanh(x @ w)
    return np_.sin(h) * h


def loss_ref(x, w):
    return jnp.sum(block(jnp, x, w) ** 2)


def counted_block(calls):
    def fn(x, w):
        calls.append(xgrad.is_grad_enabled())
        return block(xgrad, x, w)

    return fn


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_matches_jax_and_recomputes_once(use_reentrant):
    x, w = leaf(X0), leaf(W0)
    calls = []
    out = checkpoint(counted_block(calls), x, w, use_reentrant=use_reentrant)
    close(out.array, block(jnp, X0, W0))
    (out * out).sum().backward()
    assert len(calls) == 2 and calls[1] is True  # forward, then one recomputation with grad on
    gx, gw = jax.grad(loss_ref, argnums=(0, 1))(X0, W0)
    close(x.grad.array, gx)
    close(w.grad.array, gw)


def test_reentrant_forward_keeps_no_intermediates():
    x, w = leaf(X0), leaf(W0)
    calls = []
    out = checkpoint(counted_block(calls), x, w, use_reentrant=True)
    assert calls == [False]  # the block ran without recording a graph
    assert out.grad_fn.name() == "CheckpointFunctionBackward"
    assert [n.name() for n, _ in out.grad_fn.next_functions[2:]] == ["AccumulateGrad", "AccumulateGrad"]


def test_non_reentrant_saves_placeholders_only():
    from xgrad.engine.saved import SavedTensor

    x, w = leaf(X0), leaf(W0)
    out = checkpoint(lambda a, b: block(xgrad, a, b), x, w, use_reentrant=False)
    saved = [s for s in out.grad_fn.saved if isinstance(s, SavedTensor)]
    assert saved and all(s._array is None and type(s._packed).__name__ == "_Holder" for s in saved)


def test_non_reentrant_works_with_grad_and_double_backward():
    x, w = leaf(X0), leaf(W0)
    out = checkpoint(lambda a, b: block(xgrad, a, b), x, w, use_reentrant=False)
    (gx,) = xgrad.autograd.grad((out * out).sum(), x, create_graph=True)
    close(gx.array, jax.grad(loss_ref)(X0, W0))
    (ggw,) = xgrad.autograd.grad(gx.sum(), w)
    ref = jax.grad(lambda x, w: jnp.sum(jax.grad(loss_ref)(x, w)), argnums=1)(X0, W0)
    close(ggw.array, ref)


def test_non_reentrant_retain_graph_recomputes_again():
    x, w = leaf(X0), leaf(W0)
    calls = []
    loss = checkpoint(counted_block(calls), x, w, use_reentrant=False).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    assert len(calls) == 3
    close(x.grad.array, 2 * jax.grad(lambda x, w: jnp.sum(block(jnp, x, w)))(X0, W0))


def test_non_reentrant_passes_kwargs():
    x, w = leaf(X0), leaf(W0)
    out = checkpoint(lambda a, b, scale: block(xgrad, a, b) * scale, x, w, scale=3.0, use_reentrant=False)
    out.sum().backward()
    close(w.grad.array, jax.grad(lambda w: 3.0 * jnp.sum(block(jnp, X0, w)))(W0))


def test_reentrant_rejects_kwargs_and_grad():
    x, w = leaf(X0), leaf(W0)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: scale"):
        checkpoint(lambda a, b, scale: a, x, w, scale=1.0, use_reentrant=True)
    out = checkpoint(lambda a, b: block(xgrad, a, b), x, w, use_reentrant=True)
    with pytest.raises(RuntimeError, match=r"xgrad.utils.checkpoint is incompatible with .grad\(\)"):
        xgrad.autograd.grad(out.sum(), x)


def test_reentrant_warns_when_no_input_requires_grad():
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        out = checkpoint(lambda a: a * 2.0, xgrad.tensor(X0), use_reentrant=True)
    assert not out.requires_grad


def test_reentrant_closure_parameters_get_grads():
    x, w = leaf(X0), leaf(W0)
    out = checkpoint(lambda a: block(xgrad, a, w), x, use_reentrant=True)
    (out * out).sum().backward()
    gx, gw = jax.grad(loss_ref, argnums=(0, 1))(X0, W0)
    close(x.grad.array, gx)
    close(w.grad.array, gw)


def test_tuple_outputs_and_non_tensor_args():
    for use_reentrant in (True, False):
        x = leaf(X0)

        def fn(a, power):
            return a**power, a.sum()

        p, s = checkpoint(fn, x, 3, use_reentrant=use_reentrant)
        (p.sum() + 2.0 * s).backward()
        close(x.grad.array, 3 * X0**2 + 2.0)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_dropout_with_default_key_sees_the_same_mask(use_reentrant):
    x = leaf(X0)

    def fn(a):
        return xgrad.dropout(a.exp(), p=0.5)

    xgrad.manual_seed(7)
    out = checkpoint(fn, x, use_reentrant=use_reentrant)
    after_forward = xgrad.randn(2).tolist()
    mask = np.asarray(out.array) != 0
    out.sum().backward()
    close(x.grad.array, np.where(mask, 2.0 * np.exp(X0), 0.0))
    # The caller's random stream is untouched by the recomputation.
    xgrad.manual_seed(7)
    fn(xgrad.tensor(X0))
    assert xgrad.randn(2).tolist() == after_forward


def test_without_preserved_rng_state_the_mask_changes():
    x = xgrad.tensor(np.ones((64,)), requires_grad=True)
    xgrad.manual_seed(3)
    out = checkpoint(lambda a: xgrad.dropout(a * 1.0, p=0.5), x, use_reentrant=False, preserve_rng_state=False)
    mask = np.asarray(out.array) != 0
    out.sum().backward()
    assert not np.array_equal(np.asarray(x.grad.array) != 0, mask)


def test_recomputed_metadata_mismatch_raises():
    state = {"n": 3}
    x = leaf(np.arange(4.0))

    def fn(a):
        return (a[: state["n"]].exp()).sum()

    out = checkpoint(fn, x, use_reentrant=False)
    state["n"] = 2
    with pytest.raises(CheckpointError, match="Recomputed values for the following tensors have different metadata") as info:
        out.backward()
    assert "saved metadata: {'shape': (3,)" in str(info.value)


def test_recomputation_saving_a_different_number_of_tensors_raises():
    state = {"extra": False}
    x = leaf(X0)

    def fn(a):
        y = a.exp()
        return (y.sin() if state["extra"] else y).sum()

    with set_checkpoint_early_stop(False):
        out = checkpoint(fn, x, use_reentrant=False)
    state["extra"] = True
    with pytest.raises(CheckpointError, match="trying to save more tensors during recomputation"):
        out.backward(retain_graph=True)
    state["extra"] = False
    out.backward()  # the next backward works
    close(x.grad.array, np.exp(X0))
    # Early stop (the default) never reaches what is saved after the forward's last value.
    x.grad = None
    state["extra"] = False
    out = checkpoint(fn, x, use_reentrant=False)
    state["extra"] = True
    out.backward()
    close(x.grad.array, np.exp(X0))


def test_nested_in_reentrant_function_depth():
    """Checkpoints inside checkpoints: each level recomputes inside the outer one's backward."""
    x = leaf(X0)

    def nest(a, depth):
        if depth == 0:
            return a.sin()
        return checkpoint(nest, a, depth - 1, use_reentrant=True) * 1.0

    nest(x, 6).sum().backward()
    close(x.grad.array, np.cos(X0))


FLAGS = pytest.mark.parametrize("flag", [False, True], ids=["eager", "compiled"])


@FLAGS
def test_nested_non_reentrant_checkpoints_match_jax(flag):
    x = leaf([0.5, 1.0])

    def inner(t):
        return t.sin() * t

    def outer(t):
        return checkpoint(inner, t.exp(), use_reentrant=False).cos()

    checkpoint(outer, x, use_reentrant=False).sum().backward(compiled=flag)
    expected = jax.grad(lambda a: jnp.cos(jnp.sin(jnp.exp(a)) * jnp.exp(a)).sum())(x.array)
    close(x.grad.array, expected)
    compiled.reset()


@FLAGS
def test_a_checkpointed_function_may_call_autograd_grad(flag):
    """PyTorch's non-reentrant checkpoint recomputes per graph task, so an inner grad works both times."""
    x = leaf([0.5, 1.0, -0.3])
    calls = []

    def with_grad(t):
        calls.append(1)
        u = t.sin() * t
        (g,) = xgrad.autograd.grad(u.sum(), t, create_graph=True)
        return g * t

    checkpoint(with_grad, x, use_reentrant=False).sum().backward(compiled=flag)
    expected = jax.grad(lambda a: (jax.grad(lambda b: (jnp.sin(b) * b).sum())(a) * a).sum())(x.array)
    close(x.grad.array, expected)
    assert len(calls) >= 2  # the forward, then the backward's recomputation
    compiled.reset()


def test_early_stop_skips_what_follows_the_last_saved_value():
    x = leaf([1.0, 2.0])
    ran = []

    def fn(t):
        y = t.exp()
        ran.append("after the last save")
        return y * 1.0  # a constant factor saves nothing

    checkpoint(fn, x, use_reentrant=False).sum().backward()
    assert len(ran) == 1
    close(x.grad.array, np.exp([1.0, 2.0]))
    with set_checkpoint_early_stop(False):
        out = checkpoint(fn, x, use_reentrant=False)
    out.sum().backward()
    assert len(ran) == 3


def _changing_dtype_block(state):
    def fn(a):
        return a.to(state["dtype"]).exp().sum()

    return fn


def test_determinism_check_none_skips_the_metadata_check():
    state = {"dtype": jnp.float64}
    x = leaf([0.5, 1.0])
    out = checkpoint(_changing_dtype_block(state), x, use_reentrant=False)
    state["dtype"] = jnp.float32
    with pytest.raises(CheckpointError, match="Recomputed values for the following tensors have different metadata"):
        out.backward(retain_graph=True)
    out = checkpoint(_changing_dtype_block(state), x, use_reentrant=False, determinism_check="none")
    state["dtype"] = jnp.float64
    out.backward()
    np.testing.assert_allclose(np.asarray(x.grad.array), np.exp([0.5, 1.0]), rtol=1e-6)
    with pytest.raises(ValueError, match="determinism_check should be one of"):
        checkpoint(lambda a: a, x, use_reentrant=False, determinism_check="sometimes")


def test_debug_lists_what_forward_and_recomputation_saved():
    state = {"n": 3}
    x = leaf(np.arange(4.0))

    def fn(a):
        return (a[: state["n"]].exp().sin()).sum()

    out = checkpoint(fn, x, use_reentrant=False)
    state["n"] = 2
    with pytest.raises(CheckpointError, match="pass debug=True") as plain:
        out.backward(retain_graph=True)
    assert "Saved by the original forward" not in str(plain.value)
    state["n"] = 3
    out = checkpoint(fn, x, use_reentrant=False, debug=True)
    state["n"] = 2
    with pytest.raises(CheckpointError, match="different metadata") as info:
        out.backward()
    message = str(info.value)
    assert "Saved by the original forward:\n  0: exp saved float64[3]" in message
    assert "Saved by the recomputation:\n  0: exp saved float64[2]" in message
    assert "sin saved float64[3]" in message and "test_checkpoint.py" in message and "in fn" in message
    with set_checkpoint_debug_enabled(True):
        state["n"] = 3
        out = checkpoint(fn, x, use_reentrant=False)
    state["n"] = 2
    with pytest.raises(CheckpointError, match="Saved by the recomputation"):
        out.backward()


def test_reentrant_checkpoint_stays_valid_after_an_error():
    """PyTorch's test_checkpoint_valid_reset_on_error: a failed grad() does not poison the next backward."""
    a = leaf([[0.5, 1.0], [1.5, -0.5]])
    b = checkpoint(lambda t: t.exp(), a, use_reentrant=True).sum()
    with pytest.raises(RuntimeError, match=r"xgrad.utils.checkpoint is incompatible with .grad\(\)"):
        xgrad.autograd.grad(b, (a,))
    c = checkpoint(lambda t: t.exp(), a, use_reentrant=True).sum()
    c.backward()
    close(a.grad.array, np.exp(a.array))
    # An error raised by the recomputation itself does not poison the next one either.
    state = {"fail": False}

    def flaky(t):
        if state["fail"]:
            raise ValueError("recomputation failed")
        return t.sin()

    d = checkpoint(flaky, a, use_reentrant=True).sum()
    state["fail"] = True
    with pytest.raises(ValueError, match="recomputation failed"):
        d.backward()
    state["fail"] = False
    a.grad = None
    checkpoint(flaky, a, use_reentrant=True).sum().backward()
    close(a.grad.array, np.cos(a.array))

"""Every engine error with PyTorch's leading phrase, and a working engine after each one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad import autograd
from xgrad.ops import defprim

CPU1 = jax.devices("cpu")[1]


def with_rule(name, grad_of):
    """A test primitive ``2 * x`` whose backward returns ``grad_of(x)``: a deliberately wrong rule."""
    return defprim(name, lambda x: x * 2.0, [lambda g, out, x: grad_of(x)], register=False)


@pytest.fixture
def x():
    return xgrad.tensor([1.0, 2.0, 3.0], dtype=jnp.float64, requires_grad=True)


def assert_engine_works():
    """The next backward after an error runs normally."""
    w = xgrad.tensor([1.0, -2.0], requires_grad=True)
    (w * w).sum().backward()
    assert w.grad.tolist() == [2.0, -4.0]


# -- arguments of backward and grad -----------------------------------------------------------------


def test_backward_twice():
    w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    y = (w.exp()).sum()
    y.backward()
    for again in (y.backward, lambda: autograd.grad(y, w)):
        with pytest.raises(RuntimeError, match=r"^Trying to backward through the graph a second time .*retain_graph=True"):
            again()
    assert_engine_works()


def test_implicit_grad_of_a_non_scalar(x):
    with pytest.raises(RuntimeError, match="^grad can be implicitly created only for scalar outputs$"):
        (x * 2).backward()
    with pytest.raises(RuntimeError, match="^grad can be implicitly created only for scalar outputs$"):
        autograd.grad(x * 2, x)
    assert_engine_works()


def test_implicit_grad_of_a_complex_scalar():
    z = xgrad.tensor(1.0 + 2.0j, requires_grad=True)  # Python complex: complex64, as PyTorch's default
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for real scalar outputs but got complex64"):
        (z * z).backward()


@pytest.mark.parametrize("make", [lambda x: xgrad.tensor(1.0), lambda x: xgrad.tensor([1, 2]).sum(), lambda x: x.detach().sum()])
def test_tensors_that_do_not_require_grad(x, make):
    with pytest.raises(RuntimeError, match="^element 0 of tensors does not require grad and does not have a grad_fn$"):
        make(x).backward()
    with pytest.raises(RuntimeError, match="^element 1 of tensors does not require grad and does not have a grad_fn$"):
        autograd.backward([x.sum(), make(x)])
    with pytest.raises(RuntimeError, match="^element 0 of tensors does not require grad"):
        autograd.grad(make(x), x)
    assert x.grad is None
    assert_engine_works()


def test_inputs_that_do_not_require_grad(x):
    with pytest.raises(RuntimeError, match="One of the differentiated Tensors does not require grad"):
        autograd.grad(x.sum(), [x, xgrad.tensor([1.0])])
    with pytest.raises(RuntimeError, match="One of the differentiated Tensors does not require grad"):
        x.sum().backward(inputs=[xgrad.tensor([1.0])])
    with pytest.raises(RuntimeError, match=r"'inputs' argument to backward\(\) cannot be empty."):
        x.sum().backward(inputs=[])
    with pytest.raises(ValueError, match="grad requires non-empty inputs."):
        autograd.grad(x.sum(), [])


def test_unused_input_without_allow_unused(x):
    other = xgrad.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="^One of the differentiated Tensors appears to not have been used in the graph. "
                       "Set allow_unused=True if this is the desired behavior.$"):
        autograd.grad((x * x).sum(), [x, other])
    with pytest.raises(ValueError, match="Expected allow_unused to be True or not passed when materialize_grads=True"):
        autograd.grad((x * x).sum(), [x, other], allow_unused=False, materialize_grads=True)
    assert_engine_works()


def test_grad_tensors_shape_mismatch(x):
    with pytest.raises(RuntimeError, match=r"^Mismatch in shape: grad_output\[0\] has a shape of \[2\] and output\[0\] has a shape of \[3\]\.$"):
        (x * 2).backward(xgrad.tensor([1.0, 1.0]))
    with pytest.raises(RuntimeError, match=r"Mismatch in shape: grad_output\[1\] has a shape of \[\] and output\[1\] has a shape of \[3\]"):
        autograd.grad([x.sum(), x * 2], x, grad_outputs=[None, 1.0])
    assert_engine_works()


def test_number_of_grad_tensors(x):
    with pytest.raises(RuntimeError, match="got 1 tensors and 2 gradients"):
        autograd.backward([x.sum()], grad_tensors=[None, None])


def test_non_tensor_arguments(x):
    with pytest.raises(TypeError, match="tensors must be"):
        autograd.backward([x.sum(), 3.0])
    with pytest.raises(TypeError, match="inputs must be a Tensor or a sequence of Tensors"):
        autograd.grad(x.sum(), "x")


def test_queue_callback_outside_backward():
    with pytest.raises(RuntimeError, match=r"^Final callbacks can only be installed during backward pass\.$"):
        autograd.queue_callback(lambda: None)


# -- gradients a node returns ---------------------------------------------------------------------


def test_gradient_of_the_wrong_shape(x):
    bad = with_rule("errors_test_shape", lambda v: xgrad.ones(2, 4, dtype=jnp.float64))
    y = bad(x).sum()
    with pytest.raises(RuntimeError, match=r"^Function ErrorsTestShapeBackward returned an invalid gradient at index 0 - "
                       r"got \[2, 4\] but expected shape compatible with \[3\]$"):
        y.backward()
    assert x.grad is None
    assert_engine_works()


def test_gradient_that_only_broadcasts_is_summed_down(x):
    wide = with_rule("errors_test_broadcast", lambda v: xgrad.tensor(np.arange(6.0).reshape(2, 3)))
    wide(x).sum().backward()
    assert x.grad.tolist() == [3.0, 5.0, 7.0]
    keep = xgrad.tensor([[1.0], [2.0]], requires_grad=True)
    with_rule("errors_test_broadcast_keepdim", lambda v: xgrad.ones(2, 3, dtype=jnp.float64))(keep).sum().backward()
    assert keep.grad.tolist() == [[3.0], [3.0]]


def test_gradient_of_the_wrong_dtype(x):
    ints = with_rule("errors_test_int_dtype", lambda v: xgrad.ones(3, dtype=jnp.int32))
    with pytest.raises(RuntimeError, match="^Function ErrorsTestIntDtypeBackward returned an invalid gradient at index 0 - "
                       "expected dtype float64 but got int32$"):
        ints(x).sum().backward()
    # Another float dtype is cast to the input's, as PyTorch does.
    f32 = with_rule("errors_test_f32", lambda v: xgrad.ones(3, dtype=jnp.float32) * 0.5)
    f32(x).sum().backward()
    assert x.grad.dtype == jnp.float64 and x.grad.tolist() == [0.5, 0.5, 0.5]


def test_gradient_on_the_wrong_device(x):
    elsewhere = with_rule("errors_test_device", lambda v: xgrad.ones(3, dtype=jnp.float64, device=CPU1))
    with pytest.raises(RuntimeError, match="^Function ErrorsTestDeviceBackward returned an invalid gradient at index 0 - "
                       "expected device cpu:0 but got cpu:1$"):
        elsewhere(x).sum().backward()
    assert_engine_works()
    # A 0-dim gradient is moved, as PyTorch moves CPU scalars.
    s = xgrad.tensor(2.0, requires_grad=True)
    with_rule("errors_test_scalar_device", lambda v: xgrad.tensor(4.0, device=CPU1))(s).backward()
    assert s.grad.item() == 4.0 and s.grad.device == s.device


def test_post_hook_substituting_a_bad_gradient(x):
    y = x * 2
    y.grad_fn.register_hook(lambda grad_inputs, grad_outputs: (xgrad.ones(2, 4, dtype=jnp.float64), None))
    with pytest.raises(RuntimeError, match=r"^Function MulBackward returned an invalid gradient at index 0 - "
                       r"got \[2, 4\] but expected shape compatible with \[3\]"):
        y.sum().backward()
    z = x * 2
    z.grad_fn.register_hook(lambda grad_inputs, grad_outputs: (xgrad.ones(2, 3, dtype=jnp.float64), None))
    z.sum().backward()  # broadcast only: summed down
    assert x.grad.tolist() == [2.0, 2.0, 2.0]


def test_hook_returning_the_wrong_number_of_gradients(x):
    y = x * 2
    y.grad_fn.register_hook(lambda grad_inputs, grad_outputs: (grad_inputs[0],))
    with pytest.raises(RuntimeError, match="post hook of MulBackward must return None or a tuple of 2 gradients, got 1"):
        y.sum().backward()
    z = x * 2
    z.grad_fn.register_prehook(lambda grad_outputs: ())
    with pytest.raises(RuntimeError, match="pre hook of MulBackward must return None or a tuple of 1 gradients, got 0"):
        z.sum().backward()
    assert_engine_works()


# -- consistency after errors --------------------------------------------------------------------


def test_error_from_a_user_hook_keeps_its_type_and_the_engine_recovers(x):
    handle = x.register_hook(lambda g: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        (x * x).sum().backward()
    handle.remove()
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0, 6.0]


def test_error_on_a_device_worker_thread_reaches_the_caller():
    w = xgrad.tensor([1.0, 2.0, 3.0], device=CPU1, requires_grad=True)
    bad = with_rule("errors_test_worker", lambda v: xgrad.ones(5, dtype=jnp.float64, device=CPU1))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="ErrorsTestWorkerBackward returned an invalid gradient"):
            (bad(w) * w).sum().backward()
    (w * w).sum().backward()
    assert w.grad.tolist() == [2.0, 4.0, 6.0] and w.grad.device == CPU1
    assert_engine_works()


def test_graph_survives_a_failed_backward_with_retain_graph(x):
    state = {"fail": True}

    def rule(g, out, v):
        if state["fail"]:
            raise ValueError("rule failed once")
        return g * 2.0

    flaky = defprim("errors_test_flaky", lambda v: v * 2.0, [rule], register=False)
    y = (flaky(x) * x).sum()
    with pytest.raises(ValueError, match="rule failed once"):
        y.backward(retain_graph=True)
    state["fail"] = False
    x.grad = None
    y.backward()
    # d/dx (2x * x) = 4x
    assert x.grad.tolist() == [4.0, 8.0, 12.0]

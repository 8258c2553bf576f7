"""``xgrad.autograd.functional``: PyTorch's ``test/autograd/test_functional.py`` (the plain-tensor
variants), ported with its functions, values and messages, run with the eager and the compiled
backward; plus checks against ``jax.jacrev``/``jax.hessian`` and a Hessian-vector product inside
``xgrad.compile``.
"""

import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
import xgrad.autograd.functional as autogradF
from tests._backward_modes import eager_and_compiled  # noqa: F401 - the fixture
from xgrad.testing import gradcheck as _gradcheck
from xgrad.testing import gradgradcheck as _gradgradcheck

pytestmark = pytest.mark.usefixtures("eager_and_compiled")

_key = iter(range(10_000))


def gradcheck(fn, inputs):
    """PyTorch's gradcheck calls, in fast mode: one random direction per input (each probe is a whole
    functional call, so full Jacobians by finite differences would dominate the suite's time)."""
    return _gradcheck(fn, inputs, fast_mode=True)


def gradgradcheck(fn, inputs):
    return _gradgradcheck(fn, inputs, fast_mode=True)


def _rand(*shape, dtype=jnp.float32, requires_grad=False, normal=False):
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], list | tuple) else shape
    rng = np.random.default_rng(next(_key))  # NumPy: no program to compile per shape
    values = rng.standard_normal(shape) if normal else rng.random(shape)
    return xgrad.tensor(np.asarray(values, dtype=dtype), requires_grad=requires_grad)


ctors = types.SimpleNamespace(
    ones=lambda *s, dtype=jnp.float32, requires_grad=False: xgrad.tensor(jnp.ones(_shape(s), dtype), requires_grad=requires_grad),
    zeros=lambda *s, dtype=jnp.float32: xgrad.tensor(jnp.zeros(_shape(s), dtype)),
    rand=_rand,
    randn=lambda *s, dtype=jnp.float32: _rand(*s, dtype=dtype, normal=True),
    tensor=lambda v, dtype=jnp.float32, requires_grad=False: xgrad.tensor(np.asarray(v), dtype=dtype, requires_grad=requires_grad),
)


def _shape(s):
    return tuple(s[0]) if len(s) == 1 and isinstance(s[0], list | tuple) else s


def equal(a, b):
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            equal(x, y)
        return
    np.testing.assert_allclose(np.asarray(a.array if isinstance(a, xgrad.Tensor) else a),
                               np.asarray(b.array if isinstance(b, xgrad.Tensor) else b), rtol=1e-5, atol=1e-6)


def not_equal(a, b):
    assert not np.allclose(np.asarray(a.array), np.asarray(b.array))


def assert_same_struct(res, base):
    if isinstance(base, xgrad.Tensor):
        assert isinstance(res, xgrad.Tensor)
        assert base.shape == res.shape
    elif isinstance(base, tuple):
        assert isinstance(res, tuple) and len(base) == len(res)
        for el_base, el_res in zip(base, res, strict=True):
            assert isinstance(el_base, xgrad.Tensor) and isinstance(el_res, xgrad.Tensor)
            assert el_base.shape == el_res.shape
    else:
        raise RuntimeError("The base given to `_assert_same_struct` doesn't have the right structure.")


def assert_interleaved_struct(res, base1, base2):
    if isinstance(base1, xgrad.Tensor) and isinstance(base2, xgrad.Tensor):
        assert isinstance(res, xgrad.Tensor)
        assert res.shape == base1.shape + base2.shape
    elif isinstance(base1, tuple) and isinstance(base2, xgrad.Tensor):
        assert isinstance(res, tuple) and len(res) == len(base1)
        for el_res, el_base1 in zip(res, base1, strict=True):
            assert el_res.shape == el_base1.shape + base2.shape
    elif isinstance(base1, xgrad.Tensor) and isinstance(base2, tuple):
        assert isinstance(res, tuple) and len(res) == len(base2)
        for el_res, el_base2 in zip(res, base2, strict=True):
            assert el_res.shape == base1.shape + el_base2.shape
    elif isinstance(base1, tuple) and isinstance(base2, tuple):
        assert isinstance(res, tuple) and len(res) == len(base1)
        for el_res, el_base1 in zip(res, base1, strict=True):
            assert isinstance(el_res, tuple) and len(el_res) == len(base2)
            for el_el_res, el_base2 in zip(el_res, base2, strict=True):
                assert el_el_res.shape == el_base1.shape + el_base2.shape
    else:
        raise RuntimeError("The bases given to `_assert_interleaved_struct` don't have the right structure.")


def check_jacobian_vectorize_correctness(f, inputs, test_forward_ad=True):
    expected = autogradF.jacobian(f, inputs, vectorize=False)
    equal(autogradF.jacobian(f, inputs, vectorize=True), expected)
    if test_forward_ad:
        equal(autogradF.jacobian(f, inputs, strategy="forward-mode", vectorize=True), expected)


def check_hessian_vectorize_correctness(f, inputs):
    expected = autogradF.hessian(f, inputs, vectorize=False)
    equal(autogradF.hessian(f, inputs, vectorize=True), expected)
    equal(autogradF.hessian(f, inputs, outer_jacobian_strategy="forward-mode", vectorize=True), expected)


# -- vjp ----------------------------------------------------------------------------------------


def test_vjp_err_check():
    def foo(a):
        return 3 * a.narrow(0, 0, 3)

    def bar(a):
        return 3 * a.narrow(0, 0, 3), "bar"

    inp = ctors.rand(4)
    v = ctors.ones(3)
    with pytest.raises(TypeError, match="The inputs given to vjp must be either a Tensor"):
        autogradF.vjp(foo, (inp, 2), v)
    with pytest.raises(TypeError, match="The outputs of the user-provided function given to vjp must"):
        autogradF.vjp(bar, inp, v)
    with pytest.raises(RuntimeError, match="The vector v can only be None if the user-provided function returns"):
        autogradF.vjp(foo, inp)
    with pytest.raises(RuntimeError, match="The given v should contain a single Tensor."):
        autogradF.vjp(foo, inp, (xgrad.ones_like(inp), xgrad.ones_like(inp)))
    with pytest.raises(RuntimeError, match=r"v has invalid size: should be torch.Size"):
        autogradF.vjp(foo, inp, v[:2])
    res = autogradF.vjp(foo, inp, v)[1]
    assert_same_struct(res, inp)


def test_structure_messages_in_full():
    inp = ctors.rand(4)
    with pytest.raises(TypeError) as info:
        autogradF.vjp(lambda a: a, (inp, 2), ctors.ones(4))
    assert str(info.value) == (
        "The inputs given to vjp must be either a Tensor or a tuple of Tensors but the value at index 1 has type "
        "<class 'int'>."
    )
    with pytest.raises(RuntimeError) as info:
        autogradF.vjp(lambda a: a, inp, ctors.ones(3))
    assert str(info.value) == "v has invalid size: should be torch.Size([4]) but got torch.Size([3])."
    with pytest.raises(RuntimeError, match=r"Entry 1 in v has invalid size"):
        autogradF.vjp(lambda a, b: (a, b), (inp, inp), (ctors.ones(4), ctors.ones(3)))
    with pytest.raises(RuntimeError, match="v is a tuple of invalid length: should be 2 but got 1."):
        autogradF.vjp(lambda a, b: (a, b), (inp, inp), (ctors.ones(4),))


def test_vjp_err_check_strict():
    def foo(a):
        return a.detach()

    def bar(a):
        # A non-leaf Tensor that requires grad but is not connected to the input.
        return a.long().float().requires_grad_().clone()

    inp = ctors.rand(4)
    v = ctors.rand(4)
    with pytest.raises(RuntimeError, match="Output 0 of the user-provided function does not require gradients."):
        autogradF.vjp(foo, inp, v, strict=True)
    res = autogradF.vjp(foo, inp, v, strict=False)
    assert_same_struct(res[1], inp)
    assert res[1].abs().sum().item() == 0.0

    with pytest.raises(RuntimeError, match="The output of the user-provided function is independent of input 0"):
        autogradF.vjp(bar, inp, v, strict=True)
    res = autogradF.vjp(bar, inp, v, strict=False)
    assert_same_struct(res[1], inp)
    assert res[1].abs().sum().item() == 0.0

    # The Jacobian does not depend on the input.
    def foo(a):
        return a.clone()

    inp.requires_grad_()
    with pytest.raises(RuntimeError, match="jacobian of the user-provided function is independent of input 0."):
        autogradF.vjp(foo, inp, v, create_graph=True, strict=True)
    res = autogradF.vjp(foo, inp, v, create_graph=True, strict=False)
    assert_same_struct(res[1], inp)
    equal(res[1], v)


def test_vjp_no_grad():
    def reducer(x):
        return x.sum(dim=1)

    inputs = ctors.rand(4, 4)
    v = ctors.ones(4)
    with xgrad.no_grad():
        res = autogradF.vjp(reducer, inputs, v)
    assert res[0].grad_fn is None and res[1].grad_fn is None
    not_equal(res[1], ctors.zeros(4, 4))

    inputs.requires_grad_()
    v.requires_grad_()
    with xgrad.no_grad():
        res = autogradF.vjp(reducer, inputs, v, create_graph=True)
    assert res[0].grad_fn is not None and res[1].grad_fn is not None
    not_equal(res[1], ctors.zeros(4, 4))


def test_vjp_output():
    def reducer(x):
        return x.sum(dim=1)

    inputs = ctors.rand(4, 4)
    v = ctors.ones(4)
    res = autogradF.vjp(reducer, inputs, v)
    assert_same_struct(res[1], inputs)
    assert res[0].grad_fn is None and res[1].grad_fn is None

    def adder(x, y):
        return 2 * x + 3 * y

    inputs = (ctors.rand(2), ctors.rand(2))
    v = ctors.ones(2)
    out, vjp_val = autogradF.vjp(adder, inputs, v)
    assert_same_struct(vjp_val, inputs)
    assert out.grad_fn is None and vjp_val[0].grad_fn is None and vjp_val[1].grad_fn is None

    def adder(x, y):
        return 2 * x + 3 * y, x + y

    inputs = (ctors.rand(2), ctors.rand(2))
    v = (ctors.tensor([1.0, 0.0]), ctors.tensor([1.0, 0.0]))
    out, vjp_val = autogradF.vjp(adder, inputs, v)
    assert_same_struct(vjp_val, inputs)
    assert out[0].grad_fn is None and out[1].grad_fn is None
    assert vjp_val[0].grad_fn is None and vjp_val[1].grad_fn is None
    equal(vjp_val, (ctors.tensor([3.0, 0.0]), ctors.tensor([4.0, 0.0])))


def test_vjp_scalar():
    def reducer(x):
        return x.sum()

    inputs = ctors.rand(4, 4)
    v = ctors.ones([])
    res = autogradF.vjp(reducer, inputs, v)
    assert_same_struct(res[0], v)
    assert_same_struct(res[1], inputs)
    res = autogradF.vjp(reducer, inputs)
    assert_same_struct(res[0], v)
    assert_same_struct(res[1], inputs)

    def expander(x):
        return x.unsqueeze(0).repeat(4)

    inputs = ctors.rand([])
    v = ctors.ones(4)
    res = autogradF.vjp(expander, inputs, v)
    assert_same_struct(res[0], v)
    assert_same_struct(res[1], inputs)


def test_vjp_create_graph():
    def reducer(x):
        return x.sum(dim=1)

    inputs = ctors.rand(2, 2, dtype=jnp.float64, requires_grad=True)
    v = ctors.ones(2, dtype=jnp.float64, requires_grad=True)
    res = autogradF.vjp(reducer, inputs, v, create_graph=True)
    assert_same_struct(res[1], inputs)
    assert res[0].grad_fn is not None and res[1].grad_fn is not None
    gradcheck(lambda inp, v: autogradF.vjp(reducer, inputs, v, create_graph=True), (inputs, v))
    gradgradcheck(lambda inp, v: autogradF.vjp(reducer, inputs, v, create_graph=True), (inputs, v))

    def adder(x, y):
        return 2 * x + 3 * y, x * y

    inputs = (ctors.rand(2, dtype=jnp.float64, requires_grad=True), ctors.rand(2, dtype=jnp.float64, requires_grad=True))
    v = (ctors.tensor([1.0, 0.0], dtype=jnp.float64, requires_grad=True),
         ctors.tensor([1.0, 0.0], dtype=jnp.float64, requires_grad=True))
    gradcheck(lambda *args: autogradF.vjp(adder, args[:2], args[2:], create_graph=True)[1], inputs + v)
    gradgradcheck(lambda *args: autogradF.vjp(adder, args[:2], args[2:], create_graph=True)[1], inputs + v)

    def foo(*args):
        x, y = args[:2]
        v = args[2:]
        x = x.cos()
        val, grad = autogradF.vjp(adder, (x, y), v, create_graph=True)
        return val[0].exp() + val[1].exp() + grad[0].exp() + grad[1].exp() + x.exp() + y.exp()

    gradcheck(foo, inputs + v)
    gradgradcheck(foo, inputs + v)


# -- jvp ----------------------------------------------------------------------------------------


def test_jvp_err_check():
    def foo(a):
        return 3 * a.narrow(0, 0, 3)

    def bar(a):
        return 3 * a.narrow(0, 0, 3), "bar"

    inp = ctors.rand(4)
    v = ctors.rand(4)
    with pytest.raises(TypeError, match="The inputs given to jvp must be either a Tensor"):
        autogradF.jvp(foo, (inp, 2), v)
    with pytest.raises(TypeError, match="The outputs of the user-provided function given to jvp must"):
        autogradF.jvp(bar, inp, v)
    with pytest.raises(RuntimeError, match="The vector v can only be None if the input to the user-provided function"):
        autogradF.jvp(foo, inp)
    with pytest.raises(RuntimeError, match="The given v should contain a single Tensor."):
        autogradF.jvp(foo, inp, (v, v))
    with pytest.raises(RuntimeError, match="v has invalid size: should be torch.Size"):
        autogradF.jvp(foo, inp, v[:2])
    res = autogradF.jvp(foo, inp, v)[1]
    assert_same_struct(res, foo(inp))


def test_jvp_err_check_strict():
    def foo(a):
        return a.detach()

    def bar(a):
        return a.long().float().requires_grad_().clone()

    inp = ctors.rand(4)
    v = ctors.rand(4)
    with pytest.raises(RuntimeError, match="Output 0 of the user-provided function does not require gradients."):
        autogradF.jvp(foo, inp, v, strict=True)
    res = autogradF.jvp(foo, inp, v, strict=False)
    assert_same_struct(res[1], res[0])
    assert res[1].abs().sum().item() == 0.0

    with pytest.raises(RuntimeError, match="The output of the user-provided function is independent of input 0"):
        autogradF.jvp(bar, inp, v, strict=True)
    res = autogradF.jvp(bar, inp, v, strict=False)
    assert_same_struct(res[1], res[0])
    assert res[1].abs().sum().item() == 0.0

    def foo(a):
        return a.clone()

    inp.requires_grad_()
    with pytest.raises(RuntimeError, match="jacobian of the user-provided function is independent of input 0."):
        autogradF.jvp(foo, inp, v, create_graph=True, strict=True)
    res = autogradF.jvp(foo, inp, v, create_graph=True, strict=False)
    assert_same_struct(res[1], inp)
    equal(res[1], v)


def test_jvp_no_grad():
    def reducer(x):
        return x.sum(dim=1)

    inputs = ctors.rand(4, 4)
    v = ctors.ones(4, 4)
    with xgrad.no_grad():
        res = autogradF.jvp(reducer, inputs, v)
    assert res[0].grad_fn is None and res[1].grad_fn is None
    not_equal(res[1], ctors.zeros(4))

    inputs.requires_grad_()
    v.requires_grad_()
    with xgrad.no_grad():
        res = autogradF.jvp(reducer, inputs, v, create_graph=True)
    assert res[0].grad_fn is not None and res[1].grad_fn is not None
    not_equal(res[1], ctors.zeros(4))


def test_jvp_output():
    def reducer(x):
        return x.sum(dim=1)

    inputs = ctors.rand(4, 4)
    v = ctors.ones(4, 4)
    res = autogradF.jvp(reducer, inputs, v)
    assert_same_struct(res[1], res[0])
    assert res[0].grad_fn is None and res[1].grad_fn is None

    def adder(x, y):
        return 2 * x + 3 * y

    inputs = (ctors.rand(2), ctors.rand(2))
    v = (ctors.ones(2), ctors.ones(2))
    out, jvp_val = autogradF.jvp(adder, inputs, v)
    assert_same_struct(jvp_val, out)
    assert out.grad_fn is None and jvp_val.grad_fn is None
    equal(jvp_val, ctors.tensor([5.0, 5.0]))

    def adder(x, y):
        return 2 * x + 3 * y, x + y

    inputs = (ctors.rand(2), ctors.rand(2))
    v = (ctors.tensor([1.0, 0.0]), ctors.tensor([1.0, 0.0]))
    out, jvp_val = autogradF.jvp(adder, inputs, v)
    assert_same_struct(jvp_val, out)
    assert out[0].grad_fn is None and out[1].grad_fn is None
    assert jvp_val[0].grad_fn is None and jvp_val[1].grad_fn is None
    equal(jvp_val, (ctors.tensor([5.0, 0.0]), ctors.tensor([2.0, 0.0])))


def test_jvp_scalar():
    def reducer(x):
        return x.sum()

    inputs = ctors.rand(4, 4)
    v = ctors.ones(4, 4)
    res = autogradF.jvp(reducer, inputs, v)
    assert_same_struct(res[0], ctors.zeros([]))
    assert_same_struct(res[1], res[0])

    def expander(x):
        return x.unsqueeze(0).repeat(4)

    inputs = ctors.rand([])
    v = ctors.ones([])
    res = autogradF.jvp(expander, inputs, v)
    assert_same_struct(res[0], ctors.zeros(4))
    assert_same_struct(res[1], res[0])
    res = autogradF.jvp(expander, inputs)
    assert_same_struct(res[0], ctors.zeros(4))
    assert_same_struct(res[1], res[0])


def test_jvp_create_graph():
    def reducer(x):
        return x.sum(dim=1)

    inputs = ctors.rand(2, 2, dtype=jnp.float64, requires_grad=True)
    v = ctors.ones(2, 2, dtype=jnp.float64, requires_grad=True)
    res = autogradF.jvp(reducer, inputs, v, create_graph=True)
    assert_same_struct(res[1], res[0])
    assert res[0].grad_fn is not None and res[1].grad_fn is not None
    gradcheck(lambda inp, v: autogradF.jvp(reducer, inp, v, create_graph=True), (inputs, v))
    gradgradcheck(lambda inp, v: autogradF.jvp(reducer, inp, v, create_graph=True), (inputs, v))

    def adder(x, y):
        return 2 * x + 3 * y, x * y

    inputs = (ctors.rand(2, dtype=jnp.float64, requires_grad=True), ctors.rand(2, dtype=jnp.float64, requires_grad=True))
    v = (ctors.tensor([1.0, 0.0], dtype=jnp.float64, requires_grad=True),
         ctors.tensor([1.0, 0.0], dtype=jnp.float64, requires_grad=True))
    gradcheck(lambda *args: autogradF.jvp(adder, args[:2], args[2:], create_graph=True)[1], inputs + v)
    gradgradcheck(lambda *args: autogradF.jvp(adder, args[:2], args[2:], create_graph=True)[1], inputs + v)


# -- jacobian -----------------------------------------------------------------------------------


def test_construct_standard_basis_for():
    test_cases = [
        (ctors.randn(2, 3),),
        (ctors.randn(1),),
        (ctors.randn([]),),
        (ctors.randn(1), ctors.randn([]), ctors.randn([])),
        (ctors.randn(2), ctors.randn(3), ctors.randn([])),
        (ctors.randn(2, 3), ctors.randn(3), ctors.randn(3, 4, 2)),
        (ctors.randn(2, dtype=jnp.float64), ctors.randn(3, dtype=jnp.float32)),
    ]
    for inputs in test_cases:
        numels = tuple(t.numel() for t in inputs)
        results = autogradF._standard_basis(inputs, numels)
        for result, inp in zip(results, inputs, strict=True):
            assert result.dtype == inp.dtype
        stacked = np.concatenate([np.asarray(r, np.float32) for r in results], axis=1)
        np.testing.assert_array_equal(stacked, np.eye(stacked.shape[0], dtype=np.float32))


@pytest.mark.parametrize("api", [autogradF.jacobian, autogradF.hessian])
def test_vectorize_raises_no_warnings(api):
    def foo(a):
        return (a**2).sum()

    x = ctors.randn(3)
    with warnings.catch_warnings(record=True) as wa:
        warnings.simplefilter("always")
        api(foo, x, vectorize=True)
    assert [w for w in wa if "xgrad" not in str(w.category.__module__)] == []


@pytest.mark.parametrize("vectorize", [True, False])
def test_jacobian_err_check(vectorize):
    def foo(a):
        return 3 * a.narrow(0, 0, 3)

    def bar(a):
        return 3 * a.narrow(0, 0, 3), "bar"

    inp = ctors.rand(4)
    with pytest.raises(TypeError, match="The inputs given to jacobian must be either a Tensor"):
        autogradF.jacobian(foo, (inp, 2), vectorize=vectorize)
    with pytest.raises(TypeError, match="The outputs of the user-provided function given to jacobian must"):
        autogradF.jacobian(bar, inp, vectorize=vectorize)
    res = autogradF.jacobian(foo, inp, vectorize=vectorize)
    assert_interleaved_struct(res, foo(inp), inp)

    def foo(a, b):
        return b, 3 * a.narrow(0, 0, 3)

    inp = (ctors.rand(4), ctors.rand(5))
    res = autogradF.jacobian(foo, inp, vectorize=vectorize)
    assert_interleaved_struct(res, foo(*inp), inp)


def test_jacobian_err_check_strict():
    def foo(a):
        return a.detach()

    def bar(a):
        return a.long().float().requires_grad_().clone()

    inp = ctors.rand(4)
    with pytest.raises(RuntimeError, match="Output 0 of the user-provided function does not require gradients."):
        autogradF.jacobian(foo, inp, strict=True)
    res = autogradF.jacobian(foo, inp, strict=False)
    assert_interleaved_struct(res, foo(inp), inp)
    assert res.abs().sum().item() == 0.0

    with pytest.raises(RuntimeError, match="Output 0 of the user-provided function is independent of input 0."):
        autogradF.jacobian(bar, inp, strict=True)
    res = autogradF.jacobian(bar, inp, strict=False)
    assert_interleaved_struct(res, foo(inp), inp)
    assert res.abs().sum().item() == 0.0

    def foo(a):
        return a.clone()

    inp.requires_grad_()
    with pytest.raises(RuntimeError, match="jacobian of the user-provided function is independent of input 0."):
        autogradF.jacobian(foo, inp, create_graph=True, strict=True)
    res = autogradF.jacobian(foo, inp, create_graph=True, strict=False)
    assert_interleaved_struct(res, inp, inp)
    equal(res, xgrad.eye(4))


def test_jacobian_err_check_strict_vectorize_and_strategy():
    inp = ctors.rand(4)
    with pytest.raises(RuntimeError, match="not supported together"):
        autogradF.jacobian(lambda x: x, inp, strict=True, vectorize=True)
    with pytest.raises(RuntimeError, match="not supported together"):
        autogradF.jacobian(lambda x: x, inp, strict=True, strategy="forward-mode", vectorize=True)
    with pytest.raises(NotImplementedError, match="not supported together"):
        autogradF.jacobian(lambda x: x, inp, create_graph=True, strategy="forward-mode", vectorize=True)
    with pytest.raises(NotImplementedError, match="only implemented for `vectorize=True`"):
        autogradF.jacobian(lambda x: x, inp, strategy="forward-mode")
    with pytest.raises(AssertionError, match='Expected strategy to be either "forward-mode" or "reverse-mode"'):
        autogradF.jacobian(lambda x: x, inp, strategy="sideways")


def test_jacobian_no_grad():
    def exp_reducer(x):
        return x.exp().sum(dim=1)

    inputs = ctors.rand(4, 4)
    with xgrad.no_grad():
        res = autogradF.jacobian(exp_reducer, inputs)
    assert res.grad_fn is None
    not_equal(res, ctors.zeros(4, 4, 4))
    with xgrad.no_grad():
        res = autogradF.jacobian(exp_reducer, inputs, create_graph=True)
    assert res.grad_fn is not None
    not_equal(res, ctors.zeros(4, 4, 4))


@pytest.mark.parametrize("vectorize", [True, False])
def test_jacobian_output(vectorize):
    def exp_reducer(x):
        return x.exp().sum(dim=1)

    inputs = ctors.rand(4, 4)
    res = autogradF.jacobian(exp_reducer, inputs, vectorize=vectorize)
    assert_interleaved_struct(res, exp_reducer(inputs), inputs)
    assert res.grad_fn is None

    def identity(x):
        return x.clone()

    inputs = ctors.rand(4)
    res = autogradF.jacobian(identity, inputs, vectorize=vectorize)
    assert_interleaved_struct(res, identity(inputs), inputs)
    assert res.grad_fn is None
    equal(res, xgrad.eye(4))

    def add_exp_reducer(x, y):
        return (x + y.exp()).sum(dim=1)

    inputs = (ctors.rand(4, 4), ctors.rand(4, 4))
    res = autogradF.jacobian(add_exp_reducer, inputs, vectorize=vectorize)
    assert_interleaved_struct(res, add_exp_reducer(*inputs), inputs)
    assert res[0].grad_fn is None and res[1].grad_fn is None


@pytest.mark.parametrize("vectorize", [True, False])
def test_jacobian_scalar(vectorize):
    def reducer(x):
        return x.sum()

    inputs = ctors.rand(4, 4)
    res = autogradF.jacobian(reducer, inputs, vectorize=vectorize)
    assert_same_struct(res, inputs)

    def expander(x):
        return x.unsqueeze(0).repeat(4)

    inputs = ctors.rand([])
    res = autogradF.jacobian(expander, inputs, vectorize=vectorize)
    assert_same_struct(res, ctors.zeros(4))


@pytest.mark.parametrize("vectorize", [True, False])
def test_jacobian_create_graph(vectorize):
    def exp_reducer(x):
        return x.exp().sum(dim=1)

    inputs = ctors.rand(2, 2, dtype=jnp.float64, requires_grad=True)
    res = autogradF.jacobian(exp_reducer, inputs, create_graph=True, vectorize=vectorize)
    assert_interleaved_struct(res, exp_reducer(inputs), inputs)
    assert res.grad_fn is not None
    gradcheck(lambda inp: autogradF.jacobian(exp_reducer, inp, create_graph=True, vectorize=vectorize), inputs)
    gradgradcheck(lambda inp: autogradF.jacobian(exp_reducer, inp, create_graph=True, vectorize=vectorize), inputs)

    def add_exp_reducer(x, y):
        return (x + y).exp().sum(dim=1)

    inputs = (ctors.rand(2, 2, dtype=jnp.float64, requires_grad=True), ctors.rand(2, 2, dtype=jnp.float64, requires_grad=True))
    res = autogradF.jacobian(add_exp_reducer, inputs, create_graph=True, vectorize=vectorize)
    assert_interleaved_struct(res, add_exp_reducer(*inputs), inputs)
    assert res[0].grad_fn is not None and res[1].grad_fn is not None

    def foo(x, y):
        x = x.cos()
        val, jac = autogradF.jacobian(add_exp_reducer, (x, y), create_graph=True, vectorize=vectorize)
        res = val[0].exp().sum() + val[1].exp().sum() + jac[0].exp().sum()
        return res + jac[1].exp().sum() + x.exp().sum() + y.exp().sum()

    gradcheck(foo, inputs)


# Shapes below are PyTorch's, made smaller where the row-by-row (vectorize=False) reference
# would run one backward per output element of a large output: the functions are its.


def test_jacobian_vectorize_correctness_simple():
    check_jacobian_vectorize_correctness(lambda x: 3 * x**2, ctors.randn(2, 3, 2))


def test_jacobian_vectorize_correctness_multi_input():
    def f(x, y):
        return (x.cos() * x) @ y.sin()

    check_jacobian_vectorize_correctness(f, (ctors.randn(2, 3), ctors.randn(3, 2)))


def test_jacobian_vectorize_correctness_multi_input_multi_output():
    def f(x, y):
        return (x * x) @ y, x @ (x.sum(1) * y), y.sum()

    check_jacobian_vectorize_correctness(f, (ctors.randn(3, 2), ctors.randn(2, 3)))


def test_jacobian_vectorize_correctness_unrelated_outputs():
    def f(x, y):
        return x, y, x, y

    check_jacobian_vectorize_correctness(f, (ctors.randn(2), ctors.randn(3)))


def test_jacobian_vectorize_correctness_zero_dim():
    def f(x, y):
        return x.sum(), y.sum(), x * y

    check_jacobian_vectorize_correctness(f, (ctors.randn(3), ctors.randn(3)))

    def g(x):
        return xgrad.stack([x, x, x])

    check_jacobian_vectorize_correctness(g, ctors.randn([]))

    def h(x, y):
        return y.sum(), x * y

    check_jacobian_vectorize_correctness(h, (ctors.randn([]), ctors.randn(1)))


def test_jacobian_vectorize_correctness_different_dtype():
    def f(x, y):
        return (x * y).float(), (x * y).double()

    # Forward mode gives the outputs' dtypes, reverse mode the inputs'.
    check_jacobian_vectorize_correctness(f, (ctors.randn(3), ctors.randn(3)), test_forward_ad=False)


# -- hessian ------------------------------------------------------------------------------------


def test_hessian_vectorize_correctness_simple():
    check_hessian_vectorize_correctness(lambda x: (3 * x**2).sum(), ctors.randn(2, 3))


def test_hessian_vectorize_correctness_multi_input():
    def f(x, y, z):
        return ((x.relu() * x) @ y.sin() @ z).sum()

    check_hessian_vectorize_correctness(f, (ctors.randn(2, 2), ctors.randn(2, 2), ctors.randn(2, 2)))


def test_hessian_vectorize_correctness_unrelated_outputs():
    def f(x, y):
        return (x**2).sum()

    check_hessian_vectorize_correctness(f, (ctors.randn(2), ctors.randn(3)))

    def f(x, y):
        return ctors.ones([])

    check_hessian_vectorize_correctness(f, (ctors.randn(2), ctors.randn(3)))


@pytest.mark.parametrize("vectorize", [True, False])
def test_hessian_err_check(vectorize):
    def foo(a):
        return 3 * a.narrow(0, 0, 3).exp().sum()

    def bar(a):
        return 3 * a.narrow(0, 0, 3), "bar"

    def bar2(a):
        return 3 * a.narrow(0, 0, 3)

    def bar3(a):
        return 3 * a.narrow(0, 0, 3), 3 * a.narrow(0, 0, 3)

    inp = ctors.rand(4)
    with pytest.raises(TypeError, match="The inputs given to hessian must be either a Tensor"):
        autogradF.hessian(foo, (inp, 2), vectorize=vectorize)
    with pytest.raises(TypeError, match="The outputs of the user-provided function given to hessian must"):
        autogradF.hessian(bar, inp, vectorize=vectorize)
    with pytest.raises(RuntimeError, match="The Tensor returned by the function given to hessian should contain a single element"):
        autogradF.hessian(bar2, inp, vectorize=vectorize)
    with pytest.raises(RuntimeError, match="The function given to hessian should return a single Tensor"):
        autogradF.hessian(bar3, inp, vectorize=vectorize)
    res = autogradF.hessian(foo, inp, vectorize=vectorize)
    assert_interleaved_struct(res, inp, inp)

    def foo(a, b):
        return (3 * b.narrow(0, 0, 3) * a.narrow(0, 0, 3)).sum()

    inp = (ctors.rand(4), ctors.rand(5))
    res = autogradF.hessian(foo, inp, vectorize=vectorize)
    assert_interleaved_struct(res, inp, inp)


def test_hessian_err_check_strict():
    def foo(a):
        return a.detach().sum()

    def bar(a):
        return a.long().float().requires_grad_().clone().sum()

    def bar2(a):
        return (3 * a).sum()  # a linear function: its jacobian is independent of the input

    inp = ctors.rand(4)
    with pytest.raises(RuntimeError, match="Output 0 of the user-provided function does not require gradients."):
        autogradF.hessian(foo, inp, strict=True)
    res = autogradF.hessian(foo, inp, strict=False)
    assert_interleaved_struct(res, inp, inp)
    assert res.abs().sum().item() == 0.0

    with pytest.raises(RuntimeError, match="jacobian of the user-provided function with respect to input 0"):
        autogradF.hessian(bar, inp, strict=True)
    res = autogradF.hessian(bar, inp, strict=False)
    assert_interleaved_struct(res, inp, inp)
    assert res.abs().sum().item() == 0.0

    with pytest.raises(RuntimeError, match="jacobian of the user-provided function with respect to input 0 is"):
        autogradF.hessian(bar2, inp, strict=True)
    res = autogradF.hessian(bar2, inp, strict=False)
    assert_interleaved_struct(res, inp, inp)
    assert res.abs().sum().item() == 0.0


def test_hessian_err_check_strict_vectorize():
    with pytest.raises(RuntimeError, match="not supported together"):
        autogradF.hessian(lambda x: (x**3).sum(), ctors.rand(4), strict=True, vectorize=True)


def test_hessian_no_grad():
    def pow_reducer(x):
        return x.pow(3).sum()

    inputs = ctors.rand(2, 2)
    with xgrad.no_grad():
        res = autogradF.hessian(pow_reducer, inputs)
    assert res.grad_fn is None
    not_equal(res, ctors.zeros(2, 2, 2, 2))
    with xgrad.no_grad():
        res = autogradF.hessian(pow_reducer, inputs, create_graph=True)
    assert res.grad_fn is not None
    not_equal(res, ctors.zeros(2, 2, 2, 2))


@pytest.mark.parametrize("vectorize", [True, False])
def test_hessian_output(vectorize):
    def pow_reducer(x):
        return x.pow(3).sum()

    inputs = ctors.rand(2, 2)
    res = autogradF.hessian(pow_reducer, inputs, vectorize=vectorize)
    assert_interleaved_struct(res, inputs, inputs)
    assert res.grad_fn is None

    def add_pow_reducer(x, y):
        return (x + y).pow(3).sum()

    inputs = (ctors.rand(2, 2), ctors.rand(2, 2))
    res = autogradF.hessian(add_pow_reducer, inputs, vectorize=vectorize)
    assert_interleaved_struct(res, inputs, inputs)
    assert all(res[i][j].grad_fn is None for i in range(2) for j in range(2))


@pytest.mark.parametrize("vectorize", [True, False])
def test_hessian_scalar(vectorize):
    def reducer(x):
        return x.sum()

    inputs = ctors.rand(4, 4)
    res = autogradF.hessian(reducer, inputs, vectorize=vectorize)
    assert_interleaved_struct(res, inputs, inputs)
    inputs = ctors.rand([])
    res = autogradF.hessian(reducer, inputs, vectorize=vectorize)
    assert_same_struct(res, inputs)

    def bad_reducer(x):
        return x.sum().view(1, 1, 1)

    inputs = ctors.rand(4, 4)
    res = autogradF.hessian(bad_reducer, inputs, vectorize=vectorize)
    assert_interleaved_struct(res, inputs, inputs)


@pytest.mark.parametrize("vectorize", [True, False])
def test_hessian_create_graph(vectorize):
    def pow_reducer(x):
        return x.pow(3).sum()

    inputs = ctors.rand(2, 2, dtype=jnp.float64, requires_grad=True)
    res = autogradF.hessian(pow_reducer, inputs, create_graph=True, vectorize=vectorize)
    assert_interleaved_struct(res, inputs, inputs)
    assert res.grad_fn is not None
    gradcheck(lambda inp: autogradF.hessian(pow_reducer, inp, create_graph=True, vectorize=vectorize), inputs)

    def add_pow_reducer(x, y):
        return (x + y).pow(3).sum()

    inputs = (ctors.rand(2, 2, dtype=jnp.float64, requires_grad=True), ctors.rand(2, 2, dtype=jnp.float64, requires_grad=True))
    res = autogradF.hessian(add_pow_reducer, inputs, create_graph=True, vectorize=vectorize)
    assert_interleaved_struct(res, inputs, inputs)
    assert all(res[i][j].grad_fn is not None for i in range(2) for j in range(2))


# -- vhp and hvp ----------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["vhp", "hvp"])
def test_hessian_product_err_check(api):
    fn = getattr(autogradF, api)

    def foo(a):
        return 3 * a.narrow(0, 0, 3).exp().sum()

    def bar(a):
        return 3 * a.narrow(0, 0, 3), "bar"

    def bar2(a):
        return 3 * a.narrow(0, 0, 3)

    inp = ctors.rand(4)
    v = ctors.rand(4)
    with pytest.raises(TypeError, match=f"The inputs given to {api} must be either a Tensor"):
        fn(foo, (inp, 2), v)
    with pytest.raises(TypeError, match=f"The outputs of the user-provided function given to {api} must"):
        fn(bar, inp, v)
    with pytest.raises(RuntimeError, match=f"The Tensor returned by the function given to {api} should contain a single element"):
        fn(bar2, inp, v)
    with pytest.raises(RuntimeError, match="v has invalid size:"):
        fn(foo, inp, ctors.rand(5))
    with pytest.raises(TypeError, match=f"The v given to {api} must be either a Tensor or a tuple of Tensors"):
        fn(foo, inp, (v, 2))
    res = fn(foo, inp, v)
    assert_same_struct(res[1], inp)

    def foo(a, b):
        return (3 * b.narrow(0, 0, 3) * a.narrow(0, 0, 3)).sum()

    inp = (ctors.rand(4), ctors.rand(5))
    v = (ctors.rand(4), ctors.rand(5))
    res = fn(foo, inp, v)
    assert_same_struct(res[1], inp)


@pytest.mark.parametrize("api", ["vhp", "hvp"])
def test_hessian_product_err_check_strict(api):
    fn = getattr(autogradF, api)

    def foo(a):
        return a.detach().sum()

    def bar(a):
        return a.long().float().requires_grad_().clone().sum()

    def bar2(a):
        return (3 * a).sum()

    inp = ctors.rand(4)
    v = ctors.rand(4)
    with pytest.raises(RuntimeError, match="Output 0 of the user-provided function does not require gradients."):
        fn(foo, inp, v, strict=True)
    res = fn(foo, inp, v, strict=False)
    assert_same_struct(res[1], inp)
    assert res[1].abs().sum().item() == 0.0

    with pytest.raises(RuntimeError, match="The output of the user-provided function is independent of input 0"):
        fn(bar, inp, v, strict=True)
    res = fn(bar, inp, v, strict=False)
    assert_same_struct(res[1], inp)
    assert res[1].abs().sum().item() == 0.0

    with pytest.raises(RuntimeError, match="jacobian of the user-provided function with respect to input 0 is"):
        fn(bar2, inp, v, strict=True)
    res = fn(bar2, inp, v, strict=False)
    assert_same_struct(res[1], inp)
    assert res[1].abs().sum().item() == 0.0


@pytest.mark.parametrize("api", ["vhp", "hvp"])
def test_hessian_product_no_grad_output_scalar(api):
    fn = getattr(autogradF, api)

    def reducer(x):
        return x.exp().sum()

    inputs = ctors.rand(4, 4)
    v = ctors.ones(4, 4)
    with xgrad.no_grad():
        res = fn(reducer, inputs, v)
    assert res[0].grad_fn is None and res[1].grad_fn is None
    not_equal(res[1], ctors.zeros(4, 4))
    with xgrad.no_grad():
        res = fn(reducer, inputs, v, create_graph=True)
    assert res[0].grad_fn is not None and res[1].grad_fn is not None

    def bar(a, b):
        return (a + 3 * b.narrow(0, 0, 3)).exp().sum()

    inputs = (ctors.rand(3), ctors.rand(4))
    v = (ctors.ones(3), ctors.ones(4))
    out, val = fn(bar, inputs, v)
    assert_same_struct(val, inputs)
    assert out.grad_fn is None and val[0].grad_fn is None and val[1].grad_fn is None

    inputs = ctors.rand([])
    v = ctors.rand([])
    assert_same_struct(fn(reducer, inputs, v)[1], inputs)
    assert_same_struct(fn(reducer, inputs)[1], inputs)

    def bad_reducer(x):
        return x.exp().sum().view(1, 1, 1)

    inputs = ctors.rand(4, 4)
    assert_same_struct(fn(bad_reducer, inputs, ctors.rand(4, 4))[1], inputs)


@pytest.mark.parametrize("api", ["vhp", "hvp"])
def test_hessian_product_create_graph(api):
    fn = getattr(autogradF, api)

    def foo(a):
        return 3 * a.narrow(0, 0, 3).exp().sum()

    inputs = ctors.rand(4, 2, dtype=jnp.float64, requires_grad=True)
    v = ctors.ones(4, 2, dtype=jnp.float64, requires_grad=True)
    res = fn(foo, inputs, v, create_graph=True)
    assert_same_struct(res[1], inputs)
    assert res[0].grad_fn is not None and res[1].grad_fn is not None
    gradcheck(lambda inp, v: fn(foo, inp, v, create_graph=True), (inputs, v))
    gradgradcheck(lambda inp, v: fn(foo, inp, v, create_graph=True), (inputs, v))


def test_jacobian_match_vjp_jvp():
    def foo(x):
        return x**3 + x.sum()

    inputs = ctors.rand(4)
    v = ctors.rand(4)
    jac = autogradF.jacobian(foo, inputs)
    jvp = autogradF.jvp(foo, inputs, v)[1]
    vjp = autogradF.vjp(foo, inputs, v)[1]
    equal(jvp, (jac @ v.unsqueeze(1)).squeeze(1))
    equal(vjp, (v.unsqueeze(0) @ jac).squeeze(0))


def test_hessian_match_vhp_hvp():
    def foo(a):
        return 3 * a.narrow(0, 0, 3).exp().sum()

    inputs = ctors.rand(4)
    v = ctors.rand(4)
    hes = autogradF.hessian(foo, inputs)
    hvp = autogradF.hvp(foo, inputs, v)[1]
    vhp = autogradF.vhp(foo, inputs, v)[1]
    equal(hvp, (hes @ v.unsqueeze(1)).squeeze(1))
    equal(vhp, (v.unsqueeze(0) @ hes).squeeze(0))


# -- against jax ------------------------------------------------------------------------------------


def model_xgrad(w, b, x):
    return ((x @ w + b).tanh() ** 2).sum()


def model_jax(w, b, x):
    return jnp.sum(jnp.tanh(x @ w + b) ** 2)


W0 = np.array([[0.3, -0.2, 0.5], [0.1, 0.4, -0.6]])
B0 = np.array([0.05, -0.1, 0.2])
X0 = np.array([[1.0, -0.5], [0.3, 0.8], [-1.2, 0.4]])


@pytest.mark.parametrize("vectorize,strategy", [(False, "reverse-mode"), (True, "reverse-mode"), (True, "forward-mode")])
def test_jacobian_and_hessian_equal_jax(vectorize, strategy):
    x = xgrad.tensor(X0)
    args = (xgrad.tensor(W0), xgrad.tensor(B0))
    jac = autogradF.jacobian(lambda w, b: (x @ w + b).tanh(), args, vectorize=vectorize, strategy=strategy)
    expected = jax.jacrev(lambda w, b: jnp.tanh(X0 @ w + b), argnums=(0, 1))(W0, B0)
    equal(jac, expected)
    hess = autogradF.hessian(lambda w, b: model_xgrad(w, b, x), args, vectorize=vectorize, outer_jacobian_strategy=strategy)
    expected = jax.hessian(lambda w, b: model_jax(w, b, X0), argnums=(0, 1))(W0, B0)
    equal(hess, expected)


def test_hvp_equals_jax_and_runs_in_a_compiled_step():
    v = (xgrad.tensor(np.ones_like(W0)), xgrad.tensor(np.arange(3.0)))
    expected = jax.jvp(jax.grad(lambda w, b: model_jax(w, b, X0), argnums=(0, 1)), (W0, B0),
                       (np.ones_like(W0), np.arange(3.0)))[1]
    x = xgrad.tensor(X0)

    def hvp_step(w, b):
        return autogradF.hvp(lambda w, b: model_xgrad(w, b, x), (w, b), v)[1]

    eager = hvp_step(xgrad.tensor(W0), xgrad.tensor(B0))
    equal(eager, expected)
    equal(autogradF.vhp(lambda w, b: model_xgrad(w, b, x), (xgrad.tensor(W0), xgrad.tensor(B0)), v)[1], expected)
    step = xgrad.compile(hvp_step, fallback="error")
    for _ in range(2):
        equal(step(xgrad.tensor(W0), xgrad.tensor(B0)), expected)
    assert step.stats()["compiles"] == 1

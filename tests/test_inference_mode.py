"""Inference mode and inference tensors, ported from PyTorch's ``TestAutogradInferenceMode``
(test/test_autograd.py), with its values and message phrases (NOTE [Inference tensors]).

Left out, as xgrad has no such API: the ``transpose_``/``resize_``/``resize_as_`` in-place
view ops, ``out=`` arguments and the ``_version`` error of inference tensors (xgrad's
arrays are immutable; an inference tensor keeps its version counter).
"""

import itertools

import pytest

import xgrad
from tests._backward_modes import eager_and_compiled  # noqa: F401

ERR_SAVED = "Inference tensors cannot be saved for backward"
ERR_INPLACE = "Inplace update to inference tensor outside InferenceMode"
ERR_VIEW_INPLACE = "A view was created in inference mode and is being modified inplace"


def is_view(t):
    return t._view is not None


def test_inference_mode_context_manager():
    assert not xgrad.is_inference_mode_enabled()
    with xgrad.inference_mode():
        assert xgrad.is_inference_mode_enabled()
        with xgrad.inference_mode(False):
            assert not xgrad.is_inference_mode_enabled()
        assert xgrad.is_inference_mode_enabled()
    assert not xgrad.is_inference_mode_enabled()


def test_inference_mode_decorator():
    def func(x):
        assert xgrad.is_inference_mode_enabled() == mode
        return x * x

    for mode, use_kwarg in itertools.product((True, False, None), (True, False)):
        if mode is None:
            decorated = xgrad.inference_mode(mode=func) if use_kwarg else xgrad.inference_mode(func)
            mode = True
        else:
            decorated = xgrad.inference_mode(mode=mode)(func) if use_kwarg else xgrad.inference_mode(mode)(func)
        for requires_grad in (True, False):
            c = xgrad.ones(1, 2, 3, requires_grad=requires_grad)
            d = decorated(c)
            assert not mode or d.is_inference()
            assert d.requires_grad == (requires_grad and not mode)


def test_inference_mode_tensor_creation():
    with xgrad.inference_mode():
        c = xgrad.ones(1, 2, 3)  # factories make inference tensors
        assert not c.requires_grad and c.is_inference()
        tmp = xgrad.ones(1, 2, 3, requires_grad=True)
        assert tmp.requires_grad and tmp.is_inference()
        tmp = xgrad.ones(1, 2, 3).requires_grad_(False)
        assert not tmp.requires_grad and tmp.is_inference()


@pytest.mark.usefixtures("eager_and_compiled")
def test_inference_mode_existing_autograd_session():
    s = xgrad.ones(1, 2, 3, requires_grad=True)
    a = s.clone()
    out = a * a  # a is saved outside inference mode
    with xgrad.inference_mode():
        a.add_(2)
    assert not a.is_inference()
    # a normal tensor keeps its version counter inside inference mode
    with pytest.raises(RuntimeError, match="one of the variables needed for gradient computation has been modified by an inplace operation"):
        out.backward(xgrad.ones_like(out))


def test_inference_mode_inf_tensor_in_inf_mode_functional_op():
    with xgrad.inference_mode():
        for requires_grad in (True, False):
            c = xgrad.ones(1, 2, 3, requires_grad=requires_grad)
            func_out = c * c
            assert func_out.is_inference() and not func_out.requires_grad


def test_inference_mode_inf_tensor_in_inf_mode_inplace_op():
    @xgrad.inference_mode()
    def run_test(fn):
        for requires_grad in (True, False):
            c = xgrad.ones(1, 2, 3, requires_grad=requires_grad)
            fn(c)  # still an inference tensor afterwards
            assert c.is_inference()
            assert c.requires_grad == requires_grad

    run_test(lambda x: x.add_(2))
    run_test(lambda x: x.copy_(xgrad.ones(1, 2, 3)))


def test_inference_mode_inf_tensor_in_inf_mode_view_op():
    with xgrad.inference_mode():
        for requires_grad in (True, False):
            c = xgrad.ones(1, 2, 3, requires_grad=requires_grad)
            view_out = c.view(-1)
            assert view_out.is_inference() and not view_out.requires_grad


def test_inference_mode_inf_tensor_in_normal_mode_functional_op():
    for requires_grad in (True, False):
        with xgrad.inference_mode():
            c = xgrad.ones(1, 2, 3, requires_grad=requires_grad)
    func_out = c * c
    assert not func_out.is_inference() and not func_out.requires_grad and func_out.is_leaf


def test_inference_mode_inf_tensor_in_normal_mode_inplace_op():
    def run_test(fn):
        for requires_grad in (False, True):
            with xgrad.inference_mode():
                c = xgrad.ones(1, 2, 3, requires_grad=requires_grad)
            if requires_grad:
                # a leaf that requires grad used in an in-place op: raises either way
                with pytest.raises(RuntimeError):
                    fn(c)
            else:
                with pytest.raises(RuntimeError, match=ERR_INPLACE):
                    fn(c)

    run_test(lambda x: x.add_(2))
    run_test(lambda x: x.__setitem__(0, 1.0))


def test_inference_mode_inf_tensor_in_normal_mode_view_op():
    for requires_grad in (True, False):
        with xgrad.inference_mode():
            c = xgrad.ones(1, 2, 3, requires_grad=requires_grad)
        out = c.view(-1)
        assert out.is_inference() and not out.requires_grad
        assert not is_view(out) and out.is_leaf


def test_normal_tensor_inplace_output_in_inference_mode():
    for requires_grad in (True, False):
        s = xgrad.ones(1, 2, 3, requires_grad=requires_grad)
        a = s.clone()
        with xgrad.inference_mode():
            a.add_(2)
            assert not a.is_inference() and a.requires_grad == requires_grad
            a.add_(2)  # inplace -> inplace
            assert not a.is_inference() and a.requires_grad == requires_grad
            view_out = a.view(-1)  # inplace -> inplace -> view
            assert not view_out.is_inference() and view_out.requires_grad == requires_grad


def test_normal_tensor_inplace_output_in_normal_mode():
    for requires_grad in (True, False):
        s = xgrad.ones(1, 2, 3, requires_grad=requires_grad)
        a = s.clone()
        with xgrad.inference_mode():
            a.add_(2)
            assert not a.is_inference() and a.requires_grad == requires_grad
        a.add_(2)
        assert not a.is_inference() and a.requires_grad == requires_grad
        a.add_(2)
        assert not a.is_inference() and a.requires_grad == requires_grad
        view_out = a.view(-1)
        assert not view_out.is_inference() and view_out.requires_grad == requires_grad


def test_normal_tensor_view_output_in_inference_mode():
    for requires_grad in (True, False):
        s = xgrad.ones(1, 2, 3, requires_grad=requires_grad)
        a = s.clone()
        with xgrad.inference_mode():
            out = a.view(-1)
            assert not out.is_inference() and out.requires_grad == requires_grad and is_view(out)
            tmp = out.view(-1)  # view -> view
            assert not tmp.is_inference() and tmp.requires_grad == requires_grad
            assert is_view(tmp) and tmp.is_leaf
            assert xgrad.is_inference_mode_enabled()
            tmp.add_(2)  # view -> view -> inplace
            assert not tmp.is_inference() and tmp.requires_grad == requires_grad
            assert a._version == tmp._version
        assert a.tolist() == [[[3.0] * 3] * 2]


def test_normal_tensor_view_output_in_normal_mode():
    for requires_grad in (True, False):
        s = xgrad.ones(1, 2, 3, requires_grad=requires_grad)
        a = s.clone()
        with xgrad.inference_mode():
            out = a.view(-1)
            assert not out.is_inference() and out.requires_grad == requires_grad
            assert is_view(out) and out.is_leaf
        tmp = out * out
        assert not tmp.is_inference() and tmp.requires_grad == requires_grad
        if requires_grad:
            with pytest.raises(RuntimeError, match=ERR_VIEW_INPLACE):
                out.add_(2)
        else:
            out.add_(2)
        tmp = out.view(2, 3)
        assert not tmp.is_inference() and tmp.requires_grad == requires_grad


@pytest.mark.usefixtures("eager_and_compiled")
def test_mix_inference_and_normal_tensor_functional_op():
    for requires_grad in (True, False):
        s = xgrad.ones(1, 2, 3, requires_grad=requires_grad)
        with xgrad.inference_mode():
            c = xgrad.ones(1, 2, 3, requires_grad=requires_grad)
        out = c.add(s)  # add saves nothing for backward
        assert not out.is_inference() and out.requires_grad == requires_grad
        if requires_grad:
            # a leaf inference tensor that requires grad still gets its gradient
            out.backward(xgrad.ones_like(out))
            assert c.grad.tolist() == xgrad.ones_like(c).tolist()
            with pytest.raises(RuntimeError, match=ERR_SAVED):
                c * s


def test_mix_inference_and_normal_tensor_inplace_op():
    for requires_grad in (True, False):
        s = xgrad.ones(1, 2, 3, requires_grad=requires_grad)
        a = s.clone()
        with xgrad.inference_mode():
            c = xgrad.ones(1, 2, 3)
        assert c.is_inference()
        if requires_grad:
            with pytest.raises(RuntimeError, match=ERR_SAVED):
                a.mul_(c)
        else:
            a.mul_(c)
            with pytest.raises(RuntimeError, match=ERR_INPLACE + " is not allowed"):
                c.copy_(s * s)


def test_mix_inference_and_normal_tensor_view_op():
    for requires_grad in (True, False):
        s = xgrad.ones(1, 2, 3, requires_grad=requires_grad)
        with xgrad.inference_mode():
            c = xgrad.ones(1, 2, 3)
        tmp1 = c.view_as(s)
        assert tmp1.is_inference() and not tmp1.requires_grad
        tmp2 = s.view_as(c)  # s.view(c's shape): not a mixed input
        assert not tmp2.is_inference() and tmp2.requires_grad == requires_grad


def test_inference_mode_handle_direct_view_on_rebase():
    for requires_grad in (True, False):
        s = xgrad.ones(1, 2, 3, requires_grad=requires_grad)
        a = s.clone()
        with xgrad.inference_mode():
            view_out = a.view_as(a)
        if requires_grad:
            with pytest.raises(RuntimeError, match=ERR_VIEW_INPLACE):
                view_out.add_(2)
        else:
            view_out.add_(2)


def test_a_view_of_a_requires_grad_tensor_taken_in_inference_mode_requires_grad():
    a = xgrad.tensor([1.0, 2.0], requires_grad=True).clone()
    with xgrad.inference_mode():
        v = a[:1]
    assert v.requires_grad and v.is_leaf and v.grad_fn is None and not v.is_inference()

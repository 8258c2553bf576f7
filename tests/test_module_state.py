"""Module dtype and device conversions, submodule/parameter/buffer lookup, state dicts and printing, as PyTorch's.

Expected texts and dtypes were written down from the same calls on PyTorch 2.14.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
import xgrad.nn as nn


def _linear_with_int_buffer():
    m = nn.Linear(2, 2, key=0)
    m.register_buffer("steps", xgrad.tensor(np.zeros(2, np.int32)))
    m.register_buffer("scale", xgrad.ones(2))
    return m


@pytest.mark.parametrize(
    ("convert", "dtype"),
    [("double", jnp.float64), ("float", jnp.float32), ("half", jnp.float16), ("bfloat16", jnp.bfloat16)],
)
def test_dtype_conversions_cast_floating_parameters_buffers_and_grads_in_place(convert, dtype):
    m = _linear_with_int_buffer()
    weight = m.weight
    m(xgrad.ones(1, 2)).sum().backward()
    assert getattr(m, convert)() is m
    assert m.weight is weight and isinstance(weight, nn.Parameter) and weight.requires_grad
    assert [t.dtype for t in (m.weight, m.bias, m.scale, m.weight.grad)] == [jnp.dtype(dtype)] * 4
    assert m.steps.dtype == jnp.int32  # integer buffers keep their dtype, as PyTorch's


def test_to_takes_a_tensors_dtype_and_refuses_integer_dtypes():
    m = _linear_with_int_buffer()
    m.to(xgrad.ones(1, dtype=jnp.bfloat16))
    assert (m.weight.dtype, m.steps.dtype) == (jnp.bfloat16, jnp.int32)
    m.to("cpu", jnp.float32, non_blocking=True)
    assert m.weight.dtype == jnp.float32
    with pytest.raises(TypeError, match="nn.Module.to only accepts floating point or complex dtypes, but got desired dtype=int32"):
        m.to(jnp.int32)


def test_double_without_jax_x64_says_how_to_turn_it_on():
    m = nn.Linear(2, 2, key=0)
    with jax.enable_x64(False), pytest.raises(RuntimeError, match=r'jax.config.update\("jax_enable_x64", True\)'):
        m.double()
    assert m.weight.dtype == jnp.float32


def test_cpu_and_cuda():
    m = nn.Linear(2, 2, key=0)
    assert m.cpu() is m and m.weight.device.platform == "cpu"
    if all(d.platform != "gpu" for d in jax.devices()):
        with pytest.raises(RuntimeError, match="Module.cuda\\(\\): JAX sees no GPU"):
            m.cuda()


def test_get_submodule_parameter_and_buffer_with_pytorchs_errors():
    model = nn.Sequential(nn.Linear(2, 3, key=0), nn.BatchNorm1d(3))
    assert model.get_submodule("") is model and model.get_submodule("1") is model[1]
    assert model.get_parameter("0.weight") is model[0].weight
    assert model.get_buffer("1.running_mean") is model[1].running_mean
    for call, target, message in [
        (model.get_submodule, "0.foo", "Linear has no attribute `foo`"),
        (model.get_submodule, "0.weight", "`weight` is not an nn.Module"),
        (model.get_parameter, "1.running_mean", "`running_mean` is not an nn.Parameter"),
        (model.get_buffer, "1.weight", "`weight` is not a buffer"),
        (model.get_buffer, "1.nope", "BatchNorm1d has no attribute `nope`"),
    ]:
        with pytest.raises(AttributeError, match=message):
            call(target)

    class Blocks(nn.Module):
        def __init__(self):
            self.blocks = [nn.Linear(2, 2, key=1)]

    blocks = Blocks()
    assert blocks.get_submodule("blocks.0") is blocks.blocks[0]
    assert blocks.get_parameter("blocks.0.bias") is blocks.blocks[0].bias


def test_state_dict_keep_vars_and_zero_grad_default():
    m = nn.Linear(2, 2, key=0)
    kept = m.state_dict(keep_vars=True)
    assert kept["weight"] is m.weight
    detached = m.state_dict()
    assert detached["weight"] is not m.weight and not detached["weight"].requires_grad
    np.testing.assert_array_equal(detached["weight"].array, m.weight.array)
    destination = {"other": 1}
    assert m.state_dict(destination=destination, prefix="lin.") is destination
    assert list(destination) == ["other", "lin.weight", "lin.bias"]
    with pytest.raises(NotImplementedError, match="assign=False"):
        m.load_state_dict(detached, assign=True)
    m(xgrad.ones(1, 2)).sum().backward()
    m.zero_grad()
    assert m.weight.grad is None and m.bias.grad is None


def test_repr_prints_extra_repr_and_children_as_pytorch():
    class Scaled(nn.Module):
        def __init__(self):
            self.inner = nn.Sequential(nn.Linear(2, 3, key=0), nn.ReLU())

        def extra_repr(self):
            return "factor=2"

    assert repr(Scaled()) == (
        "Scaled(\n  factor=2\n  (inner): Sequential(\n    (0): Linear(in_features=2, out_features=3, bias=True)\n"
        "    (1): ReLU()\n  )\n)"
    )
    assert repr(nn.Linear(2, 3, key=0)) == "Linear(in_features=2, out_features=3, bias=True)"
    assert repr(nn.Module()) == "Module()"

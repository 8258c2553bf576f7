"""PyTorch's argument checks of the op library, and the values PyTorch defines where JAX's differ.

One table of bad inputs (one row per case): each call must raise PyTorch's exception type
with PyTorch's phrase (the phrases are PyTorch 2.13's, from running the same call there).
Shape and dtype rows come from the registry's shape rules (NOTE [Shape rules]), so they
hold the same inside ``xgrad.compile``. Then the gradients PyTorch defines at special
points (``std`` of a constant, ``maximum``/``minimum`` with NaN, ``relu``'s double
backward) under the eager and the compiled backward and ``xgrad.compile``.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from tests._backward_modes import eager_and_compiled  # noqa: F401 (fixture)

z = xgrad.zeros
i64 = jnp.int64

BAD_INPUTS = [
    # -- broadcasting: elementwise, comparisons, where, masked_fill, clamp, losses
    ("add", lambda: z(2, 3) + z(4), RuntimeError, r"^The size of tensor a \(3\) must match the size of tensor b \(4\) at non-singleton dimension 1$"),
    ("mul 3-d", lambda: z(2, 3, 5) * z(4, 1), RuntimeError, r"tensor a \(3\) must match the size of tensor b \(4\) at non-singleton dimension 1"),
    ("pow", lambda: z(2) ** z(3), RuntimeError, "must match the size of tensor b"),
    ("maximum", lambda: xgrad.maximum(z(2), z(3)), RuntimeError, "must match the size of tensor b"),
    ("lt", lambda: z(2, 3) < z(4), RuntimeError, r"tensor a \(3\) must match the size of tensor b \(4\)"),
    ("logical_and", lambda: xgrad.logical_and(z(2) > 0, z(3) > 0), RuntimeError, "must match the size of tensor b"),
    ("where", lambda: xgrad.where(z(2, 3) > 0, z(4), 0.0), RuntimeError, r"tensor a \(3\) must match the size of tensor b \(4\)"),
    ("masked_fill", lambda: z(2, 3).masked_fill(z(4) > 0, 0.0), RuntimeError, r"tensor a \(4\) must match the size of tensor b \(3\)"),
    ("masked_select", lambda: xgrad.masked_select(z(2, 3), z(4) > 0), RuntimeError, "must match the size of tensor b"),
    ("clamp", lambda: xgrad.clamp(z(2, 3), z(4)), RuntimeError, "must match the size of tensor b"),
    ("mse_loss", lambda: xgrad.mse_loss(z(2, 3), z(4)), RuntimeError, "must match the size of tensor b"),
    # -- contractions
    ("matmul 2-d", lambda: z(2, 3) @ z(2, 3), RuntimeError, r"^mat1 and mat2 shapes cannot be multiplied \(2x3 and 2x3\)$"),
    ("matmul 1-d", lambda: z(3) @ z(2), RuntimeError, r"^inconsistent tensor size, expected tensor \[3\] and src \[2\]"),
    ("matmul mat-vec", lambda: z(2, 3) @ z(2), RuntimeError, r"^size mismatch, got input \(2\), mat \(2x3\), vec \(2\)$"),
    ("matmul vec-mat", lambda: z(3) @ z(2, 3), RuntimeError, r"shapes cannot be multiplied \(1x3 and 2x3\)"),
    ("matmul batch-mat", lambda: z(2, 2, 3) @ z(2, 3), RuntimeError, r"shapes cannot be multiplied \(4x3 and 2x3\)"),
    ("matmul batched", lambda: z(2, 2, 3) @ z(2, 2, 3), RuntimeError, r"^Expected size for first two dimensions of batch2 tensor to be: \[2, 3\] but got: \[2, 2\]\.$"),
    ("matmul batch dims", lambda: z(2, 2, 3) @ z(3, 3, 3), RuntimeError, r"tensor a \(2\) must match the size of tensor b \(3\) at non-singleton dimension 0"),
    ("matmul 0-d", lambda: z() @ z(3), RuntimeError, r"^both arguments to matmul need to be at least 1D, but they are 0D and 1D$"),
    ("matmul int float", lambda: z(1, 2, dtype=i64) @ z(2, 2), RuntimeError, r"^expected m1 and m2 to have the same dtype, but got: long int != (float|double)$"),
    ("matmul int int32", lambda: z(2, 2, dtype=i64) @ z(2, 2, dtype=jnp.int32) @ z(2, 2, dtype=jnp.bool_), RuntimeError, "long int != bool"),
    ("dot int float", lambda: z(2, dtype=i64) @ z(2), RuntimeError, r"^dot : expected both vectors to have same dtype, but found Long and"),
    ("linear", lambda: xgrad.linear(z(2, 3), z(4, 2)), RuntimeError, r"shapes cannot be multiplied \(2x3 and 2x4\)"),
    ("linear int", lambda: xgrad.linear(z(2, 3, dtype=i64), z(4, 3)), RuntimeError, "expected m1 and m2 to have the same dtype, but got: long int"),
    ("linear bias", lambda: xgrad.linear(z(2, 3), z(4, 3), z(3)), RuntimeError, r"The expanded size of the tensor \(4\) must match the existing size \(3\)"),
    ("bmm", lambda: xgrad.bmm(z(2, 2, 3), z(2, 2, 3)), RuntimeError, r"batch2 tensor to be: \[2, 3\] but got: \[2, 2\]"),
    ("baddbmm", lambda: xgrad.baddbmm(z(2, 3), z(1, 2, 3), z(1, 2, 3)), RuntimeError, r"batch2 tensor to be: \[1, 3\] but got: \[1, 2\]"),
    ("einsum sizes", lambda: xgrad.einsum("ij,jk->ik", z(2, 3), z(2, 3)), RuntimeError, r"^einsum\(\): subscript j has size 2 for operand 1 which does not broadcast with previously seen size 3$"),
    ("einsum operands", lambda: xgrad.einsum("ij,jk->ik", z(2, 3)), RuntimeError, r"^einsum\(\): fewer operands were provided than specified in the equation$"),
    ("einsum ndim", lambda: xgrad.einsum("ij,jk->ik", z(2, 3), z(3)), RuntimeError, r"the number of subscripts in the equation \(2\) does not match the number of dimensions \(1\) for operand 1"),
    ("sdpa q k", lambda: xgrad.scaled_dot_product_attention(z(1, 2, 3), z(1, 2, 4), z(1, 2, 4)), RuntimeError, r"batch2 tensor to be: \[1, 3\] but got: \[1, 4\]"),
    ("sdpa v", lambda: xgrad.scaled_dot_product_attention(z(1, 2, 3), z(1, 2, 3), z(1, 4, 4)), RuntimeError, r"batch2 tensor to be: \[1, 2\] but got: \[1, 4\]"),
    ("sdpa mask", lambda: xgrad.scaled_dot_product_attention(z(1, 2, 3), z(1, 2, 3), z(1, 2, 3), attn_mask=z(3, 3)), RuntimeError, "must match the size of tensor b"),
    # -- conv2d
    ("conv2d negative padding", lambda: xgrad.conv2d(z(1, 1, 4, 4), z(1, 1, 3, 3), padding=-1), RuntimeError, "^negative padding is not supported$"),
    ("conv2d same strided", lambda: xgrad.conv2d(z(1, 1, 4, 4), z(1, 1, 3, 3), padding="same", stride=2), RuntimeError, "^padding='same' is not supported for strided convolutions$"),
    ("conv2d kernel too large", lambda: xgrad.conv2d(z(1, 1, 2, 2), z(1, 1, 3, 3)), RuntimeError, r"^Calculated padded input size per channel: \(2 x 2\)\. Kernel size: \(3 x 3\)\. Kernel size can't be greater than actual input size$"),
    ("conv2d stride 0", lambda: xgrad.conv2d(z(1, 1, 4, 4), z(1, 1, 3, 3), stride=0), RuntimeError, "^non-positive stride is not supported$"),
    ("conv2d dilation 0", lambda: xgrad.conv2d(z(1, 1, 4, 4), z(1, 1, 3, 3), dilation=0), RuntimeError, r"^dilation should be greater than zero, but got \[0, 0\]$"),
    ("conv2d groups 0", lambda: xgrad.conv2d(z(1, 1, 4, 4), z(1, 1, 3, 3), groups=0), RuntimeError, "^non-positive groups is not supported$"),
    ("conv2d groups", lambda: xgrad.conv2d(z(1, 2, 4, 4), z(3, 1, 3, 3), groups=2), RuntimeError, "expected weight to be divisible by 2 at dimension 0"),
    ("conv2d channels", lambda: xgrad.conv2d(z(1, 2, 4, 4), z(1, 1, 3, 3)), RuntimeError, r"^Given groups=1, weight of size \[1, 1, 3, 3\], expected input\[1, 2, 4, 4\] to have 1 channels, but got 2 channels instead$"),
    ("conv2d padding string", lambda: xgrad.conv2d(z(1, 1, 4, 4), z(1, 1, 3, 3), padding="bogus"), RuntimeError, "^Invalid padding string: 'bogus'$"),
    ("conv2d 2-d input", lambda: xgrad.conv2d(z(4, 4), z(1, 1, 3, 3)), RuntimeError, r"^Expected 3D \(unbatched\) or 4D \(batched\) input to conv2d, but got input of size: \[4, 4\]$"),
    ("conv2d bias", lambda: xgrad.conv2d(z(1, 1, 4, 4), z(2, 1, 3, 3), z(3)), RuntimeError, r"expected bias to be 1-dimensional with 2 elements, but got bias of size \[3\] instead"),
    ("conv2d dtypes", lambda: xgrad.conv2d(z(1, 1, 4, 4, dtype=i64), z(1, 1, 3, 3)), RuntimeError, "^expected scalar type Long but found"),
    # -- dtypes PyTorch's kernels refuse
    ("softmax int", lambda: xgrad.softmax(xgrad.tensor([1, 2]), 0), NotImplementedError, "^\"softmax_lastdim_kernel_impl\" not implemented for '(Long|Int)'$"),
    ("log_softmax int", lambda: xgrad.log_softmax(xgrad.tensor([1, 2]), 0), NotImplementedError, "\"log_softmax_lastdim_kernel_impl\" not implemented"),
    ("cross_entropy int", lambda: xgrad.cross_entropy(xgrad.tensor([[1, 2]]), xgrad.tensor([0])), NotImplementedError, "\"log_softmax_lastdim_kernel_impl\" not implemented"),
    ("softmax int dim 0", lambda: xgrad.softmax(xgrad.tensor([[1, 2]]), 0), NotImplementedError, "^\"softmax_kernel_impl\" not implemented"),
    ("gelu int", lambda: xgrad.gelu(xgrad.tensor([1])), NotImplementedError, "^\"GeluKernelImpl\" not implemented for '(Long|Int)'$"),
    ("silu bool", lambda: xgrad.silu(xgrad.tensor([True])), NotImplementedError, "^\"silu_cpu\" not implemented for 'Bool'$"),
    ("softplus int", lambda: xgrad.softplus(xgrad.tensor([1])), NotImplementedError, "\"softplus_cpu\" not implemented"),
    ("abs bool", lambda: xgrad.abs(xgrad.tensor([True])), NotImplementedError, "^\"abs_cpu\" not implemented for 'Bool'$"),
    ("relu bool", lambda: xgrad.relu(xgrad.tensor([True])), RuntimeError, "^Boolean inputs not supported for relu$"),
    ("neg bool", lambda: -xgrad.tensor([True]), RuntimeError, "^Negation, the `-` operator, on a bool tensor is not supported"),
    ("sub bools", lambda: xgrad.tensor([True]) - xgrad.tensor([False]), RuntimeError, "^Subtraction, the `-` operator, with two bool tensors is not supported"),
    ("sub a bool", lambda: 1.0 - xgrad.tensor([True]), RuntimeError, "^Subtraction, the `-` operator, with a bool tensor is not supported"),
    ("matmul bools", lambda: xgrad.tensor([[True]]) @ xgrad.tensor([[True]]), NotImplementedError, "^\"addmm_impl_cpu_\" not implemented for 'Bool'$"),
    ("norm int", lambda: xgrad.tensor([3, 4]).norm(), RuntimeError, "^linalg.vector_norm: Expected a floating point or complex tensor as input. Got (Long|Int)$"),
    ("normalize bool", lambda: xgrad.normalize(xgrad.tensor([True]), dim=0), RuntimeError, "Got Bool$"),
    ("dropout int", lambda: xgrad.dropout(xgrad.tensor([1, 2]), 0.5), RuntimeError, "^result type Float can't be cast to the desired output type (Long|Int)$"),
    ("mse_loss int", lambda: xgrad.mse_loss(xgrad.tensor([1]), xgrad.tensor([2])), NotImplementedError, "^\"mse_cpu\" not implemented"),
    ("layer_norm int", lambda: xgrad.layer_norm(xgrad.tensor([[1, 2]]), (2,)), NotImplementedError, "\"LayerNormKernelImpl\" not implemented"),
    ("nll_loss int", lambda: xgrad.nll_loss(xgrad.tensor([[1, 2]]), xgrad.tensor([0])), NotImplementedError, "\"nll_loss_out_frame\" not implemented"),
    ("bce int", lambda: xgrad.binary_cross_entropy(xgrad.tensor([1]), xgrad.tensor([1])), NotImplementedError, "\"binary_cross_entropy\" not implemented"),
    ("bce with logits int", lambda: xgrad.binary_cross_entropy_with_logits(xgrad.tensor([1]), xgrad.tensor([1])), NotImplementedError, "\"log_sigmoid_cpu\" not implemented"),
    ("interpolate int", lambda: xgrad.interpolate(xgrad.ones(1, 1, 2, 2, dtype=i64), size=(3, 3)), NotImplementedError, "\"upsample_nearest2d_channels_last\" not implemented"),
    ("interpolate empty", lambda: xgrad.interpolate(z(1, 1, 2, 2), size=(0, 2)), RuntimeError, r"^Input and output sizes should be greater than 0, but got input \(H: 2, W: 2\) output \(H: 0, W: 2\)$"),
    ("topk bool", lambda: xgrad.topk(xgrad.tensor([True, False]), 1), RuntimeError, "^topk does not support bool dtypes"),
    ("argmax bool", lambda: xgrad.argmax(xgrad.tensor([True, False])), RuntimeError, r"^argmax\(\): does not support bool input$"),
    ("argmin bool", lambda: xgrad.argmin(xgrad.tensor([True, False]), 0), RuntimeError, r"^argmin\(\): does not support bool input$"),
    # -- indexing and reductions
    ("float index", lambda: z(3)[xgrad.tensor([0.0])], IndexError, "^tensors used as indices must be long, int, byte or bool tensors$"),
    ("float index write", lambda: z(3).__setitem__(xgrad.tensor([0.0]), 1.0), IndexError, "^tensors used as indices must be long"),
    ("index shapes", lambda: z(3, 3)[xgrad.tensor([0, 1]), xgrad.tensor([0, 1, 2])], IndexError, r"^shape mismatch: indexing tensors could not be broadcast together with shapes \[2\], \[3\]$"),
    ("index_select float index", lambda: xgrad.index_select(z(3), 0, xgrad.tensor([0.0])), RuntimeError, r"^index_select\(\): Expected dtype int32 or int64 for index"),
    ("scatter_add dtypes", lambda: xgrad.scatter_add(z(3), 0, xgrad.tensor([0]), xgrad.tensor([1])), RuntimeError, r"^scatter\(\): Expected self.dtype to be equal to src.dtype$"),
    ("pad crops past nothing", lambda: xgrad.pad(z(3), (-2, -2)), RuntimeError, r"^narrow\(\): length must be non-negative\.$"),
    ("amax empty dim", lambda: xgrad.amax(z(2, 0), 1), IndexError, r"^amax\(\): Expected reduction dim 1 to have non-zero size\.$"),
    ("amin empty dim", lambda: xgrad.amin(z(0, 2), 0), IndexError, r"^amin\(\): Expected reduction dim 0 to have non-zero size\.$"),
    ("amax empty", lambda: xgrad.amax(z(2, 0)), RuntimeError, r"^amax\(\): Expected reduction dim to be specified for input.numel\(\) == 0"),
    # -- sequences and sizes
    ("cat tensor", lambda: xgrad.cat(z(2, 2)), TypeError, r"^cat\(\): argument 'tensors' \(position 1\) must be tuple of Tensors, not Tensor$"),
    ("cat None", lambda: xgrad.cat([z(2), None]), TypeError, "^expected Tensor as element 1 in argument 0, but got NoneType$"),
    ("stack tensor", lambda: xgrad.stack(z(2)), TypeError, r"^stack\(\): argument 'tensors' \(position 1\) must be tuple of Tensors, not Tensor$"),
    ("stack empty", lambda: xgrad.stack([]), RuntimeError, "^stack expects a non-empty TensorList$"),
    ("reshape floats", lambda: z(6).reshape(2.0, 3.0), TypeError, r"^reshape\(\): argument 'shape' \(position 1\) must be tuple of ints, but found element of type float at pos 0$"),
    ("view floats", lambda: z(6).view((2, 3.0)), TypeError, "but found element of type float at pos 1"),
    ("permute floats", lambda: z(2, 3).permute(0.0, 1), TypeError, r"^permute\(\): argument 'dims'"),
    ("movedim lengths", lambda: xgrad.movedim(z(2, 3, 4), (0, 1), (2,)), RuntimeError, r"^movedim: Invalid source or destination dims: source \(\[0, 1\] dims\) should contain the same number of dims as destination \(\[2\] dims\)$"),
    ("movedim repeated", lambda: xgrad.movedim(z(2, 3, 4), (0, 0), (2, 1)), RuntimeError, r"^movedim: repeated dim in `source` \(\[0, 0\]\)$"),
    ("movedim range", lambda: xgrad.movedim(z(2, 3), 2, 0), IndexError, "Dimension out of range"),
    ("diag 3-d", lambda: xgrad.diag(z(2, 2, 2)), RuntimeError, r"^diag\(\): Supports 1D or 2D tensors\. Got 3D$"),
    ("unfold too large", lambda: z(5).unfold(0, 6, 1), RuntimeError, "^maximum size for tensor at dimension 0 is 5 but size is 6$"),
    ("unfold step 0", lambda: z(5).unfold(0, 2, 0), RuntimeError, "^step is 0 but must be > 0$"),
    ("unfold negative size", lambda: z(5).unfold(0, -1, 1), RuntimeError, "^size is -1 but must be >= 0$"),
    ("float of many", lambda: float(z(2)), ValueError, "^only one element tensors can be converted to Python scalars$"),
    ("int of many", lambda: int(z(2, 2)), ValueError, "^only one element tensors can be converted to Python scalars$"),
]


@pytest.mark.parametrize("call, error, message", [r[1:] for r in BAD_INPUTS], ids=[r[0] for r in BAD_INPUTS])
def test_bad_input_raises_pytorchs_error(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("name", ["add", "matmul 2-d", "conv2d channels", "einsum sizes", "index shapes"])
def test_shape_rules_hold_inside_xgrad_compile(name):
    # The rule runs when the step is traced: the same error, not JAX's.
    _, call, error, message = next(r for r in BAD_INPUTS if r[0] == name)
    step = xgrad.compile(lambda: call(), fallback="error")
    with pytest.raises(error, match=message.rstrip("$")):  # the step's trace appends JAX's note
        step()


def test_a_rule_runs_once_per_signature():
    # The rule runs inside the jitted forward's trace: a cache hit does not call it again.
    from xgrad.ops import shape_rules

    calls = []
    original = shape_rules._matmul_shapes
    shape_rules._matmul_shapes = lambda *a: calls.append(a) or original(*a)
    try:
        a, b = xgrad.ones(7, 13), xgrad.ones(13, 5)  # a signature no other test uses
        for _ in range(3):
            a @ b
    finally:
        shape_rules._matmul_shapes = original
    assert len(calls) == 1


VALID_EDGES = [
    ("matmul with an empty dim", lambda: z(2, 3, 1) @ z(1, 0), np.zeros((2, 3, 0))),
    ("conv2d unbatched", lambda: xgrad.conv2d(xgrad.ones(1, 3, 3), xgrad.ones(1, 1, 2, 2)), np.full((1, 2, 2), 4.0)),
    ("conv2d kernel equal to the padded input", lambda: xgrad.conv2d(xgrad.ones(1, 1, 1, 1), xgrad.ones(1, 1, 3, 3), padding=1), np.ones((1, 1, 1, 1))),
    ("max of two tensors", lambda: xgrad.max(xgrad.tensor([1.0, 3.0]), xgrad.tensor([2.0, 0.0])), [2.0, 3.0]),
    ("min of two tensors", lambda: xgrad.min(xgrad.tensor([1.0, 3.0]), xgrad.tensor([2.0, 0.0])), [1.0, 0.0]),
    ("gather empty index of lower rank", lambda: xgrad.gather(z(2, 3), 1, xgrad.zeros(0, dtype=i64)), np.zeros(0)),
    ("reshape NumPy ints", lambda: z(6).reshape(np.int64(2), 3), np.zeros((2, 3))),
    ("sigmoid of ints", lambda: xgrad.sigmoid(xgrad.tensor([0, 0])), [0.5, 0.5]),
    ("rsqrt of ints", lambda: xgrad.rsqrt(xgrad.tensor([1, 4])), [1.0, 0.5]),
    ("sign of bools", lambda: xgrad.sign(xgrad.tensor([True, False])), [True, False]),
    ("mse_loss int input, float target", lambda: xgrad.mse_loss(xgrad.tensor([1, 2]), xgrad.tensor([1.0, 4.0])), 2.0),
    ("dropout int, eval", lambda: xgrad.dropout(xgrad.tensor([1, 2]), 0.5, training=False), [1, 2]),
    ("pad with negative widths crops", lambda: xgrad.pad(xgrad.arange(4.0), (-1, 1), value=9.0), [1.0, 2.0, 3.0, 9.0]),
    ("unfold empty windows", lambda: z(5).unfold(0, 0, 1), np.zeros((6, 0))),
    ("unfold 0-dim", lambda: xgrad.tensor(2.0).unfold(0, 1, 1), [2.0]),
    ("diag beyond the matrix", lambda: xgrad.diag(z(2, 3), 5), np.zeros(0)),
    ("movedim as moveaxis", lambda: xgrad.ones(2, 3, 4).moveaxis(0, 2), np.ones((3, 4, 2))),
    # PyTorch refuses two float widths; xgrad promotes them, as JAX does (x64 makes xgrad.ones float64).
    ("matmul float32 float64", lambda: xgrad.ones(1, 2, dtype=jnp.float32) @ xgrad.ones(2, 1), [[2.0]]),
    ("einsum broadcast size 1", lambda: xgrad.einsum("ij,ij->ij", xgrad.ones(2, 1), xgrad.ones(2, 3)), np.ones((2, 3))),
]


@pytest.mark.parametrize("call, expected", [r[1:] for r in VALID_EDGES], ids=[r[0] for r in VALID_EDGES])
def test_valid_edge_cases(call, expected):
    out = call()
    assert out.shape == np.shape(expected)
    np.testing.assert_allclose(out.detach().numpy(), expected)


# -- gradients PyTorch defines ----------------------------------------------------------
def _grads(fn, *values, compiled_step=False):
    """``fn``'s input gradients through ``backward()``: eagerly (the fixture picks the engine) or in ``xgrad.compile``."""
    leaves = [xgrad.tensor(v, dtype=jnp.float64, requires_grad=True) for v in values]

    def step():
        for t in leaves:
            t.grad = None
        fn(*leaves).sum().backward()

    (xgrad.compile(step, fallback="error") if compiled_step else step)()
    return [t.grad.detach().numpy() for t in leaves]


STEP = pytest.mark.parametrize("compiled_step", [False, True], ids=["step", "xgrad.compile"])


@pytest.mark.usefixtures("eager_and_compiled")
@STEP
@pytest.mark.parametrize(
    "call, values, expected",
    [
        (lambda t: t.std(dim=0), [[1.0, 2.0], [1.0, 3.0]], [[0.0, -math.sqrt(0.5)], [0.0, math.sqrt(0.5)]]),
        (lambda t: t.std(correction=0), [1.0], [0.0]),
        (lambda t: t.std(), [2.0, 2.0, 2.0], [0.0, 0.0, 0.0]),
        (lambda t: t.std(dim=1, keepdim=True, correction=0), [[1.0, 1.0], [0.0, 2.0]], [[0.0, 0.0], [-0.5, 0.5]]),
    ],
    ids=["dim=0 constant column", "one element, correction=0", "constant", "keepdim"],
)
def test_std_gradient_is_zero_where_std_is_zero(call, values, expected, compiled_step):
    (grad,) = _grads(call, values, compiled_step=compiled_step)
    np.testing.assert_allclose(grad, expected, atol=1e-12)


@pytest.mark.usefixtures("eager_and_compiled")
@STEP
@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_maximum_minimum_send_the_gradient_through_a_nan_operand(op, compiled_step):
    # PyTorch: where(x == y, g / 2, g) masked to 0 where x loses; with a NaN operand neither
    # comparison holds, so both operands get the whole gradient (values from PyTorch 2.13).
    nan = math.nan
    x, y = [nan, 1.0, 2.0, nan, 3.0], [0.0, 2.0, 2.0, nan, 1.0]
    gx, gy = _grads(getattr(xgrad, op), x, y, compiled_step=compiled_step)
    wins = [1.0, 0.0, 0.5, 1.0, 1.0] if op == "maximum" else [1.0, 1.0, 0.5, 1.0, 0.0]
    loses = [1.0, 1.0, 0.5, 1.0, 0.0] if op == "maximum" else [1.0, 0.0, 0.5, 1.0, 1.0]
    np.testing.assert_allclose(gx, wins)
    np.testing.assert_allclose(gy, loses)


@pytest.mark.usefixtures("eager_and_compiled")
@pytest.mark.parametrize(
    "call, shape, requires_grad",
    [
        (xgrad.relu, (3,), True),
        (xgrad.relu, (0,), True),
        (lambda a: a.exp(), (0,), True),
        (lambda a: xgrad.roll(a, 1, 0), (3,), False),
        (lambda a: xgrad.roll(a, 1, 0), (0,), False),
        (lambda a: xgrad.index_select(a, 0, xgrad.tensor([0, 2])), (3,), False),
        (lambda a: a * 2, (0,), False),
        (lambda a: xgrad.maximum(a, a * 0), (3,), False),
        (lambda a: a.clamp(-0.5, 0.5), (3,), False),
        (lambda a: a.clamp(-0.5, 0.5), (0,), False),
        (lambda a: a.amax(), (3,), False),
        (lambda a: xgrad.roll(xgrad.relu(a), 1, 0), (3,), True),
        (lambda a: xgrad.roll(a, 1, 0) * a, (0,), True),
    ],
    ids=["relu", "relu empty", "exp empty", "roll", "roll empty", "index_select", "mul empty", "maximum", "clamp",
         "clamp empty", "amax", "roll of relu", "roll times input, empty"],
)
def test_create_graph_grad_requires_grad_as_pytorchs(call, shape, requires_grad):
    # PyTorch 2.13: relu's backward (threshold_backward) is differentiable in relu's output, with
    # a zero derivative, so its grad requires grad and the second derivative is zeros, not None;
    # maximum's, clamp's and amax's read their input through comparisons only: no grad. The
    # compiled backward decides it from its program's data flow, op by op, as eager does.
    a = xgrad.tensor(np.linspace(-1.0, 1.0, shape[0]), requires_grad=True)
    (g,) = xgrad.autograd.grad(call(a).sum(), a, create_graph=True)
    assert g.requires_grad is requires_grad
    if requires_grad:
        (gg,) = xgrad.autograd.grad(g.sum(), a, allow_unused=True)
        assert gg is not None and gg.shape == shape and not np.any(gg.detach().numpy())


@pytest.mark.usefixtures("eager_and_compiled")
def test_empty_matmul_and_linear_backward():
    a, b = xgrad.zeros(2, 3, 1, requires_grad=True), xgrad.zeros(1, 0, requires_grad=True)
    (a @ b).sum().backward()
    assert a.grad.shape == (2, 3, 1) and b.grad.shape == (1, 0)
    x, w = xgrad.zeros(2, 0, 3, requires_grad=True), xgrad.ones(4, 3, requires_grad=True)
    xgrad.linear(x, w).sum().backward()
    assert x.grad.shape == (2, 0, 3)
    np.testing.assert_array_equal(w.grad.detach().numpy(), np.zeros((4, 3)))


@pytest.mark.usefixtures("eager_and_compiled")
def test_gather_with_an_empty_index_of_lower_rank_has_its_shape():
    x = xgrad.ones(2, 3, requires_grad=True)
    out = xgrad.gather(x, 1, xgrad.zeros(0, dtype=i64))
    assert out.shape == (0,) and out.requires_grad
    out.sum().backward()
    np.testing.assert_array_equal(x.grad.detach().numpy(), np.zeros((2, 3)))


def _along_loops(x: np.ndarray, dim: int, index: np.ndarray, src: np.ndarray | None = None) -> np.ndarray:
    """torch.gather (``src`` None) or scatter_add by their definition, one index at a time."""
    out = np.zeros(index.shape) if src is None else x.copy()
    for at in np.ndindex(index.shape):
        to = list(at)
        to[dim] = index[at]
        if src is None:
            out[at] = x[tuple(to)]
        else:
            out[tuple(to)] += src[at]
    return out


@pytest.mark.usefixtures("eager_and_compiled")
@pytest.mark.parametrize("step", ["eager", "xgrad.compile"])
def test_gather_and_scatter_add_with_an_index_smaller_than_the_input_in_other_dims(step):
    # PyTorch reads the leading part of the other dims (NOTE [Gather along a dim is batched]).
    rng = np.random.default_rng(0)
    x_value, weights = rng.normal(size=(4, 5, 3)), rng.normal(size=(4, 5, 3))
    index_value, src_value = rng.integers(0, 5, size=(3, 4, 2)), rng.normal(size=(3, 4, 2))
    x = xgrad.tensor(x_value, requires_grad=True)
    src = xgrad.tensor(src_value, requires_grad=True)
    index = xgrad.tensor(index_value)

    def run():
        picked = xgrad.gather(x, 1, index)
        added = xgrad.scatter_add(x, 1, index, src)
        ((picked * picked).sum() + (added * xgrad.tensor(weights)).sum()).backward()
        return picked, added

    picked, added = (xgrad.compile(run, fallback="error") if step == "xgrad.compile" else run)()
    expected = _along_loops(x_value, 1, index_value)
    np.testing.assert_allclose(picked.detach().numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(added.detach().numpy(), _along_loops(x_value, 1, index_value, src_value), rtol=1e-12)
    # d/dx: the squares' 2 * picked scattered back, plus the weights (scatter_add passes x through)
    np.testing.assert_allclose(x.grad.detach().numpy(), _along_loops(weights, 1, index_value, 2 * expected), rtol=1e-12)
    np.testing.assert_allclose(src.grad.detach().numpy(), _along_loops(weights, 1, index_value), rtol=1e-12)


# -- what PyTorch accepts ----------------------------------------------------------------
@pytest.mark.usefixtures("eager_and_compiled")
@pytest.mark.parametrize("index", [0, [0, 2]], ids=["basic", "advanced"])
def test_setitem_value_with_extra_leading_unit_dims(index):
    # PyTorch drops the value's leading size-1 dims before broadcasting it (values from PyTorch 2.13).
    v = xgrad.tensor([[[7.0, 8.0]]], requires_grad=True)
    c = xgrad.zeros(3, 2)
    c[index] = v * 1
    rows = [0] if index == 0 else [0, 2]
    np.testing.assert_array_equal(c.detach().numpy(), [[7.0, 8.0] if r in rows else [0.0, 0.0] for r in range(3)])
    (c * xgrad.arange(6.0).reshape(3, 2)).sum().backward()
    np.testing.assert_array_equal(v.grad.detach().numpy(), [[[sum(2.0 * r for r in rows), sum(2.0 * r + 1 for r in rows)]]])


@pytest.mark.usefixtures("eager_and_compiled")
@STEP
def test_write_into_one_row_of_an_expanded_tensor(compiled_step):
    # PyTorch writes the row's memory, which every row of the expand shares (values from PyTorch 2.13).
    g = xgrad.ones(2, requires_grad=True)

    def step():
        g.grad = None
        b = g * 1
        e = b.expand(3, 2)
        e[1] = xgrad.tensor([5.0, 6.0]) * g
        (e * xgrad.arange(6.0).reshape(3, 2)).sum().backward()
        return e, b

    e, b = (xgrad.compile(step, fallback="error") if compiled_step else step)()
    np.testing.assert_array_equal(e.detach().numpy(), [[5.0, 6.0]] * 3)
    np.testing.assert_array_equal(b.detach().numpy(), [5.0, 6.0])
    np.testing.assert_array_equal(g.grad.detach().numpy(), [30.0, 54.0])


def test_expanded_writes_that_repeat_elements_still_raise():
    e = xgrad.ones(1).clone().expand(3)
    e[0] = 0.0  # one element: allowed, and all of e is that element
    np.testing.assert_array_equal(e.detach().numpy(), [0.0, 0.0, 0.0])
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor refers to a single memory location"):
        xgrad.ones(1).clone().expand(2, 3)[0] = 0.0
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        xgrad.ones(1).clone().expand(3).add_(1.0)


@pytest.mark.usefixtures("eager_and_compiled")
def test_contiguous_gives_a_tensor_view_accepts():
    x = xgrad.tensor(np.arange(24.0).reshape(2, 3, 4), requires_grad=True)
    heads = x.transpose(1, 2)
    assert not heads.is_contiguous()
    merged = heads.contiguous().view(2, 12)
    np.testing.assert_array_equal(merged.detach().numpy(), np.arange(24.0).reshape(2, 3, 4).transpose(0, 2, 1).reshape(2, 12))
    (merged * xgrad.arange(24.0).reshape(2, 12)).sum().backward()
    np.testing.assert_array_equal(x.grad.detach().numpy(), np.arange(24.0).reshape(2, 4, 3).transpose(0, 2, 1))
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        heads.view(2, 12)


def test_contiguity_follows_pytorchs_strides():
    x = xgrad.zeros(2, 3, 4)
    row = x[1]
    assert x.contiguous() is x and row.contiguous() is row and row.is_contiguous()
    assert not x[:, 1].is_contiguous() and not x.transpose(0, 1).is_contiguous()
    assert xgrad.zeros(3, 1).expand(3, 1).is_contiguous() and not xgrad.zeros(3, 1).expand(3, 4).is_contiguous()


def test_legacy_tensor_constructor():
    t = xgrad.Tensor([1, 2.5])
    assert t.dtype == xgrad.get_default_dtype() == xgrad.float32 and t.tolist() == [1.0, 2.5] and not t.requires_grad  # PyTorch: the default dtype
    assert xgrad.Tensor([[1.0], [2.0]]).shape == (2, 1)


# -- modules ---------------------------------------------------------------------------------
nn = xgrad.nn

MODULE_ERRORS = [
    ("Conv2d padding string", lambda: nn.Conv2d(1, 1, 3, padding="bogus", key=0), ValueError, r"^Invalid padding string 'bogus', should be one of \{'same', 'valid'\}$"),
    ("Conv2d same strided", lambda: nn.Conv2d(1, 1, 3, padding="same", stride=2, key=0), ValueError, "^padding='same' is not supported for strided convolutions$"),
    ("Conv2d groups 0", lambda: nn.Conv2d(2, 2, 3, groups=0, key=0), ValueError, "^groups must be a positive integer$"),
    ("Conv2d in_channels", lambda: nn.Conv2d(3, 2, 3, groups=2, key=0), ValueError, "^in_channels must be divisible by groups$"),
    ("Conv2d out_channels", lambda: nn.Conv2d(2, 3, 3, groups=2, key=0), ValueError, "^out_channels must be divisible by groups$"),
    ("Conv2d negative kernel", lambda: nn.Conv2d(1, 1, -1, key=0), RuntimeError, r"^Trying to create tensor with negative dimension -1: \[1, 1, -1, -1\]$"),
    ("Conv2d stride 0", lambda: nn.Conv2d(1, 1, 3, stride=0, key=0)(z(1, 1, 4, 4)), RuntimeError, "^non-positive stride is not supported$"),
    ("Conv2d channels", lambda: nn.Conv2d(2, 3, 3, key=0)(z(1, 1, 4, 4)), RuntimeError, r"expected input\[1, 1, 4, 4\] to have 2 channels, but got 1 channels instead$"),
    ("LayerNorm negative", lambda: nn.LayerNorm(-1), RuntimeError, r"^Trying to create tensor with negative dimension -1: \[-1\]$"),
    ("Embedding negative", lambda: nn.Embedding(-3, 2, key=0), RuntimeError, r"^Trying to create tensor with negative dimension -3: \[-3, 2\]$"),
    ("BatchNorm2d channels", lambda: nn.BatchNorm2d(3)(z(2, 2, 4, 4)), RuntimeError, "^running_mean should contain 2 elements not 3$"),
    ("BatchNorm1d channels", lambda: nn.BatchNorm1d(3)(z(2, 2)), RuntimeError, "^running_mean should contain 2 elements not 3$"),
    ("BatchNorm2d rank", lambda: nn.BatchNorm2d(3)(z(2, 3)), ValueError, r"^expected 4D input \(got 2D input\)$"),
    ("Linear on int64", lambda: nn.Linear(2, 2, key=0)(z(1, 2, dtype=i64)), RuntimeError, "to have the same dtype, but got: long int != float"),
]


@pytest.mark.parametrize("call, error, message", [r[1:] for r in MODULE_ERRORS], ids=[r[0] for r in MODULE_ERRORS])
def test_bad_module_arguments_raise_pytorchs_error(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_empty_conv_kernel_builds_as_in_pytorch():
    conv = nn.Conv2d(1, 2, 0, key=0)  # PyTorch builds it: an empty weight, no fan-in for the bias bound
    assert conv.weight.shape == (2, 1, 0, 0)
    np.testing.assert_array_equal(conv.bias.detach().numpy(), np.zeros(2))
    assert nn.LayerNorm(0).weight.shape == (0,)


def test_assigning_a_non_parameter_to_a_parameter_raises():
    model = nn.Linear(2, 2, key=0)
    with pytest.raises(TypeError, match=r"^cannot assign 'float' as parameter 'weight' \(Parameter or None expected\)$"):
        model.weight = 3.0
    with pytest.raises(TypeError, match="cannot assign 'Tensor' as parameter 'weight'"):
        model.weight = xgrad.zeros(2, 2)
    assert [n for n, _ in model.named_parameters()] == ["weight", "bias"]  # nothing was dropped
    model.weight = nn.Parameter(xgrad.zeros(2, 2))
    model.bias = None
    assert [n for n, _ in model.named_parameters()] == ["weight"]
    outer = nn.Module()
    outer.inner = nn.Linear(1, 1, key=0)
    with pytest.raises(TypeError, match=r"^cannot assign 'int' as child module 'inner' \(Module or None expected\)$"):
        outer.inner = 3
    outer.inner = None
    assert list(outer.named_parameters()) == []

"""``xgrad.nn.init`` and ``xgrad.nn.utils`` against NumPy transcriptions of PyTorch's definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest

import xgrad
from xgrad import nn
from xgrad.nn import init
from xgrad.nn.utils import clip_grad_norm_, clip_grad_value_, parameters_to_vector, vector_to_parameters


def f64_zeros(*shape):
    return xgrad.zeros(*shape, dtype=np.float64)


def numpy_fans(shape):
    receptive = int(np.prod(shape[2:]))
    return shape[1] * receptive, shape[0] * receptive


@pytest.mark.parametrize(("name", "param", "gain"), [
    *[(n, None, 1.0) for n in ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                               "conv_transpose3d", "sigmoid")],
    ("tanh", None, 5 / 3), ("relu", None, math.sqrt(2)), ("selu", None, 0.75),
    ("leaky_relu", None, math.sqrt(2 / (1 + 0.01**2))), ("leaky_relu", 0.2, math.sqrt(2 / (1 + 0.04))),
    ("leaky_relu", 0, math.sqrt(2)),
])
def test_calculate_gain(name, param, gain):
    assert init.calculate_gain(name, param) == pytest.approx(gain, rel=1e-15)


def test_calculate_gain_errors():
    with pytest.raises(ValueError, match="Unsupported nonlinearity softmax"):
        init.calculate_gain("softmax")
    with pytest.raises(ValueError, match="negative_slope True not a valid number"):
        init.calculate_gain("leaky_relu", True)


def test_fill_in_place_under_no_grad_and_return_the_tensor():
    w = nn.Parameter(f64_zeros(3, 4))
    version = w._version
    assert init.normal_(w) is w
    assert w.is_leaf and w.requires_grad and w.grad_fn is None and w._version > version
    assert init.ones_(w) is w and (w.detach().numpy() == 1).all()
    assert (init.zeros_(w).detach().numpy() == 0).all()
    assert (init.constant_(w, 0.25).detach().numpy() == 0.25).all()
    np.testing.assert_array_equal(init.eye_(w).detach().numpy(), np.eye(3, 4))
    with pytest.raises(ValueError, match="Only tensors with 2 dimensions are supported"):
        init.eye_(f64_zeros(2, 2, 2))


def test_uniform_and_normal_moments():
    u = init.uniform_(f64_zeros(200, 200), -1.0, 3.0).detach().numpy()
    assert u.min() >= -1.0 and u.max() < 3.0
    assert abs(u.mean() - 1.0) < 0.03 and abs(u.std() - 4 / math.sqrt(12)) < 0.02
    n = init.normal_(f64_zeros(200, 200), mean=2.0, std=0.5).detach().numpy()
    assert abs(n.mean() - 2.0) < 0.01 and abs(n.std() - 0.5) < 0.01


def test_trunc_normal_stays_in_bounds():
    t = init.trunc_normal_(f64_zeros(100, 100), mean=0.5, std=2.0, a=-1.0, b=1.5).detach().numpy()
    assert t.min() >= -1.0 and t.max() <= 1.5 and t.std() > 0.5  # spread over the whole interval
    s = init.trunc_normal_(f64_zeros(200, 100)).detach().numpy()  # the defaults: N(0, 1) cut at +-2
    assert s.min() >= -2 and s.max() <= 2 and abs(s.mean()) < 0.03
    assert abs(s.std() - 0.8796) < 0.02  # the standard deviation of N(0, 1) truncated to [-2, 2]


SHAPE = (64, 32, 3, 3)


@pytest.mark.parametrize("gain", [1.0, 2.5])
def test_xavier_bounds_and_std(gain):
    fan_in, fan_out = numpy_fans(SHAPE)
    std = gain * math.sqrt(2.0 / (fan_in + fan_out))
    u = init.xavier_uniform_(f64_zeros(*SHAPE), gain=gain).detach().numpy()
    bound = math.sqrt(3) * std
    assert np.abs(u).max() <= bound and np.abs(u).max() > 0.99 * bound
    n = init.xavier_normal_(f64_zeros(*SHAPE), gain=gain).detach().numpy()
    assert abs(n.std() / std - 1) < 0.03


@pytest.mark.parametrize(("a", "mode", "nonlinearity"), [
    (0, "fan_in", "leaky_relu"), (math.sqrt(5), "fan_in", "leaky_relu"), (0, "fan_out", "relu"), (0, "FAN_OUT", "tanh"),
])
def test_kaiming_bounds_and_std(a, mode, nonlinearity):
    fan_in, fan_out = numpy_fans(SHAPE)
    gain = {"leaky_relu": math.sqrt(2 / (1 + a**2)), "relu": math.sqrt(2), "tanh": 5 / 3}[nonlinearity]
    std = gain / math.sqrt(fan_in if mode.lower() == "fan_in" else fan_out)
    u = init.kaiming_uniform_(f64_zeros(*SHAPE), a=a, mode=mode, nonlinearity=nonlinearity).detach().numpy()
    bound = math.sqrt(3) * std
    assert np.abs(u).max() <= bound and np.abs(u).max() > 0.99 * bound
    n = init.kaiming_normal_(f64_zeros(*SHAPE), a=a, mode=mode, nonlinearity=nonlinearity).detach().numpy()
    assert abs(n.std() / std - 1) < 0.03


def test_fan_errors_and_zero_element_warning():
    for fn in (init.xavier_uniform_, init.xavier_normal_, init.kaiming_uniform_, init.kaiming_normal_):
        with pytest.raises(ValueError, match="Fan in and fan out can not be computed for tensor with fewer than 2 dimensions"):
            fn(f64_zeros(5))
    with pytest.raises(ValueError, match=r"Mode fan_avg not supported, please use one of \['fan_in', 'fan_out'\]"):
        init.kaiming_uniform_(f64_zeros(2, 3), mode="fan_avg")
    with pytest.warns(UserWarning, match="Initializing zero-element tensors is a no-op"):
        assert init.kaiming_normal_(f64_zeros(0, 3)).shape == (0, 3)


@pytest.mark.parametrize(("shape", "gain"), [((3, 5), 1.0), ((5, 3), 2.0), ((4, 2, 3), 0.5), ((4, 4), 1.0)])
def test_orthogonal(shape, gain):
    q = init.orthogonal_(f64_zeros(*shape), gain=gain).detach().numpy().reshape(shape[0], -1)
    rows, cols = q.shape
    gram = q @ q.T if rows <= cols else q.T @ q
    np.testing.assert_allclose(gram, gain**2 * np.eye(min(rows, cols)), atol=1e-12)
    with pytest.raises(ValueError, match="Only tensors with 2 or more dimensions are supported"):
        init.orthogonal_(f64_zeros(3))


@pytest.mark.parametrize("fill", [
    lambda t, g=None: init.uniform_(t, generator=g), lambda t, g=None: init.normal_(t, generator=g),
    lambda t, g=None: init.trunc_normal_(t, generator=g), lambda t, g=None: init.xavier_normal_(t, generator=g),
    lambda t, g=None: init.kaiming_uniform_(t, generator=g), lambda t, g=None: init.orthogonal_(t, generator=g),
])
def test_reproducible_under_manual_seed_and_generator(fill):
    xgrad.manual_seed(7)
    a = fill(f64_zeros(4, 3)).detach().numpy()
    b = fill(f64_zeros(4, 3)).detach().numpy()
    xgrad.manual_seed(7)
    np.testing.assert_array_equal(fill(f64_zeros(4, 3)).detach().numpy(), a)
    assert not np.array_equal(a, b)  # each call draws afresh
    np.testing.assert_array_equal(fill(f64_zeros(4, 3), 3).detach().numpy(), fill(f64_zeros(4, 3), 3).detach().numpy())


def test_generator_keystate_and_bad_generator():
    from xgrad.generator import KeyState

    a, b = KeyState(5), KeyState(5)
    first = init.normal_(f64_zeros(3), generator=a).detach().numpy()
    np.testing.assert_array_equal(init.normal_(f64_zeros(3), generator=b).detach().numpy(), first)
    assert not np.array_equal(init.normal_(f64_zeros(3), generator=a).detach().numpy(), first)  # the state advanced
    with pytest.raises(TypeError, match="generator must be None .* got str"):
        init.uniform_(f64_zeros(3), generator="cuda")


def test_trunc_normal_warns_for_a_mean_far_from_the_interval():
    with pytest.warns(UserWarning, match=r"mean is more than 2 std from \[a, b\] in nn.init.trunc_normal_"):
        init.trunc_normal_(f64_zeros(3), mean=10.0)


def test_random_init_inside_compile_draws_as_eager():
    w = f64_zeros(3, 4)

    def reinit():
        init.kaiming_normal_(w)
        return w * 1.0

    step = xgrad.compile(reinit)
    xgrad.manual_seed(11)
    eager = [reinit().detach().numpy() for _ in range(2)]
    xgrad.manual_seed(11)
    compiled = [step().detach().numpy() for _ in range(2)]
    np.testing.assert_allclose(compiled, eager, rtol=1e-12)
    assert not np.array_equal(compiled[0], compiled[1])


def numpy_clip(grads, max_norm, norm_type):
    if norm_type == math.inf:
        total = max(np.abs(g).max() for g in grads)
    else:
        total = np.linalg.norm([np.linalg.norm(g.ravel(), norm_type) for g in grads], norm_type)
    coef = min(max_norm / (total + 1e-6), 1.0)
    return total, [g * coef for g in grads]


GRADS = [np.array([[3.0, -4.0], [1.0, 0.5]]), np.array([-2.0, 7.0, 0.25])]


def params_with_grads(grads):
    params = [nn.Parameter(xgrad.tensor(np.zeros_like(g))) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = xgrad.tensor(g)
    return params


@pytest.mark.parametrize("norm_type", [2.0, 1, math.inf, "inf", 3.0])
@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grad_norm_matches_pytorch_formula(norm_type, max_norm):
    params = params_with_grads(GRADS)
    total = clip_grad_norm_(params, max_norm, norm_type=norm_type)
    want_total, want_grads = numpy_clip(GRADS, max_norm, float(norm_type))
    assert isinstance(total, xgrad.Tensor)
    np.testing.assert_allclose(total.detach().numpy(), want_total, rtol=1e-12)
    for p, g in zip(params, want_grads, strict=True):
        np.testing.assert_allclose(p.grad.detach().numpy(), g, rtol=1e-12)


def test_clip_grad_norm_edge_cases():
    single = params_with_grads(GRADS[:1])[0]
    np.testing.assert_allclose(clip_grad_norm_(single, 1.0).detach().numpy(), np.linalg.norm(GRADS[0]), rtol=1e-12)
    assert clip_grad_norm_([nn.Parameter(f64_zeros(2))], 1.0).item() == 0.0  # no grads
    bad = params_with_grads([np.array([1.0, np.nan])])
    with pytest.raises(RuntimeError, match=r"The total norm of order 2\.0 for gradients from `parameters` is non-finite"):
        clip_grad_norm_(bad, 1.0, error_if_nonfinite=True)
    assert np.isnan(clip_grad_norm_(bad, 1.0).item())
    huge = params_with_grads([np.array([np.inf, 1.0])])
    with pytest.raises(RuntimeError, match="set `error_if_nonfinite=False`"):
        clip_grad_norm_(huge, 1.0, norm_type=1, error_if_nonfinite=True)


def test_clip_grad_value_and_vector_round_trip():
    params = params_with_grads(GRADS)
    assert clip_grad_value_(params, 1.5) is None
    for p, g in zip(params, GRADS, strict=True):
        np.testing.assert_array_equal(p.grad.detach().numpy(), np.clip(g, -1.5, 1.5))
    vec = parameters_to_vector(params)
    np.testing.assert_array_equal(vec.detach().numpy(), np.zeros(7))
    new = np.arange(7.0)
    vector_to_parameters(xgrad.tensor(new), params)
    np.testing.assert_array_equal(parameters_to_vector(params).detach().numpy(), new)
    np.testing.assert_array_equal(params[0].detach().numpy(), new[:4].reshape(2, 2))
    with pytest.raises(TypeError, match="expected torch.Tensor, but got: ndarray"):
        vector_to_parameters(new, params)


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_training_step_with_clipping_compiled_matches_eager(norm_type):
    def setup():
        model = nn.Linear(4, 3, key=0, dtype=np.float64)
        opt = xgrad.optim.SGD(model.parameters(), lr=0.1)

        def step(x, y):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).sum()
            loss.backward()
            total = clip_grad_norm_(model.parameters(), 0.5, norm_type=norm_type, error_if_nonfinite=True)
            clip_grad_value_(model.parameters(), 0.2)
            opt.step()
            return loss, total

        return model, step

    model_e, step_e = setup()
    model_c, step_c = setup()
    step_c = xgrad.compile(step_c)
    rng = np.random.default_rng(0)
    for _ in range(3):
        x, y = xgrad.tensor(rng.normal(size=(5, 4))), xgrad.tensor(rng.normal(size=(5, 3)))
        (loss_e, total_e), (loss_c, total_c) = step_e(x, y), step_c(x, y)
        np.testing.assert_allclose(loss_c.detach().numpy(), loss_e.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(total_c.detach().numpy(), total_e.detach().numpy(), rtol=1e-12)
    for pe, pc in zip(model_e.parameters(), model_c.parameters(), strict=True):
        np.testing.assert_allclose(pc.detach().numpy(), pe.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(pc.grad.detach().numpy(), pe.grad.detach().numpy(), rtol=1e-12)
    bad = xgrad.tensor(np.full((5, 4), np.inf))
    with pytest.raises(RuntimeError, match="is non-finite, so it cannot be clipped"):
        step_c(bad, xgrad.tensor(np.zeros((5, 3))))


def test_tensor_uniform_and_normal_methods():
    xgrad.manual_seed(2)
    u = f64_zeros(300).uniform_(-2.0, 1.0).detach().numpy()
    xgrad.manual_seed(2)
    np.testing.assert_array_equal(init.uniform_(f64_zeros(300), -2.0, 1.0).detach().numpy(), u)
    assert u.min() >= -2.0 and u.max() < 1.0
    xgrad.manual_seed(2)
    n = f64_zeros(300).normal_(1.0, 0.5)
    xgrad.manual_seed(2)
    np.testing.assert_array_equal(init.normal_(f64_zeros(300), 1.0, 0.5).detach().numpy(), n.detach().numpy())
    leaf = xgrad.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        leaf.normal_()
    y = leaf * 2
    y.uniform_(generator=0)  # a refill cuts the history: no gradient reaches the leaf through it
    y.sum().backward()
    np.testing.assert_array_equal(leaf.grad.detach().numpy(), np.zeros(3))

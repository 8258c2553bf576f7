"""PyTorch's optimizer API: parameter groups, state dicts, the newer optimizers, LBFGS and the schedulers.

Numbers come from tests/fixtures/torch_optim.json (written by make_torch_optim.py with
PyTorch): trajectories of two parameters in two groups, state dicts, lr sequences.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest

import xgrad
from xgrad import optim

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "torch_optim.json").read_text())
W0, B0 = [1.0, -2.0, 0.5], [0.7, -1.3]
CURVATURE, SHIFT, TARGET = np.array([1.0, 0.5, 2.0]), np.array([0.3, -1.0, 0.2]), np.array([0.5, -0.25])
STEPS, MID = 5, 3

OPTIMIZERS = {
    "sgd": ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}, {"lr": 0.05, "momentum": 0.5}),
    "sgd_nesterov": ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}, {"lr": 0.02, "weight_decay": 0.1}),
    "sgd_maximize": ("SGD", {"lr": 0.05, "maximize": True}, {"lr": 0.01}),
    "adam": ("Adam", {"lr": 0.1, "weight_decay": 0.1}, {"lr": 0.05, "betas": (0.8, 0.99)}),
    "adam_amsgrad": ("Adam", {"lr": 0.1, "amsgrad": True, "eps": 1e-3}, {"lr": 0.2, "maximize": True}),
    "adamw": ("AdamW", {"lr": 0.1, "weight_decay": 0.1}, {"lr": 0.05, "weight_decay": 0.5, "amsgrad": True}),
    "adamax": ("Adamax", {"lr": 0.1, "weight_decay": 0.05}, {"lr": 0.2, "betas": (0.5, 0.9)}),
    "nadam": ("NAdam", {"lr": 0.1, "weight_decay": 0.1}, {"lr": 0.05, "decoupled_weight_decay": True, "momentum_decay": 0.01}),
    "radam": ("RAdam", {"lr": 0.1}, {"lr": 0.2, "betas": (0.9, 0.9), "weight_decay": 0.1, "decoupled_weight_decay": True}),
    "adagrad": ("Adagrad", {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1}, {"lr": 0.3, "weight_decay": 0.1}),
    "adadelta": ("Adadelta", {"lr": 1.0}, {"lr": 0.5, "rho": 0.8, "weight_decay": 0.1}),
    "rmsprop": ("RMSprop", {"lr": 0.01, "momentum": 0.9, "centered": True}, {"lr": 0.02, "alpha": 0.9, "weight_decay": 0.1}),
}


def loss_of(w, b):
    """make_torch_optim.py's loss."""
    curvature, shift, target = (xgrad.tensor(v) for v in (CURVATURE, SHIFT, TARGET))
    return 0.5 * (curvature * w * w).sum() + (shift * w).sum() + 0.25 * (b**4).sum() - (target * b).sum() + w[0] * b[1]


def make(name, w0=W0, b0=B0):
    cls, kwargs, group1 = OPTIMIZERS[name]
    w = xgrad.tensor(np.array(w0, np.float64), requires_grad=True)
    b = xgrad.tensor(np.array(b0, np.float64), requires_grad=True)
    return w, b, getattr(optim, cls)([{"params": [w]}, {"params": [b], **group1}], **kwargs)


def train(w, b, opt, steps):
    trajectory = []
    for _ in range(steps):
        opt.zero_grad()
        loss_of(w, b).backward()
        opt.step()
        trajectory.append((w.detach().numpy().copy(), b.detach().numpy().copy()))
    return trajectory


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_two_param_groups_follow_pytorch(name):
    w, b, opt = make(name)
    want = FIXTURE["optimizers"][name]
    for step, (got_w, got_b) in enumerate(train(w, b, opt, STEPS)):
        np.testing.assert_allclose(got_w, want["w"][step], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got_b, want["b"][step], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_state_dict_has_pytorch_layout_and_pytorchs_loads_and_resumes(name):
    w, b, opt = make(name)
    train(w, b, opt, MID)
    torch_state = FIXTURE["optimizers"][name]["state_dict"]
    ours = opt.state_dict()
    assert list(ours["state"]) == [int(k) for k in torch_state["state"]]
    for i, saved in torch_state["state"].items():
        assert set(ours["state"][int(i)]) == set(saved)
        for key, value in saved.items():
            np.testing.assert_allclose(ours["state"][int(i)][key].numpy(), value, rtol=1e-9, atol=1e-12)
    for group, saved in zip(ours["param_groups"], torch_state["param_groups"], strict=True):
        assert {k: list(v) if isinstance(v, tuple) else v for k, v in group.items()} == saved
    # PyTorch's state dict (arrays for tensors) into a fresh optimizer at PyTorch's parameters: the same next steps.
    want = FIXTURE["optimizers"][name]
    w, b, fresh = make(name, want["w"][MID - 1], want["b"][MID - 1])
    as_arrays = {int(i): {k: np.asarray(v) for k, v in s.items()} for i, s in torch_state["state"].items()}
    fresh.load_state_dict({"state": as_arrays, "param_groups": torch_state["param_groups"]})
    for step, (got_w, got_b) in enumerate(train(w, b, fresh, STEPS - MID), start=MID):
        np.testing.assert_allclose(got_w, want["w"][step], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got_b, want["b"][step], rtol=1e-9, atol=1e-12)


def test_resumed_training_gives_the_uninterrupted_losses():
    w, b, opt = make("adamw")
    uninterrupted = [float(loss_of(*p)) for p in (map(xgrad.tensor, wb) for wb in train(w, b, opt, STEPS))]
    w, b, opt = make("adamw")
    train(w, b, opt, MID)
    saved, saved_params = opt.state_dict(), (w.detach().numpy(), b.detach().numpy())
    w, b, resumed = make("adamw", *saved_params)
    resumed.load_state_dict(saved)
    losses = [float(loss_of(*p)) for p in (map(xgrad.tensor, wb) for wb in train(w, b, resumed, STEPS - MID))]
    np.testing.assert_allclose(losses, uninterrupted[MID:], rtol=1e-12)


# -- NumPy transcriptions of PyTorch's documented algorithms, one group ---------------------------


def grad_at(p):
    return CURVATURE * p + SHIFT


def numpy_adagrad(p, steps, lr, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10):
    total, out = np.full_like(p, initial_accumulator_value), []
    for t in range(1, steps + 1):
        g = grad_at(p) + weight_decay * p
        total = total + g * g
        p = p - lr / (1 + (t - 1) * lr_decay) * g / (np.sqrt(total) + eps)
        out.append(p)
    return out


def numpy_rmsprop(p, steps, lr, alpha=0.99, eps=1e-8, momentum=0.0, centered=False):
    square_avg, grad_avg, buf, out = 0 * p, 0 * p, 0 * p, []
    for _ in range(steps):
        g = grad_at(p)
        square_avg = alpha * square_avg + (1 - alpha) * g * g
        grad_avg = alpha * grad_avg + (1 - alpha) * g
        avg = np.sqrt(square_avg - grad_avg**2 if centered else square_avg) + eps
        buf = momentum * buf + g / avg
        p = p - lr * (buf if momentum else g / avg)
        out.append(p)
    return out


def numpy_adadelta(p, steps, lr=1.0, rho=0.9, eps=1e-6):
    square_avg, acc_delta, out = 0 * p, 0 * p, []
    for _ in range(steps):
        g = grad_at(p)
        square_avg = rho * square_avg + (1 - rho) * g * g
        delta = np.sqrt(acc_delta + eps) / np.sqrt(square_avg + eps) * g
        acc_delta = rho * acc_delta + (1 - rho) * delta * delta
        p = p - lr * delta
        out.append(p)
    return out


def numpy_adam_variant(p, steps, kind, lr, betas=(0.9, 0.999), eps=1e-8, momentum_decay=4e-3):
    b1, b2 = betas
    m, v, u, mu_product, out = 0 * p, 0 * p, 0 * p, 1.0, []
    for t in range(1, steps + 1):
        g = grad_at(p)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        if kind == "adamax":
            u = np.maximum(b2 * u, np.abs(g) + eps)
            p = p - lr / (1 - b1**t) * m / u
        elif kind == "nadam":
            mu, mu_next = (b1 * (1 - 0.5 * 0.96 ** (s * momentum_decay)) for s in (t, t + 1))
            mu_product = float(np.float32(mu_product) * np.float32(mu))  # PyTorch keeps it in float32
            denom = np.sqrt(v / (1 - b2**t)) + eps
            p = p - lr * (1 - mu) / (1 - mu_product) * g / denom - lr * mu_next / (1 - mu_product * mu_next) * m / denom
        else:  # radam
            rho_inf = 2 / (1 - b2) - 1
            rho_t = rho_inf - 2 * t * b2**t / (1 - b2**t)
            if rho_t > 5:
                rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
                p = p - lr * m / (1 - b1**t) * rect * math.sqrt(1 - b2**t) / (np.sqrt(v) + eps)
            else:
                p = p - lr * m / (1 - b1**t)
        out.append(p)
    return out


NUMPY_CASES = [
    ("Adagrad", {"lr": 0.2, "lr_decay": 0.1, "weight_decay": 0.05, "initial_accumulator_value": 0.3}, numpy_adagrad),
    ("RMSprop", {"lr": 0.01, "alpha": 0.9, "momentum": 0.5, "centered": True}, numpy_rmsprop),
    ("RMSprop", {"lr": 0.01}, numpy_rmsprop),
    ("Adadelta", {"lr": 0.5, "rho": 0.8}, numpy_adadelta),
    ("Adamax", {"lr": 0.1, "betas": (0.8, 0.9)}, lambda p, n, **k: numpy_adam_variant(p, n, "adamax", **k)),
    ("NAdam", {"lr": 0.1, "momentum_decay": 0.01}, lambda p, n, **k: numpy_adam_variant(p, n, "nadam", **k)),
    ("RAdam", {"lr": 0.1, "betas": (0.9, 0.9)}, lambda p, n, **k: numpy_adam_variant(p, n, "radam", **k)),
]


@pytest.mark.parametrize(("cls", "kwargs", "reference"), NUMPY_CASES, ids=[c[0] + ",".join(c[1]) for c in NUMPY_CASES])
def test_updates_follow_numpy_transcriptions(cls, kwargs, reference):
    p = xgrad.tensor(np.array(W0), requires_grad=True)
    opt = getattr(optim, cls)([p], **kwargs)
    got = []
    for _ in range(6):
        opt.zero_grad()
        (xgrad.tensor(CURVATURE) * p * p / 2 + xgrad.tensor(SHIFT) * p).sum().backward()
        opt.step()
        got.append(p.detach().numpy().copy())
    np.testing.assert_allclose(got, reference(np.array(W0), 6, **kwargs), rtol=1e-10, atol=1e-12)

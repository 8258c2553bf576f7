"""PyTorch's optimizer API: parameter groups, state dicts, the newer optimizers, LBFGS and the schedulers.

Numbers come from tests/fixtures/torch_optim.json (written by make_torch_optim.py with
PyTorch): trajectories of two parameters in two groups, state dicts, lr sequences.
"""

import json
import math
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

import xgrad
from tests._backward_modes import eager_and_compiled  # noqa: F401 (a fixture)
from xgrad import optim
from xgrad.optim import lr_scheduler

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


# make_torch_optim.py's SWITCHED: an entry that chooses the update's state, and its value at each step.
SWITCHED = {
    "sgd_momentum": ("sgd", "momentum", [0.9, 0.0, 0.0, 0.9, 0.5]),
    "rmsprop_centered": ("rmsprop", "centered", [True, False, True, False, True]),
    "rmsprop_momentum": ("rmsprop", "momentum", [0.9, 0.0, 0.9, 0.0, 0.5]),
    "adam_amsgrad": ("adam_amsgrad", "amsgrad", [True, False, False, True, True]),
}


@pytest.mark.parametrize("name", SWITCHED)
def test_state_an_entry_switches_off_stays_and_resumes_as_pytorchs(name):
    """Momentum set to zero (or ``centered``/``amsgrad`` off) leaves its state entry as it is, unread; set again, the
    update resumes from it, as PyTorch's does (a fresh buffer would start from the gradient)."""
    optimizer, key, values = SWITCHED[name]
    w, b, opt = make(optimizer)
    want = FIXTURE["switched"][name]
    for step, value in enumerate(values):
        for group in opt.param_groups:
            group[key] = value
        (got_w, got_b), = train(w, b, opt, 1)
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


# -- LBFGS -----------------------------------------------------------------------------------------

LBFGS_CASES = {
    "lbfgs": {"lr": 1.0, "max_iter": 5, "history_size": 3},
    "lbfgs_strong_wolfe": {"line_search_fn": "strong_wolfe", "max_iter": 8, "history_size": 4},
}


@pytest.mark.parametrize("name", LBFGS_CASES)
def test_lbfgs_follows_pytorch(name):
    w = xgrad.tensor(np.array(W0), requires_grad=True)
    b = xgrad.tensor(np.array(B0), requires_grad=True)
    opt = optim.LBFGS([w, b], **LBFGS_CASES[name])
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = loss_of(w, b)
        loss.backward()
        return loss

    want = FIXTURE["lbfgs"][name]
    for step in range(3):
        np.testing.assert_allclose(float(opt.step(closure)), want["loss"][step], rtol=1e-9)
        np.testing.assert_allclose(w.detach().numpy(), want["w"][step], rtol=1e-7, atol=1e-10)
        np.testing.assert_allclose(b.detach().numpy(), want["b"][step], rtol=1e-7, atol=1e-10)
    assert opt.state[w]["func_evals"] == want["func_evals"] == len(calls) and opt.state[w]["n_iter"] == want["n_iter"]
    with pytest.raises(ValueError, match="LBFGS doesn't support per-parameter options"):
        optim.LBFGS([{"params": [w]}, {"params": [b]}])


# -- schedulers ------------------------------------------------------------------------------------

EPOCHS = 12
PLATEAU_METRICS = [5.0, 4.0, 4.0, 3.9, 3.95, 3.0, 3.0, 3.0, 3.0, 2.0, 2.5, 2.5]
SCHEDULERS = {
    "step": lambda opt: lr_scheduler.StepLR(opt, step_size=3, gamma=0.5),
    "multistep": lambda opt: lr_scheduler.MultiStepLR(opt, milestones=[2, 5, 5, 8], gamma=0.5),
    "constant": lambda opt: lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=4),
    "linear": lambda opt: lr_scheduler.LinearLR(opt, start_factor=0.25, end_factor=0.75, total_iters=5),
    "polynomial": lambda opt: lr_scheduler.PolynomialLR(opt, total_iters=6, power=2.0),
    "exponential": lambda opt: lr_scheduler.ExponentialLR(opt, gamma=0.8),
    "cosine": lambda opt: lr_scheduler.CosineAnnealingLR(opt, T_max=4, eta_min=0.01),
    "warm_restarts": lambda opt: lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=3, T_mult=2, eta_min=0.05),
    "lambda": lambda opt: lr_scheduler.LambdaLR(opt, [lambda e: 0.9**e, lambda e: 1 / (e + 1)]),
    "multiplicative": lambda opt: lr_scheduler.MultiplicativeLR(opt, lambda e: 0.95),
    "sequential": lambda opt: lr_scheduler.SequentialLR(
        opt, [lr_scheduler.ConstantLR(opt, factor=0.1, total_iters=2), lr_scheduler.ExponentialLR(opt, gamma=0.9)], milestones=[3]
    ),
    "chained": lambda opt: lr_scheduler.ChainedScheduler(
        [lr_scheduler.ConstantLR(opt, factor=0.1, total_iters=2), lr_scheduler.ExponentialLR(opt, gamma=0.9)]
    ),
    "one_cycle": lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=[1.0, 0.5], total_steps=EPOCHS),
    "one_cycle_adam": lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=EPOCHS, three_phase=True, anneal_strategy="linear"),
    "cyclic": lambda opt: lr_scheduler.CyclicLR(
        opt, base_lr=[0.1, 0.05], max_lr=[1.0, 0.5], step_size_up=3, step_size_down=2, mode="triangular2"
    ),
    "cyclic_adam": lambda opt: lr_scheduler.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=2, mode="exp_range", gamma=0.9),
    "plateau": lambda opt: lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=1, cooldown=1, threshold=0.1, min_lr=[0.1, 0.2]),
}


def two_group_optimizer(name):
    w = xgrad.tensor(np.array(W0), requires_grad=True)
    b = xgrad.tensor(np.array(B0), requires_grad=True)
    groups = [{"params": [w]}, {"params": [b], "lr": 0.5}]
    return optim.Adam(groups, lr=1.0) if name.endswith("_adam") else optim.SGD(groups, lr=1.0, momentum=0.9)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_schedulers_follow_pytorch_per_group(name):
    opt = two_group_optimizer(name)
    sched = SCHEDULERS[name](opt)
    lrs, momenta = [], []
    for epoch in range(EPOCHS):
        lrs.append(sched.get_last_lr())
        assert lrs[-1] == [g["lr"] for g in opt.param_groups]
        momenta.append([g["betas"][0] if "betas" in g else g["momentum"] for g in opt.param_groups])
        opt.step()
        sched.step(PLATEAU_METRICS[epoch]) if name == "plateau" else sched.step()
    np.testing.assert_allclose(lrs, FIXTURE["schedulers"][name]["lr"], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(momenta, FIXTURE["schedulers"][name]["momentum"], rtol=1e-12)


@pytest.mark.parametrize("name", ["cosine", "sequential", "plateau"])
def test_scheduler_state_dict_resumes(name):
    def run(opt, sched, epochs):
        for epoch in epochs:
            opt.step()
            sched.step(PLATEAU_METRICS[epoch]) if name == "plateau" else sched.step()

    opt = two_group_optimizer(name)
    sched = SCHEDULERS[name](opt)
    run(opt, sched, range(5))
    saved_opt, saved_sched = opt.state_dict(), sched.state_dict()
    run(opt, sched, range(5, 9))
    other = two_group_optimizer(name)
    other_sched = SCHEDULERS[name](other)
    other.load_state_dict(saved_opt)
    other_sched.load_state_dict(saved_sched)
    run(other, other_sched, range(5, 9))
    assert other_sched.get_last_lr() == sched.get_last_lr()


def test_scheduler_errors():
    opt = two_group_optimizer("sgd")
    with pytest.raises(ValueError, match="Expected 2 lr_lambdas, but got 1"):
        lr_scheduler.LambdaLR(opt, [lambda e: 1.0])
    with pytest.raises(ValueError, match="You must define either total_steps OR"):
        lr_scheduler.OneCycleLR(opt, max_lr=1.0)
    with pytest.raises(ValueError, match="max_lr must have the same length as optimizer.param_groups"):
        lr_scheduler.OneCycleLR(opt, max_lr=[1.0], total_steps=3)
    with pytest.raises(KeyError, match=r"param 'initial_lr' is not specified in param_groups\[0\]"):
        lr_scheduler.StepLR(opt, step_size=1, last_epoch=3)
    with pytest.raises(ValueError, match="Factor should be < 1.0."):
        lr_scheduler.ReduceLROnPlateau(opt, factor=1.0)
    sched = lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=2)
    sched.step()
    sched.step()
    with pytest.raises(ValueError, match="Tried to step 3 times. The specified number of total steps is 2"):
        sched.step()


# -- parameter groups ------------------------------------------------------------------------------


def test_param_groups_defaults_state_and_pytorchs_errors():
    model = xgrad.nn.Sequential(xgrad.nn.Linear(2, 3, key=0), xgrad.nn.Linear(3, 1, key=1))
    base, head = model[0], model[1]
    opt = optim.SGD([{"params": base.parameters()}, {"params": head.parameters(), "lr": 1e-3}], lr=0.1, momentum=0.9)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 1e-3] and opt.param_groups[1]["momentum"] == 0.9
    assert opt.defaults["lr"] == 0.1 and opt.param_groups[0]["params"] == list(base.parameters())
    assert set(opt.state[head.weight]) == {"step", "momentum_buffer"}  # keyed by the parameter, as PyTorch
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter group"):
        opt.add_param_group({"params": [head.bias]})
    extra = xgrad.tensor([1.0], requires_grad=True)
    opt.add_param_group({"params": extra, "momentum": 0.5})
    assert opt.param_groups[2]["params"] == [extra] and opt.param_groups[2]["lr"] == 0.1
    with pytest.raises(ValueError, match="can't optimize a non-leaf Tensor"):
        optim.Adam([extra * 2])
    with pytest.raises(TypeError, match="should be an iterable of Tensors or dicts, but got"):
        optim.Adam(extra)
    with pytest.raises(TypeError, match="ordering of tensors in sets will change between runs"):
        optim.Adam([{"params": {extra}}])
    with pytest.raises(ValueError, match="optimizer got an empty parameter list"):
        optim.SGD([])
    with pytest.raises(NotImplementedError, match="differentiable=True is not supported"):
        optim.Adam([extra], differentiable=True)
    with pytest.warns(UserWarning, match="duplicate parameters"):
        optim.SGD([extra, extra])


def test_zero_grad_step_closure_and_parameters_without_grad():
    w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    idle = xgrad.tensor([3.0], requires_grad=True)
    opt = optim.Adam([{"params": [w]}, {"params": [idle], "lr": 0.5}], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 5.0 and opt.step() is None
    assert idle.tolist() == [3.0] and idle._version == 0 and 1 not in opt.state_dict()["state"]
    opt.zero_grad(set_to_none=False)
    assert w.grad.tolist() == [0.0, 0.0] and idle.grad is None
    opt.zero_grad()
    assert w.grad is None


@pytest.mark.usefixtures("eager_and_compiled")
def test_group_entries_set_between_steps_are_used_eager_and_in_xgrad_compile():
    """A scheduler and a user change lr and betas between steps; a compiled step reads them without retracing."""

    def setup():
        w = xgrad.tensor(np.array(W0), requires_grad=True)
        b = xgrad.tensor(np.array(B0), requires_grad=True)
        opt = optim.Adam([{"params": [w]}, {"params": [b], "lr": 0.05}], lr=0.1, weight_decay=0.1)
        sched = lr_scheduler.ExponentialLR(opt, gamma=0.7)

        def step():
            opt.zero_grad()
            loss = loss_of(w, b)
            loss.backward()
            opt.step()
            return loss

        return w, b, opt, sched, step

    eager, compiled = setup(), setup()
    compiled_step = xgrad.compile(compiled[4])
    for i in range(4):
        want, got = eager[4](), compiled_step()
        np.testing.assert_allclose(got.item(), want.item(), rtol=1e-12)
        for _, _, opt, sched, _ in (eager, compiled):
            sched.step()
            opt.param_groups[1]["betas"] = (0.9 - 0.1 * i, 0.99)
    for a, b in zip(eager[:2], compiled[:2], strict=True):
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-12)
    assert compiled_step.stats()["compiles"] == 1


two_devices = pytest.mark.skipif(len(jax.devices()) < 2, reason="needs two devices")


@two_devices
@pytest.mark.parametrize(
    "make_optimizer", [lambda ps: optim.Adam(ps, lr=0.1), lambda ps: optim.Optax(ps, optax.adam(0.1))], ids=["Adam", "Optax"]
)
def test_state_follows_parameters_moved_after_the_optimizer_was_built(make_optimizer):
    def train(move):
        model = xgrad.nn.Linear(3, 2, key=0, dtype=np.float64)
        opt = make_optimizer(list(model.parameters()))
        x = xgrad.tensor(np.ones((4, 3)))
        for step in range(3):
            if move and step == 1:
                model.to(jax.devices()[1])
                x = xgrad.tensor(jax.device_put(x.array, jax.devices()[1]))
            opt.zero_grad()
            (model(x) ** 2).sum().backward()
            opt.step()
        return model, opt

    moved, opt = train(move=True)
    reference, _ = train(move=False)
    np.testing.assert_allclose(moved.weight.detach().numpy(), reference.weight.detach().numpy(), rtol=1e-12)
    state = opt.state[moved.weight].values() if isinstance(opt, optim.Optimizer) else jax.tree.leaves(opt.state)
    for leaf in state:
        assert jax.numpy.asarray(leaf).devices() == {jax.devices()[1]}


@two_devices
def test_sharded_state_keeps_its_sharding_through_step_and_load():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))

    def sharded_param():
        return xgrad.tensor(jax.device_put(np.arange(8.0).reshape(4, 2), rows), requires_grad=True)

    w = sharded_param()
    opt = optim.AdamW([w], lr=0.1)
    (w * w).sum().backward()
    opt.step()
    for key in ("exp_avg", "exp_avg_sq"):
        assert opt.state[w][key].array.sharding.is_equivalent_to(rows, 2)
    saved = opt.state_dict()
    saved["state"][0] = {k: v.numpy() for k, v in saved["state"][0].items()}  # as host arrays, like a loaded file
    w2 = sharded_param()
    other = optim.AdamW([w2], lr=0.1)
    other.load_state_dict(saved)
    assert other.state[w2]["exp_avg"].array.sharding.is_equivalent_to(rows, 2)
    np.testing.assert_array_equal(other.state[w2]["exp_avg_sq"].numpy(), opt.state[w]["exp_avg_sq"].numpy())


def test_lbfgs_step_raises_inside_xgrad_compile_and_without_a_closure():
    w = xgrad.tensor(np.array(W0), requires_grad=True)
    opt = optim.LBFGS([w])

    def closure():
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss

    with pytest.raises(RuntimeError, match="LBFGS.step calls its closure a data-dependent number of times"):
        xgrad.compile(lambda: opt.step(closure))()
    with pytest.raises(TypeError, match="needs a closure"):
        opt.step()


def test_a_one_element_tensor_learning_rate():
    w = xgrad.tensor(2.0, requires_grad=True)
    opt = optim.SGD([w], lr=xgrad.tensor([0.25]))
    (w * w).backward()
    opt.step()
    assert w.shape == () and w.item() == 1.0
    with pytest.raises(ValueError, match="Tensor lr must be 1-element"):
        optim.SGD([w], lr=xgrad.tensor([0.1, 0.2]))

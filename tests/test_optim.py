"""optim.SGD/Adam/AdamW and the lr schedulers, against NumPy transcriptions of PyTorch's documented updates."""

import math

import jax
import numpy as np
import optax
import pytest

import xgrad
from xgrad import optim
from xgrad.optim import lr_scheduler

CURVATURE = np.array([1.0, 0.5, 2.0, 0.1])
SHIFT = np.array([0.3, -1.0, 0.2, 2.0])
START = np.array([1.0, -2.0, 0.5, 3.0])


def grad_at(p):
    """The gradient of ``sum(CURVATURE * p**2 / 2 + SHIFT * p)``."""
    return CURVATURE * p + SHIFT


def run_xgrad(make_optimizer, steps, scheduler=None):
    w = xgrad.tensor(START.copy(), requires_grad=True)
    opt = make_optimizer([w])
    sched = scheduler(opt) if scheduler else None
    trajectory = []
    for _ in range(steps):
        opt.zero_grad()
        (xgrad.tensor(CURVATURE) * w * w / 2 + xgrad.tensor(SHIFT) * w).sum().backward()
        opt.step()
        if sched is not None:
            sched.step()
        trajectory.append(w.detach().numpy().copy())
    return np.array(trajectory)


def torch_sgd(steps, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False):
    """torch.optim.SGD's documented algorithm."""
    p, buf, out = START.copy(), None, []
    for _ in range(steps):
        g = grad_at(p)
        g = -g if maximize else g
        g = g + weight_decay * p
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
        out.append(p.copy())
    return np.array(out)


def torch_adam(steps, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, decoupled=False, maximize=False):
    """torch.optim.Adam's (decoupled=False) or AdamW's documented algorithm."""
    b1, b2 = betas
    p, m, v, v_max, out = START.copy(), 0.0, 0.0, 0.0, []
    for t in range(1, steps + 1):
        g = grad_at(p)
        g = -g if maximize else g
        if decoupled:
            p = p * (1 - lr * weight_decay)
        elif weight_decay:
            g = g + weight_decay * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        bc1, bc2 = 1 - b1**t, 1 - b2**t
        if amsgrad:
            v_max = np.maximum(v_max, v)
            denom = np.sqrt(v_max) / math.sqrt(bc2) + eps
        else:
            denom = np.sqrt(v) / math.sqrt(bc2) + eps
        p = p - lr * (m / bc1) / denom
        out.append(p.copy())
    return np.array(out)


SGD_CASES = [
    {"lr": 0.1},
    {"lr": 0.1, "momentum": 0.9},
    {"lr": 0.05, "momentum": 0.8, "dampening": 0.3},
    {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1},
    {"lr": 0.1, "weight_decay": 0.5, "maximize": True},
]


@pytest.mark.parametrize("kwargs", SGD_CASES, ids=lambda k: ",".join(k))
def test_sgd_follows_pytorch(kwargs):
    got = run_xgrad(lambda params: optim.SGD(params, **kwargs), steps=5)
    np.testing.assert_allclose(got, torch_sgd(5, **kwargs), rtol=1e-12, atol=1e-12)


ADAM_CASES = [
    {"lr": 0.1},
    {"lr": 0.1, "betas": (0.8, 0.9), "eps": 1e-3, "weight_decay": 0.3},
    {"lr": 0.2, "betas": (0.5, 0.9), "eps": 1e-2, "amsgrad": True},
    {"lr": 0.1, "weight_decay": 0.1, "amsgrad": True, "maximize": True},
]


@pytest.mark.parametrize("kwargs", ADAM_CASES, ids=lambda k: ",".join(k))
def test_adam_follows_pytorch(kwargs):
    got = run_xgrad(lambda params: optim.Adam(params, **kwargs), steps=6)
    np.testing.assert_allclose(got, torch_adam(6, **kwargs), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kwargs", [*ADAM_CASES, {"lr": 0.1, "weight_decay": 0.5}], ids=lambda k: ",".join(k))
def test_adamw_follows_pytorch(kwargs):
    kwargs = {"weight_decay": 1e-2, **kwargs}  # AdamW's default decay
    got = run_xgrad(lambda params: optim.AdamW(params, **kwargs), steps=6)
    np.testing.assert_allclose(got, torch_adam(6, decoupled=True, **kwargs), rtol=1e-10, atol=1e-12)


def test_pytorch_defaults_and_argument_errors():
    w = xgrad.tensor([1.0], requires_grad=True)
    assert optim.SGD([w]).param_groups[0]["lr"] == 1e-3 and optim.Adam([w]).defaults["lr"] == 1e-3
    adamw = optim.AdamW([w])
    assert adamw.param_groups[0]["params"] == [w] and adamw.param_groups[0]["weight_decay"] == 1e-2
    with pytest.raises(TypeError, match="^optimizer can only optimize Tensors, but one of the params is str$"):
        optim.AdamW({"w": w})  # a dict iterates over its names, as in PyTorch
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        optim.SGD([w], lr=-1)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero dampening"):
        optim.SGD([w], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1: 1.0"):
        optim.Adam([w], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Invalid weight_decay value: -0.1"):
        optim.AdamW([w], weight_decay=-0.1)


def test_module_parameters_train():
    model = xgrad.nn.MLP([2, 8, 1], activation=xgrad.nn.Tanh, key=0)
    x = xgrad.tensor(np.random.default_rng(0).normal(size=(16, 2)).astype(np.float32))
    y = (x[:, :1] * x[:, 1:]).detach()
    opt = optim.AdamW(model.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = xgrad.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


# -- schedulers ---------------------------------------------------------------------------------

EPOCHS = 12
SCHEDULES = {
    "StepLR": (lambda opt: lr_scheduler.StepLR(opt, step_size=3, gamma=0.5), lambda t: 0.5 ** (t // 3)),
    "ExponentialLR": (lambda opt: lr_scheduler.ExponentialLR(opt, gamma=0.8), lambda t: 0.8**t),
    "CosineAnnealingLR": (
        lambda opt: lr_scheduler.CosineAnnealingLR(opt, T_max=5, eta_min=0.1),
        lambda t: 0.1 + (1 - 0.1) * (1 + math.cos(math.pi * t / 5)) / 2,  # PyTorch's closed form, periodic past T_max
    ),
    "LinearLR": (lambda opt: lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=4), lambda t: 0.25 + 0.75 * min(t, 4) / 4),
    "LambdaLR": (lambda opt: lr_scheduler.LambdaLR(opt, lambda epoch: 1 / (1 + epoch)), lambda t: 1 / (1 + t)),
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_schedulers_follow_pytorch_and_drive_the_step(name):
    make_scheduler, factor = SCHEDULES[name]
    expected = [factor(t) for t in range(EPOCHS)]
    opt = optim.SGD([xgrad.tensor(np.zeros(1), requires_grad=True)], lr=1.0)
    sched = make_scheduler(opt)
    seen = []
    for _ in range(EPOCHS):
        seen.append(sched.get_last_lr()[0])
        assert opt.param_groups[0]["lr"] == seen[-1]
        sched.step()
    np.testing.assert_allclose(seen, expected, rtol=1e-6)
    # each optimizer step uses the epoch's rate: plain SGD moves by -lr_t * grad_t
    got = run_xgrad(lambda params: optim.SGD(params, lr=1.0), steps=EPOCHS, scheduler=make_scheduler)
    p, want = START.copy(), []
    for lr in expected:
        p = p - lr * grad_at(p)
        want.append(p.copy())
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_scheduler_state_and_import_path():
    from xgrad.optim.lr_scheduler import StepLR

    opt = optim.Adam([xgrad.tensor(np.zeros(1), requires_grad=True)], lr=0.1)
    sched = StepLR(opt, step_size=1, gamma=0.5)
    sched.step()
    state = sched.state_dict()
    other_opt = optim.Adam([xgrad.tensor(np.zeros(1), requires_grad=True)], lr=0.1)
    other = StepLR(other_opt, step_size=1, gamma=0.5)
    # As in PyTorch, the rates live in the optimizer's state dict, the epoch in the scheduler's.
    other_opt.load_state_dict(opt.state_dict())
    other.load_state_dict(state)
    other.step()
    assert other.get_last_lr() == pytest.approx([0.025]) and other_opt.param_groups[0]["lr"] == pytest.approx(0.025)
    with pytest.raises(TypeError, match="Optax is not an Optimizer"):
        StepLR(optim.Optax([xgrad.tensor(np.zeros(1), requires_grad=True)], optax.sgd(0.1)), step_size=1)



def _adam_reference(w, counts_and_uses, lr=0.1, b1=0.9, b2=0.999, eps=1e-8):
    """PyTorch's Adam on one parameter of ``(w * w).sum()``, in NumPy: ``counts_and_uses`` gives each step's use."""
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    t = 0
    for used, set_count in counts_and_uses:
        if set_count is not None:
            t = set_count
        if not used:
            continue
        t += 1
        g = 2 * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - lr / (1 - b1**t) * m / (np.sqrt(v / (1 - b2**t)) + eps)
    return w, t


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_step_counts_stay_per_parameter_when_one_skips_a_step_or_loads_its_own(mode):
    """NOTE [Shared counters]: counters share one array only while their values agree."""
    rng = np.random.default_rng(0)
    start = [rng.normal(size=(3,)) for _ in range(3)]
    ws = [xgrad.tensor(w, requires_grad=True) for w in start]
    opt = optim.Adam(ws, lr=0.1)

    def step(uses):
        opt.zero_grad()
        sum((w * w).sum() for w, used in zip(ws, uses, strict=True) if used).backward()
        opt.step()

    run = xgrad.compile(step, fallback="error") if mode == "compile" else step
    assert len({id(opt.state[w]["step"]._array) for w in ws}) == 1
    uses = [(1, 1, 1), (1, 0, 1), (1, 1, 1), (1, 1, 1)]
    for u in uses[:2]:
        run(u)
    state = opt.state_dict()
    state["state"][2]["step"] = xgrad.tensor(7.0)  # a count of its own, loaded between steps
    opt.load_state_dict(state)
    for u in uses[2:]:
        run(u)
    for k, w in enumerate(ws):
        history = [(u[k], 7 if (k == 2 and i == 2) else None) for i, u in enumerate(uses)]
        expected, count = _adam_reference(start[k], history)
        np.testing.assert_allclose(w.detach().numpy(), expected, rtol=1e-12)
        assert float(opt.state[w]["step"]) == count
    assert [float(opt.state[w]["step"]) for w in ws] == [4.0, 3.0, 9.0]


def test_a_shared_counter_goes_through_the_update_once(monkeypatch):
    # NOTE [Shared counters]: the group's update takes the one ``step`` array its
    # parameters share once and gives it back once (one output, not one per parameter),
    # and every parameter's ``step`` is then that array.
    from xgrad.optim import optimizer as optimizer_module

    program = optimizer_module._jitted_group_step()
    outputs = []

    class Recording:
        def __call__(self, *args):
            result = program(*args)
            outputs.append(jax.tree.leaves(result))
            return result

    monkeypatch.setattr(optimizer_module, "_jitted_group_step", Recording)
    ws = [xgrad.tensor(np.ones(3), requires_grad=True), xgrad.tensor(np.ones(2), requires_grad=True)]
    opt = optim.Adam(ws, lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        sum((w * w).sum() for w in ws).backward()
        opt.step()
    assert [len(leaves) for leaves in outputs] == [2 + 2 * 2 + 1] * 2  # parameters, moments, one count
    assert opt.state[ws[0]]["step"]._array is opt.state[ws[1]]["step"]._array
    assert float(opt.state[ws[1]]["step"]) == 2.0


def test_an_optimizer_pickles_and_its_copy_steps_as_the_original():
    import pickle

    def make():
        xgrad.manual_seed(0)
        model = xgrad.nn.Linear(3, 2)
        return model, optim.Adam(model.parameters(), lr=0.05, betas=(0.8, 0.9), weight_decay=0.01)

    model, opt = make()
    x = xgrad.randn(4, 3)
    model(x).pow(2).sum().backward()
    opt.step()
    model2, opt2 = pickle.loads(pickle.dumps((model, opt)))
    group, group2 = opt.param_groups[0], opt2.param_groups[0]
    assert type(group2) is type(group) and dict(group2).keys() == dict(group).keys()
    assert group2["lr"] == 0.05 and group2["betas"] == (0.8, 0.9)
    group2["lr"] = 0.01  # the copy's packed hyperparameters are its own
    group["lr"] = 0.01
    for m, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        m(x).pow(2).sum().backward()
        o.step()
    np.testing.assert_array_equal(np.asarray(model2.weight.detach()), np.asarray(model.weight.detach()))

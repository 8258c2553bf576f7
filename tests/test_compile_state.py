"""``xgrad.compile`` and the state around a step: concurrent first calls, failed traces, and the
Python state eager re-reads every call (schedulers, ``train()``/``eval()``, module hooks).

Each test runs the same step eagerly on one copy of the state and compiled on another, over
several calls, and compares what eager does call by call.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad import nn

RNG = np.random.default_rng(0)
XS = [xgrad.tensor(RNG.normal(size=(4, 3))) for _ in range(4)]


def make_model(seed=0):
    xgrad.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).to(jnp.float64)


def state_leaves(model, opt=None):
    """Every array of the model's parameters, buffers and ``.grad``s, and of the optimizer's state."""
    leaves = [t._array for t in [*model.parameters(), *model.buffers()]]
    leaves += [p.grad._array for p in model.parameters() if p.grad is not None]
    if opt is not None:
        leaves += [t._array for state in opt.state.values() for t in state.values() if isinstance(t, xgrad.Tensor)]
    return leaves


def assert_no_tracer(model, opt=None):
    assert not any(isinstance(a, jax.core.Tracer) for a in state_leaves(model, opt))


def forward_backward(model, x):
    """An eager forward and backward: the loss and the parameters' grads."""
    for p in model.parameters():
        p.grad = None
    loss = model(x).pow(2).mean()
    loss.backward()
    return [loss.item()] + [p.grad.numpy() for p in model.parameters()]


def assert_same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-10, atol=1e-12)


# -- concurrent first calls --------------------------------------------------------------
def test_concurrent_first_calls_trace_once_and_all_match_eager():
    """Four threads call a fresh compiled step at once: one traces, the others wait and hit its
    program; each gets eager's results, and no tracer is left in the model."""

    def setup():
        model = make_model()

        def step(x):
            for p in model.parameters():
                p.grad = None
            loss = model(x).pow(2).mean()
            loss.backward()
            return loss, [p.grad.clone() for p in model.parameters()]

        return model, step

    eager_model, eager_step = setup()
    model, step = setup()
    step = xgrad.compile(step)
    barrier = threading.Barrier(len(XS), timeout=30)
    results: dict[int, list[np.ndarray]] = {}
    errors: list[BaseException] = []

    def run(i):
        try:
            barrier.wait()
            loss, grads = step(XS[i])
            results[i] = [loss.numpy()] + [g.numpy() for g in grads]
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(XS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert step.stats()["compiles"] == 1 and step.stats()["hits"] == len(XS) - 1
    for i, x in enumerate(XS):
        loss, grads = eager_step(x)
        assert_same(results[i], [loss.detach().numpy()] + [g.numpy() for g in grads])
    assert_no_tracer(model)
    assert_same(forward_backward(model, XS[0])[1:], forward_backward(eager_model, XS[0])[1:])


def test_a_step_raising_while_traced_leaves_the_model_as_it_was():
    """An exception in the middle of a trace (after backward and the optimizer's step) leaves
    the model, its ``.grad``s and the optimizer as before the call: usable eagerly, as a fresh one."""
    model, fresh = make_model(), make_model()
    opt = xgrad.optim.Adam(model.parameters(), lr=0.1)
    fresh_opt = xgrad.optim.Adam(fresh.parameters(), lr=0.1)

    def failing(x):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        raise ValueError("a bad batch")

    with pytest.raises(ValueError, match="a bad batch"):
        xgrad.compile(failing)(XS[0])
    assert_no_tracer(model, opt)
    assert all(p.grad is None for p in model.parameters())
    for m, o in ((model, opt), (fresh, fresh_opt)):
        forward_backward(m, XS[1])
        o.step()
    assert_same(forward_backward(model, XS[2]), forward_backward(fresh, XS[2]))
    assert_same([b.numpy() for b in model.buffers()], [b.numpy() for b in fresh.buffers()])


def test_a_step_raising_while_traced_leaves_no_module_attribute_it_set():
    """What the failed trace set on modules (an attribute holding a traced output, a buffer, a
    mode) is undone: no tracer stays, and the model computes as a fresh one."""
    model, fresh = make_model(), make_model()

    def failing(x):
        out = model(x)
        model.last = out
        model[1].register_buffer("seen", out.detach())
        model.eval()
        raise ValueError("a bad batch")

    with pytest.raises(ValueError, match="a bad batch"):
        xgrad.compile(failing)(XS[0])
    assert not hasattr(model, "last") and "seen" not in dict(model.named_buffers())
    assert model.training and model[1].training
    assert_no_tracer(model)
    assert_same(forward_backward(model, XS[1]), forward_backward(fresh, XS[1]))


def test_a_module_attribute_set_to_a_computed_tensor_is_not_frozen():
    """An attribute set to a tensor of the step would hold a tracer after the trace: the step runs
    eagerly instead (after a warning naming the attribute), and the attribute holds each call's value."""
    model = make_model()

    def step(x):
        out = model(x)
        model[3].last = out.detach()
        return out

    compiled = xgrad.compile(step)
    with pytest.warns(xgrad.compile_step.CompileFallbackWarning, match=r"Linear\.last was set"):
        for x in XS[:2]:
            out = compiled(x)
            np.testing.assert_array_equal(model[3].last.numpy(), out.detach().numpy())
    assert_no_tracer(model)
    with pytest.raises(xgrad.compile_step.CompileFallbackError, match=r"Linear\.last"):
        xgrad.compile(step, fallback="error")(XS[0])


# -- post-accumulate-grad hooks --------------------------------------------------------
@pytest.mark.parametrize("mode", ["eager", "compiled backward", "xgrad.compile"])
def test_a_post_accumulate_grad_hook_returning_a_value_is_rejected(mode):
    """Every hook runs, then PyTorch's RuntimeError; the ``.grad`` written before the hooks stays."""
    w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    calls = []
    w.register_post_accumulate_grad_hook(lambda p: calls.append("first") or p.grad * 2)
    w.register_post_accumulate_grad_hook(lambda p: calls.append("second"))

    def step(x):
        (w * x).sum().backward(compiled=mode == "compiled backward")
        return w.grad

    run = xgrad.compile(step) if mode == "xgrad.compile" else step
    for call in range(3):
        w.grad = None
        with pytest.raises(RuntimeError, match="^Tensor post accumulate grad hooks should return None.$"):
            run(xgrad.tensor([3.0, 4.0]))
        assert calls == ["first", "second"] * (call + 1)
        np.testing.assert_array_equal(w.grad.numpy(), [3.0, 4.0])


# -- train() / eval() ------------------------------------------------------------------
def test_train_and_eval_between_calls_are_guarded():
    """``eval()`` between calls makes BatchNorm read its running statistics, as eagerly, and
    ``train()`` its batch statistics again; each mode is traced once."""
    eager_model, model = make_model(), make_model()
    step = xgrad.compile(lambda x: model(x), fallback="error")
    modes = [True, False, True, False, False, True]
    for x, training in zip(XS + XS, modes, strict=False):
        eager_model.train(training)
        model.train(training)
        np.testing.assert_allclose(step(x).detach().numpy(), eager_model(x).detach().numpy(), rtol=1e-10, atol=1e-12)
        assert_same([b.numpy() for b in model.buffers()], [b.numpy() for b in eager_model.buffers()])
    assert step.stats()["compiles"] == 2  # one program per mode: going back to a mode hits its program


def test_a_mode_set_inside_the_step_is_the_mode_its_calls_run_in():
    """A step that calls ``eval()`` itself runs in eval mode at every call, whatever the mode before."""
    eager_model, model = make_model(), make_model()

    def evaluate(m, x):
        m.eval()
        return m(x)

    step = xgrad.compile(lambda x: evaluate(model, x), fallback="error")
    for x in XS:
        model.train()
        eager_model.train()
        np.testing.assert_allclose(step(x).detach().numpy(), evaluate(eager_model, x).detach().numpy(), rtol=1e-10)
        assert not model.training


# -- module forward hooks --------------------------------------------------------------
@pytest.mark.parametrize("kind", ["forward", "forward pre", "global forward"])
def test_module_forward_hooks_run_at_every_call(kind):
    """A counting forward hook runs once per call, as eagerly (the step runs eagerly, after a
    warning naming why); under ``fallback="error"`` the step raises instead of dropping calls."""
    model = make_model()
    calls = []
    hook = (lambda m, args: calls.append(1)) if kind == "forward pre" else (lambda m, args, out: calls.append(1))
    if kind == "global forward":
        handle = nn.modules.module.register_module_forward_hook(hook)
    elif kind == "forward pre":
        handle = model[1].register_forward_pre_hook(hook)
    else:
        handle = model[1].register_forward_hook(hook)
    try:
        step = xgrad.compile(lambda x: model(x))
        with pytest.warns(xgrad.compile_step.CompileFallbackWarning, match="forward hooks"):
            outs = [step(x) for x in XS]
        assert len(calls) == len(XS) * (5 if kind == "global forward" else 1)
        for x, out in zip(XS, outs, strict=True):
            np.testing.assert_allclose(out.detach().numpy(), make_model()(x).detach().numpy(), rtol=1e-10)
        with pytest.raises(xgrad.compile_step.CompileFallbackError, match="BatchNorm1d has forward hooks|Sequential has"):
            xgrad.compile(lambda x: model(x), fallback="error")(XS[0])
    finally:
        handle.remove()


def test_pure_forward_hooks_are_traced_in():
    model = make_model()
    model[1].register_forward_hook(xgrad.autograd.compiled.pure_hook(lambda m, args, out: out * 2))
    step = xgrad.compile(lambda x: model(x), fallback="error")
    for x in XS:
        np.testing.assert_allclose(step(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-10)
    assert step.stats()["compiles"] == 1


# -- LR schedulers ---------------------------------------------------------------------
SCHEDULERS = {
    "StepLR": lambda opt: xgrad.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
    "OneCycleLR (momentum too)": lambda opt: xgrad.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=6),
    "SequentialLR": lambda opt: xgrad.optim.lr_scheduler.SequentialLR(
        opt, [xgrad.optim.lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=2),
              xgrad.optim.lr_scheduler.ExponentialLR(opt, gamma=0.7)], milestones=[2]),
    "ReduceLROnPlateau (on the loss)": lambda opt: xgrad.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0),
}


@pytest.mark.parametrize("first", [False, True], ids=["after opt.step", "before opt.step"])
@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_an_lr_scheduler_stepped_in_the_step_steps_at_every_call(name, first):
    """The scheduler's Python runs at every call, at its place in the step: the rates it sets are
    the ones the optimizer reads after it, in that call and the next, and its own state moves as eagerly."""

    def setup():
        model = make_model()
        opt = xgrad.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = SCHEDULERS[name](opt)

        def step(x):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            advance = (lambda: sched.step(-loss)) if "Plateau" in name else sched.step
            if first:
                advance()
            opt.step()
            if not first:
                advance()
            return loss

        return model, opt, sched, step

    eager_model, eager_opt, eager_sched, eager_step = setup()
    model, opt, sched, step = setup()
    step = xgrad.compile(step, fallback="error")
    for x in XS + XS[:2]:
        np.testing.assert_allclose(step(x).item(), eager_step(x).item(), rtol=1e-10)
        for group, eager_group in zip(opt.param_groups, eager_opt.param_groups, strict=True):
            assert {k: v for k, v in group.items() if k != "params"} == {
                k: v for k, v in eager_group.items() if k != "params"}
        assert sched.state_dict() == eager_sched.state_dict()
    assert_same([p.detach().numpy() for p in model.parameters()], [p.detach().numpy() for p in eager_model.parameters()])
    assert step.stats()["compiles"] == 1
    # Nothing in the program reads what the scheduler sets after it: it runs after the program, no host call in it.
    assert ("callback" in step.lower(XS[0]).as_text()) == first


def test_a_rate_tensor_set_in_the_step_then_an_entry_set_between_calls_steps_as_eager():
    """A Tensor rate given to the step and set as ``lr`` inside it is read at every call; an entry set by hand
    between calls packs the rate the Tensor holds then (no traced value kept from the trace)."""

    def setup():
        xgrad.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).to(jnp.float64)
        opt = xgrad.optim.Adam(model.parameters(), lr=0.05)

        def step(x, lr):
            opt.param_groups[0]["lr"] = lr
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss

        return model, opt, step

    eager_model, eager_opt, eager_step = setup()
    model, opt, step = setup()
    step = xgrad.compile(step, fallback="error")
    for i, x in enumerate(XS):
        lr = xgrad.tensor(0.1 / (i + 1))
        np.testing.assert_allclose(step(x, lr).item(), eager_step(x, lr).item(), rtol=1e-10)
        for o in (opt, eager_opt):
            o.param_groups[0]["eps"] = 10.0 ** -(i + 2)
        assert_same([p.detach().numpy() for p in model.parameters()], [p.detach().numpy() for p in eager_model.parameters()])
    assert step.stats()["compiles"] == 1


def test_hyperparameters_set_between_calls_are_one_program_input_and_never_recompile():
    """A group's numeric hyperparameters reach the program as one packed input: a scheduler's rate and
    betas, eps and weight decay set by hand between calls change no program, and every call steps as eager."""

    def setup():
        xgrad.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).to(jnp.float64)
        opt = xgrad.optim.Adam(model.parameters(), lr=0.05, betas=(0.8, 0.99), weight_decay=0.01)
        sched = xgrad.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)

        def step(x):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss

        return model, opt, sched, step

    settings = [{}, {"betas": (0.7, 0.9)}, {"eps": 1e-3, "weight_decay": 0.2}, {"betas": (0.95, 0.999), "eps": 1e-8}]
    eager_model, eager_opt, eager_sched, eager_step = setup()
    model, opt, sched, step = setup()
    step = xgrad.compile(step, fallback="error")
    for x, entries in zip(XS, settings, strict=True):
        for o in (opt, eager_opt):
            o.param_groups[0].update(entries)
        np.testing.assert_allclose(step(x).item(), eager_step(x).item(), rtol=1e-10)
        sched.step()
        eager_sched.step()
        assert_same([p.detach().numpy() for p in model.parameters()], [p.detach().numpy() for p in eager_model.parameters()])
    assert opt.param_groups[0]["lr"] == 0.05 * 0.5**4
    assert step.stats()["compiles"] == 1
    # Parameters, Adam's two moments of each, the group's one step counter, its hyperparameters, the batch.
    params = list(model.parameters())
    assert len(jax.tree.leaves(step.lower(XS[0]).args_info)) == 3 * len(params) + 3


# -- parameter-group entries read and set in the step -------------------------------------
GROUP_MODES = ["eager", "compiled backward", "xgrad.compile"]
X_GROUP = np.array([[1.0, -2.0, 0.5], [0.3, 0.2, -1.0], [2.0, 1.0, 1.0], [-0.5, 0.4, 0.1]])


def numpy_sgd(weight, bias, steps, momenta=None):
    """The weights after SGD steps on ``loss = scale * sum((x @ w.T + b) ** 2)``, one per ``(scale, lr, maximize)``
    in ``steps``, each with its momentum in ``momenta`` (none if not given; while it is zero the buffer is kept as it
    is, unread, as PyTorch keeps it), computed by hand: the independent reference."""
    weights, buffer = [], None
    for (scale, lr, maximize), momentum in zip(steps, momenta or [0.0] * len(steps), strict=True):
        y = X_GROUP @ weight.T + bias
        grad = (-1.0 if maximize else 1.0) * scale * 2 * np.concatenate([(y.T @ X_GROUP).ravel(), y.sum(0)])
        if momentum != 0:
            buffer = grad if buffer is None else momentum * buffer + grad
        flat = np.concatenate([weight.ravel(), bias]) - lr * (grad if momentum == 0 else buffer)
        weight, bias = flat[:weight.size].reshape(weight.shape), flat[weight.size:]
        weights.append(flat)
    return weights


def group_step(mode, body, scheduler=None):
    """A Linear layer, its SGD and a step running ``body(group, loss) -> loss`` after backward's loss is made
    and before ``opt.step()`` (and ``scheduler(opt)``'s ``step()`` where ``scheduler`` says)."""
    xgrad.manual_seed(0)
    model = nn.Linear(3, 2).to(jnp.float64)
    opt = xgrad.optim.SGD(model.parameters(), lr=0.1)
    sched = None if scheduler is None else xgrad.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
    group = opt.param_groups[0]
    x = xgrad.tensor(X_GROUP)

    def step():
        opt.zero_grad()
        loss = body(group, model(x).pow(2).sum())
        loss.backward(compiled=mode == "compiled backward")
        if scheduler == "before opt.step":
            sched.step()
        opt.step()
        if scheduler == "after opt.step":
            sched.step()
        return loss

    start = (model.weight.detach().numpy(), model.bias.detach().numpy())
    run = xgrad.compile(step, fallback="error") if mode == "xgrad.compile" else step
    return run, group, lambda: np.concatenate([model.weight.detach().numpy().ravel(), model.bias.detach().numpy()]), start


@pytest.mark.parametrize("mode", GROUP_MODES)
def test_a_rate_halved_in_the_step_halves_it_at_every_call(mode):
    """``g["lr"] = g["lr"] * 0.5`` in the step: each call reads the rate the last one left, as eagerly
    (a compiled step traces again for the new rate it reads), and the group holds it after every call."""

    def halve(group, loss):
        group["lr"] = group["lr"] * 0.5
        return loss

    run, group, weights, start = group_step(mode, halve)
    expected = numpy_sgd(*start, [(1.0, 0.1 * 0.5 ** (k + 1), False) for k in range(4)])
    for k in range(4):
        run()
        assert type(group["lr"]) is float and group["lr"] == 0.1 * 0.5 ** (k + 1)
        np.testing.assert_allclose(weights(), expected[k], rtol=1e-10)
    if mode == "xgrad.compile":
        assert run.stats()["compiles"] == 4


@pytest.mark.parametrize("mode", GROUP_MODES)
def test_entries_read_in_the_step_and_set_between_calls_are_read_at_every_call(mode):
    """A number (``loss * g["lr"]``) and a flag (``g.get("maximize")``, also the update's option) the step
    reads, set by hand between calls, act at the next call as eagerly; a call that changed neither runs
    the program it ran before."""

    def scaled(group, loss):
        loss = loss * group["lr"]
        return -loss if group.get("maximize") else loss

    run, group, weights, start = group_step(mode, scaled)
    settings = [(0.1, False), (0.1, False), (0.3, False), (0.3, True), (0.05, True)]
    expected = numpy_sgd(*start, [(-lr if maximize else lr, lr, maximize) for lr, maximize in settings])
    for k, (lr, maximize) in enumerate(settings):
        group["lr"], group["maximize"] = lr, maximize
        run()
        np.testing.assert_allclose(weights(), expected[k], rtol=1e-10)
    if mode == "xgrad.compile":
        assert run.stats()["compiles"] == 4 and run.stats()["hits"] == 1


@pytest.mark.parametrize("scheduler", [None, "after opt.step", "before opt.step"])
@pytest.mark.parametrize("mode", GROUP_MODES)
def test_a_rate_set_in_the_step_is_the_groups_after_every_call(mode, scheduler):
    """``g["lr"] = 0.05`` in the step, the rate set by hand to 1.0 between calls: every call steps with 0.05
    (halved first by a scheduler stepped before ``opt.step()``) and leaves the group holding what eager
    leaves; the scheduler's reads and sets of the rate on the host trace nothing again: one program."""

    def set_rate(group, loss):
        group["lr"] = 0.05
        return loss

    run, group, weights, start = group_step(mode, set_rate, scheduler)
    lr = 0.025 if scheduler == "before opt.step" else 0.05
    expected = numpy_sgd(*start, [(1.0, lr, False)] * 3)
    for k in range(3):
        run()
        assert group["lr"] == (0.05 if scheduler is None else 0.025)
        np.testing.assert_allclose(weights(), expected[k], rtol=1e-10)
        group["lr"] = 1.0
    if mode == "xgrad.compile":
        assert run.stats()["compiles"] == 1


def momentum_step(mode, after_step=lambda group: None, optimizer=lambda params: xgrad.optim.SGD(params, lr=0.05, momentum=0.9)):
    """A Linear layer, its ``optimizer`` (SGD with momentum) and a step calling ``after_step(group)`` after ``opt.step()``."""
    xgrad.manual_seed(0)
    model = nn.Linear(3, 2).to(jnp.float64)
    opt = optimizer(model.parameters())
    x = xgrad.tensor(X_GROUP)

    def step():
        opt.zero_grad()
        model(x).pow(2).sum().backward(compiled=mode == "compiled backward")
        opt.step()
        after_step(opt.param_groups[0])

    run = xgrad.compile(step, fallback="error") if mode == "xgrad.compile" else step
    return run, opt.param_groups[0], lambda: [p.detach().numpy() for p in model.parameters()]


@pytest.mark.parametrize("mode", GROUP_MODES)
def test_the_updates_options_set_between_calls_choose_its_code_at_the_next_call(mode):
    """``nesterov`` and ``maximize``, which the update takes as code choices, set by hand between calls change
    the next call's update as eagerly; setting one to the value it holds traces nothing again."""
    eager_run, eager_group, eager_weights = momentum_step("eager")
    run, group, weights = momentum_step(mode)
    for nesterov, maximize in [(False, False), (False, False), (True, False), (True, True)]:
        for g in (group, eager_group):
            g["nesterov"], g["maximize"] = nesterov, maximize
        run()
        eager_run()
        assert_same(weights(), eager_weights())
    if mode == "xgrad.compile":
        assert run.stats()["compiles"] == 3


@pytest.mark.parametrize(("key", "value", "momentum"), [("nesterov", True, 0.9), ("momentum", 0.9, 0.0)])
@pytest.mark.parametrize("mode", GROUP_MODES)
def test_an_option_set_in_the_step_after_its_update_chooses_the_next_calls_update(mode, key, value, momentum):
    """``g["nesterov"] = True`` after ``opt.step()``: the first call's update is plain momentum, the next ones
    Nesterov's, as eagerly (``g["momentum"] = 0.9`` from none: plain SGD, then momentum from a buffer made then), and
    the group holds the entry after every call."""

    def set_entry(group):
        group[key] = value

    def optimizer(params):
        return xgrad.optim.SGD(params, lr=0.05, momentum=momentum)

    eager_run, eager_group, eager_weights = momentum_step("eager", set_entry, optimizer)
    run, group, weights = momentum_step(mode, set_entry, optimizer)
    for _ in range(3):
        run()
        eager_run()
        assert group[key] == value and type(group[key]) is type(value)
        assert_same(weights(), eager_weights())


@pytest.mark.parametrize("mode", GROUP_MODES)
def test_momentum_turned_on_and_off_between_calls_steps_as_sgd_with_it(mode):
    """A warm-up that turns SGD's momentum on at the third call (``g["momentum"] = 0.9``: whether a
    ``momentum_buffer`` exists is the update's code choice), off at the sixth and on again at the last: each call
    steps as SGD with that momentum does, turned on again resuming the buffer it left; a compiled step traces again
    when it turns on or off, not when it changes while on."""
    run, group, weights, start = group_step(mode, lambda group, loss: loss)
    momenta = [0.0, 0.0, 0.9, 0.9, 0.5, 0.0, 0.9]
    expected = numpy_sgd(*start, [(1.0, 0.1, False)] * len(momenta), momenta)
    for k, momentum in enumerate(momenta):
        group["momentum"] = momentum
        run()
        np.testing.assert_allclose(weights(), expected[k], rtol=1e-10)
    if mode == "xgrad.compile":
        assert run.stats()["compiles"] == 4


# An entry of each optimizer that chooses which state its update keeps, and the values it is set to call by call.
STATE_CHOICES = {
    "RMSprop momentum": (lambda params: xgrad.optim.RMSprop(params, lr=0.01), "momentum", [0.0, 0.9, 0.5, 0.5, 0.0, 0.9]),
    "RMSprop centered": (lambda params: xgrad.optim.RMSprop(params, lr=0.01), "centered", [False, True, True, True, False, True]),
    # A short second-moment memory, so its running maximum (the ``max_exp_avg_sq`` state) parts from it.
    "Adam amsgrad": (lambda params: xgrad.optim.Adam(params, lr=0.05, betas=(0.9, 0.5)), "amsgrad", [False, True, True, True, False, True]),
}


@pytest.mark.parametrize("choice", list(STATE_CHOICES))
@pytest.mark.parametrize("mode", GROUP_MODES)
def test_an_entry_choosing_the_updates_state_set_between_calls_steps_as_eager(mode, choice):
    """The entry set by hand between calls makes its state entry at the next call or leaves it unread, as eagerly:
    the state made then is the program's, carried from call to call (not a constant of the trace that made it)."""
    optimizer, key, values = STATE_CHOICES[choice]
    eager_run, eager_group, eager_weights = momentum_step("eager", optimizer=optimizer)
    run, group, weights = momentum_step(mode, optimizer=optimizer)
    for value in values:
        for g in (group, eager_group):
            g[key] = value
        run()
        eager_run()
        assert_same(weights(), eager_weights())
    if mode == "xgrad.compile":
        assert run.stats()["compiles"] == 4


# The step's own code reading an entry ``scale`` (absent: 1.0) through each of dict's read paths.
SCALE_READS = {
    "get": lambda group: group.get("scale", 1.0),
    "setdefault": lambda group: group.setdefault("scale", 1.0),
    "in": lambda group: group["scale"] if "scale" in group else 1.0,
    "iteration": lambda group: next((group[key] for key in group if key == "scale"), 1.0),
    "reversed": lambda group: next((group[key] for key in reversed(group) if key == "scale"), 1.0),
    "keys": lambda group: group["scale"] if "scale" in group.keys() else 1.0,
    "items": lambda group: dict(group.items()).get("scale", 1.0),
    "values": lambda group: dict(zip(dict.keys(group), group.values(), strict=True)).get("scale", 1.0),
    "**group": lambda group: (lambda scale=1.0, **others: scale)(**group),
    "dict(group)": lambda group: dict(group).get("scale", 1.0),
    "copy": lambda group: group.copy().get("scale", 1.0),
}


@pytest.mark.parametrize("read", list(SCALE_READS))
@pytest.mark.parametrize("mode", GROUP_MODES)
def test_an_entry_read_through_any_dict_read_and_set_between_calls_is_read_at_every_call(mode, read):
    """``loss * scale``, ``scale`` read from the group by the step's own code as ``read`` says, first absent, then
    added, kept, and changed by hand between calls: each call steps with the scale eager reads then, and a call
    that changed nothing runs the program it ran before."""
    run, group, weights, start = group_step(mode, lambda group, loss: loss * SCALE_READS[read](group))
    scales = [1.0, 2.0, 2.0, 0.5]
    expected = numpy_sgd(*start, [(scale, 0.1, False) for scale in scales])
    for k, scale in enumerate(scales):
        if k:
            group["scale"] = scale
        run()
        np.testing.assert_allclose(weights(), expected[k], rtol=1e-10)
    if mode == "xgrad.compile":
        assert run.stats()["compiles"] == 3 and run.stats()["hits"] == 1

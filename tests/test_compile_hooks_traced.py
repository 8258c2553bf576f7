"""Hooks traced into an ``xgrad.compile`` program without being marked (NOTE [Hooks traced in]).

Each test runs one step over a few batches eagerly, with ``backward(compiled=True)`` and under
``xgrad.compile``, and compares the state, the results and what the hooks did with eager's. A
hook that touches no Python state must leave no host call in the program; one that does must
run at every call, in eager's order, with eager's values; a value a traced-in hook read that
changes later must change the result as it does eagerly.
"""

from __future__ import annotations

import operator

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad.autograd import compiled
from xgrad.autograd.compiled import HostHook, host_hook, pure_hook

MODES = ["eager", "compiled", "compile"]


@pytest.fixture(autouse=True)
def fresh_compiled_backward():
    """Each test's models are new: their compiled backwards are not recompilations of the last test's."""
    compiled.reset()
    yield
    compiled.reset()

BATCHES = [np.array([[1.0, 2.0], [-0.5, 1.5], [2.0, -1.0]]) * k for k in (1.0, -0.7, 1.9)]
W0 = np.array([[0.3, -0.2], [0.1, 0.4], [-0.5, 0.25]])
W2 = np.array([[0.2, -0.3, 0.6], [0.7, 0.1, -0.4]])


def make_model():
    """Linear(2, 3), Tanh, Linear(3, 2) in float64, the same weights every time."""
    model = xgrad.nn.Sequential(xgrad.nn.Linear(2, 3), xgrad.nn.Tanh(), xgrad.nn.Linear(3, 2)).double()
    with xgrad.no_grad():
        model[0].weight.copy_(xgrad.tensor(W0))
        model[0].bias.fill_(0.1)
        model[2].weight.copy_(xgrad.tensor(W2))
        model[2].bias.fill_(-0.2)
    return model


def run(mode, install=lambda model: None, inside=lambda h: None):
    """The step over ``BATCHES``: results and parameters after each call, and the compiled step (or ``None``)."""
    model = make_model()
    install(model)
    opt = xgrad.optim.SGD(model.parameters(), lr=0.5)

    def step(x):
        opt.zero_grad()
        h = model[0](x)
        inside(h)
        loss = (model[2](model[1](h)) ** 2).sum()
        loss.backward(compiled=mode == "compiled")
        opt.step()
        return loss, h.grad if h.retains_grad else loss

    fn = xgrad.compile(step, fallback="error") if mode == "compile" else step
    seen = []
    for x in BATCHES:
        loss, extra = fn(xgrad.tensor(x))
        seen.append([loss.detach().numpy(), extra.detach().numpy(), *(p.detach().numpy().copy() for p in model.parameters())])
    return seen, (fn if mode == "compile" else None)


def host_calls(step):
    """Whether the compiled step's program calls the host (a hook run there)."""
    return "callback" in step.lower(xgrad.tensor(BATCHES[0])).as_text()


def assert_same(got, expected):
    for a, e in zip(got, expected, strict=True):
        for x, y in zip(a, e, strict=True):
            assert_close(x, y)


def assert_close(got, expected):
    # Not equality: a tanh fused into the compiled program may differ from eager's, which runs it alone, in
    # its last bits (NOTE [A fused float64 tanh] in test_compile_observers.py).
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)


def assert_same_log(log, expected):
    """Logs of ``(name, value)``: the same names in the same order, the values as ``assert_close``."""
    assert [name for name, _ in log] == [name for name, _ in expected]
    assert_close([value for _, value in log], [value for _, value in expected])


def _post_accumulate(model):
    def halve(p):
        p.grad.mul_(0.5)

    model[2].weight.register_post_accumulate_grad_hook(halve)


def _post_hook(h):
    h.grad_fn.register_hook(lambda grad_inputs, grad_outputs: tuple(None if g is None else g.clamp(-0.2, 0.2) for g in grad_inputs))


# Each hook kind, changing gradients without touching Python state: (outside the step, on the intermediate h).
PURE_KINDS = {
    "tensor": (lambda m: m[0].weight.register_hook(lambda g: g.clamp(-0.05, 0.05)), lambda h: None),
    "intermediate": (lambda m: None, lambda h: h.register_hook(lambda g: g * 3.0)),
    "retain_grad": (lambda m: None, lambda h: h.retain_grad()),
    "post_accumulate": (_post_accumulate, lambda h: None),
    "node_pre": (lambda m: None, lambda h: h.grad_fn.register_prehook(lambda grad_outputs: (grad_outputs[0] * 0.5,))),
    "node_post": (lambda m: None, _post_hook),
    "module_full_backward": (lambda m: m[2].register_full_backward_hook(lambda mod, gi, go: (gi[0] * 0.25,)), lambda h: None),
    "module_full_backward_pre": (
        lambda m: m[0].register_full_backward_pre_hook(lambda mod, go: (go[0].clamp(-0.3, 0.3),)), lambda h: None,
    ),
}


@pytest.mark.parametrize("kind", PURE_KINDS)
def test_every_hook_kind_that_touches_no_python_state_is_traced_in_with_eagers_values(kind):
    install, inside = PURE_KINDS[kind]
    expected, _ = run("eager", install, inside)
    plain, _ = run("eager")
    if kind != "retain_grad":
        assert not np.allclose(expected[-1][-1], plain[-1][-1]) or not np.allclose(expected[-1][2], plain[-1][2])
    for mode in MODES[1:]:
        got, step = run(mode, install, inside)
        assert_same(got, expected)
    assert not host_calls(step)


# Hooks with Python effects: each logs what it does, and those that change a gradient do it by Python state.
CALLS = 0
SEEN: dict[str, object] = {}


def _global_counter(g):
    global CALLS
    CALLS += 1
    return g * CALLS


def _closure_counter(log):
    count = 0

    def hook(g):
        nonlocal count
        count += 1
        log.append(("nonlocal", count))
        return g / count

    return hook


def _remember(log):
    def hook(module, grad_input, grad_output):
        module.last = float(grad_output[0].sum())
        log.append(("attribute", module.last))

    return hook


def _stored(g):
    SEEN["last"] = g  # a store no name reveals: found when the trial changed the dict, then undone
    return g * 2.0


def _set_item(g):
    return operator.setitem(SEEN, "item", g.sum()) or g * 0.5


HOST_KINDS = {
    "append_item": lambda log: ("w0", lambda g: log.append(("append", g.sum().item()))),
    "print": lambda log: ("w0", lambda g: print("grad sum", g.sum())),
    "concrete_branch": lambda log: ("b0", lambda g: g * 2.0 if float(g.sum()) > 0 else g),
    "global_write": lambda log: ("w2", _global_counter),
    "nonlocal_write": lambda log: ("b2", _closure_counter(log)),
    "attribute_write": lambda log: ("module", _remember(log)),
    "subscript_store": lambda log: ("w0", _stored),
    "setitem_call": lambda log: ("b0", _set_item),
    # A module's pre-hook traced in, its backward hook on the host (it needs a concrete value), and the reverse.
    "module_backward_hook_on_the_host": lambda log: ("module_pair", (
        lambda module, go: (go[0] * 0.5,),
        lambda module, gi, go: (gi[0] * 2.0 if float(go[0].sum()) > 0 else gi[0] * 3.0,),
    )),
    "module_pre_hook_on_the_host": lambda log: ("module_pair", (
        lambda module, go: (go[0] * 2.0 if float(go[0].sum()) > 0 else go[0] * 3.0,),
        lambda module, gi, go: (gi[0] + go[0].sum(),),
    )),
    "node_pre_logging": lambda log: ("node_pre", lambda grad_outputs: log.append(("pre", float(grad_outputs[0].sum())))),
    "node_post_branching": lambda log: ("node_post", lambda grad_inputs, grad_outputs: (
        tuple(None if g is None else g * (2.0 if float(g.sum()) > 0 else -1.0) for g in grad_inputs)
    )),
    "post_accumulate_logging": lambda log: ("post_accumulate", lambda p: log.append(("post", float(p.grad.sum())))),
    "host_hook": lambda log: ("w2", host_hook(lambda g: g * 0.5)),
    "host_hook_on_a_module": lambda log: ("module", host_hook(lambda module, gi, go: (gi[0] * 0.5,))),
}


def _install_host(kind, log):
    """Where the kind's hook goes: before the step (on a parameter or a module), or inside it (on h's node)."""
    where, hook = HOST_KINDS[kind](log)

    def install(model):
        if where == "module":
            model[2].register_full_backward_hook(hook)
        elif where == "module_pair":
            model[2].register_full_backward_pre_hook(hook[0])
            model[2].register_full_backward_hook(hook[1])
        elif where in ("w0", "b0", "w2", "b2"):
            {"w0": model[0].weight, "b0": model[0].bias, "w2": model[2].weight, "b2": model[2].bias}[where].register_hook(hook)
        elif where == "post_accumulate":
            model[0].weight.register_post_accumulate_grad_hook(hook)

    def inside(h):
        if where == "node_pre":
            h.grad_fn.register_prehook(hook)
        elif where == "node_post":
            h.grad_fn.register_hook(hook)

    return install, inside


@pytest.mark.parametrize("kind", HOST_KINDS)
def test_hooks_with_python_effects_run_on_the_host_at_every_call_as_eagerly(kind, capsys):
    global CALLS
    outcomes = {}
    for mode in MODES:
        CALLS = 0
        SEEN.clear()
        log: list[object] = []
        got, step = run(mode, *_install_host(kind, log))
        seen = {k: np.asarray(v.detach().numpy()) for k, v in SEEN.items()}
        outcomes[mode] = (got, log, capsys.readouterr().out, CALLS, seen)
    expected = outcomes["eager"]
    for mode in MODES[1:]:
        got, log, printed, calls, seen = outcomes[mode]
        assert_same(got, expected[0])
        assert_same_log(log, expected[1])
        assert printed == expected[2] and calls == expected[3]
        assert seen.keys() == expected[4].keys()
        for key, value in seen.items():
            assert_close(value, expected[4][key])
    assert host_calls(step)


def test_traced_in_and_host_hooks_keep_eagers_order_and_values():
    def install(log):
        def installer(model):
            model[2].weight.register_hook(lambda g: log.append(("w2", float(g.sum()))))
            model[2].bias.register_hook(lambda g: g * 0.5)  # traced in
            model[0].weight.register_hook(lambda g: g.clamp(-0.05, 0.05))  # traced in
            model[0].weight.register_hook(lambda g: log.append(("w0 after the clamp", float(g.abs().max()))))
            model[0].bias.register_hook(lambda g: log.append(("b0", float(g.sum()))))

        return installer

    logs = {}
    for mode in MODES:
        log: list[object] = []
        logs[mode] = (run(mode, install(log))[0], log)
    for mode in MODES[1:]:
        assert_same(logs[mode][0], logs["eager"][0])
        assert_same_log(logs[mode][1], logs["eager"][1])
    assert [name for name, _ in logs["eager"][1][:3]] == ["w2", "w0 after the clamp", "b0"]
    assert all(value <= 0.05 for name, value in logs["compile"][1] if name == "w0 after the clamp")


SCALE = 2.0


class Config:
    scale = 2.0


CONFIG = Config()
FACTORS = {"scale": 2.0}


class Settings:
    def __init__(self):
        self._scale = 2.0

    @property
    def scale(self):
        return self._scale

    @staticmethod
    def global_scale():
        return SCALE


SETTINGS = Settings()


def _reads_property(g):
    return g * SETTINGS.scale


OPTIMIZER = xgrad.optim.SGD([xgrad.tensor([1.0], requires_grad=True)], lr=2.0)


def _reads_learning_rate(g):
    return g * OPTIMIZER.param_groups[0]["lr"]


class Scaler(xgrad.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 2.0


class Parent(xgrad.nn.Module):
    def __init__(self):
        super().__init__()
        self.child = Scaler()


PARENT = Parent()


def _reads_child_module(g):
    return g * PARENT.child.scale


def _reads_by_name(g):
    return g * getattr(SETTINGS, "_scale")  # noqa: B009  (the name as a string is what is tested)


def _reads_global(g):
    return g * SCALE


def _reads_through_a_static_method(g):
    return g * Settings.global_scale()


def _reads_attribute(g):
    return g * CONFIG.scale


def _reads_item(g):
    return g * FACTORS["scale"]


def _closure_reader():
    scale = 2.0

    def hook(g):
        return g * scale

    def rebind(value):
        nonlocal scale
        scale = value

    return hook, rebind


def _set_global(value):
    global SCALE
    SCALE = value


READERS = {
    "global": (lambda: _reads_global, _set_global),
    "static_method": (lambda: _reads_through_a_static_method, _set_global),
    "class_attribute_then_instance": (lambda: _reads_attribute, lambda v: setattr(CONFIG, "scale", v)),
    "dict_item": (lambda: _reads_item, lambda v: FACTORS.__setitem__("scale", v)),
    "property": (lambda: _reads_property, lambda v: setattr(SETTINGS, "_scale", v)),
    "child_module_attribute": (lambda: _reads_child_module, lambda v: setattr(PARENT.child, "scale", v)),
    "attribute_by_name": (lambda: _reads_by_name, lambda v: setattr(SETTINGS, "_scale", v)),
    "optimizer_learning_rate": (lambda: _reads_learning_rate, lambda v: OPTIMIZER.param_groups[0].__setitem__("lr", v)),
}


@pytest.mark.parametrize("kind", [*READERS, "closure"])
def test_a_traced_in_hook_whose_read_value_changes_later_gives_eagers_result(kind):
    if kind == "closure":
        hook, rebind = _closure_reader()
    else:
        make, rebind = READERS[kind]
        hook = make()
    results = {}
    for mode in MODES:
        rebind(2.0)
        model = make_model()
        model[0].weight.register_hook(hook)

        def step(x, model=model, compiled_backward=mode == "compiled"):
            model.zero_grad()
            (model(x) ** 2).sum().backward(compiled=compiled_backward)
            return model[0].weight.grad * 1.0

        fn = xgrad.compile(step, fallback="error") if mode == "compile" else step
        grads = []
        for value in (2.0, 2.0, -3.0, 0.5):
            rebind(value)
            grads.append(fn(xgrad.tensor(BATCHES[0])).numpy())
        results[mode] = grads
        if mode == "compile":
            assert not host_calls(fn)
            assert fn.stats()["compiles"] == 3  # traced again for each new value, and only then
    for mode in MODES[1:]:
        for got, expected in zip(results[mode], results["eager"], strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-12)
    np.testing.assert_allclose(results["eager"][2], -1.5 * results["eager"][0], rtol=1e-12)
    rebind(2.0)


def test_a_leafs_post_accumulate_hooks_traced_in_then_on_the_host_keep_eagers_values_and_order():
    def install(log):
        def halve(p):
            p.grad.mul_(0.5)

        def third(p):
            p.grad.sub_(p.grad / 3.0)

        def installer(model):
            weight = model[2].weight
            weight.register_post_accumulate_grad_hook(halve)  # traced in
            weight.register_post_accumulate_grad_hook(lambda p: log.append(float(p.grad.sum())))  # on the host
            weight.register_post_accumulate_grad_hook(third)  # follows the one before to the host

        return installer

    outcomes = {}
    for mode in MODES:
        log: list[float] = []
        got, step = run(mode, install(log))
        outcomes[mode] = (got, log)
    for mode in MODES[1:]:
        assert_same(outcomes[mode][0], outcomes["eager"][0])
        np.testing.assert_allclose(outcomes[mode][1], outcomes["eager"][1], rtol=1e-12)
    assert len(outcomes["compile"][1]) == len(BATCHES)


class Slotted:
    __slots__ = ("scale",)


def test_a_hook_reading_an_attribute_held_in_slots_stays_on_the_host_and_sees_each_value():
    slotted = Slotted()
    results = {}
    for mode in ("eager", "compile"):
        model = make_model()
        model[0].weight.register_hook(lambda g: g * slotted.scale)  # no guard can see a slot change: on the host

        def step(x, model=model):
            model.zero_grad()
            (model(x) ** 2).sum().backward()
            return model[0].weight.grad * 1.0

        fn = xgrad.compile(step, fallback="error") if mode == "compile" else step
        results[mode] = []
        for value in (2.0, -3.0):
            slotted.scale = value
            results[mode].append(fn(xgrad.tensor(BATCHES[0])).numpy())
    np.testing.assert_allclose(results["compile"], results["eager"], rtol=1e-12)
    assert host_calls(fn)


def _post_accumulate_step(mode, model_as_argument, hook):
    """A step whose first weight has post-accumulate hook ``hook``, the model a closure or an argument: its results."""
    model = make_model()
    model[0].weight.register_post_accumulate_grad_hook(hook)

    def step(model, x):
        model.zero_grad()
        (model(x) ** 2).sum().backward(compiled=mode == "compiled")
        return model[0].weight.grad * 1.0

    if model_as_argument:
        fn = xgrad.compile(step, fallback="error") if mode == "compile" else step
        return lambda x: fn(model, x)

    def closed(x):
        return step(model, x)

    return xgrad.compile(closed, fallback="error") if mode == "compile" else closed


@pytest.mark.parametrize("model_as_argument", [False, True], ids=["closure", "argument"])
@pytest.mark.parametrize("mode", MODES)
def test_a_post_accumulate_hook_returning_a_value_raises_eagers_error(mode, model_as_argument):
    step = _post_accumulate_step(mode, model_as_argument, lambda p: p.grad.mul_(0.5))
    with pytest.raises(RuntimeError, match="post accumulate grad hooks should return None"):
        step(xgrad.tensor(BATCHES[0]))


@pytest.mark.parametrize("model_as_argument", [False, True], ids=["closure", "argument"])
@pytest.mark.parametrize("mode", MODES)
def test_a_post_accumulate_hook_runs_when_the_model_is_a_step_argument(mode, model_as_argument):
    def halve(p):
        p.grad.mul_(0.5)

    got = [_post_accumulate_step(mode, model_as_argument, halve)(xgrad.tensor(x)).numpy() for x in BATCHES]
    expected = [_post_accumulate_step("eager", False, lambda p: None)(xgrad.tensor(x)).numpy() * 0.5 for x in BATCHES]
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)


def test_host_hook_marks_and_their_errors():
    def double(g):
        return g * 2

    assert isinstance(host_hook(double), HostHook) and host_hook(host_hook(double)) == host_hook(double)
    with pytest.raises(TypeError, match="host_hook expects a callable"):
        host_hook(3)
    with pytest.raises(TypeError, match="either pure or on the host"):
        host_hook(pure_hook(double))


# -- hooks on the intermediates of an unmodified Equinox model (from_jax(trace=True)) --------
X = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)


@jax.custom_vjp
def _clip(x):
    return x


_clip.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.05, 0.05),))


@jax.custom_vjp
def _double(x):
    return x


_double.defvjp(lambda x: (x, None), lambda _, g: (2.0 * g,))


@pytest.fixture(scope="module")
def mlp():
    return eqx.filter_jit(lambda key: eqx.nn.MLP(3, 2, 5, 1, activation=jnp.tanh, key=key))(jax.random.PRNGKey(1))


def _loss(model, x):
    return (jax.vmap(model)(x) ** 2).sum()


def _reference(model, x):
    """Equinox's gradient of the loss with ``custom_vjp``s: a clip after the first layer, a doubling after the second."""
    def one(model, x):  # eqx.nn.MLP.__call__ with the two
        h = _clip(model.layers[0](x))
        return _double(model.layers[1](model.activation(h)))

    return eqx.filter_grad(lambda m: (jax.vmap(lambda x: one(m, x))(x) ** 2).sum())(model).layers[0].weight


def _clipped_grad(traced, params, x, compiled_backward=False):
    first = params.layers[0].weight
    first.grad = None
    with xgrad.intermediates() as acts:
        loss = traced(params, x)
    acts["layers[0]"].register_hook(lambda g: g.clamp(-0.05, 0.05))
    acts["layers[1]"].register_hook(lambda g: g * 2.0)
    loss.backward(compiled=compiled_backward)
    return first.grad * 1.0


@pytest.mark.parametrize("mode", [*MODES, "jax.jit"])
def test_hooks_on_an_equinox_models_intermediates_equal_a_custom_vjp_and_are_traced_in(mlp, mode):
    traced = xgrad.from_jax(_loss, trace=True)
    params = jax.tree_util.tree_map(lambda a: xgrad.tensor(a, requires_grad=True) if eqx.is_array(a) else a, mlp)
    expected = _reference(mlp, X)
    if mode == "jax.jit":
        arrays, static = eqx.partition(mlp, eqx.is_array)

        @jax.jit
        def grad_of(arrays, x):
            tensors = jax.tree_util.tree_map(
                lambda a: xgrad.Tensor(a, requires_grad=True) if eqx.is_array(a) else a, eqx.combine(arrays, static),
            )
            return _clipped_grad(traced, tensors, xgrad.Tensor(x)).array

        got = grad_of(arrays, X)
    elif mode == "compile":
        step = xgrad.compile(lambda x: _clipped_grad(traced, params, x), fallback="error")
        got = step(xgrad.tensor(X)).array
        assert "callback" not in step.lower(xgrad.tensor(X)).as_text()
    else:
        got = _clipped_grad(traced, params, xgrad.tensor(X), compiled_backward=mode == "compiled").array
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)


# -- the same hooks under a plain jax.jit, where a traced hook's Python would run once ------
XS = [X * k for k in (1.0, -0.7, 1.9)]
SCALE = 2.0


def _jit_step(mlp, install, route):
    """``route`` (``"engine"``: ``loss.backward()`` on ``from_jax(trace=True)`` intermediates; ``"jax.grad"``: JAX's
    AD, the hooks on the parameters) of the MLP's loss, ``install(tensors, intermediates)`` adding the hooks: a
    function of the arrays and a batch giving the first layer's weight gradient."""
    traced = xgrad.from_jax(_loss, trace=True)
    arrays, static = eqx.partition(mlp, eqx.is_array)

    def tensors_of(arrays):
        return jax.tree_util.tree_map(
            lambda a: xgrad.Tensor(a, requires_grad=True) if eqx.is_array(a) else a, eqx.combine(arrays, static),
        )

    if route == "jax.grad":
        def loss(arrays, x):
            tensors = tensors_of(arrays)
            install(tensors, None)
            return traced(tensors, xgrad.Tensor(x)).array

        return arrays, lambda arrays, x: jax.grad(loss)(arrays, x).layers[0].weight

    def step(arrays, x):
        tensors = tensors_of(arrays)
        with xgrad.intermediates() as acts:
            loss = traced(tensors, xgrad.Tensor(x))
        install(tensors, acts)
        loss.backward()
        return tensors.layers[0].weight.grad.array

    return arrays, step


def _eager_and_jitted(mlp, install, route, log):
    """The step over ``XS`` eagerly and under ``jax.jit``: (its results, what ``log`` held after), for each."""
    global SCALE
    arrays, step = _jit_step(mlp, install, route)
    runs = []
    for fn in (step, jax.jit(step)):
        log.clear()
        got = []
        for i, x in enumerate(XS):
            SCALE = 2.0 + i  # rebound between calls: a hook reading it must see each value
            got.append(np.asarray(fn(arrays, x)))
        runs.append((got, list(log)))
    SCALE = 2.0
    return runs


def _effectful_hooks(log):
    """An observer, a gradient-changing hook with an effect, one reading a global rebound between calls."""
    def observe(name):
        return lambda g: log.append((name, np.asarray(g.sum().array)))

    def scale_and_count(g):
        log.append(("scale", len(log)))
        return g * 0.5

    def install(tensors, acts):
        first, second = (acts["layers[0]"], acts["layers[1]"]) if acts is not None else (
            tensors.layers[0].weight, tensors.layers[1].weight)
        first.register_hook(observe("first"))
        second.register_hook(observe("second, before"))
        second.register_hook(scale_and_count)
        second.register_hook(lambda g: g * SCALE)
        second.register_hook(observe("second, after"))

    return install


@pytest.mark.parametrize("route", ["engine", "jax.grad"])
def test_hooks_with_python_effects_under_jax_jit_run_at_every_call_with_eagers_values_and_order(mlp, route):
    log = []
    (eager, eager_log), (jitted, jit_log) = _eager_and_jitted(mlp, _effectful_hooks(log), route, log)
    for got, expected in zip(jitted, eager, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)
    assert len(eager_log) == 3 * 4
    assert [name for name, _ in jit_log] == [name for name, _ in eager_log]
    for (_, got), (_, expected) in zip(jit_log, eager_log, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("route", ["engine", "jax.grad"])
def test_pure_hooks_under_jax_jit_leave_no_host_call(mlp, route):
    def install(tensors, acts):
        first, second = (acts["layers[0]"], acts["layers[1]"]) if acts is not None else (
            tensors.layers[0].weight, tensors.layers[1].weight)
        first.register_hook(lambda g: g.clamp(-0.05, 0.05))
        second.register_hook(lambda g: g * 2.0)

    arrays, step = _jit_step(mlp, install, route)
    assert "callback" not in jax.jit(step).lower(arrays, X).as_text()
    np.testing.assert_allclose(jax.jit(step)(arrays, X), step(arrays, X), rtol=1e-12, atol=1e-14)


def test_a_hook_with_python_effects_under_jax_jit_of_vmap_raises_naming_the_fix(mlp):
    seen = []

    def install(tensors, acts):
        acts["layers[0]"].register_hook(lambda g: seen.append(g))

    arrays, step = _jit_step(mlp, install, "engine")
    per_example = jax.jit(jax.vmap(step, in_axes=(None, 0)))
    with pytest.raises(RuntimeError, match="pure_hook"):
        per_example(arrays, jnp.stack(XS))
    assert seen == []


def test_a_post_accumulate_hook_with_python_effects_under_jax_jit_raises_naming_the_fix():
    seen = []
    model = make_model()
    model[0].weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad))

    @jax.jit
    def step(model, x):
        (model(xgrad.Tensor(x)) ** 2).sum().backward()
        return model[0].weight.grad.array

    with pytest.raises(RuntimeError, match="post-accumulate-grad hook"):
        step(model, BATCHES[0])
    assert seen == []


def test_module_backward_hooks_with_python_effects_under_jax_jit_run_at_every_call_as_eagerly():
    log = []

    def scale_and_log(module, grad_inputs, grad_outputs):
        log.append(("backward", np.asarray(grad_outputs[0].sum().array)))
        return (grad_inputs[0] * 0.5,)

    model = make_model()
    model[2].register_full_backward_hook(scale_and_log)
    model[0].register_full_backward_pre_hook(lambda module, go: log.append(("pre", np.asarray(go[0].sum().array))))

    def step(model, x):
        model.zero_grad()
        (model(xgrad.Tensor(x)) ** 2).sum().backward()
        return model[0].weight.grad.array

    runs = []
    for fn in (step, jax.jit(step)):
        log.clear()
        got = [np.asarray(fn(model, x)) for x in BATCHES]
        runs.append((got, list(log)))
    (eager, eager_log), (jitted, jit_log) = runs
    np.testing.assert_allclose(jitted, eager, rtol=1e-12, atol=1e-14)
    assert [name for name, _ in eager_log] == ["backward", "pre"] * 3
    assert [name for name, _ in jit_log] == [name for name, _ in eager_log]
    np.testing.assert_allclose([v for _, v in jit_log], [v for _, v in eager_log], rtol=1e-12, atol=1e-14)

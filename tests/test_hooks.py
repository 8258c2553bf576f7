"""Tensor hooks, retain_grad, post-accumulate-grad hooks and node hooks, against PyTorch's semantics.

Reference gradients come from ``jax.vjp`` of the same computation on plain arrays;
orders of events follow PyTorch's NOTE [Hooks ordering].
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import xgrad
from tests._backward_modes import every_backward_mode  # noqa: F401  (a fixture)
from tests._helpers import close, leaf
from xgrad.autograd import get_execution_order, set_multithreading_enabled

pytestmark = pytest.mark.usefixtures("every_backward_mode")  # every test: eager, compiled, each backward a compiled step

X0 = np.array([0.3, -1.2, 0.7])


# -- Tensor.register_hook ---------------------------------------------------------------


def test_hook_on_non_leaf_replaces_its_gradient():
    x = leaf(X0)
    y = x * 2.0
    y.register_hook(lambda g: g * 3.0)
    (x.exp() * y).sum().backward()

    def f(x, y):
        return jnp.sum(jnp.exp(x) * y)

    _, vjp = jax.vjp(f, X0, 2.0 * X0)
    gx, gy = vjp(1.0)
    close(x.grad.array, gx + 2.0 * (3.0 * gy))


def test_hook_on_leaf_sees_the_summed_gradient_once():
    x = leaf(X0)
    seen = []
    x.register_hook(lambda g: seen.append(np.asarray(g.array)))
    (x.sin() + x * x).sum().backward()
    assert len(seen) == 1
    close(seen[0], jnp.cos(X0) + 2 * X0)
    close(x.grad.array, seen[0])


def test_hooks_run_in_registration_order_each_seeing_the_last_result():
    x = leaf(X0)
    y = x.tanh()
    calls = []
    y.register_hook(lambda g: calls.append(("a", np.asarray(g.array))) or g + 1.0)
    y.register_hook(lambda g: calls.append(("b", np.asarray(g.array))) or g * 10.0)
    y.register_hook(lambda g: calls.append(("c", np.asarray(g.array))))
    y.sum().backward()
    assert [c[0] for c in calls] == ["a", "b", "c"]
    close(calls[0][1], np.ones(3))
    close(calls[1][1], np.full(3, 2.0))
    close(calls[2][1], np.full(3, 20.0))
    close(x.grad.array, 20.0 * (1 - jnp.tanh(X0) ** 2))


def test_removed_hook_does_not_run():
    x = leaf(X0)
    calls = []
    handle = x.register_hook(lambda g: calls.append(1))
    handle.remove()
    handle.remove()  # removing twice is harmless
    x.sum().backward()
    assert calls == []


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_remove_from_inside_a_hook_during_backward(compiled):
    x = leaf(X0)
    y = x * 1.0
    calls = []
    handles = {}

    def first(g):
        calls.append("first")
        handles["first"].remove()
        handles["second"].remove()

    handles["first"] = y.register_hook(first)
    handles["second"] = y.register_hook(lambda g: calls.append("second"))
    y.sum().backward(retain_graph=True, compiled=compiled)
    # PyTorch runs a snapshot of the hooks (PyDict_Values): the second was collected
    # before the first removed it, so it still runs in this pass, and in no later one.
    assert calls == ["first", "second"]
    y.sum().backward(compiled=compiled)
    assert calls == ["first", "second"]
    close(x.grad.array, np.full(3, 2.0))


def test_hooks_registered_before_and_after_use_in_the_graph():
    x = leaf(X0)
    calls = []
    x.register_hook(lambda g: calls.append("leaf-before"))
    y = x * 3.0
    y.register_hook(lambda g: calls.append("y-before-use"))
    z = (y * y).sum()
    y.register_hook(lambda g: calls.append("y-after-use"))
    x.register_hook(lambda g: calls.append("leaf-after"))
    z.backward()
    assert calls == ["y-before-use", "y-after-use", "leaf-before", "leaf-after"]
    close(x.grad.array, 18.0 * X0)


def test_hook_on_tensor_that_does_not_require_grad_raises():
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        xgrad.tensor([1.0]).register_hook(lambda g: g)


@pytest.mark.parametrize(
    "bad, exc, phrase",
    [
        (lambda g: xgrad.zeros(2, dtype=jnp.float64), RuntimeError, r"returned a gradient of shape \[2\], expected \[3\]"),
        (lambda g: xgrad.zeros(3, dtype=jnp.float32), RuntimeError, "returned a gradient of dtype float32, expected float64"),
        (lambda g: 1.0, TypeError, "must return a Tensor or None, got float"),
    ],
)
def test_bad_hook_result_raises_and_next_backward_works(bad, exc, phrase):
    x = leaf(X0)
    y = x.exp()
    handle = y.register_hook(bad)
    with pytest.raises(exc, match=phrase):
        y.sum().backward(retain_graph=True)
    handle.remove()
    y.sum().backward()
    close(x.grad.array, jnp.exp(X0))


def test_replacing_a_none_gradient_raises():
    x = leaf(X0)
    a, b = xgrad.ops.from_jax(lambda v: (v * 1.0, v * 2.0))(x)  # one node, two outputs
    b.register_hook(lambda g: xgrad.ones(3, dtype=jnp.float64))  # b gets no gradient: its slot stays None
    with pytest.raises(RuntimeError, match="can't replace a None gradient with a non-None value"):
        a.sum().backward()


# -- retain_grad -------------------------------------------------------------------------


def test_retain_grad_keeps_value_after_tensor_hooks():
    x = leaf(X0)
    y = x.sin()
    y.retain_grad()  # registered before the hook, still sees its result
    y.register_hook(lambda g: g * 5.0)
    assert y.retains_grad and not x.retains_grad
    (y * y).sum().backward()
    close(y.grad.array, 5.0 * 2 * np.sin(X0))
    close(x.grad.array, 5.0 * 2 * np.sin(X0) * np.cos(X0))


def test_retained_grad_accumulates_and_leaf_retain_is_noop():
    x = leaf(X0)
    x.retain_grad()
    assert not x.retains_grad
    y = x * 2.0
    y.retain_grad()
    y.retain_grad()  # idempotent: the grad is not added twice
    y.sum().backward(retain_graph=True)
    y.sum().backward()
    close(y.grad.array, np.full(3, 2.0))
    close(x.grad.array, np.full(3, 4.0))


def test_retain_grad_without_requires_grad_raises():
    with pytest.raises(RuntimeError, match="can't retain_grad on Tensor that has requires_grad=False"):
        xgrad.tensor([1.0]).retain_grad()


def test_non_leaf_without_retain_grad_has_no_grad():
    x = leaf(X0)
    y = x * 2.0
    y.sum().backward()
    assert not y.retains_grad
    with pytest.warns(UserWarning, match="not a leaf Tensor"):
        assert y.grad is None


# -- post-accumulate-grad hooks ---------------------------------------------------------


def test_post_accumulate_hook_sees_updated_grad_and_the_tensor():
    x = leaf(X0)
    x.grad = xgrad.tensor(np.ones(3))
    seen = []
    x.register_post_accumulate_grad_hook(lambda t: seen.append((t, np.asarray(t.grad.array))))
    (x * x).sum().backward()
    assert seen[0][0] is x
    close(seen[0][1], 1.0 + 2 * X0)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_post_accumulate_hook_returning_a_value_raises(compiled):
    """PyTorch's test_post_accumulate_grad_hook_returns_not_None."""
    x = leaf(X0)
    handle = x.register_post_accumulate_grad_hook(lambda t: t.grad)
    with pytest.raises(RuntimeError, match=r"^Tensor post accumulate grad hooks should return None\.$"):
        (x * x).sum().backward(compiled=compiled)
    handle.remove()
    x.grad = None
    (x * x).sum().backward(compiled=compiled)  # the next backward works
    close(x.grad.array, 2 * X0)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_post_accumulate_grad_hook_ordering(compiled):
    """PyTorch's test_post_accumulate_grad_hook_ordering: tensor pre-hook, node pre-hook,
    post-accumulate hook, node post-hook: ((1 - 2) / 5 + 0.5) * 10 = 3.

    PyTorch's node post-hook reads ``grad_out[0]``, which there shares storage with the
    ``.grad`` the post-accumulate hook changed in place (AccumulateGrad steals the
    incoming buffer); here the received grad is its own tensor, so the hook reads
    ``.grad`` itself, which gives the same order check.
    """
    tensor = leaf([0.1, 0.2, 0.3])
    received = []

    def post_acc_grad_hook(t):
        t.grad.add_(0.5)

    def acc_grad_node_post_hook(grad_in, grad_out):
        received.append(grad_out[0].tolist())
        tensor.grad = tensor.grad * 10.0

    acc_grad = (tensor * 1.0).grad_fn.next_functions[0][0]
    tensor.register_hook(lambda g: g - 2.0)
    acc_grad.register_prehook(lambda grad_out: (grad_out[0] / 5.0,))
    tensor.register_post_accumulate_grad_hook(post_acc_grad_hook)
    acc_grad.register_hook(acc_grad_node_post_hook)
    tensor.sum().backward(compiled=compiled)
    close(tensor.grad.array, np.full(3, 3.0))
    close(received[0], np.full(3, -0.2))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("x_first", [True, False], ids=["x*w", "w*x"])
def test_accumulators_ready_together_run_in_edge_order(compiled, x_first):
    """PyTorch gives AccumulateGrad the highest sequence number: the two accumulators
    made ready by MulBackward tie and run in its edge order, hooks included."""
    x, w = leaf(X0), leaf([0.5, 0.25, 2.0])
    events = []
    for name, t in (("x", x), ("w", w)):
        t.register_hook(lambda g, name=name: events.append(f"tensor:{name}"))
        t.register_post_accumulate_grad_hook(lambda t, name=name: events.append(f"post-accumulate:{name}"))
    y = x * w if x_first else w * x
    y.sum().backward(compiled=compiled)
    first, second = ("x", "w") if x_first else ("w", "x")
    assert events == [f"tensor:{first}", f"post-accumulate:{first}", f"tensor:{second}", f"post-accumulate:{second}"]
    acc = y.grad_fn.next_functions[0][0]
    assert acc.sequence_nr == 2**64 - 1 == y.grad_fn.next_functions[1][0].sequence_nr
    close(x.grad.array, w.array)
    close(w.grad.array, x.array)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("op", ["linear(h, w, b)", "h * w", "w * h"])
def test_accumulators_made_ready_with_an_interior_node_run_first(compiled, op):
    """A node that makes an interior node and accumulators ready at once: the accumulators
    run first, in edge order, then the interior node, wherever it sits among the edges,
    as PyTorch's ready queue orders them (AccumulateGrad has the highest sequence number)."""
    x, w, b = leaf(np.ones((4, 3))), leaf(np.full((4, 3), 0.5)), leaf([0.1, 0.2, 0.3, 0.4])
    events = []
    for name, t in (("w", w), ("b", b)):
        t.register_hook(lambda g, name=name: events.append(name))
    h = x * 2.0
    h.register_hook(lambda g: events.append("h"))
    x.register_hook(lambda g: events.append("x"))
    y = {"linear(h, w, b)": lambda: xgrad.nn.functional.linear(h, w, b), "h * w": lambda: h * w, "w * h": lambda: w * h}[op]()
    y.sum().backward(compiled=compiled)
    assert events == (["w", "b", "h", "x"] if op.startswith("linear") else ["w", "h", "x"])
    close(x.grad.array, np.full((4, 3), 2.0 * (0.5 * 4 if op.startswith("linear") else 0.5)))


@pytest.mark.parametrize("register", ["register_hook", "register_post_accumulate_grad_hook"])
def test_tensor_hooks_are_checked_at_registration(register):
    x = leaf(X0)
    with pytest.raises(TypeError, match="hook must be callable"):
        getattr(x, register)(3)
    with pytest.raises(TypeError, match="cannot be called with 1 positional argument"):
        getattr(x, register)(lambda a, b: None)
    with pytest.raises(RuntimeError, match="cannot register a hook on a tensor that doesn't require gradient"):
        getattr(xgrad.tensor([1.0]), register)(lambda g: None)


def test_post_accumulate_hook_on_non_leaf_raises():
    y = leaf(X0) * 2.0
    with pytest.raises(RuntimeError, match="post accumulate grad hooks cannot be registered on non-leaf tensors"):
        y.register_post_accumulate_grad_hook(lambda t: None)


def test_post_accumulate_hook_does_not_run_for_grad():
    x = leaf(X0)
    calls = []
    x.register_post_accumulate_grad_hook(lambda t: calls.append(1))
    (g,) = xgrad.autograd.grad((x * x).sum(), x)
    assert calls == [] and x.grad is None
    close(g.array, 2 * X0)


# -- node hooks -------------------------------------------------------------------------


def test_node_prehook_and_hook_replace_grads():
    x = leaf(X0)
    w = leaf([1.5, 2.0, -0.5])
    y = x * w
    node = y.grad_fn
    seen = {}

    def pre(grad_outputs):
        seen["pre"] = grad_outputs
        return (grad_outputs[0] * 2.0,)

    def post(grad_inputs, grad_outputs):
        seen["post"] = (grad_inputs, grad_outputs)
        return (grad_inputs[0], grad_inputs[1] * 0.0)

    node.register_prehook(pre)
    node.register_hook(post)
    y.sum().backward()
    assert isinstance(seen["pre"], tuple) and len(seen["pre"]) == 1
    grad_inputs, grad_outputs = seen["post"]
    close(grad_outputs[0].array, np.full(3, 2.0))
    _, vjp = jax.vjp(lambda a, b: a * b, X0, np.array([1.5, 2.0, -0.5]))
    gx, gw = vjp(np.full(3, 2.0))
    close(grad_inputs[0].array, gx)
    close(grad_inputs[1].array, gw)
    close(x.grad.array, gx)
    close(w.grad.array, np.zeros(3))


def test_hooks_on_accumulate_grad_node():
    x = leaf(X0)
    y = x * 3.0
    acc = y.grad_fn.next_functions[0][0]
    assert acc.name() == "AccumulateGrad" and acc.variable is x
    events = []
    acc.register_prehook(lambda go: events.append("pre") or (go[0] + 1.0,))
    acc.register_hook(lambda gi, go: events.append(("post", gi, np.asarray(go[0].array))))
    x.register_post_accumulate_grad_hook(lambda t: events.append("post-accumulate"))
    y.sum().backward()
    assert events[:2] == ["pre", "post-accumulate"]
    assert events[2][0] == "post" and events[2][1] == ()
    close(events[2][2], np.full(3, 4.0))
    close(x.grad.array, np.full(3, 4.0))


@pytest.mark.parametrize("method, phrase", [("register_prehook", r"fn\(grad_outputs\)"), ("register_hook", r"fn\(grad_inputs, grad_outputs\)")])
def test_node_hook_with_wrong_arity_raises_at_registration(method, phrase):
    node = (leaf(X0) * 2.0).grad_fn
    with pytest.raises(TypeError, match=phrase):
        getattr(node, method)(lambda a, b, c: None)


def test_node_hook_returning_wrong_number_of_grads_raises():
    x = leaf(X0)
    y = x * 2.0
    y.grad_fn.register_prehook(lambda go: (go[0], go[0]))
    with pytest.raises(RuntimeError, match="must return None or a tuple of 1 gradients, got 2"):
        y.sum().backward()


def test_node_hook_handle_remove():
    x = leaf(X0)
    y = x * 2.0
    calls = []
    handle = y.grad_fn.register_prehook(lambda go: calls.append(1))
    handle.remove()
    y.sum().backward()
    assert calls == []


# -- hooks during autograd.grad ----------------------------------------------------------


def test_tensor_hook_on_captured_input_changes_the_captured_value():
    x = leaf(X0)
    x.register_hook(lambda g: g * 4.0)
    (g,) = xgrad.autograd.grad((x * x).sum(), x)
    close(g.array, 8.0 * X0)
    assert x.grad is None


def test_hooks_on_pruned_nodes_never_run():
    x = leaf(X0)
    w = leaf([1.0, 2.0, 3.0])
    events = []
    ww = w * 2.0
    ww.register_hook(lambda g: events.append("ww-tensor"))
    ww.grad_fn.register_prehook(lambda go: events.append("ww-node"))
    w.register_hook(lambda g: events.append("w-tensor"))
    z = (x.sin() * ww).sum()
    (gx,) = xgrad.autograd.grad(z, x)
    assert events == []
    close(gx.array, np.cos(X0) * 2.0 * np.array([1.0, 2.0, 3.0]))


# -- order of events ---------------------------------------------------------------------


def instrument(named_tensors, events):
    """Record every hook kind on every tensor and node of the graph into ``events``."""
    nodes = {}
    for name, t in named_tensors.items():
        t.register_hook(lambda g, name=name: events.append(f"tensor:{name}"))
        if t.grad_fn is not None:
            t.retain_grad()
            nodes[t.grad_fn] = name
        else:
            t.register_post_accumulate_grad_hook(lambda _, name=name: events.append(f"post-accumulate:{name}"))
            nodes[t.grad_fn or xgrad.engine.node.grad_accumulator(t)] = name
    for node, name in nodes.items():
        tensor = named_tensors[name]

        def pre(go, name=name, tensor=tensor):
            # retains_grad hooks run after tensor hooks and before node pre-hooks
            retained = "" if tensor.is_leaf else f"(retained={tensor.grad is not None})"
            events.append(f"pre:{name}{retained}")

        node.register_prehook(pre)
        node.register_hook(lambda gi, go, name=name: events.append(f"post:{name}"))
    return nodes


def node_events(name, leaf=False, retained=True):
    if leaf:
        return [f"tensor:{name}", f"pre:{name}", f"post-accumulate:{name}", f"post:{name}"]
    return [f"tensor:{name}", f"pre:{name}(retained={retained})", f"post:{name}"]


def diamond():
    x = leaf(X0)
    a = x * 2.0  # MulBackward
    b = a.exp()
    c = a.sin()  # created after b: higher sequence_nr, runs first
    d = b + c
    loss = d.sum()
    return {"x": x, "a": a, "b": b, "c": c, "d": d, "loss": loss}


def test_order_of_every_hook_kind_on_a_diamond():
    t = diamond()
    events = []
    nodes = instrument(t, events)
    with set_multithreading_enabled(False):
        order = get_execution_order(t["loss"])
        t["loss"].backward()
    names = ["loss", "d", "c", "b", "a", "x"]
    expected = [e for n in names for e in node_events(n, leaf=n == "x")]
    assert events == expected
    assert [nodes[n] for n in order] == names
    close(t["x"].grad.array, jax.grad(lambda x: jnp.sum(jnp.exp(2 * x) + jnp.sin(2 * x)))(X0))


def test_order_with_shared_leaf_and_two_roots():
    x = leaf(X0)
    w = leaf([0.5, 0.25, 2.0])
    p = x * w  # creates x's AccumulateGrad, then w's
    s = x + w
    q = s.tanh()
    r1 = p.sum()
    qp = q * p
    r2 = qp.sum()
    t = {"x": x, "w": w, "p": p, "s": s, "q": q, "r1": r1, "qp": qp, "r2": r2}
    events = []
    nodes = instrument(t, events)
    with set_multithreading_enabled(False):
        order = get_execution_order([r1, r2])
        xgrad.autograd.backward([r1, r2])
    # Latest sequence_nr first among ready nodes; p waits for both of its users. The
    # accumulators share PyTorch's highest sequence number and run in p's edge order.
    names = ["r2", "qp", "r1", "q", "s", "p", "x", "w"]
    assert [nodes[n] for n in order] == names
    expected = [e for n in names for e in node_events(n, leaf=n in ("x", "w"))]
    assert events == expected

    def f(x, w):
        p = x * w
        return jnp.sum(p) + jnp.sum(jnp.tanh(x + w) * p)

    gx, gw = jax.grad(f, argnums=(0, 1))(X0, np.array([0.5, 0.25, 2.0]))
    close(x.grad.array, gx)
    close(w.grad.array, gw)


def test_order_during_grad_with_inputs():
    t = diamond()
    events = []
    nodes = instrument(t, events)
    with set_multithreading_enabled(False):
        order = get_execution_order(t["loss"], inputs=[t["a"]])
        (ga,) = xgrad.autograd.grad(t["loss"], [t["a"]])
    # a is captured: its tensor hook and retains-grad hook run, its node does not.
    names = ["loss", "d", "c", "b"]
    assert [nodes[n] for n in order] == names
    assert events == [e for n in names for e in node_events(n)] + ["tensor:a"]
    assert t["x"].grad is None
    a = 2.0 * X0
    close(ga.array, np.exp(a) + np.cos(a))
    close(t["a"].grad.array, ga.array)


def test_order_of_backward_with_inputs_runs_the_input_accumulators():
    t = diamond()
    with set_multithreading_enabled(False):
        order = get_execution_order(t["loss"], inputs=[t["x"]], accumulate_grad=True)
        recorded = []
        for node in order:
            node.register_prehook(lambda go, node=node: recorded.append(node))
        xgrad.autograd.backward(t["loss"], inputs=[t["x"]])
    assert recorded == order
    assert order[-1].name() == "AccumulateGrad"


# -- properties over random graphs ------------------------------------------------------

UNARY = {"sin": (xgrad.sin, jnp.sin), "tanh": (xgrad.tanh, jnp.tanh), "exp": (xgrad.exp, jnp.exp)}
BINARY = {"add": (xgrad.add, jnp.add), "mul": (xgrad.mul, jnp.multiply), "sub": (xgrad.sub, jnp.subtract)}


@st.composite
def programs(draw):
    """A random DAG over two leaves: each step applies an op to earlier values (fan-in and fan-out)."""
    steps = []
    for i in range(draw(st.integers(1, 6))):
        available = 2 + i
        if draw(st.booleans()):
            steps.append((draw(st.sampled_from(sorted(UNARY))), draw(st.integers(0, available - 1))))
        else:
            steps.append((draw(st.sampled_from(sorted(BINARY))), draw(st.integers(0, available - 1)), draw(st.integers(0, available - 1))))
    return steps


def run_program(steps, values, table_index):
    for step in steps:
        if len(step) == 2:
            values.append(UNARY[step[0]][table_index](values[step[1]]))
        else:
            values.append(BINARY[step[0]][table_index](values[step[1]], values[step[2]]))
    return values


def xgrad_grads(steps, hooks):
    """Gradients of the sum of all values w.r.t. the two leaves, with ``hooks[i]`` on value ``i``."""
    leaves = [leaf([0.4, -0.3]), leaf([1.1, 0.2])]
    values = run_program(steps, list(leaves), 0)
    for i, hook in hooks.items():
        values[i].register_hook(hook)
    total = values[0] * 0.0
    for v in values[2:]:
        total = total + v
    total.sum().backward()
    return [np.asarray(t.grad.array) if t.grad is not None else np.zeros(2) for t in leaves]


@given(programs(), st.data())
def test_property_hook_returning_none_changes_nothing(steps, data):
    n = 2 + len(steps)
    hooked = data.draw(st.sets(st.integers(0, n - 1), min_size=1))
    baseline = xgrad_grads(steps, {})
    observed = xgrad_grads(steps, {i: (lambda g: None) for i in hooked})
    for a, b in zip(baseline, observed, strict=True):
        np.testing.assert_array_equal(a, b)


@given(programs(), st.data(), st.sampled_from([0.0, -2.0, 3.5]))
def test_property_scaling_hook_scales_exactly_the_affected_grads(steps, data, c):
    """A hook scaling value ``k``'s grad by ``c`` equals, in JAX, scaling the cotangent flowing out of ``k``."""
    n = 2 + len(steps)
    k = data.draw(st.integers(2, n - 1))
    observed = xgrad_grads(steps, {k: lambda g: g * c})

    def f(x0, x1, scale_path):
        values = [x0, x1]
        for i, step in enumerate(steps):
            # Value k's uses see it with gradient scaled by c: k_used = stop_grad(k) + c * (k - stop_grad(k)).
            if len(step) == 2:
                out = UNARY[step[0]][1](values[step[1]])
            else:
                out = BINARY[step[0]][1](values[step[1]], values[step[2]])
            if 2 + i == k and scale_path:
                out = jax.lax.stop_gradient(out) + c * (out - jax.lax.stop_gradient(out))
            values.append(out)
        return sum(jnp.sum(v) for v in values[2:])

    x0, x1 = np.array([0.4, -0.3]), np.array([1.1, 0.2])
    ref = jax.grad(f, argnums=(0, 1))(x0, x1, True)
    for a, b in zip(observed, ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    unaffected = xgrad_grads(steps, {})
    ref_plain = jax.grad(f, argnums=(0, 1))(x0, x1, False)
    for a, b in zip(unaffected, ref_plain, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.eager_engine
def test_hooks_run_for_nodes_on_a_device_worker_thread():
    """Nodes on the second host device run on its worker thread: every hook kind still runs, in order."""
    import threading

    device = jax.devices()[-1]
    x = xgrad.tensor(X0, device=device, requires_grad=True)
    y = x.sin()
    events = []
    y.register_hook(lambda g: events.append(("tensor", threading.current_thread().name)) or g * 2.0)
    y.grad_fn.register_prehook(lambda go: events.append(("pre", threading.current_thread().name)))
    x.register_post_accumulate_grad_hook(lambda t: events.append(("post-accumulate", threading.current_thread().name)))
    y.sum().backward()
    assert [e[0] for e in events] == ["tensor", "pre", "post-accumulate"]
    if device != jax.local_devices(backend="cpu")[0]:
        assert all(name.startswith("xgrad-autograd") for _, name in events)
    close(x.grad.array, 2.0 * np.cos(X0))
    assert x.grad.device == device


def test_a_tensor_hook_runs_with_grad_mode_off():
    """The engine runs a backward's hooks with grad mode off (no ``create_graph``): an op in one records nothing."""
    w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    seen = []
    w.register_hook(lambda g: seen.append((xgrad.is_grad_enabled(), g.detach().requires_grad_().norm().requires_grad)))
    for _ in range(3):  # in a step: the exact program's host call, then the observer variant
        (w * w).sum().backward()
    assert seen == [(False, False)] * 3


def test_a_hook_dicts_version_names_one_state_of_one_dict():
    """A compiled step's guard takes an equal ``HookDict.version`` for the same hooks: every change, by a handle
    or by the dict's own methods, and every copy (pickled too) gets a version no dict had before."""
    import copy
    import pickle

    x = leaf(X0)
    seen = []

    def version(hooks):
        seen.append(hooks.version)
        return hooks.version

    first = x.register_hook(lambda g: None)
    hooks = x._backward_hooks
    before = version(hooks)
    second = x.register_hook(lambda g: None)
    version(hooks)
    second.remove()
    version(hooks)
    second.remove()  # removed twice: the dict is as it was, and its version still one of its own
    assert list(hooks) == [first.id] and version(hooks) != before
    for change in (
        lambda h: h.update({-1: lambda g: None}), lambda h: h.setdefault(-2, lambda g: None), lambda h: h.pop(-2),
        lambda h: h.popitem(), lambda h: h.__delitem__(first.id), lambda h: h.__ior__({-3: None}), lambda h: h.clear(),
    ):
        change(hooks)
        version(hooks)
    for made in (copy.copy(hooks), copy.deepcopy(hooks), pickle.loads(pickle.dumps(hooks))):
        assert type(made) is type(hooks) and made == hooks
        version(made)
    assert len(set(seen)) == len(seen), seen

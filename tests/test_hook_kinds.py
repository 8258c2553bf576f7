"""Every route and tool covers every kind of hook in the table (NOTE [Hook kinds] in ``xgrad/tensor/hook_kinds.py``).

Each test is parametrized over ``KINDS``: a row added to the table that a route does not
read (the eager engine, the compiled backward's key and miss reasons, ``xgrad.compile``'s
state guard, JAX's AD, ``viz``, ``xgrad.testing``) fails here. The values each check
compares against are independent of the table: JAX's gradients (``check_hooks``), the
hook's own calls, PyTorch's order as ``tests/test_hooks.py`` pins it.
"""

import re

import jax
import numpy as np
import pytest

import xgrad
from tests._backward_modes import every_backward_mode  # noqa: F401  (a fixture)
from xgrad.autograd import compiled
from xgrad.autograd.compiled import pure_hook
from xgrad.tensor.hook_kinds import ACCUMULATED, KINDS, LEAF_KINDS, RECORDS, REPLACES_GRAD, REPLACES_GRADS
from xgrad.testing.invariants import check_hooks
from xgrad.testing.op_specs import specs_for
from xgrad.testing.programs import HookedProgram, HookSpec, build_program
from xgrad.viz import make_dot

# Each kind where it may sit: on a leaf (it keeps hooks of the kind) and on a computed value (its grad_fn keeps them).
PLACES = [(kind, "leaf") for kind in KINDS if kind.leaf_slot] + [(kind, "computed") for kind in KINDS if kind.node_slot]
PLACE_IDS = [f"{kind.name}-on-{where}" for kind, where in PLACES]


def _register(kind, t, hook):
    """A hook of ``kind`` on ``t`` through its public method (``retain_grad`` takes none)."""
    on, method = kind.register
    owner = t if on == "tensor" else t.grad_fn
    return getattr(owner, method)() if kind.convention is RECORDS else getattr(owner, method)(hook)


def _observer(kind, calls):
    """A hook of ``kind`` that only logs that it ran, taking the arguments its convention gives."""
    if kind.convention in (REPLACES_GRAD, REPLACES_GRADS):
        return lambda *args: calls.append(kind.name)
    return lambda t: calls.append(kind.name)


def test_the_table_is_complete_and_in_pytorchs_order():
    """Names and labels are unique, each kind is kept somewhere, ranks order the kinds as PyTorch runs them."""
    assert len({k.name for k in KINDS}) == len({k.label for k in KINDS}) == len({k.rank for k in KINDS}) == len(KINDS)
    assert all(k.node_slot or k.leaf_slot for k in KINDS)
    pytorchs = ["tensor", "retain_grad", "prehook", "posthook", "post_accumulate"]  # NOTE [Hooks ordering]
    assert [k.name for k in sorted(KINDS, key=lambda k: k.rank) if k.name in pytorchs] == pytorchs


@pytest.mark.usefixtures("every_backward_mode")
@pytest.mark.parametrize(("kind", "where"), PLACES, ids=PLACE_IDS)
def test_each_kind_runs_in_every_backward_mode(kind, where):
    """``xgrad.testing`` places a hook of each kind where it may sit; eager, the compiled backward and a compiled
    step each run it once, in PyTorch's order, and its scaling reaches the gradients as JAX computes them."""
    p = build_program([(3,)], [(specs_for("sin")[0], [0]), (specs_for("mul")[0], [1, 0])])
    target = "x0" if where == "leaf" else "v0"
    hooks = [HookSpec(kind.name, target, 2.0 if kind.replaces else None)]
    if kind.name != "tensor":  # another kind beside it: the order between the two is checked too
        hooks.insert(0, HookSpec("tensor", target, None))
    check_hooks(HookedProgram(p, hooks))


@pytest.mark.usefixtures("every_backward_mode")
def test_every_kind_at_once_runs_in_the_ranks_order():
    p = build_program([(3,)], [(specs_for("sin")[0], [0]), (specs_for("mul")[0], [1, 0])])
    hooks = [HookSpec(kind.name, "x0" if where == "leaf" else "v0") for kind, where in reversed(PLACES)]
    check_hooks(HookedProgram(p, hooks))


@pytest.mark.parametrize(("kind", "where"), PLACES, ids=PLACE_IDS)
def test_viz_labels_each_kind_at_its_node(kind, where):
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    y = x.sin()
    _register(kind, x if where == "leaf" else y, _observer(kind, []))
    labels = re.findall(r'label="([^"]*)"', make_dot((y * 2).sum()).source)
    node = r"(2)" if where == "leaf" else r"SinBackward\n(2)"
    assert f"{node}\\nhooks: {kind.label}" in labels


@pytest.mark.parametrize(("kind", "where"), [p for p in PLACES if p[0].phase != ACCUMULATED],
                         ids=[i for p, i in zip(PLACES, PLACE_IDS, strict=True) if p[0].phase != ACCUMULATED])
def test_the_compiled_key_sees_each_kind_and_its_recompile_reason_names_it(kind, where):
    """A hook of each kind that runs at a node changes the compiled backward's key (a pure one by identity), and the
    recompile reason names its kind; the kinds run after ``.grad`` is written the compiled backward runs on the host
    (``test_each_kind_runs_in_every_backward_mode``)."""
    compiled.reset()
    calls = []
    hook = pure_hook(_observer(kind, calls))

    def run(hooked):
        x = xgrad.tensor([1.0, 2.0], requires_grad=True)
        y = x.sin()
        if hooked:
            _register(kind, x if where == "leaf" else y, hook)
        (y * 2).sum().backward(compiled=True)

    run(False)
    run(False)
    run(True)
    s = compiled.stats()
    assert (s["misses"], s["hits"]) == (2, 1)
    node = "AccumulateGrad" if where == "leaf" else "SinBackward"
    assert f"the hooks on {node} changed ({kind.label} hooks;" in s["recompile_reasons"][-1]
    compiled.reset()


@pytest.mark.parametrize("kind", LEAF_KINDS, ids=[k.name for k in LEAF_KINDS])
def test_a_compiled_steps_state_guard_sees_each_kind_a_leaf_keeps(kind):
    """A hook of each kind a leaf keeps, registered on a step's state between calls, makes the step trace again,
    and runs there as eagerly."""
    w = xgrad.tensor([1.0, -2.0], requires_grad=True)
    calls = []

    @xgrad.compile
    def step(x):
        w.grad = None
        (w * x).sum().backward()

    x = xgrad.tensor([3.0, 4.0])
    step(x)
    step(x)
    _register(kind, w, _observer(kind, calls))
    step(x)
    step(x)
    s = step.stats()
    assert (s["misses"], s["hits"]) == (2, 2)
    assert calls == [kind.name] * 2
    np.testing.assert_allclose(w.grad.numpy(), [3.0, 4.0])


@pytest.mark.parametrize("kind", LEAF_KINDS, ids=[k.name for k in LEAF_KINDS])
def test_jax_ad_carries_each_kind_a_leaf_keeps_and_calls_those_it_lowers(kind):
    """Through a pytree round trip a leaf keeps its hooks of each kind; ``jax.grad`` calls those of the kinds marked
    ``jax_ad`` on the cotangent (NOTE [Hooks on JAX's AD]), and no other."""
    w = xgrad.tensor([1.0, -2.0], requires_grad=True)
    calls = []
    if kind.convention is REPLACES_GRAD:
        def hook(g):
            calls.append(kind.name)
            return g * 3
    else:
        hook = _observer(kind, calls)
    _register(kind, w, hook)
    leaves, tree = jax.tree_util.tree_flatten(w)
    back = jax.tree_util.tree_unflatten(tree, leaves)
    kept = [fn[1] if kind.convention is REPLACES_GRAD else fn for fn in getattr(back, kind.leaf_slot).values()]
    assert kept == [hook]
    grad = jax.grad(lambda t: (t * t).sum().array)(w)
    expected = 2 * np.array([1.0, -2.0]) * (3 if kind.jax_ad else 1)
    np.testing.assert_allclose(np.asarray(grad.array), expected)
    assert calls == ([kind.name] if kind.jax_ad else [])

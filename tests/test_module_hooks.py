"""Module forward/backward hooks and the global module hooks, against PyTorch's order and values.

The expected call sequences were written down from the same programs run on PyTorch 2.14;
gradient values come from ``jax.vjp`` of the module's function on plain arrays.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
import xgrad.nn as nn
from tests._backward_modes import every_backward_mode  # noqa: F401  (a fixture)
from tests._helpers import close
from xgrad.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
    register_module_full_backward_hook,
    register_module_full_backward_pre_hook,
)

pytestmark = pytest.mark.usefixtures("every_backward_mode")  # every test: eager, compiled, each backward a compiled step

NO_INPUT_GRAD_WARNING = "Full backward hook is firing when gradients are computed with respect to module outputs"


def _values(grads):
    return [None if g is None else np.asarray(g.array).tolist() for g in grads]


class Two(nn.Module):
    def forward(self, x, flag, y, scale=1.0):
        return x * y * scale, x + 1


def test_hook_order_and_arguments_match_pytorch():
    log = []
    handles = [
        register_module_forward_pre_hook(lambda m, a: log.append(("gpre", type(m).__name__, len(a)))),
        register_module_forward_hook(lambda m, a, o: log.append(("gfwd", len(a), type(o).__name__))),
        register_module_full_backward_pre_hook(lambda m, go: log.append(("gbpre", _values(go)))),
        register_module_full_backward_hook(lambda m, gi, go: log.append(("gbwd", _values(gi), _values(go)))),
    ]
    m = Two()
    m.register_forward_pre_hook(lambda mod, a: log.append(("pre1",)))
    m.register_forward_pre_hook(lambda mod, a: log.append(("pre0",)), prepend=True)
    m.register_forward_pre_hook(lambda mod, a, k: log.append(("prekw", sorted(k))), with_kwargs=True)
    m.register_forward_hook(lambda mod, a, o: log.append(("fwd1",)))
    m.register_forward_hook(lambda mod, a, k, o: log.append(("fwdkw", sorted(k))), with_kwargs=True, prepend=True)
    m.register_full_backward_pre_hook(lambda mod, go: log.append(("bpre",)))
    m.register_full_backward_hook(lambda mod, gi, go: log.append(("bwd1", _values(gi))))
    m.register_full_backward_hook(lambda mod, gi, go: log.append(("bwd0",)), prepend=True)
    try:
        x = xgrad.tensor([1.0, 2.0], requires_grad=True)
        a, b = m(x, "f", xgrad.tensor([3.0, 4.0]), scale=2.0)
        assert a.grad_fn.name() == b.grad_fn.name() == "BackwardHookFunctionBackward"
        (a.sum() * 2 + (b * b).sum()).backward()
    finally:
        for h in handles:
            h.remove()
    # A Tensor input that does not require grad gets a zero gradient, a non-Tensor None (PyTorch's values).
    assert log == [
        ("gpre", "Two", 3), ("pre0",), ("pre1",), ("prekw", ["scale"]), ("gfwd", 3, "tuple"), ("fwdkw", ["scale"]),
        ("fwd1",), ("gbpre", [[2.0, 2.0], [4.0, 6.0]]), ("bpre",),
        ("gbwd", [[16.0, 22.0], None, [0.0, 0.0]], [[2.0, 2.0], [4.0, 6.0]]), ("bwd0",),
        ("bwd1", [[16.0, 22.0], None, [0.0, 0.0]]),
    ]
    assert x.grad.tolist() == [16.0, 22.0]


def test_nested_modules_fire_in_pytorchs_order():
    log = []
    seq = nn.Sequential(nn.Linear(3, 2, key=0), nn.Tanh(), nn.Linear(2, 1, key=1))
    for name, m in seq.named_modules():
        name = name or "seq"
        m.register_forward_pre_hook(lambda mod, a, name=name: log.append(("fpre", name)))
        m.register_forward_hook(lambda mod, a, o, name=name: log.append(("f", name)))
        m.register_full_backward_pre_hook(lambda mod, go, name=name: log.append(("bpre", name)))
        m.register_full_backward_hook(
            lambda mod, gi, go, name=name: log.append(("b", name, tuple(None if g is None else g.shape for g in gi)))
        )
    with pytest.warns(UserWarning, match=NO_INPUT_GRAD_WARNING):
        seq(xgrad.ones(4, 3)).sum().backward()
    assert log == [
        ("fpre", "seq"), ("fpre", "0"), ("f", "0"), ("fpre", "1"), ("f", "1"), ("fpre", "2"), ("f", "2"), ("f", "seq"),
        ("bpre", "seq"), ("b", "seq", (None,)), ("bpre", "2"), ("b", "2", ((4, 2),)), ("bpre", "1"),
        ("b", "1", ((4, 2),)), ("bpre", "0"), ("b", "0", (None,)),
    ]


def test_grad_input_and_grad_output_match_jax_vjp_and_can_be_replaced():
    lin = nn.Linear(3, 2, key=0)
    w, b = np.asarray(lin.weight.array), np.asarray(lin.bias.array)
    x0 = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]])
    seen = {}

    def pre_hook(module, grad_output):
        seen["grad_output"] = np.asarray(grad_output[0].array)
        return (grad_output[0] * 10.0,)

    def hook(module, grad_input, grad_output):
        seen["grad_input"] = np.asarray(grad_input[0].array)
        seen["grad_output_after_pre_hook"] = np.asarray(grad_output[0].array)
        return (grad_input[0] + 1.0,)

    lin.register_full_backward_pre_hook(pre_hook)
    lin.register_full_backward_hook(hook)
    x = xgrad.tensor(x0, requires_grad=True)
    out = lin(x)
    (out * out).sum().backward()

    out0 = x0 @ w.T + b
    cotangent = 2 * out0
    _, vjp = jax.vjp(lambda x, w, b: x @ w.T + b, x0, w, b)
    gx, gw, gb = vjp(10.0 * cotangent)
    close(seen["grad_output"], cotangent)
    close(seen["grad_output_after_pre_hook"], 10.0 * cotangent)
    close(seen["grad_input"], gx)
    close(x.grad.array, gx + 1.0)
    close(lin.weight.grad.array, gw)
    close(lin.bias.grad.array, gb)


def test_wrong_number_of_gradients_from_a_hook_raises_pytorchs_error():
    x = xgrad.ones(1, 2, requires_grad=True)
    lin = nn.Linear(2, 2, key=0)
    handle = lin.register_full_backward_pre_hook(lambda m, go: (go[0], go[0]))
    with pytest.raises(RuntimeError, match="Backward pre hook returned an invalid number of grad_output, got 2, but expected 1"):
        lin(x).sum().backward()
    handle.remove()
    lin.register_full_backward_hook(lambda m, gi, go: (gi[0], gi[0]))
    with pytest.raises(RuntimeError, match="Backward hook returned an invalid number of grad_input, got 2, but expected 1"):
        lin(x).sum().backward()


def test_no_input_requiring_grad_runs_the_hook_with_grad_output_and_warns():
    lin = nn.Linear(2, 2, key=0)
    seen = []
    lin.register_full_backward_hook(lambda m, gi, go: seen.append((gi, go[0].shape)))
    with pytest.warns(UserWarning, match=NO_INPUT_GRAD_WARNING):
        lin(xgrad.ones(1, 2)).sum().backward()
    assert seen == [((None,), (1, 2))]
    lin.register_full_backward_hook(lambda m, gi, go: (xgrad.ones(1, 2),))
    with pytest.warns(UserWarning, match=NO_INPUT_GRAD_WARNING), pytest.raises(
        RuntimeError, match="Backward hook for Modules where no input requires gradient should always return None"
    ):
        lin(xgrad.ones(1, 2)).sum().backward()


def test_hooks_fire_once_under_a_double_backward():
    calls = []
    lin = nn.Linear(2, 1, key=0)
    lin.register_full_backward_hook(lambda m, gi, go: calls.append(1))
    x = xgrad.tensor([[1.0, 2.0]], requires_grad=True)
    (g,) = xgrad.autograd.grad(lin(x).sum(), x, create_graph=True)
    assert len(calls) == 1
    close(g.array, np.asarray(lin.weight.array))


def test_forward_pre_hook_and_forward_hook_replace_args_kwargs_and_output():
    lin = nn.Linear(2, 2, key=0)
    x = xgrad.tensor([[1.0, -2.0]])
    expected = lin(x * 0.0) * 3.0
    lin.register_forward_pre_hook(lambda m, a: a[0] * 0.0)  # a single value becomes the args tuple
    lin.register_forward_hook(lambda m, a, o: o * 3.0)
    close(lin(x).array, expected.array)

    two = Two()
    two.register_forward_pre_hook(lambda m, a, k: (a, {"scale": 5.0}), with_kwargs=True)
    a, _ = two(xgrad.tensor([1.0]), None, xgrad.tensor([2.0]), scale=1.0)
    assert a.tolist() == [10.0]
    bad = nn.ReLU()
    bad.register_forward_pre_hook(lambda m, a, k: 5, with_kwargs=True)
    with pytest.raises(RuntimeError, match=r"forward pre-hook must return None or a tuple of \(new_args, new_kwargs\), but got 5."):
        bad(x)


class Boom(nn.Module):
    def forward(self, x):
        raise ValueError("boom")


def test_always_call_forward_hooks_run_when_forward_raises():
    log = []
    m = Boom()
    m.register_forward_hook(lambda mod, a, o: log.append(("always", o)), always_call=True)
    m.register_forward_hook(lambda mod, a, o: log.append(("never",)))
    with register_module_forward_hook(lambda mod, a, o: log.append(("global",)), always_call=True), pytest.raises(ValueError, match="boom"):
        m(xgrad.ones(1))
    assert log == [("global",), ("always", None)]
    failing = Boom()
    failing.register_forward_hook(lambda mod, a, o: 1 / 0, always_call=True)
    with pytest.warns(UserWarning, match="module forward hook with ``always_call=True`` raised an exception that was silenced"), \
            pytest.raises(ValueError, match="boom"):
        failing(xgrad.ones(1))


def test_backward_hooks_on_a_module_returning_a_dict_warn_and_never_fire():
    class Dict(nn.Module):
        def forward(self, x):
            return {"y": x * 2.0}

    d = Dict()
    d.register_full_backward_hook(lambda m, gi, go: pytest.fail("must not fire"))
    x = xgrad.ones(2, requires_grad=True)
    with pytest.warns(UserWarning, match="module output should be a Tensor or a tuple of Tensors but received <class 'dict'>"):
        out = d(x)
    out["y"].sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


def test_handles_remove_hooks_and_their_flags():
    lin = nn.Linear(2, 1, key=0)
    with lin.register_forward_hook(lambda m, a, k, o: None, with_kwargs=True, always_call=True):
        assert len(lin._forward_hooks) == len(lin._forward_hooks_with_kwargs) == len(lin._forward_hooks_always_called) == 1
    assert not (lin._forward_hooks or lin._forward_hooks_with_kwargs or lin._forward_hooks_always_called)
    calls = []
    with register_module_forward_pre_hook(lambda m, a: calls.append(1)):
        lin(xgrad.ones(1, 2))
    lin(xgrad.ones(1, 2))
    assert calls == [1]
    with pytest.raises(NotImplementedError, match="register_full_backward_hook"):
        lin.register_backward_hook(lambda m, gi, go: None)


def test_module_hooks_inside_xgrad_compile_run_every_call_with_concrete_values():
    lin = nn.Linear(3, 2, key=0, dtype=jnp.float64)
    w = np.asarray(lin.weight.array)
    log = []
    lin.register_full_backward_pre_hook(lambda m, go: log.append(("bpre", np.asarray(go[0].array))))
    lin.register_full_backward_hook(lambda m, gi, go: log.append(("b", np.asarray(gi[0].array))) or (gi[0] * 2.0,))

    @xgrad.compile
    def step(x):
        x.grad = None
        (lin(x) * 3.0).sum().backward()
        return x.grad

    x = xgrad.ones(2, 3, dtype=jnp.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", xgrad.autograd.compiled.RecompileWarning)
        for _ in range(3):  # the second call traces again: the parameters' .grad went from None to a tensor
            log.clear()
            grad = step(x)
            assert [kind for kind, _ in log] == ["bpre", "b"]
            close(log[0][1], np.full((2, 2), 3.0))
            close(log[1][1], np.full((2, 2), 3.0) @ w)
            close(grad.array, 2.0 * np.full((2, 2), 3.0) @ w)
    assert step.stats()["hits"] == 1


def test_a_module_rebuilt_from_its_pytree_has_its_own_hook_dicts():
    lin = nn.Linear(2, 1, key=0, dtype=jnp.float64)
    lin.register_forward_hook(lambda m, a, o: o * 2.0)
    copy = jax.tree_util.tree_map(lambda a: a, lin)
    copy.register_forward_hook(lambda m, a, o: o * 5.0)
    x = xgrad.ones(1, 2, dtype=jnp.float64)
    plain = jnp.ones((1, 2)) @ lin.weight.array.T + lin.bias.array
    close(lin(x).array, 2.0 * plain)
    close(copy(x).array, 10.0 * plain)

"""PyTorch's checkpoint tests (test/test_autograd.py: test_checkpointing*, TestNestedCheckpoint…), eager and compiled.

Their values, counts and message phrases are PyTorch's; a dispatch-mode counter there
becomes a Python-level counter here (xgrad has no dispatch modes).
"""

import collections
import contextlib
import copy
import gc
import weakref

import numpy as np
import pytest

import xgrad
import xgrad.utils.checkpoint
from tests._backward_modes import eager_and_compiled  # noqa: F401  (a fixture)
from xgrad import nn
from xgrad.autograd import Function
from xgrad.utils import CheckpointError, set_checkpoint_debug_enabled, set_checkpoint_early_stop
from xgrad.utils.checkpoint import checkpoint, checkpoint_sequential

pytestmark = pytest.mark.usefixtures("eager_and_compiled")  # every test, eager and compiled


def allclose(a, b):
    return np.allclose(np.asarray(a.array), np.asarray(b.array), rtol=1e-5, atol=1e-6)


@contextlib.contextmanager
def gc_disabled():
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_both_spellings_are_the_same_function():
    x = xgrad.tensor([0.5, 1.0], requires_grad=True)
    a = xgrad.utils.checkpoint.checkpoint(lambda t: t.sin().sum(), x, use_reentrant=False)
    b = xgrad.utils.checkpoint(lambda t: t.sin().sum(), x, use_reentrant=False)
    (ga,) = xgrad.autograd.grad(a, x)
    (gb,) = xgrad.autograd.grad(b, x)
    assert allclose(ga, gb) and allclose(ga, x.cos())


def test_checkpointing():
    # PyTorch's test (a slowTest) runs 2000 inputs through a 1000-wide bottleneck; 8 through 100 show the same.
    num_inp, nz_inp, nz_bottleneck = 8, 10, 100
    module = nn.Sequential(nn.Linear(nz_inp, nz_bottleneck), nn.ReLU(), nn.Linear(nz_bottleneck, nz_inp))
    feat_combined = []
    for _ in range(num_inp):
        data_r = xgrad.rand(1, nz_inp).requires_grad_(True)
        feat_combined.append(checkpoint(module, data_r, use_reentrant=True))
    mean_combined = xgrad.stack(feat_combined).mean()
    mean_combined.backward()
    assert all(p.grad is not None for p in module.parameters())


@pytest.mark.parametrize("input_requires_grad", [True, False])
def test_checkpointing_without_reentrant(input_requires_grad):
    num_inp, nz_inp, nz_bottleneck = 8, 10, 100  # PyTorch's slowTest: 2000 inputs, a 1000-wide bottleneck

    class MyModule(nn.Module):
        def __init__(self, mod):
            super().__init__()
            self.module = mod

        def forward(self, data):
            return self.module(data)

    module = MyModule(nn.Sequential(nn.Linear(nz_inp, nz_bottleneck), nn.ReLU(), nn.Linear(nz_bottleneck, nz_inp)))
    module_copy = copy.deepcopy(module)
    feat_combined, feat_combined_no_checkpoint = [], []
    for _ in range(num_inp):
        data_r = xgrad.rand(1, nz_inp).requires_grad_(input_requires_grad)
        feat_combined.append(checkpoint(module, data=data_r, use_reentrant=False))
        feat_combined_no_checkpoint.append(module_copy(data_r))
    xgrad.stack(feat_combined).mean().backward()
    xgrad.stack(feat_combined_no_checkpoint).mean().backward()
    for checkpoint_param, param in zip(module.parameters(), module_copy.parameters(), strict=True):
        assert allclose(checkpoint_param.grad, param.grad)


def test_checkpointing_without_reentrant_custom_function_works():
    msg = "Unpack is being triggered for a tensor that was already unpacked once"

    class MyFunc(Function):
        @staticmethod
        def forward(ctx, x, y, z):
            w = x * y * z
            out = w + w
            ctx.save_for_backward(x, y, z, w, out)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            x, y, z, w, out = ctx.saved_tensors
            # Accessing the saved tensors a second time raises: recomputed tensors are
            # cleared as soon as they are unpacked.
            with pytest.raises(RuntimeError, match=msg):
                ctx.saved_tensors  # noqa: B018
            return x, y, z

    x, y, z = (xgrad.tensor(v, requires_grad=True) for v in (1.0, 2.0, 3.0))

    def foo(x, y, z):
        x = x * y * z
        y = y * y * z
        z = z * z
        return MyFunc.apply(x, y, z)

    out = checkpoint(foo, x, y, z, use_reentrant=False)
    out.sum().backward()


def test_checkpointing_without_reentrant_with_context_fn():
    log = []

    @contextlib.contextmanager
    def logging(tag):
        log.append(f"enter {tag}")
        try:
            yield
        finally:  # early stop ends the recomputation by an exception
            log.append(f"exit {tag}")

    x = xgrad.tensor(1.0, requires_grad=True)
    out = checkpoint(lambda x: x.exp(), x, use_reentrant=False, context_fn=lambda: (logging("forward"), contextlib.nullcontext()))
    assert log == ["enter forward", "exit forward"]
    log.clear()
    out = checkpoint(lambda x: x.exp(), x, use_reentrant=False, context_fn=lambda: (contextlib.nullcontext(), logging("recompute")))
    assert log == []
    out.backward()
    assert log == ["enter recompute", "exit recompute"]
    with pytest.raises(ValueError, match="only supported when use_reentrant=False"):
        checkpoint(lambda x: x.sin(), x, use_reentrant=True, context_fn=lambda: (logging("a"), logging("b")))
    with pytest.raises(ValueError, match="debug=True is incompatible with non-default context_fn"):
        checkpoint(lambda x: x.sin(), x, use_reentrant=False, debug=True, context_fn=lambda: (logging("a"), logging("b")))


def test_checkpoint_warns_if_use_reentrant_not_passed_explcitly():
    a = xgrad.randn(1, requires_grad=True)
    checkpoint(lambda x: x, a, use_reentrant=False)  # passing it explicitly does not warn
    with pytest.warns(UserWarning, match="the use_reentrant parameter should be passed explicitly"):
        checkpoint(lambda x: x, a)


def test_checkpoint_sequential_warns_if_use_reentrant_not_passed_explcitly():
    a = xgrad.randn(3, requires_grad=True)
    modules_list = [nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 3)]
    checkpoint_sequential(modules_list, 3, a, use_reentrant=False)
    with pytest.warns(UserWarning, match="the use_reentrant parameter should be passed explicitly"):
        checkpoint_sequential(modules_list, 3, a)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_sequential_matches_the_plain_run(use_reentrant):
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    x = xgrad.randn(3, 4, requires_grad=True)
    checkpoint_sequential(model, 2, x, use_reentrant=use_reentrant).sum().backward()
    got = [x.grad] + [p.grad for p in model.parameters()]
    x.grad = None
    model.zero_grad()
    model(x).sum().backward()
    for g, want in zip(got, [x.grad] + [p.grad for p in model.parameters()], strict=True):
        assert allclose(g, want)


def test_checkpoint_detects_non_determinism():
    def save_3_tensors(x):
        out = x.sin().exp()
        return out.sin()

    def save_2_tensors(x):
        return x.sin().exp()

    def save_2_tensors_alt(x):
        return x.sin() * xgrad.tensor([1.0, 2.0])

    def get_non_det_fn(orig_fn, recompute_fn):
        counter = [0]

        def fn(x):
            if counter[0] == 0:
                counter[0] += 1
                return orig_fn(x)
            return recompute_fn(x)

        return fn

    a = xgrad.randn(1, requires_grad=True)
    # Save fewer tensors during recompute
    fn = get_non_det_fn(orig_fn=save_3_tensors, recompute_fn=save_2_tensors)
    with pytest.raises(RuntimeError, match="A different number of tensors was saved"):
        checkpoint(fn, a, use_reentrant=False).backward()
    # Save more tensors during recompute
    fn = get_non_det_fn(orig_fn=save_2_tensors, recompute_fn=save_3_tensors)
    with set_checkpoint_early_stop(False):
        with pytest.raises(RuntimeError, match="trying to save more tensors during recomputation"):
            checkpoint(fn, a, use_reentrant=False).backward()
    # With early stop (the default) the extra tensors are never reached, and the results are right
    fn = get_non_det_fn(orig_fn=save_2_tensors, recompute_fn=save_3_tensors)
    checkpoint(fn, a, use_reentrant=False).backward()
    # Save the same number of tensors but the shape is different
    fn = get_non_det_fn(orig_fn=save_2_tensors, recompute_fn=save_2_tensors_alt)
    with pytest.raises(RuntimeError, match="tensors have different metadata"):
        checkpoint(fn, a, use_reentrant=False).backward()
    # The debug message with debug=True, or debug mode on globally
    fn = get_non_det_fn(orig_fn=save_2_tensors, recompute_fn=save_2_tensors_alt)
    with pytest.raises(RuntimeError, match="You are seeing this error because you passed `debug=True` to checkpoint"):
        checkpoint(fn, a, use_reentrant=False, debug=True).backward()
    fn = get_non_det_fn(orig_fn=save_2_tensors, recompute_fn=save_2_tensors_alt)
    with pytest.raises(RuntimeError, match="You are seeing this error because you passed `debug=True` to checkpoint"):
        with set_checkpoint_debug_enabled(True):
            checkpoint(fn, a, use_reentrant=False, debug=False).backward()
    # Debug mode off globally wins over debug=True
    fn = get_non_det_fn(orig_fn=save_2_tensors, recompute_fn=save_2_tensors_alt)
    with pytest.raises(RuntimeError, match="Recomputed values for the following tensors have different") as info:
        with set_checkpoint_debug_enabled(False):
            checkpoint(fn, a, use_reentrant=False, debug=True).backward()
    assert "You are seeing this error" not in str(info.value)
    assert isinstance(info.value, CheckpointError)


def test_checkpoint_valid_reset_on_error():
    a = xgrad.randn(2, 2, requires_grad=True)
    with pytest.raises(Exception, match="xgrad.utils.checkpoint is incompatible"):
        b = checkpoint(xgrad.exp, a, use_reentrant=True).sum()
        xgrad.autograd.grad(b, (a,))
    c = checkpoint(xgrad.exp, a, use_reentrant=True).sum()
    c.backward()


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpointing_without_reentrant_detached_tensor(use_reentrant):
    class NoGradModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 2, bias=False)
            self.lin2 = nn.Linear(2, 2, bias=False)

        def forward(self, x):
            with xgrad.no_grad():
                return self.lin2(self.linear(x))

    module = NoGradModule()
    err_ctx = pytest.raises(RuntimeError, match="none of output has requires_grad=True") if use_reentrant else contextlib.nullcontext()
    a = xgrad.randn(2, 2, requires_grad=True)
    for _ in range(3):
        with err_ctx:
            out = checkpoint(module, a, use_reentrant=use_reentrant)  # out does not require grad
            out += a  # the loss requires grad
            out.sum().backward()


def test_checkpointing_without_reentrant_saved_object_identity():
    x_backward = None

    class Test(Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(y)
            return x

        @staticmethod
        def backward(ctx, x):
            nonlocal x_backward
            (x_backward,) = ctx.saved_tensors
            return x, None

    a = xgrad.tensor(1.0, requires_grad=True)
    b = xgrad.tensor(1.0, requires_grad=False)
    Test.apply(a, b).backward()
    assert x_backward is b
    x_backward = None
    checkpoint(Test.apply, a, b, use_reentrant=False).backward()
    assert x_backward is b


def test_checkpointing_without_reentrant_correct_grad():
    a = xgrad.randn(2, 2, requires_grad=True)
    b = xgrad.exp(a).sum()
    b.backward()
    b_grad = a.grad
    a.grad = None
    c = checkpoint(xgrad.exp, a, use_reentrant=False).sum()
    c.backward()
    c_grad = a.grad
    a.grad = None
    d = checkpoint(xgrad.exp, a, use_reentrant=False).sum()
    (d_grad,) = xgrad.autograd.grad(d, (a,))
    assert allclose(b_grad, c_grad) and allclose(b_grad, d_grad)


def test_checkpointing_without_reentrant_parameter_used_in_an_out():
    """Gradient hooks are called once per tensor."""
    w = xgrad.randn(10, 10, requires_grad=True)
    count = 0

    def hook(grad):
        nonlocal count
        count += 1

    w.register_hook(hook)
    x = xgrad.rand(10, 10, requires_grad=True)
    h = w * x  # w outside the checkpoint
    out = checkpoint(lambda x: w * x, h, use_reentrant=False)  # and inside it
    out.sum().backward()
    assert count == 1


def test_checkpointing_without_reentrant_arbitrary_input_output():
    class MyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(5, 5, bias=False)

        def forward(self, dict_input):
            return {"result": self.layer(dict_input["tensor"])}

    model_no_checkpoint = MyModel()
    model_checkpoint_without_reentrant = copy.deepcopy(model_no_checkpoint)
    inp = {"tensor": xgrad.randn(5, 5)}
    out_no_checkpoint = model_no_checkpoint(inp)["result"].sum()
    out_checkpoint = checkpoint(model_checkpoint_without_reentrant, inp, use_reentrant=False)["result"].sum()
    assert allclose(out_checkpoint, out_no_checkpoint)
    out_no_checkpoint.backward()
    out_checkpoint.backward()
    for param, checkpoint_param in zip(model_no_checkpoint.parameters(), model_checkpoint_without_reentrant.parameters(),
                                       strict=True):
        assert allclose(param.grad, checkpoint_param.grad)


def test_custom_autograd_ac_early_stop():
    refs = []

    class Test(Function):
        @staticmethod
        def forward(ctx, x):
            y = x.clone()
            ctx.save_for_backward(y)
            refs.append(weakref.ref(y))
            return y

        @staticmethod
        def backward(ctx, *args):
            _ = ctx.saved_tensors
            return None

    inp = xgrad.randn(5, 5, requires_grad=True)

    def scope():
        # Early stop is on by default in the non-reentrant checkpoint
        out = checkpoint(Test.apply, inp, use_reentrant=False)
        out.sum().backward()

    with gc_disabled():
        scope()
        assert refs and all(ref() is None for ref in refs)


def test_save_on_cpu_and_checkpoint():
    a = xgrad.randn(2, 2, requires_grad=True)
    b = a.pow(2).pow(2).pow(2).pow(2)
    b.sum().backward()
    b_grad = a.grad
    a.grad = None
    with xgrad.autograd.graph.save_on_cpu():
        h = a.pow(2)
        h = checkpoint(lambda x: x.pow(2).pow(2), h, use_reentrant=False)
        c = h.pow(2)
    c.sum().backward()
    c_grad = a.grad
    a.grad = None

    def f(a):
        h = a.pow(2)
        with xgrad.autograd.graph.save_on_cpu():
            h = h.pow(2).pow(2)
        return h.pow(2)

    d = checkpoint(f, a, use_reentrant=False)
    d.sum().backward()
    assert allclose(b_grad, c_grad) and allclose(b_grad, a.grad)


# -- TestNestedCheckpoint ----------------------------------------------------------------------
def grad(fn):
    def wrapper(x):
        with xgrad.enable_grad():
            out = fn(x)
            (grad_input,) = xgrad.autograd.grad(out, inputs=(x,), create_graph=True)
        return grad_input

    return wrapper


def sum_of(fn):
    def wrapped(x):
        return fn(x).sum()

    return wrapped


def c(fn):
    def wrapped(*args, **kwargs):
        return checkpoint(fn, *args, use_reentrant=False, **kwargs)

    return wrapped


def get_tests(fn):
    return (
        # a function, and the same function wrapped in checkpoints in various ways
        (fn, (c(fn), c(c(fn)))),
        (grad(fn), (grad(c(fn)), grad(c(c(fn))))),
        (grad(grad(fn)), (grad(c(grad(fn))), c(grad(grad(c(fn)))), grad(c(grad(c(fn)))))),
        (grad(grad(grad(fn))), (grad(c(grad(grad(c(fn))))), grad(c(grad(c(grad(c(fn)))))))),
    )


def check_graph_dies(fn):
    def iter_graph(roots):
        seen, q = set(), collections.deque()
        for node in roots:
            if node is not None:
                seen.add(node)
                q.append(node)
        while q:
            node = q.popleft()
            for next_fn, _ in node.next_functions:
                if next_fn is None or next_fn in seen:
                    continue
                seen.add(next_fn)
                q.append(next_fn)
            yield node

    class Handle:
        def __init__(self, node_name):
            self.node_name = node_name

    def scope():
        a = xgrad.randn((), requires_grad=True)
        out = fn(a)
        refs = []
        for node in iter_graph([out.grad_fn]):
            handle = Handle(node.name())
            refs.append(weakref.ref(handle))
            node.metadata["blah"] = handle
        return refs

    with gc_disabled():
        refs = scope()
        assert [ref().node_name for ref in refs if ref() is not None] == []


@pytest.mark.slow
@pytest.mark.parametrize("early_stop", [True, False])
def test_nested_checkpoint(early_stop):
    with set_checkpoint_early_stop(early_stop):
        x = xgrad.randn((), requires_grad=True)

        def f(x):
            return x.sin().exp().sin()

        def g(x):
            a = x.sin().exp().sin()
            b = x.sin().exp().sin()
            (ga,) = xgrad.autograd.grad(a, x)
            (gb,) = xgrad.autograd.grad(b, x)
            return x.sin()

        for fn in (f, g):
            for expected_fn, actual_fns in get_tests(fn):
                expected = expected_fn(x)
                for actual_fn in actual_fns:
                    assert allclose(expected, actual_fn(x))
                    check_graph_dies(actual_fn)


@pytest.mark.parametrize("early_stop", [True, False])
def test_nested_checkpoint_two_children(early_stop):
    with set_checkpoint_early_stop(early_stop):

        def f(x):
            return x.sin().exp().sin()

        def g(x):
            return x.cos().sin().exp()

        def hc(x):
            return c(g)(c(f)(x))

        def h(x):
            return g(f(x))

        a = xgrad.randn(3, 3, requires_grad=True)
        expected = grad(sum_of(grad(sum_of(h))))(a)
        assert allclose(expected, grad(sum_of(grad(sum_of(c(hc)))))(a))
        assert allclose(expected, grad(sum_of(c(grad(sum_of(c(hc))))))(a))
        check_graph_dies(grad(c(hc)))
        check_graph_dies(grad(sum_of(grad(sum_of(c(hc))))))
        check_graph_dies(grad(sum_of(c(grad(sum_of(c(hc)))))))


@pytest.mark.parametrize("early_stop", [True, False])
def test_nested_checkpoint_non_tensor_inputs_and_outputs(early_stop):
    def fn(k, a, b, f):
        return f(k * a * b.exp()), 1, "abcd"

    k = 3
    a = xgrad.tensor(2.0, requires_grad=True)
    b = xgrad.tensor(3.0, requires_grad=True)

    def f(x):
        return x.sin()

    with set_checkpoint_early_stop(early_stop):
        out, _unused1, _unused2 = checkpoint(fn, k, a, b, f, use_reentrant=False)
    actual_grads = xgrad.autograd.grad(out, (a, b))
    out, _unused1, _unused2 = fn(k, a, b, f)
    expected_grads = xgrad.autograd.grad(out, (a, b))
    for actual, expected in zip(actual_grads, expected_grads, strict=True):
        assert allclose(actual, expected)


@pytest.mark.parametrize("early_stop", [True, False])
def test_nested_checkpoint_kwargs(early_stop):
    def fn(a, blah=None):
        out = a.sin().exp()
        if blah is not None:
            out = out * blah
        return out.sin().exp()

    a = xgrad.tensor(2.0, requires_grad=True)
    b = xgrad.tensor(3.0, requires_grad=True)
    with set_checkpoint_early_stop(early_stop):
        out = checkpoint(fn, a, blah=b, use_reentrant=False)
        actual_grads = xgrad.autograd.grad(out, (a, b))
        out = fn(a, blah=b)
        expected_grads = xgrad.autograd.grad(out, (a, b))
        for actual, expected in zip(actual_grads, expected_grads, strict=True):
            assert allclose(actual, expected)


@pytest.mark.parametrize("early_stop", [True, False])
def test_nested_checkpoint_same_graph(early_stop):
    counter = [0]

    def hook(*_unused_args):
        counter[0] += 1

    def fn(a):
        return a.sin().cos().sin()

    a = xgrad.tensor(1.0, requires_grad=True)
    with set_checkpoint_early_stop(early_stop):
        out = checkpoint(fn, a, use_reentrant=False)
    # The hook is registered on the original graph, and backward runs on the original graph
    out.grad_fn.next_functions[0][0].register_hook(hook)
    out.backward()
    assert counter[0] == 1


@pytest.mark.parametrize("early_stop", [True, False])
def test_nested_checkpoint_reentrant_backwards(early_stop):
    def fn(a):
        x = a.sin().cos()
        out = x.sin()
        return x, out

    def hook(*_unused_args):
        # backward again, skipping the part of the graph where the hook was registered
        x.backward(retain_graph=True)

    a = xgrad.tensor(1.0, requires_grad=True)
    with set_checkpoint_early_stop(early_stop):
        x, out = checkpoint(fn, a, use_reentrant=False)
    out.grad_fn.register_hook(hook)
    out.backward(retain_graph=True)


def test_nested_checkpoint_set_early_stop():
    counter = [0]

    def clone(x):
        counter[0] += 1
        return x.clone()

    def fn(x):
        # clone saves nothing: it is not recomputed iff early stop is on
        return clone(x.sin().cos())

    def run(ctx=None, **kwargs):
        counter[0] = 0
        a = xgrad.tensor(1.0, requires_grad=True)
        with ctx if ctx is not None else contextlib.nullcontext():
            out = checkpoint(fn, a, use_reentrant=False, **kwargs)
        out.backward()
        return counter[0]

    assert run() == 1  # early stop is on by default
    assert run(early_stop=False) == 2  # local setting
    assert run(early_stop=True) == 1
    # The context manager applies to checkpoints made inside it, even when backward runs after it
    assert run(set_checkpoint_early_stop(False)) == 2
    assert run(set_checkpoint_early_stop(True)) == 1
    # Nesting: the innermost wins
    counter[0] = 0
    a = xgrad.tensor(1.0, requires_grad=True)
    with set_checkpoint_early_stop(False), set_checkpoint_early_stop(True):
        out = checkpoint(fn, a, use_reentrant=False, early_stop=False)
    out.backward()
    assert counter[0] == 1
    # Precedence: the context manager over the argument
    assert run(set_checkpoint_early_stop(False), early_stop=True) == 2
    assert run(set_checkpoint_early_stop(True), early_stop=False) == 1


def test_nested_checkpoint_set_early_stop_no_recompution_needed():
    # Case 1: one tensor is saved, and it is the input: fn reruns either way
    counter = [0]

    def fn(x):
        counter[0] += 1
        return x.sin()

    a = xgrad.tensor(1.0, requires_grad=True)
    checkpoint(fn, a, use_reentrant=False).backward()
    assert counter[0] == 2
    counter = [0]
    a = xgrad.tensor(1.0, requires_grad=True)
    with set_checkpoint_early_stop(False):
        out = checkpoint(fn, a, use_reentrant=False)
    out.backward()
    assert counter[0] == 2

    # Case 2: the forward saves no tensors: nothing is unpacked, so no recomputation at all
    counter = [0]

    def fn2(x):
        counter[0] += 1
        return x.clone()

    a = xgrad.tensor(1.0, requires_grad=True)
    checkpoint(fn2, a, use_reentrant=False).backward()
    assert counter[0] == 1
    counter = [0]
    a = xgrad.tensor(1.0, requires_grad=True)
    with set_checkpoint_early_stop(False):
        out = checkpoint(fn2, a, use_reentrant=False)
    out.backward()
    assert counter[0] == 1

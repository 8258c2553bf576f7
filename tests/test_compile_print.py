"""``print`` in an ``xgrad.compile`` step prints at every call, as eager does, and stays compiled.

Each test runs the same step on two copies of the same state, eagerly (the reference:
``Tensor.__repr__``/``__format__`` on concrete values) and compiled, and compares what
they print (``capsys``), call by call; the compiled one must not have fallen back.
"""

from __future__ import annotations

import builtins
import io
import logging
import threading
import warnings

import jax
import numpy as np
import pytest

import xgrad
from xgrad.autograd import compiled as compiled_backward
from xgrad.compile_step import CompileFallbackWarning

PYTHON_PRINT = builtins.print


def setup_state():
    """A parameter, a float64 buffer and a step printing them every way a user writes it."""
    w = xgrad.tensor([1.0, -2.0], requires_grad=True)
    scale = xgrad.tensor(np.array(0.5, np.float64))

    def step(x):
        w.grad = None
        print("w before", w)  # state: its value at each call, not the traced one
        loss = ((w * x).sum() - 1.0) ** 2
        print("loss", loss, sep=": ", end=" |\n")
        print(f"loss {loss:.4f} item {loss.item():.3f} repr {loss.item()!r} {loss!r}", loss.item())
        print("%s and %s" % (loss, scale), "str " + str(scale * loss), "{} {}".format(w, x))  # noqa: UP031, UP032
        print([loss, x], (loss,), ", ".join(f"{v:.2f}" for v in (loss, 2 * loss)), " ".join([str(x), f"{loss}"]))
        loss.backward()
        print(
            "grad", w.grad,
            f"norm {w.grad.norm():.5f}",
        )
        with xgrad.no_grad():
            w.sub_(0.1 * w.grad)
        return loss

    return step


def printed_per_call(step, capsys, calls=3):
    outputs = []
    for i in range(calls):
        step(xgrad.tensor([1.0, 0.5 * i]))
        outputs.append(capsys.readouterr().out)
    return outputs


def test_print_in_a_compiled_step_prints_every_call_as_eager(capsys):
    eager = printed_per_call(setup_state(), capsys)
    step = xgrad.compile(setup_state(), fallback="error")
    assert printed_per_call(step, capsys) == eager
    assert "tensor(" in eager[0] and eager[0] != eager[1]  # values, and they change between calls
    stats = step.stats()
    assert (stats["compiles"], stats["hits"], stats["fallbacks"]) == (1, 2, 0)
    assert builtins.print is PYTHON_PRINT  # the stand-in is gone once no step is traced


def test_a_step_that_only_prints_has_no_host_call_in_its_program(capsys):
    """The prints run after the program on its outputs: JAX's fast dispatch stays."""
    step = xgrad.compile(setup_state(), fallback="error")
    text = step.lower(xgrad.tensor([1.0, 2.0])).as_text()
    assert "callback" not in text
    assert capsys.readouterr().out == ""  # tracing printed nothing


def test_nothing_is_printed_while_tracing_and_a_print_file_is_kept(capsys):
    """Print's own arguments (``file``, ``flush``) are kept; the trace itself writes nothing."""
    sink = io.StringIO()
    w = xgrad.tensor([3.0, 4.0])

    def step(x):
        print("norm", (w * x).norm(), file=sink, flush=True)
        print("done")
        return x

    compiled = xgrad.compile(step, fallback="error")
    compiled.lower(xgrad.tensor([1.0, 1.0]))
    assert (sink.getvalue(), capsys.readouterr().out) == ("", "")
    compiled(xgrad.tensor([1.0, 1.0]))
    compiled(xgrad.tensor([2.0, 2.0]))
    assert sink.getvalue() == "norm tensor(5.)\nnorm tensor(10.)\n"
    assert capsys.readouterr().out == "done\ndone\n"


def hooked_state(print_forward):
    w = xgrad.tensor([1.0, -2.0], requires_grad=True)
    w.register_hook(lambda g: print("w hook", g))  # observes

    def step(x):
        w.grad = None
        h = (w * x).tanh()
        if print_forward:  # a print before the hooks: the prints run inside the program, in order with them
            print("forward", h)
            h.register_hook(lambda g: print("h hook", g) or g * 2)  # replaces its gradient
        loss = (h * h).sum()
        loss.backward()
        print("backward", w.grad)
        return loss

    return step


@pytest.mark.parametrize("print_forward", [True, False])
@pytest.mark.parametrize("mode", ["compiled backward", "xgrad.compile"])
def test_prints_are_ordered_with_hooks_as_in_eager(capsys, mode, print_forward):
    eager = printed_per_call(hooked_state(print_forward), capsys)
    step = hooked_state(print_forward)
    if mode == "xgrad.compile":
        step = xgrad.compile(step, fallback="error")
        assert printed_per_call(step, capsys) == eager
        # Only observing hooks and prints after them: the hooks and the prints both run after the program.
        assert step.stats()["variants"] == (0 if print_forward else 1)
    else:
        compiled_backward.reset()
        with compiled_backward.enable():
            assert printed_per_call(step, capsys) == eager
        assert compiled_backward.stats()["compiles"] >= 1
        compiled_backward.reset()
    order = ["forward", "h hook", "w hook", "backward"] if print_forward else ["w hook", "backward"]
    assert [eager[0].index(word) for word in order] == sorted(eager[0].index(word) for word in order)


def test_a_print_before_a_failing_check_prints_and_the_error_is_eagers(capsys):
    table = xgrad.tensor([[1.0], [2.0]])

    def step(i):
        print("looking up", i)
        return table[i]

    compiled = xgrad.compile(step, fallback="error")
    assert compiled(xgrad.tensor([1])).tolist() == [[2.0]]
    with pytest.raises(IndexError):
        step(xgrad.tensor([5]))
    eager = capsys.readouterr().out
    assert compiled(xgrad.tensor([1])).tolist() == [[2.0]]
    with pytest.raises(IndexError):
        compiled(xgrad.tensor([5]))
    assert capsys.readouterr().out == eager
    assert eager == "looking up tensor([1], dtype=int64)\nlooking up tensor([5], dtype=int64)\n"


CONSTRUCTS = {
    "item": (lambda loss: loss.item() + 1.0, r"t\.item\(\)"),
    "if": (lambda loss: 1.0 if loss > 0 else 2.0, r"bool\(\) of a tensor \(an if, while"),
    "f-string logged": (lambda loss: logging.getLogger("t").debug(f"{loss:.3f}"), r"an f-string or format\(\)"),
    "str used": (lambda loss: len(str(loss)), r"str\(\)/repr\(\) of a tensor whose text goes somewhere other"),
    "mask": (lambda loss: (loss * xgrad.ones(2))[xgrad.ones(2) > loss], r"a boolean mask"),
}


@pytest.mark.parametrize("construct", CONSTRUCTS)
def test_the_fallback_warning_names_the_line_and_the_construct(capsys, construct):
    needs_value, message = CONSTRUCTS[construct]
    w = xgrad.tensor([1.0, -2.0], requires_grad=True)

    def step(x):
        loss = ((w * x).sum() - 1.0) ** 2
        print("loss", loss)
        needs_value(loss)
        return loss

    step(xgrad.tensor([1.0, 1.0]))
    eager = capsys.readouterr().out
    compiled = xgrad.compile(step)
    with pytest.warns(CompileFallbackWarning, match=message) as record:
        compiled(xgrad.tensor([1.0, 1.0]))
    text = str(record[0].message)
    assert f"test_compile_print.py:{CONSTRUCTS_LINE[construct]}" in text
    assert "needs_value" not in text and "lambda loss" in text  # the line's source, the user's
    # Nothing printed by the trace that fell back: eager's one line, whole.
    assert capsys.readouterr().out == eager == "loss tensor(4., grad_fn=<PowBackward>)\n"
    assert compiled.stats()["fallbacks"] == 1


CONSTRUCTS_LINE = {
    name: fn.__code__.co_firstlineno for name, (fn, _) in CONSTRUCTS.items()
}


def test_a_tensor_text_that_a_print_does_not_take_falls_back(capsys):
    """A tensor's text made for a print but kept elsewhere (here by an object's ``__str__``) is not compiled."""
    w = xgrad.tensor([1.0, 2.0])
    kept = []

    class Note:
        def __str__(self):
            kept.append(str(w))  # made while print runs, never printed
            return "note"

    def step():
        print(Note())
        return w * 2

    compiled = xgrad.compile(step)
    expected = r"the text of a tensor \(repr\(\)/str\(\) of a tensor\) went somewhere other than print"
    with pytest.warns(CompileFallbackWarning, match=expected):
        compiled()
    assert capsys.readouterr().out == "note\n"
    assert kept[-1] == "tensor([1., 2.])"


def test_print_elsewhere_while_a_step_is_traced_prints_at_once(capsys):
    """Under a ``jax.jit`` nested in the step, print is Python's (as JAX traces it); the stand-in goes afterwards."""
    def step(x):
        jax.jit(lambda a: print("inside jit") or a)(x.array)
        return x * 2

    compiled = xgrad.compile(step, fallback="error")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled(xgrad.tensor([1.0]))
        compiled(xgrad.tensor([2.0]))
    assert capsys.readouterr().out == "inside jit\n"
    assert builtins.print is PYTHON_PRINT


def test_a_trace_that_raises_prints_what_eager_printed_before_the_error_as_far_as_it_is_known(capsys):
    """``print(x.shape)`` before a shape error shows, as eagerly; a tensor's values, unknown while tracing, stop it."""
    w = xgrad.ones(3, 2)

    def step(x):
        print("x is", x.shape, "w is", tuple(w.shape))
        print("x", x)
        print("after values")
        return x @ w

    x = xgrad.ones(4, 5)
    with pytest.raises(RuntimeError) as eager_error:
        step(x)
    eager = capsys.readouterr().out
    with pytest.raises(RuntimeError) as compiled_error:
        xgrad.compile(step)(x)
    assert str(compiled_error.value) == str(eager_error.value)
    assert eager.startswith("x is (4, 5) w is (3, 2)\nx tensor(")
    assert capsys.readouterr().out == "x is (4, 5) w is (3, 2)\n"


def test_without_source_a_print_of_a_tensor_compiles_and_an_f_string_falls_back(capsys):
    """Code with no source to read (``exec`` of a string): print's arguments need none; an f-string's way is unknown."""
    namespace = {"xgrad": xgrad}
    exec(  # code with no source file: the point of the test
        "def plain(x):\n    print('x', x * 2)\n    return x\n"
        "def formatted(x):\n    print(f'{x.sum():.1f}')\n    return x\n",
        namespace,
    )
    plain = xgrad.compile(namespace["plain"], fallback="error")
    plain(xgrad.tensor([1.0]))
    plain(xgrad.tensor([2.0]))
    assert capsys.readouterr().out == "x tensor([2.])\nx tensor([4.])\n"
    formatted = xgrad.compile(namespace["formatted"])
    with pytest.warns(CompileFallbackWarning, match=r"an f-string or format\(\) of a tensor .* \(at <string>:5\)"):
        formatted(xgrad.tensor([1.5]))
    assert capsys.readouterr().out == "1.5\n"


def test_another_thread_prints_at_once_while_a_step_is_traced(capsys):
    """The stand-in print only defers in the context tracing the step; a thread running eagerly meanwhile prints."""
    tracing, printed = threading.Event(), threading.Event()

    def step(x):
        print("in step", x)
        tracing.set()
        assert printed.wait(timeout=60)  # the trace waits here while the main thread prints
        return x * 2

    compiled = xgrad.compile(step, fallback="error")
    worker = threading.Thread(target=compiled, args=(xgrad.tensor([1.0]),))
    worker.start()
    assert tracing.wait(timeout=60)
    assert builtins.print is not PYTHON_PRINT  # the stand-in, while the step is traced
    builtins.print("eager meanwhile", xgrad.tensor([3.0]))
    printed.set()
    worker.join()
    assert capsys.readouterr().out == "eager meanwhile tensor([3.])\nin step tensor([1.])\n"
    assert builtins.print is PYTHON_PRINT


class Printing(xgrad.nn.Module):
    """A model whose forward prints, in train mode only: a print below the step, in another frame."""

    def __init__(self):
        super().__init__()
        self.weight = xgrad.nn.Parameter(xgrad.tensor([[1.0, -1.0], [0.5, 2.0]]))

    def forward(self, x):
        h = x @ self.weight
        if self.training:
            print(f"hidden mean {h.mean():.3f}, weight {self.weight}")
        return h.relu().sum()


def test_a_print_in_a_modules_forward_follows_its_mode(capsys):
    def run(compile_it):
        model = Printing()
        opt = xgrad.optim.SGD(model.parameters(), lr=0.1)

        def step(x):
            opt.zero_grad()
            loss = model(x)
            loss.backward()
            opt.step()
            return loss

        step = xgrad.compile(step, fallback="error") if compile_it else step
        out = []
        for mode in ("train", "eval", "train"):
            getattr(model, mode)()
            step(xgrad.tensor([[1.0, 2.0]]))
            out.append(capsys.readouterr().out)
        return out, step

    eager, _ = run(False)
    compiled, step = run(True)
    assert compiled == eager and eager[1] == "" and eager[0] != eager[2]
    assert (step.stats()["compiles"], step.stats()["fallbacks"]) == (2, 0)


def test_a_dual_tensors_tangent_prints_its_values_inside_its_repr(capsys):
    """A dual tensor's text holds its tangent's: a mark inside a mark, both filled at every call, as eager shows them."""
    from xgrad.autograd import forward_ad as fwAD

    def setup():
        w = xgrad.tensor([1.0, 2.0])

        def step(x):
            with fwAD.dual_level():
                dual = fwAD.make_dual(x * w, 0.5 * x)
                print("dual", dual, "again", dual)
            with xgrad.no_grad():
                w.add_(x)
            return x

        return step

    eager = printed_per_call(setup(), capsys)
    step = xgrad.compile(setup(), fallback="error")
    assert printed_per_call(step, capsys) == eager
    assert "tangent=tensor(" in eager[0] and eager[1] != eager[2]
    assert step.stats()["fallbacks"] == 0

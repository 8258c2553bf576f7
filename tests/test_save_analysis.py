"""The save analysis (NOTE [Save what the needed rules read]) changes what a node keeps, never a gradient.

Each primitive whose analysis saves less with one input requiring grad runs that way (where the analysis saves least), once as
shipped and once with the analysis forced off (every primitive saves what ``save=``
allows, as if its rules' reads were unknown): the gradients must be the same.
"""

import numpy as np
import pytest

import xgrad
from xgrad.testing.op_specs import OP_SPECS


def _analysis_saves_less(spec, i):
    """Whether the op's primitive, with only input ``i`` wanting a grad, saves less than it would without the analysis."""
    prim = xgrad.ops.REGISTRY.get(spec.name)
    if prim is None or prim._reads is None or len(prim._reads) != len(spec.domains):
        return False
    wanted = tuple(k == i for k in range(len(spec.domains)))
    inputs, save_out = prim.saves(wanted)
    everything = frozenset(range(len(wanted))) if prim.save is None else prim.save
    return inputs != everything or save_out != prim.save_out


def _cases():
    seen = set()
    for spec in OP_SPECS:
        if spec.name in seen:
            continue
        seen.add(spec.name)
        for i, domain in enumerate(spec.domains):
            if domain.differentiable and _analysis_saves_less(spec, i):
                yield spec, i
                break  # one input per op keeps this quick


CASES = list(_cases())


def _grad(spec, inputs, i):
    x = xgrad.tensor(inputs[i], requires_grad=True)
    out = spec.op(*(x if k == i else xgrad.tensor(a) for k, a in enumerate(inputs)))
    outs = out if isinstance(out, (tuple, list)) else (out,)
    total = sum((o.astype(x.dtype) * 1.0).sum() for o in outs if o.dtype == x.dtype)
    (g,) = xgrad.autograd.grad(total, [x], allow_unused=True)
    return None if g is None else np.asarray(g)


@pytest.fixture
def analysis_off(monkeypatch):
    """Every primitive forgets what its rules read: it saves all that ``save=`` allows."""
    for prim in xgrad.ops.REGISTRY.values():
        monkeypatch.setattr(prim, "_reads", None)
        monkeypatch.setattr(prim, "_saves", {})
        monkeypatch.setattr(prim, "_fused", {})


@pytest.mark.parametrize("case", CASES, ids=[f"{s.id}-input{i}" for s, i in CASES])
def test_gradients_do_not_depend_on_the_save_analysis(case, request):
    spec, i = case
    inputs = spec.sample(np.random.default_rng(5), 0)
    with_analysis = _grad(spec, inputs, i)
    request.getfixturevalue("analysis_off")
    without = _grad(spec, inputs, i)
    if with_analysis is None or without is None:
        assert with_analysis is None and without is None
    else:
        np.testing.assert_allclose(with_analysis, without, rtol=1e-12, atol=0)


def _saved_tensors():
    x = xgrad.tensor([0.5, 2.0], requires_grad=True)
    node = (x * xgrad.tensor([1.5, 3.0])).grad_fn
    return sum(isinstance(s, xgrad.engine.saved.SavedTensor) for s in node.saved)


def test_forcing_the_analysis_off_saves_more(request):
    """The fixture really turns the analysis off: ``x * c`` with only ``x`` requiring grad saves ``c`` alone, else both."""
    assert _saved_tensors() == 1
    request.getfixturevalue("analysis_off")
    assert _saved_tensors() == 2

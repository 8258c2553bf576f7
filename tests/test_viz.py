"""make_dot: the Digraph mirrors the backward graph; rendering when ``dot`` is installed."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import xgrad
from xgrad.viz import make_dot, show


def _labels(dot):
    return re.findall(r'label="([^"]*)"', dot.source)


def _edges(dot):
    return re.findall(r"^\s*(\S+) -> (\S+)", dot.source, flags=re.M)


def test_nodes_edges_and_param_names():
    model = xgrad.nn.Linear(3, 2, key=0)
    x = xgrad.ones(4, 3)
    loss = model(x).tanh().sum()
    dot = make_dot(loss, params=model.named_parameters())
    labels = _labels(dot)
    assert r"weight\n(2, 3)" in labels and r"bias\n(2)" in labels
    assert r"output 0\n()" in labels
    # One graph node per backward node reachable from the root, plus the output box.
    reachable, stack = set(), [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn not in reachable:
            reachable.add(fn)
            stack.extend(n for n, _ in fn.next_functions if n is not None)
    names = {label.split("\\n")[0] for label in labels}
    assert {fn.name() for fn in reachable if not isinstance(fn, xgrad.autograd.graph.AccumulateGrad)} <= names
    assert {"TanhBackward", "SumBackward"} <= names
    node_lines = re.findall(r"^\s*(\S+) \[label=", dot.source, flags=re.M)
    assert set(node_lines) == {str(id(fn)) for fn in reachable} | {"output0"}
    # Edges follow next_functions, pointing the forward way.
    expected = {(str(id(n)), str(id(fn))) for fn in reachable for n, _ in fn.next_functions if n is not None}
    assert set(_edges(dot)) == expected | {(str(id(loss.grad_fn)), "output0")}


def test_hooks_are_marked():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: None)
    y.retain_grad()
    z = y.exp()
    z.grad_fn.register_prehook(lambda g: None)
    x.register_post_accumulate_grad_hook(lambda t: None)
    labels = _labels(make_dot(z.sum()))
    assert r"MulBackward\n(2)\nhooks: tensor, retain_grad" in labels
    assert r"ExpBackward\n(2)\nhooks: pre" in labels
    assert r"(2)\nhooks: post_accumulate" in labels
    assert r"SumBackward\n()" in labels  # no hooks, no marker


def test_show_saved_and_freed():
    x = xgrad.tensor([[1.0, 2.0]], requires_grad=True)
    loss = (x.exp() * x).sum()
    saved = [label for label in _labels(make_dot(loss, show_saved=True)) if label.startswith("saved")]
    # exp saves its output; mul saves both inputs.
    assert sorted(saved) == sorted([r"saved out 0\n(1, 2)", r"saved input 0\n(1, 2)", r"saved input 1\n(1, 2)"])
    assert not any(label.startswith("saved") for label in _labels(make_dot(loss)))
    loss.backward()
    assert r"saved input 0\nfreed" in _labels(make_dot(loss, show_saved=True))


def test_several_outputs_and_no_graph():
    x = xgrad.tensor([1.0], requires_grad=True)
    dot = make_dot([x.sin(), x.cos()])
    assert r"output 0\n(1)" in _labels(dot) and r"output 1\n(1)" in _labels(dot)
    assert _labels(make_dot(xgrad.ones(2))) == []


@pytest.mark.skipif(shutil.which("dot") is None, reason="rendering needs the Graphviz dot binary (apt-get install graphviz)")
def test_renders_png_and_svg(tmp_path):
    w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    dot = make_dot((w * w).sum(), params={"w": w})
    png = dot.pipe(format="png")
    assert png.startswith(b"\x89PNG")
    svg = dot.pipe(format="svg").decode()
    assert "<svg" in svg and "MulBackward" in svg


def test_make_dot_without_graphviz_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "graphviz", None)  # what an environment without the package imports
    w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(ImportError, match=r'pip install "xgrad\[viz\]"'):
        make_dot((w * w).sum())


@pytest.mark.parametrize("dot_program", ["installed", "missing"])
def test_show_outside_a_notebook_writes_the_graph_to_a_file(tmp_path, monkeypatch, dot_program):
    if dot_program == "installed" and shutil.which("dot") is None:
        pytest.skip("rendering needs the Graphviz dot binary (apt-get install graphviz)")
    if dot_program == "missing":
        monkeypatch.setattr(shutil, "which", lambda name: None)
    w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    dot = make_dot((w * w).sum(), params={"w": w})
    path = show(dot, tmp_path / "graph")
    if dot_program == "installed":
        assert path == tmp_path / "graph.svg" and path.read_text().lstrip().startswith("<?xml")
    else:
        assert path == tmp_path / "graph.gv" and path.read_text() == dot.source


def test_show_outside_a_notebook_writes_a_figure_to_png(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = show(fig, tmp_path / "curve")
    plt.close(fig)
    assert path == tmp_path / "curve.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_notebook_run_as_a_script_writes_its_graph_to_a_file(tmp_path):
    notebook = Path(__file__).resolve().parent.parent / "notebooks" / "01_quickstart.py"
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, str(notebook)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (picture,) = [p for p in tmp_path.iterdir() if p.stem == "quickstart_graph"]
    if picture.suffix == ".svg":
        assert "CrossEntropyBackward" in picture.read_text()
    else:  # no Graphviz dot program: the graph's source
        assert picture.suffix == ".gv" and picture.read_text().startswith("digraph")

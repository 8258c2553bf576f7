"""Pictures of the backward graph: ``make_dot`` builds a ``graphviz.Digraph``; ``show`` puts a
picture inline in a notebook, or in a file when the notebook runs as a script.

Both need the ``xgrad[viz]`` extra (graphviz, matplotlib). Rendering a graph to SVG/PNG also
needs the Graphviz ``dot`` program (``apt-get install graphviz``, ``brew install graphviz``);
building the ``Digraph`` and reading its ``.source`` does not.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xgrad.engine.node import AccumulateGrad, Node
from xgrad.engine.saved import SavedTensor
from xgrad.tensor import Tensor
from xgrad.tensor.hook_kinds import KINDS, hooks_at

if TYPE_CHECKING:
    import graphviz

__all__ = ["make_dot", "show"]

logger = logging.getLogger(__name__)

ERR_NO_GRAPHVIZ = (
    'make_dot needs the graphviz Python package: pip install "xgrad[viz]" '
    "(rendering the picture also needs Graphviz's dot program: apt-get install graphviz)"
)

# Colours as in PyTorch users' usual pictures: outputs green, parameters blue, saved values orange.
OUTPUT_COLOR = "darkolivegreen1"
LEAF_COLOR = "lightblue"
SAVED_COLOR = "orange"
HOOK_COLOR = "red"
_KINDS_IN_ORDER = sorted(KINDS, key=lambda kind: kind.rank)


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def _label(*lines: str) -> str:
    """Lines joined by dot's own line break (``\\n``), so ``.source`` stays one line per node."""
    return "\\n".join(lines)


def _hook_kinds(fn: Node) -> list[str]:
    """Which kinds of hook will run at ``fn``, by their labels, in PyTorch's order (NOTE [Hook kinds])."""
    return [kind.label for kind in _KINDS_IN_ORDER if hooks_at(fn, kind)]


def _saved_shapes(fn: Node) -> list[tuple[str, tuple[int, ...] | None]]:
    """``(label, shape)`` of each value ``fn`` saved; ``None`` shape once freed by backward."""
    found = []
    for attr in ("saved", "saved_out"):
        values = getattr(fn, attr, None)
        for i, s in enumerate(values or ()):
            if type(s) is SavedTensor:
                # Peek without unpacking: unpacking runs version checks and unpack hooks.
                ref = s._current_tensor()
                array = ref._array if ref is not None else s._array
                found.append((f"{'out' if attr == 'saved_out' else 'input'} {i}", None if array is None else array.shape))
    return found


def make_dot(tensor: Tensor | Iterable[Tensor], params: Mapping[str, Tensor] | Iterable[tuple[str, Tensor]] | None = None, show_saved: bool = False) -> graphviz.Digraph:
    """The backward graph reaching ``tensor`` as a ``graphviz.Digraph``.

    Each backward node is a box with its name and the shape of the gradient it
    receives; leaves (``AccumulateGrad``) are blue and named after their parameter
    when ``params`` names them; nodes with hooks get a red border listing the hook
    kinds. Edges point the way the forward computation went.

    Args:
        tensor: the output(s) whose graph to draw.
        params: names for leaf tensors: a mapping name → Tensor or
            ``model.named_parameters()``.
        show_saved: also draw the values each node saved for backward (orange).

    >>> import xgrad
    >>> w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> dot = xgrad.viz.make_dot((w * w).sum(), params={"w": w})
    >>> "MulBackward" in dot.source and r'label="w\\n(2)"' in dot.source
    True
    """
    try:
        import graphviz
    except ImportError as error:
        raise ImportError(ERR_NO_GRAPHVIZ, name="graphviz") from error

    outputs = [tensor] if isinstance(tensor, Tensor) else list(tensor)
    named = params.items() if isinstance(params, Mapping) else (params or ())
    param_names = {id(p): name for name, p in named}
    dot = graphviz.Digraph(
        node_attr={"style": "filled", "shape": "box", "align": "left", "fontsize": "10", "height": "0.2", "fontname": "monospace"},
        graph_attr={"size": "12,12"},
    )

    def node_id(fn: Node) -> str:
        return str(id(fn))

    seen: set[Node] = set()
    stack: list[Node] = []
    for i, out in enumerate(outputs):
        if out.grad_fn is None:
            continue
        out_id = f"output{i}"
        dot.node(out_id, _label(f"output {i}", _shape(out.shape)), fillcolor=OUTPUT_COLOR)
        dot.edge(node_id(out.grad_fn), out_id)
        if out.grad_fn not in seen:
            seen.add(out.grad_fn)
            stack.append(out.grad_fn)
    while stack:  # iterative: graphs of any depth
        fn = stack.pop()
        hooks = _hook_kinds(fn)
        style: dict[str, str] = {"color": HOOK_COLOR, "penwidth": "2"} if hooks else {}
        if isinstance(fn, AccumulateGrad):
            variable = fn.variable
            name = param_names.get(id(variable), "")
            lines = [name, _shape(variable.shape)] if name else [_shape(variable.shape)]
            fill = LEAF_COLOR
        else:
            shapes = ", ".join(_shape(m.shape) for m in fn.input_metadata)
            lines = [fn.name(), shapes]
            fill = "lightgrey"
        if hooks:
            lines.append("hooks: " + ", ".join(hooks))
        dot.node(node_id(fn), _label(*lines), fillcolor=fill, **style)
        if show_saved:
            for j, (what, shape) in enumerate(_saved_shapes(fn)):
                saved_id = f"{node_id(fn)}-saved{j}"
                dot.node(saved_id, _label(f"saved {what}", "freed" if shape is None else _shape(shape)), fillcolor=SAVED_COLOR)
                dot.edge(saved_id, node_id(fn), style="dotted", dir="none")
        for next_fn, _ in fn.next_edges:
            if next_fn is None:
                continue
            dot.edge(node_id(next_fn), node_id(fn))
            if next_fn not in seen:
                seen.add(next_fn)
                stack.append(next_fn)
    return dot


def _in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (an IPython shell with a kernel shows pictures inline)."""
    ipython = sys.modules.get("IPython")  # imported already wherever IPython runs
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and hasattr(shell, "kernel")


def show(picture: Any, name: str | os.PathLike[str]) -> Path | None:
    """Show ``picture`` (``make_dot``'s ``Digraph`` or a matplotlib ``Figure``) inline in a
    Jupyter notebook; anywhere else (a notebook run as a script) write it to the file ``name``
    (relative to the current directory) with the suffix its kind gets, and return that path.

    A figure becomes ``name.png``; a graph ``name.svg``, or its dot source ``name.gv`` where
    Graphviz's ``dot`` program is missing (render it later with ``dot -Tsvg name.gv``).

    >>> import xgrad, pathlib, tempfile
    >>> w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> path = show(make_dot((w * w).sum()), pathlib.Path(tempfile.mkdtemp()) / "graph")
    >>> path.suffix in (".svg", ".gv") and path.exists()
    True
    """
    is_graph = hasattr(picture, "source")  # graphviz's Digraph; matplotlib's Figure has none
    renderable = not is_graph or shutil.which("dot") is not None
    if _in_notebook() and renderable:
        from IPython.display import display

        display(picture)
        if not is_graph:
            import matplotlib.pyplot as plt

            plt.close(picture)  # else the inline backend shows it a second time at the cell's end
        return None
    if not is_graph:
        path = Path(name).with_suffix(".png")
        picture.savefig(path)
    elif renderable:
        path = Path(name).with_suffix(".svg")
        path.write_bytes(picture.pipe(format="svg"))
    else:
        path = Path(name).with_suffix(".gv")
        path.write_text(picture.source)
    logger.info("wrote %s", path.resolve())
    return path

"""``print`` in a compiled step: it prints at every call, with that call's values (NOTE [Print in a compiled step]).

# NOTE [Print in a compiled step]
# Eager prints at every call; a traced step's Python runs once, on tracers. So while any
# step is traced, ``builtins.print`` is a stand-in (``intercepting_print``). Called at the
# step's own trace level it writes nothing: its text becomes a host effect of the step
# (``StepTrace.host_effect``, NOTE [Python state in a compiled step]) that prints it at
# every call, after the program where nothing that needs the host follows (JAX's fast
# dispatch stays), else as one ordered host call at its place, in order with hooks.
# Anywhere else (another thread, a ``jax.jit`` nested in the step) it is plain ``print``.
#
# The text of a tensor (``repr``, ``str``, ``format``, an f-string, ``%``) is then a mark
# standing for its array at that point (``Printed``): the effect gets the arrays as the
# program's values and replaces each mark by what eager shows (with the dtype,
# ``grad_fn`` and ``requires_grad`` seen when traced; a 0-dim tensor's ``format``: its
# number's). A tensor's text is marked only where it goes into a print: inside print's
# own arguments, or where the source's syntax tree shows the expression the user's frame
# is evaluating flowing into an argument of ``print(...)`` through f-strings,
# ``str``/``repr``/``format``, ``+``, ``%`` and ``"...".join`` (``_flows_into_print``;
# without a source, no). ``t.item()`` likewise, only as print's argument, an f-string's
# value or ``str``/``repr``/``format``'s: it stands for its number, as an object that can
# only be formatted (``_PrintedNumber``). Anywhere else a value is needed now: the call
# runs eagerly (a fallback naming the line and the construct), as it does when a mark no
# print took is left at the end of the trace (its text went somewhere else as well).
# Other values' text is as traced: a Python number that changes between calls without a
# new trace prints as it was then, as under ``jax.jit``. A trace that raises the user's
# error prints what eager printed before it as far as that needs no values
# (``print(x.shape)`` before a shape error); a trace that falls back prints nothing: the
# eager call prints it all.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import functools
import linecache
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeGuard

import numpy as np

from xgrad.compile_step import recording
from xgrad.step_trace import array_of
from xgrad.tensor import Tensor
from xgrad.tensor.conversion import repr_extras, tensor_repr_text

_MARK = "\ue000{}\ue001"
_MARKS = re.compile("\ue000(\\d+)\ue001")


@dataclasses.dataclass(slots=True, eq=False)  # compared by identity, as it holds an array
class Printed:
    """One tensor's text in a traced step: its array then, how it is shown, and whether a print took it."""

    array: Any
    render: Callable[[Tensor], str]  # the text of a concrete tensor holding the values
    inner: list[int]  # the marks in the rest of its text (a forward-mode tangent's repr)
    site: str
    construct: str
    printed: bool = False


def _mark(rec: Any, t: Tensor, render: Callable[[Tensor], str], extras: list[str], frame: Any, construct: str) -> str:
    """A mark standing for ``t``'s array as it is now (read as state, so a parameter prints its value at each call)."""
    k = len(rec.printed)
    inner = [int(m) for e in extras for m in _MARKS.findall(e)]
    rec.printed.append(Printed(array_of(t), render, inner, f"{frame.f_code.co_filename}:{frame.f_lineno}", construct))
    return _MARK.format(k)


def printed_text(rec: Any, t: Tensor, format_spec: str | None, frame: Any) -> str | None:
    """``StepTrace.printed_text`` for the step ``rec`` traces."""
    if not rec.at_step_level() or not (rec.printing or _flows_into_print(frame, item=False)):
        return None
    if format_spec is None:
        extras = repr_extras(t)
        return _mark(rec, t, lambda v: tensor_repr_text(np.asarray(v._array), extras), extras, frame,
                     "repr()/str() of a tensor")
    return _mark(rec, t, lambda v: format(v.item(), format_spec), [], frame, "format() of a tensor")


def printed_item(rec: Any, t: Tensor, frame: Any) -> Any:
    """``StepTrace.printed_item`` for the step ``rec`` traces."""
    if not rec.at_step_level() or t.numel() != 1 or not _flows_into_print(frame, item=True):
        return None
    return _PrintedNumber(rec, t, frame)


class _PrintedNumber:
    """``t.item()`` whose number is only formatted into a print: each formatting is a mark standing for it."""

    __slots__ = ("_frame", "_rec", "_tensor")

    def __init__(self, rec: Any, t: Tensor, frame: Any) -> None:
        self._rec, self._tensor, self._frame = rec, t, frame

    def _text(self, convert: Callable[[Any], str]) -> str:
        """A mark whose text, at each call, is ``convert`` of the tensor's number then."""
        return _mark(self._rec, self._tensor, lambda v: convert(v.item()), [], self._frame, ".item()")

    def __format__(self, format_spec: str) -> str:
        return self._text(lambda number: format(number, format_spec))

    def __str__(self) -> str:
        return self._text(str)

    def __repr__(self) -> str:
        return self._text(repr)


def unprinted(rec: Any) -> Printed | None:
    """The first tensor text of the trace that no print took, else ``None``."""
    return next((p for p in rec.printed if not p.printed), None)


# -- the print stand-in ------------------------------------------------------------------


@dataclasses.dataclass
class _Intercept:
    """How many traces run now, and the print the stand-in replaced while they do."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    traces: int = 0
    wrapped: Callable[..., None] = builtins.print


_INTERCEPT = _Intercept()


@contextlib.contextmanager
def intercepting_print() -> Iterator[None]:
    """While the body runs, ``builtins.print`` is the stand-in (NOTE [Print in a compiled step])."""
    with _INTERCEPT.lock:
        if _INTERCEPT.traces == 0:
            _INTERCEPT.wrapped = builtins.print
            builtins.print = _print
        _INTERCEPT.traces += 1
    try:
        yield
    finally:
        with _INTERCEPT.lock:
            _INTERCEPT.traces -= 1
            if _INTERCEPT.traces == 0 and builtins.print is _print:  # one put in meanwhile stays
                builtins.print = _INTERCEPT.wrapped


def _print(*args: Any, sep: str | None = " ", end: str | None = "\n", file: Any = None, flush: bool = False) -> None:
    rec = recording.active()
    if rec is None or not rec.at_step_level():
        _INTERCEPT.wrapped(*args, sep=sep, end=end, file=file, flush=flush)
        return
    for name, value in (("sep", sep), ("end", end)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be None or a string, not {type(value).__name__}")
    printing, rec.printing = rec.printing, True  # a tensor's text made now goes into this print
    try:
        text = (" " if sep is None else sep).join(map(str, args)) + ("\n" if end is None else end)
    finally:
        rec.printing = printing  # a print inside an argument's ``__str__`` leaves the outer one's
    marks = list(dict.fromkeys(int(m) for m in _MARKS.findall(text)))
    for k in marks:  # the marks inside a tensor's text (a tangent's repr) join the list
        rec.printed[k].printed = True
        marks += [inner for inner in rec.printed[k].inner if inner not in marks]
    renders = {k: rec.printed[k].render for k in marks}
    wrapped = _INTERCEPT.wrapped

    def emit(*values: Tensor) -> None:
        by_mark = dict(zip(marks, values, strict=True))
        wrapped(_filled(text, renders, by_mark), end="", file=file, flush=flush)

    rec.host_effect(emit, tuple(Tensor(rec.printed[k].array) for k in marks), {}, [])
    rec.prints.append(None if marks else emit)


_print.__doc__ = builtins.print.__doc__


def print_before_error(rec: Any) -> None:
    """The trace raised the user's error: print what eager printed before it (``print(x.shape)`` before a shape
    error) up to the first print of a tensor's values, unknown here (the rest would show out of order)."""
    for emit in rec.prints:
        if emit is None:
            return
        emit()


def _filled(text: str, renders: dict[int, Callable[[Tensor], str]], values: dict[int, Tensor]) -> str:
    """``text`` with each mark replaced by its tensor's text (itself filled: a tangent's repr inside a repr)."""
    return _MARKS.sub(lambda m: _filled(renders[int(m[1])](values[int(m[1])]), renders, values), text)


# -- where a value goes, from the source -------------------------------------------------


def _flows_into_print(frame: Any, item: bool) -> bool:
    """Whether the expression ``frame`` is evaluating only becomes text in an argument of the builtin ``print``.

    With ``item``: the expression is ``t.item()`` and it is formatted (an f-string's value,
    ``str``/``repr``/``format``'s argument) on its way there.
    """
    code = frame.f_code
    shadowed = "print" in (*code.co_varnames, *code.co_cellvars, *code.co_freevars)
    if shadowed or frame.f_globals.get("print", frame.f_builtins.get("print")) is not _print:
        return False
    positions, index = list(code.co_positions()), frame.f_lasti // 2  # one position per 2-byte code unit
    if not 0 <= index < len(positions) or None in positions[index]:
        return False
    nodes, parents = _parsed("".join(linecache.getlines(code.co_filename, frame.f_globals)))
    node: ast.AST | None = _innermost(nodes, positions[index])
    if node is None:
        return False
    if item:  # a number: only formatting may take it (``+`` and ``%`` would compute with it)
        parent = parents.get(node)
        is_item = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "item"
        formatted = isinstance(parent, ast.FormattedValue) or _is_text_call(parent, node) or _is_print(parent)
        if not (is_item and formatted):
            return False
    while True:
        parent = parents.get(node)
        if parent is None:
            return False
        if _is_print(parent):
            return node in parent.args
        if not _becomes_text(parent, node, parents):
            return False
        node = parent


def _is_print(node: ast.AST | None) -> TypeGuard[ast.Call]:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"


def _becomes_text(parent: ast.AST, node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether ``parent`` only makes text of ``node``'s value."""
    if isinstance(parent, (ast.FormattedValue, ast.JoinedStr)):
        return True
    if isinstance(parent, ast.BinOp):
        return isinstance(parent.op, (ast.Add, ast.Mod))
    outer = parents.get(parent)
    if isinstance(parent, ast.Tuple) and isinstance(outer, ast.BinOp):  # ``"%s %s" % (a, b)``
        return isinstance(outer.op, ast.Mod) and outer.right is parent
    comprehension = isinstance(parent, (ast.ListComp, ast.GeneratorExp)) and parent.elt is node
    if comprehension or isinstance(parent, (ast.List, ast.Tuple)):
        return _is_text_call(outer, parent, join=True)  # ``", ".join(f"{v:.3f}" for v in values)``
    return _is_text_call(parent, node) or _is_text_call(parent, node, join=True)


def _is_text_call(parent: ast.AST | None, node: ast.AST, join: bool = False) -> bool:
    """Whether ``parent`` is ``str(node)``, ``repr(node)``, ``format(node, ...)`` or ``"...".format(..., node, ...)``;
    with ``join``, whether it is ``"...".join(node)``."""
    if not isinstance(parent, ast.Call) or node not in parent.args:
        return False
    func = parent.func
    if isinstance(func, ast.Name):
        return not join and func.id in ("str", "repr", "format")
    method = "join" if join else "format"
    return isinstance(func, ast.Attribute) and func.attr == method and isinstance(func.value, ast.Constant)


@functools.lru_cache(maxsize=16)
def _parsed(source: str) -> tuple[list[ast.expr], dict[ast.AST, ast.AST]]:
    """A source's expressions and each node's parent; none without a source that parses."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return [], {}
    parents: dict[ast.AST, ast.AST] = {}
    nodes = []
    for node in ast.walk(tree):
        if isinstance(node, ast.expr):
            nodes.append(node)
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    return nodes, parents


def _innermost(nodes: list[ast.expr], position: tuple[Any, ...]) -> ast.expr | None:
    """The smallest expression spanning ``position`` (a code position: lines, then columns); the deepest on a tie."""
    line, end_line, col, end_col = position
    best, best_span = None, None
    for node in nodes:
        start, stop = (node.lineno, node.col_offset), (node.end_lineno or 0, node.end_col_offset or 0)
        if start <= (line, col) and stop >= (end_line, end_col):
            span = (stop[0] - start[0], stop[1] - start[1])
            if best_span is None or span <= best_span:
                best, best_span = node, span
    return best

"""``from_jax(fn, trace=True)``: a JAX function run equation by equation as xgrad nodes.

# NOTE [Traced from_jax]
# ``from_jax(fn)`` makes one node whose backward is ``jax.vjp`` of all of ``fn``. With
# ``trace=True``, ``fn`` is traced once per input signature (``jax.make_jaxpr``) and each
# equation of its jaxpr becomes a node of its own, whose backward is the equation's
# ``jax.vjp`` (jitted; under ``create_graph`` a ``from_jax`` op, so gradients of any order
# work). The forward runs all equations as one jitted program that returns every
# intermediate value, and records one node per equation from them. Chaining the equations'
# vjps is JAX's own reverse mode of ``fn``: the gradients equal ``jax.grad(fn)``. What
# changes is that every intermediate value is a Tensor with a ``grad_fn``, which hooks,
# ``retain_grad``, anomaly mode, the profiler and ``xgrad.viz`` see. Equations that hold
# a jaxpr of their own (a nested ``jit``, ``custom_vjp``/``custom_jvp``, ``scan``,
# ``while``, ``cond``, ``remat``) stay one node each, whose vjp is JAX's (custom rules
# included).
#
# Names come from the model's own structure, never from a library's source line (which
# moves with every release). While ``fn`` is traced, each module call runs in a
# ``jax.named_scope`` of the module's name: Flax NNX and Equinox ``__call__``s (their
# classes' ``__call__`` are wrapped for the trace's duration, and act as before on other
# threads), Flax linen's through ``linen.intercept_methods``. A module's name is its path:
# in ``fn``'s arguments (``nnx.iter_modules``'s path joined by dots for NNX, ``layers.0``;
# ``jax.tree_util.keystr`` for Equinox, ``layers[0]``; an argument's own path in front
# where it is inside a container, ``['enc'].layers[0]``), or, for a module made inside
# ``fn`` (``nnx.merge``, ``eqx.combine``, a transform's copy), its path in the outermost
# module called; linen's is ``module.path`` (``Dense_0``, ``Block_0/Dense_1``). An
# outermost module's own computations (the activations between its layers) take its
# class name. The k-th call of a name in the trace opens the scope ``name#k``, so that
# two calls of one layer are two runs even back to back; the name is the same.
#
# Each equation belongs to the innermost of those scopes in its name stack; without one,
# to the ``jax.named_scope``s the user set (transforms such as ``vmap`` left out), else to
# the user's source line that made it (``model.py:12 (forward)``): the innermost frame
# outside JAX, Flax, Equinox, xgrad and the standard library. A maximal run of
# consecutive equations of one scope or line is one call of it; its value is the last
# floating-point output of the run (a layer's output). The n-th run of a name, counted
# in an ``intermediates()`` block, is keyed ``name#n`` (the first keeps the bare name).
# Nodes are named ``<Primitive>Backward[<key>]`` with the key of their run in the call.
#
# JAX's APIs used: ``jax.make_jaxpr``, ``jax.named_scope``, ``jax.extend.core``
# (``Jaxpr``, ``ClosedJaxpr``, ``Var``, ``DropVar``, ``Literal``, ``jaxpr_as_fun``) and
# an equation's name stack and frames, read through ``xgrad.jax_internals``.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad import jax_internals as jex
from xgrad.dual import set_tangent, tangents_on
from xgrad.engine.anomaly import ANOMALY, TRACEBACK_KEY
from xgrad.grad_mode import _state as _grad_state
from xgrad.ops import registry
from xgrad.ops.jaxop import _freeze, from_jax
from xgrad.ops.registry import Primitive, bind, defprim
from xgrad.tensor import Tensor, is_tensor

__all__ = ["Intermediates", "TracedJaxFunction", "intermediates"]


class Intermediates(dict[str, Tensor]):
    """The intermediate Tensors of ``from_jax(fn, trace=True)`` calls, by name, in order.

    A name is the path of the module that computed the values (Flax NNX ``layers.0``,
    Flax linen ``Dense_0``, Equinox ``layers[0]``; the outermost module's class name for
    its own computations), else the ``jax.named_scope`` they ran in, else the user's
    source line that computed them; ``name#2``, ``name#3`` … for later calls of the same
    module, scope or line. Each Tensor is the last floating-point value the call computed
    (a layer's output). Made by ``xgrad.intermediates()``.
    """

    def __init__(self) -> None:
        super().__init__()
        self._counts: dict[str, int] = {}

    def _add(self, group: str, value: Tensor) -> None:
        n = self._counts[group] = self._counts.get(group, 0) + 1
        self[group if n == 1 else f"{group}#{n}"] = value

    def __repr__(self) -> str:
        rows = ", ".join(f"{k!r}: {list(v.shape)} {v.dtype}" for k, v in self.items())
        return f"Intermediates({{{rows}}})"


class _Collectors(threading.local):
    def __init__(self) -> None:
        self.stack: list[Intermediates] = []


_collectors = _Collectors()


@contextmanager
def intermediates() -> Iterator[Intermediates]:
    """Collect the intermediate Tensors of ``from_jax(fn, trace=True)`` calls in this block.

    Yields a dict (``Intermediates``) from name to Tensor, filled as traced functions run:
    register hooks on them before ``backward()``, ``retain_grad()`` them to read their
    gradients, or read their values. Blocks nest (a call fills the innermost); the
    collection is per thread.

    >>> import jax, jax.numpy as jnp, xgrad
    >>> def layer(x, w):
    ...     with jax.named_scope("dense"):
    ...         h = jnp.tanh(x @ w)
    ...     return (h ** 2).sum()
    >>> f = xgrad.from_jax(layer, trace=True)
    >>> w = xgrad.tensor([[1.0, -1.0], [0.5, 2.0]], requires_grad=True)
    >>> with xgrad.intermediates() as acts:
    ...     loss = f(xgrad.tensor([[1.0, 2.0]]), w)
    >>> list(acts)[0]
    'dense'
    >>> _ = acts["dense"].register_hook(lambda g: 2 * g)  # double the gradient through the layer
    >>> loss.backward()
    >>> bool(jnp.allclose(w.grad.array, 2 * jax.grad(layer, argnums=1)(jnp.array([[1.0, 2.0]]), w.array)))
    True
    """
    collected = Intermediates()
    _collectors.stack.append(collected)
    try:
        yield collected
    finally:
        stack = _collectors.stack
        del stack[next(i for i in range(len(stack) - 1, -1, -1) if stack[i] is collected)]  # by identity


# -- Names by the model's structure (NOTE [Traced from_jax]) ---------------------------


def _module_kinds() -> list[tuple[type, str | None]]:
    """The module base classes of the libraries imported, each with the package of its non-layer modules.

    Equinox's ``eqx.Module`` (its transforms' wrappers, ``filter_jit``'s and others, are
    modules too: every Equinox class outside ``equinox.nn``), Flax NNX's ``nnx.Module``.
    """
    kinds: list[tuple[type, str | None]] = []
    equinox = sys.modules.get("equinox")
    if equinox is not None:
        kinds.append((equinox.Module, "equinox."))
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None:
        kinds.append((nnx.Module, None))
    return kinds


def _layer_classes() -> list[type]:
    """The module classes that define a ``__call__`` of their own (a function), less the libraries' wrappers."""
    found: list[type] = []
    for base, wrappers in _module_kinds():
        seen: set[type] = set()
        stack: list[type] = [base]
        while stack:
            subclasses: list[type] = type.__subclasses__(stack.pop())
            for cls in subclasses:
                if cls in seen:
                    continue
                seen.add(cls)
                stack.append(cls)
                wrapper = wrappers is not None and cls.__module__.startswith(wrappers) and not cls.__module__.startswith(f"{wrappers}nn.")
                if inspect.isfunction(cls.__dict__.get("__call__")) and not wrapper:
                    found.append(cls)
    return found


def _submodules(module: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every module inside ``module`` (at ``path``), with its path in the library's notation.

    NNX: ``nnx.iter_modules``'s paths joined by dots (``layers.0``); Equinox: the pytree
    path as ``jax.tree_util.keystr`` writes it (``layers[0]``).
    """
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None and isinstance(module, nnx.Module):
        for keys, sub in nnx.iter_modules(module):
            if keys:
                yield _join(path, ".".join(str(k) for k in keys)), sub
        return
    kinds = tuple(base for base, _ in _module_kinds())
    children, _ = jax.tree_util.tree_flatten_with_path(module, is_leaf=lambda x: x is not module and isinstance(x, kinds))
    for keys, child in children:
        if isinstance(child, kinds):
            child_path = _join(path, jax.tree_util.keystr(keys).lstrip("."))
            yield child_path, child
            yield from _submodules(child, child_path)


def _join(path: str, sub: str) -> str:
    return f"{path}.{sub}" if path and not sub.startswith("[") else path + sub


class _ModuleScopes:
    """The module calls of one trace, each in a ``jax.named_scope`` of its own (NOTE [Traced from_jax]).

    ``scope_names`` maps each scope opened to the module's name: its path, or its class
    name for an outermost module. The k-th call of a name opens ``name#k``, so that two
    calls of one module are two runs even with nothing between them.
    """

    def __init__(self) -> None:
        self.scope_names: dict[str, str] = {}
        self._paths: dict[int, tuple[Any, str]] = {}  # id -> (module, name); holding the module keeps the id its own
        self._calls: dict[str, int] = {}
        self._open: list[Any] = []

    def add_root(self, module: Any, path: str) -> str:
        name = path or type(module).__name__
        self._paths.setdefault(id(module), (module, name))
        for sub_path, sub in _submodules(module, path):
            self._paths.setdefault(id(sub), (sub, sub_path))
        return self._paths[id(module)][1]

    def add_arguments(self, args: Any) -> None:
        """Name the modules in ``fn``'s arguments by their paths there (``encoder.layers[0]``)."""
        kinds = tuple(base for base, _ in _module_kinds())
        if not kinds:
            return
        for arg in args:
            found, _ = jax.tree_util.tree_flatten_with_path(arg, is_leaf=lambda x: isinstance(x, kinds))
            for keys, leaf in found:
                if isinstance(leaf, kinds):
                    self.add_root(leaf, jax.tree_util.keystr(keys).lstrip("."))

    @contextmanager
    def named(self, name: str) -> Iterator[None]:
        n = self._calls[name] = self._calls.get(name, 0) + 1
        scope = name if n == 1 else f"{name}#{n}"
        self.scope_names[scope] = name
        with jax.named_scope(scope):
            yield

    @contextmanager
    def module_call(self, module: Any) -> Iterator[None]:
        if self._open and self._open[-1] is module:  # ``super().__call__``: the same call
            yield
            return
        known = self._paths.get(id(module))
        name = known[1] if known is not None else self.add_root(module, "")  # made inside ``fn``: ``nnx.merge``, ``eqx.combine``
        self._open.append(module)
        try:
            with self.named(name):
                yield
        finally:
            self._open.pop()

    def linen_interceptor(self, next_fun: Callable[..., Any], args: Any, kwargs: Any, context: Any) -> Any:
        """Flax linen's method interceptor: each ``__call__`` under the module's path (``Dense_0``, ``Block_0/Dense_1``)."""
        if context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        module = context.module
        with self.named("/".join(module.path) or type(module).__name__):
            return next_fun(*args, **kwargs)


class _ActiveScopes(threading.local):
    def __init__(self) -> None:
        self.scopes: _ModuleScopes | None = None


_active = _ActiveScopes()
_patch_lock = threading.Lock()
_patched: list[tuple[type, Any]] = []
_patch_users = 0


def _scoped(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` (a module's ``__call__``) in its module's scope while this thread traces; as it was otherwise."""

    @functools.wraps(call)  # ``inspect.signature`` (``eqx.filter_vmap``'s) still sees the original's
    def scoped_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        scopes = _active.scopes
        if scopes is None:
            return call(self, *args, **kwargs)
        with scopes.module_call(self):
            return call(self, *args, **kwargs)

    return scoped_call


@contextmanager
def _naming_modules() -> Iterator[_ModuleScopes]:
    """Module calls in this block open named scopes: NNX and Equinox ``__call__``s, Flax linen's interceptor."""
    global _patch_users
    scopes = _ModuleScopes()
    with _patch_lock:  # the classes' ``__call__`` are wrapped while any thread traces
        if _patch_users == 0:
            for cls in _layer_classes():
                call = cls.__dict__["__call__"]
                _patched.append((cls, call))
                type.__setattr__(cls, "__call__", _scoped(call))
        _patch_users += 1
    outer, _active.scopes = _active.scopes, scopes
    try:
        linen = sys.modules.get("flax.linen")
        with linen.intercept_methods(scopes.linen_interceptor) if linen is not None else nullcontext():
            yield scopes
    finally:
        _active.scopes = outer
        with _patch_lock:
            _patch_users -= 1
            if _patch_users == 0:
                for cls, call in _patched:
                    type.__setattr__(cls, "__call__", call)
                _patched.clear()


_STDLIB = sysconfig.get_path("stdlib") + os.sep
_SITE_PACKAGES = tuple({sysconfig.get_path("purelib") + os.sep, sysconfig.get_path("platlib") + os.sep})


def _library_dirs() -> tuple[str, ...]:
    """The packages whose source lines are never a name: JAX, Flax, Equinox and xgrad."""
    packages = map(sys.modules.get, ("jax", "jaxlib", "flax", "equinox", "xgrad"))
    return tuple(os.path.dirname(m.__file__) + os.sep for m in packages if m is not None and m.__file__)


def _user_file(path: str, libraries: tuple[str, ...]) -> bool:
    """Outside ``libraries`` and the standard library (where installed packages may live: those count)."""
    return not path.startswith(libraries) and (not path.startswith(_STDLIB) or path.startswith(_SITE_PACKAGES))


def _location(eqn: Any, libraries: tuple[str, ...]) -> str:
    """The user's line that made the equation, as ``file.py:line (function)``: the innermost frame outside ``libraries``.

    The line, not the column: one line (``x = relu(self.dense(x))``) is one step of the user's code.
    """
    for file, line, function in jex.source_frames(eqn.source_info):
        if _user_file(file, libraries):
            return f"{os.path.basename(file)}:{line} ({function})"
    return eqn.primitive.name


def _group(eqn: Any, scope_names: dict[str, str], location: str) -> tuple[str, str]:
    """The run an equation belongs to and the name its value is collected under (NOTE [Traced from_jax])."""
    scopes = jex.name_scopes(eqn.source_info.name_stack)
    for scope in reversed(scopes):
        name = scope_names.get(scope)
        if name is not None:
            return scope, name
    if scopes:
        return "/".join(scopes), "/".join(scopes)
    return location, location


def _inexact(aval: Any) -> bool:
    return bool(jnp.issubdtype(aval.dtype, jnp.inexact))


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[_\W]+", name) if part)


def _standalone(eqn: Any) -> Any:
    """``eqn`` with a variable for each output it drops, so that a jaxpr can return all of them."""
    if not any(isinstance(v, jex.DropVar) for v in eqn.outvars):
        return eqn
    return eqn.replace(outvars=[jex.Var(v.aval) if isinstance(v, jex.DropVar) else v for v in eqn.outvars])


def _jaxpr_function(invars: list[Any], outvars: list[Any], eqns: list[Any], effects: Any, consts: list[Any],
                    what: str) -> Callable[..., list[Any]]:
    debug = jex.DebugInfo("xgrad.from_jax", what, tuple(str(v) for v in invars), tuple(str(v) for v in outvars))
    constvars = [v for v, _ in consts]
    closed = jex.ClosedJaxpr(jex.Jaxpr(constvars, invars, outvars, eqns, effects, debug), [c for _, c in consts])
    return jex.jaxpr_as_fun(closed)  # type: ignore[no-any-return]


class _EquationVjp:
    """The vjp of one equation, w.r.t. its floating inputs.

    It is the static argument of the jitted ``_run_vjp``, equal to another one when both
    compute the same thing (primitive, parameters, literal operands, input types and
    context): equations alike, such as the layers of a deep model, share one compiled vjp.
    """

    __slots__ = ("_hash", "diff_mask", "key", "out_avals", "run")

    def __init__(self, eqn: Any, invars: list[Any], run: Callable[..., list[Any]]) -> None:
        self.run = run  # holds ``eqn``: ids that ``_freeze`` puts in the key stay unique while it lives
        self.diff_mask = tuple(_inexact(v.aval) for v in invars)
        self.out_avals = tuple(v.aval for v in eqn.outvars)
        operands = tuple(("literal", _freeze(v.val), v.aval) if isinstance(v, jex.Literal) else invars.index(v) for v in eqn.invars)
        self.key = (eqn.primitive, _freeze(eqn.params), operands, tuple(v.aval for v in invars), repr(eqn.ctx))
        self._hash = hash(self.key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _EquationVjp) and self.key == other.key

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        n_in = len(self.diff_mask)
        primals, cotangents = args[:n_in], args[n_in:]
        diff_idx = [i for i, d in enumerate(self.diff_mask) if d]

        def of_diff(*diff_args: Any) -> Any:
            full = list(primals)
            for i, a in zip(diff_idx, diff_args, strict=True):
                full[i] = a
            return tuple(self.run(*full))

        _, pullback = jax.vjp(of_diff, *(primals[i] for i in diff_idx))
        # Integer and boolean outputs take JAX's float0 cotangent (their grads are zeros here).
        cts = tuple(ct if _inexact(aval) else np.zeros(aval.shape, jax.dtypes.float0) for ct, aval in zip(cotangents, self.out_avals, strict=True))
        return tuple(pullback(cts))


@functools.partial(jax.jit, static_argnums=0)
def _run_vjp(vjp: _EquationVjp, *args: Any) -> tuple[Any, ...]:
    return vjp(*args)


def _equation_primitive(eqn: Any, invars: list[Any], key: str, location: str) -> Primitive:
    """One xgrad primitive for the (standalone) equation ``eqn``; its backward is the equation's ``jax.vjp``."""
    outvars = list(eqn.outvars)
    run = _jaxpr_function(invars, outvars, [eqn], eqn.effects, [], f"{eqn.primitive.name} at {location}")
    num_outputs = len(outvars)

    def impl(*arrays: Any) -> Any:
        outs = run(*arrays)
        return tuple(outs) if num_outputs > 1 else outs[0]

    name = eqn.primitive.name
    if "name" in eqn.params and isinstance(eqn.params["name"], str):  # a nested jit: its function's name
        name = f"{name}_{eqn.params['name']}"
    vjp = _EquationVjp(eqn, invars, run)
    diff_mask = vjp.diff_mask
    vjp_op = from_jax(vjp, name=f"{name}_vjp")

    def joint_vjp(g: Any, out: Any, *inputs: Any) -> tuple[Any, ...]:
        args = (*inputs, *(g if num_outputs > 1 else (g,)))
        if _grad_state.enabled:  # a recorded backward (create_graph): the vjp as an op, differentiable again
            grads = iter(vjp_op(*args))
        else:
            grads = iter([Tensor(a) for a in _run_vjp(vjp, *[a._array if isinstance(a, Tensor) else a for a in args])])
        return tuple(next(grads) if d else None for d in diff_mask)

    apply = defprim(name, impl, joint_vjp=joint_vjp, num_outputs=num_outputs, register=False, jit=False)
    prim: Primitive = apply.primitive  # type: ignore[attr-defined]
    prim.node_name = f"{_camel(name)}Backward[{key}]"
    return prim


class _Step:
    """One equation of a traced program: its primitive, where its inputs come from, where its outputs go."""

    __slots__ = ("invars", "location", "outvars", "prim")

    def __init__(self, prim: Primitive, invars: list[Any], outvars: list[Any], location: str) -> None:
        self.prim = prim
        self.invars = invars
        self.outvars = outvars
        self.location = location


class _Program:
    """``fn`` traced for one input signature: its steps, and the values collected by name."""

    def __init__(self, closed: Any, out_tree: Any, scope_names: dict[str, str]) -> None:
        jaxpr = closed.jaxpr
        self.invars = list(jaxpr.invars)
        self.outvars = list(jaxpr.outvars)
        self.consts = list(zip(jaxpr.constvars, closed.consts, strict=True))
        self.out_tree = out_tree
        # Runs of consecutive equations of one group (NOTE [Traced from_jax]): the key of
        # each equation, and per run the value collected (step, output) under its name.
        libraries = _library_dirs()
        locations = [_location(eqn, libraries) for eqn in jaxpr.eqns]
        groups = [_group(eqn, scope_names, location) for eqn, location in zip(jaxpr.eqns, locations, strict=True)]
        runs_seen: dict[str, int] = {}
        keys: list[str] = []
        self.collected: list[tuple[str, int, int]] = []
        for k, (run, name) in enumerate(groups):
            if k == 0 or run != groups[k - 1][0]:
                n = runs_seen[name] = runs_seen.get(name, 0) + 1
                self.collected.append((name, -1, -1))
            keys.append(name if n == 1 else f"{name}#{n}")
            floats = [j for j, v in enumerate(jaxpr.eqns[k].outvars) if _inexact(v.aval)]
            if floats:
                self.collected[-1] = (name, k, floats[-1])
        self.collected = [c for c in self.collected if c[1] >= 0]
        eqns = [_standalone(eqn) for eqn in jaxpr.eqns]
        self.steps = []
        for eqn, key, location in zip(eqns, keys, locations, strict=True):
            invars = list(dict.fromkeys(v for v in eqn.invars if not isinstance(v, jex.Literal)))
            self.steps.append(_Step(_equation_primitive(eqn, invars, key, location), invars, list(eqn.outvars), location))
        # The forward of every equation at once, one program returning all their outputs:
        # one compile per signature instead of one per equation.
        every_output = [v for eqn in eqns for v in eqn.outvars]
        self.forward = jax.jit(_jaxpr_function(self.invars, every_output, eqns, jaxpr.effects, self.consts, "forward"))

    def run(self, inputs: list[Any]) -> Any:
        values = self.forward(*[x._array if isinstance(x, Tensor) else x for x in inputs])
        env: dict[Any, Any] = dict(self.consts)
        env.update(zip(self.invars, inputs, strict=True))
        outputs: list[tuple[Any, ...]] = []
        record = _grad_state.enabled
        anomaly = ANOMALY.enabled
        # Inside a dual level each equation's outputs get their tangents as a bound op's would
        # (NOTE [Tangents are jvp of the forward]).
        dual = tangents_on()
        position = 0
        for step in self.steps:
            n = step.prim.num_outputs
            arrays = values[position : position + n]
            position += n
            args = tuple([env[v] for v in step.invars])
            tangents = registry.tangent_rule(step.prim, args, {}) if dual else None
            if record and any(isinstance(a, Tensor) and (a.grad_fn is not None or a._requires_grad) for a in args):
                out = bind(step.prim, args, {}, arrays[0] if n == 1 else tuple(arrays), tangents)
                outs = out if n > 1 else (out,)
                if anomaly:
                    _note_equation(outs, step)
            else:
                outs = tuple([Tensor(a) for a in arrays])
                if tangents is not None:
                    for o, t in zip(outs, tangents, strict=True):
                        set_tangent(o, t)
            env.update(zip(step.outvars, outs, strict=True))
            outputs.append(outs)
        if _collectors.stack:
            collected = _collectors.stack[-1]
            for group, k, j in self.collected:
                collected._add(group, outputs[k][j])
        results = [v.val if isinstance(v, jex.Literal) else env[v] for v in self.outvars]
        results = [r if isinstance(r, Tensor) else Tensor(jnp.asarray(r)) for r in results]
        return jax.tree_util.tree_unflatten(self.out_tree, results)


def _note_equation(outs: tuple[Tensor, ...], step: _Step) -> None:
    """Anomaly mode: the node's forward trace ends at the JAX equation and the user's line that made it."""
    for t in outs:
        node = t.grad_fn
        if node is not None:
            trace = node.metadata.get(TRACEBACK_KEY, "")
            node.metadata[TRACEBACK_KEY] = f"{trace}  JAX equation {step.prim.name} of the traced function, at {step.location}\n"
            return


def _is_dynamic(x: Any) -> bool:
    """Arrays and Tensors are inputs of the traced program; every other leaf is static."""
    return isinstance(x, (Tensor, jax.Array, np.ndarray, np.generic))


def _signature(x: Any) -> tuple[Any, ...]:
    array = x._array if isinstance(x, Tensor) else x
    return (tuple(np.shape(array)), jnp.result_type(array), bool(getattr(array, "weak_type", False)))


class TracedJaxFunction:
    """``from_jax(fn, trace=True)``: ``fn`` run equation by equation as xgrad nodes (NOTE [Traced from_jax])."""

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn = fn
        self.name = name
        self.programs: dict[Any, _Program] = {}
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **static: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(args, is_leaf=is_tensor)
        dynamic = [i for i, x in enumerate(leaves) if _is_dynamic(x)]
        statics = tuple((i, _freeze(x)) for i, x in enumerate(leaves) if not _is_dynamic(x))
        key = (treedef, statics, _freeze(static), tuple(_signature(leaves[i]) for i in dynamic),
               jax.config.jax_enable_x64)  # type: ignore[attr-defined]  # JAX's Config stub lists no flags
        program = self.programs.get(key)
        if program is None:
            program = self._trace(leaves, treedef, dynamic, static)
            with self._lock:
                program = self.programs.setdefault(key, program)
        return program.run([leaves[i] for i in dynamic])

    def _trace(self, leaves: list[Any], treedef: Any, dynamic: list[int], static: dict[str, Any]) -> _Program:
        fn = self.fn

        def of_dynamic(*arrays: Any) -> Any:
            full = list(leaves)
            for i, a in zip(dynamic, arrays, strict=True):
                full[i] = a
            args = jax.tree_util.tree_unflatten(treedef, full)
            scopes.add_arguments(args)
            return fn(*args, **static)

        shapes = [jax.ShapeDtypeStruct(*_signature(leaves[i])[:2], weak_type=_signature(leaves[i])[2]) for i in dynamic]
        with _naming_modules() as scopes:
            closed, out_shape = jax.make_jaxpr(of_dynamic, return_shape=True)(*shapes)
        return _Program(closed, jax.tree_util.tree_structure(out_shape), scopes.scope_names)

"""The primitive registry: each op's forward and its backward rules, side by side.

# NOTE [Derivatives are data]
# A primitive is a ``jnp``/``lax`` forward plus one backward rule per argument (or
# one joint rule for all), registered once at import by ``defprim``. A rule is a pure
# function ``rule(g, out, *inputs, **params)`` of the incoming gradient, the values
# the primitive saved and its static parameters, written with xgrad ops so that a
# backward recorded under ``create_graph=True`` is itself differentiable. Inputs the
# primitive does not save reach the rule as an ``Aval`` (shape and dtype only); what
# it saves is what the rules of its grad-requiring inputs read (NOTE [Save what the
# needed rules read]).
# Rules may return gradients in the broadcast shape: ``validate_outputs`` sums them
# down to each input's shape, the one place un-broadcasting is written. The eager
# engine and the compiled lowering replay the same rules.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp

from xgrad.bounded_cache import BoundedCache
from xgrad.dual import LEVEL, set_tangent, tangents_on
from xgrad.engine.anomaly import ANOMALY, record_forward_trace
from xgrad.engine.dataflow import PRIMITIVE_JIT_PREFIX
from xgrad.engine.node import NO_EDGE, Edge, InputMetadata, grad_accumulator
from xgrad.engine.rules import Aval, RuleArgs, made_grads
from xgrad.engine.saved import SavedTensor
from xgrad.fast_compile import FastJit
from xgrad.grad_mode import _state as _grad_state
from xgrad.grad_mode import stops_gradients
from xgrad.jax_capture import check_captured_leaves
from xgrad.jax_internals import ARRAY_SHARDING_FIELD, devices_in_process, loaded_names
from xgrad.ops.devices import check_same_devices
from xgrad.ops.dispatch import DISPATCH
from xgrad.ops.fused_rules import MAX_FUSED, UNFUSED, device_scalar, fuse, fusion_signature
from xgrad.ops.primitive_node import PrimitiveNode
from xgrad.step_trace import current as _current_step
from xgrad.tensor import Tensor
from xgrad.tensor.jax_boundary import ERR_CUT_BY_JAX

logger = logging.getLogger(__name__)

__all__ = ["REGISTRY", "Aval", "Primitive", "PrimitiveNode", "bind", "defprim"]

Rule = Callable[..., Any]

_Tracer = jax.core.Tracer  # read once: ``jax.core.Tracer`` is two attribute lookups per op

# What each argument of a recorded op is, the key of its primitive's save plan: not a tensor, a
# tensor that needs no grad, one that wants it.
_CONSTANT, _NO_GRAD, _WANTS_GRAD = 0, 1, 2


class _SavePlan(NamedTuple):
    """What a node keeps of its inputs (NOTE [Save what the needed rules read]), per primitive and argument kinds.

    ``inputs`` and ``save_out`` are ``Primitive.saves``'s answer, ``wanted`` which inputs want a grad;
    the positions of the tensor inputs whose values it keeps (a ``SavedTensor``), whose shape and
    dtype (an ``Aval``) and those it drops (``None``); the positions of the tensors that need no grad
    (checked for a cut by a JAX transformation); ``holds_tensors`` whether it saves any tensor.
    """

    inputs: frozenset[int] | None
    save_out: bool
    wanted: tuple[bool, ...]
    save_at: tuple[int, ...]
    aval_at: tuple[int, ...]
    drop_at: tuple[int, ...]
    no_grad_at: tuple[int, ...]
    holds_tensors: bool


class Primitive:
    """One differentiable op: forward ``impl`` and backward rules.

    >>> import xgrad
    >>> prim = xgrad.mul.primitive
    >>> prim.name, prim.node_name, len(prim.vjps)
    ('mul', 'MulBackward', 2)
    """

    __slots__ = (
        "_fast", "_fused", "_jitted", "_outputs", "_reads", "_saves", "impl", "jit", "joint_vjp", "name", "node_name", "num_outputs", "save", "save_out", "vjps",
    )

    def __init__(
        self,
        name: str,
        impl: Callable[..., Any],
        vjps: Sequence[Rule | None] | None,
        joint_vjp: Rule | None,
        save: Sequence[int] | None,
        save_out: bool,
        num_outputs: int,
        jit: bool = True,
        shape_rule: Callable[..., None] | None = None,
    ) -> None:
        self.name = name
        self.node_name = "".join(part.capitalize() for part in name.split("_")) + "Backward"
        self.impl = impl if shape_rule is None else _checked(impl, shape_rule)
        self.vjps = tuple(vjps) if vjps is not None else None
        self.joint_vjp = joint_vjp
        self.save = None if save is None else frozenset(save)
        self.save_out = save_out
        self.num_outputs = num_outputs
        self.jit = jit
        self._jitted: dict[Any, FastJit] = {}
        self._fast: Any = None  # the fast program without params, once made (NOTE [Jitted dispatch])
        self._fused: BoundedCache[Any, Any] = BoundedCache(MAX_FUSED)  # NOTE [Fused eager rules]
        self._reads = None if self.vjps is None else tuple(_rule_reads(rule) for rule in self.vjps)
        self._saves: dict[tuple[int, ...], _SavePlan] = {}
        self._outputs: dict[Any, tuple[Any, tuple[InputMetadata]]] = {}  # NOTE [One metadata per output aval]

    def saves(self, wanted: tuple[bool, ...]) -> tuple[frozenset[int] | None, bool]:
        """Which inputs (``None``: all) and whether the output to save, given which inputs want a grad.

        # NOTE [Save what the needed rules read]
        # As PyTorch's generated nodes do, a primitive saves only what the rules of its
        # inputs that require grad read: ``x * 1.5`` with only ``x`` requiring grad saves
        # nothing, since ``x``'s rule reads only ``g`` and the constant. What a rule
        # reads comes from its code (``_rule_reads``); ``save=`` narrows it further to
        # the inputs whose values (not only shape and dtype) the rules need: those reach
        # the rules as an ``Aval``. A tensor input that no needed rule reads is kept as
        # ``None``: the rules that would read it never run for this node (a backward can
        # narrow which inputs want a gradient, never widen it), so it costs no ``Aval``
        # (``linear``'s weight and bias when only the weight's rule, which reads the
        # input, and the bias's, which reads ``g``, are needed).
        """
        plan = self._save_plan(tuple([_WANTS_GRAD if want else _NO_GRAD for want in wanted]))
        return plan.inputs, plan.save_out

    def _save_plan(self, kinds: tuple[int, ...]) -> _SavePlan:
        """What a node of this primitive keeps, given what each argument is (``_CONSTANT``, ``_NO_GRAD``, ``_WANTS_GRAD``)."""
        cached = self._saves.get(kinds)
        if cached is not None:
            return cached
        wanted = tuple([kind == _WANTS_GRAD for kind in kinds])
        n = len(kinds)
        everything = frozenset(range(n))
        if self._reads is None:
            inputs: frozenset[int] | None = self.save
            read = everything
            save_out = self.save_out
        else:
            read_set: set[int] = set()
            reads_out = False
            for want, reads in zip(wanted, self._reads, strict=True):
                if want and reads is not None:
                    read_set |= reads[0]
                    reads_out = reads_out or reads[1]
                elif want:  # a rule whose reads are unknown: it may read anything
                    read_set.update(everything)
                    reads_out = True
            read = frozenset(read_set)
            inputs = read if self.save is None else read & self.save
            save_out = self.save_out and reads_out
        tensors = [i for i in range(n) if kinds[i] != _CONSTANT]
        save_at = tuple([i for i in tensors if inputs is None or i in inputs])
        aval_at = tuple([i for i in tensors if i not in save_at and i in read])
        drop_at = tuple([i for i in tensors if i not in save_at and i not in read])
        no_grad_at = tuple([i for i in tensors if kinds[i] == _NO_GRAD])
        plan = _SavePlan(inputs, save_out, wanted, save_at, aval_at, drop_at, no_grad_at, save_out or bool(save_at))
        self._saves[kinds] = plan
        return plan

    def _output_metadata(self, aval: Any, sharding: Any) -> tuple[InputMetadata]:
        """The one output's metadata, kept for the next output of this ``aval`` and ``sharding``.

        # NOTE [One metadata per output aval]
        # A node keeps its outputs' shape, dtype and sharding (``InputMetadata``). JAX hands
        # the arrays of one shape and dtype one ``aval`` object, and a jitted program its
        # output the same ``sharding`` object call after call, so a primitive of one output
        # keeps the metadata it made by the output's ``aval`` (a cheap hash) while the
        # sharding is the same object: the nodes of a step share it, where each made three
        # tuples of its own (0.07-0.1 µs of a recording). Another program (other params)
        # or placement makes its own. Bounded: a process that meets many shapes starts over.
        """
        if len(self._outputs) >= _MAX_OUTPUT_AVALS:
            self._outputs.clear()
        metadata = (_new_tuple(InputMetadata, (aval.shape, aval.dtype, sharding)),)
        self._outputs[aval] = (sharding, metadata)
        return metadata

    def dispatch(self, arrays: list[Any], params: dict[str, Any]) -> Any:
        """Run the forward on arrays.

        # NOTE [Jitted dispatch]
        # Each primitive's forward runs as a ``jax.jit`` function, one per set of static
        # params: jit's C++ fast path dispatches about twice as fast as the ``jnp``
        # wrappers, and that cost is paid once per op in the forward and again for
        # every op a backward rule calls. Params that cannot be hashed (index arrays)
        # run the plain ``impl``. A primitive called without params keeps its fast
        # program (``_fast``) once made, and ``bind`` calls it itself where no argument
        # is traced: this method's call, its key and its lookups cost 0.3 µs of a
        # recorded op of 5. Any error goes through ``_failed`` either way.
        """
        if not self.jit:
            return self.impl(*arrays, **params)
        try:
            key = tuple(params.items()) if params else ()
            fn = self._jitted.get(key)
        except TypeError:
            return self.impl(*arrays, **params)
        if fn is None:
            fn = FastJit(_named(functools.partial(self.impl, **params) if params else self.impl, self.name))
            self._jitted[key] = fn
            if not params:
                self._fast = fn.fast
        # Traced arrays: the op is inlined into a traced program, which takes no options of its own (NOTE [Fast compiles]).
        traced = False
        for a in arrays:
            if isinstance(a, _Tracer):
                traced = True
                break
        try:
            if traced:
                return fn.plain(*arrays)
            try:
                # The fast program called directly (a frame less than ``FastJit.__call__``); the
                # ``ValueError`` of a trace that refuses its options goes back to ``FastJit``'s fallback.
                return fn.fast(*arrays)
            except ValueError:
                return fn(*arrays)
        except Exception as e:
            self._failed(e, arrays)
            raise

    def _failed(self, e: Exception, arrays: list[Any]) -> None:
        """Called with the forward's error ``e``: raise PyTorch's ``TypeError`` for a ``None`` argument, or
        leave ``e`` (the caller raises it) without JAX's note, which is not about xgrad's own message."""
        if not isinstance(e, RuntimeError | IndexError):  # JAX's error, not a shape rule's
            for i, a in enumerate(arrays):
                if a is None:  # PyTorch's TypeError for a None where a Tensor goes
                    raise TypeError(f"{self.name}(): argument (position {i + 1}) must be Tensor, not NoneType") from None
        # A shape rule's error leaves the trace with JAX's note about its hidden frames
        # appended; the message is xgrad's alone (NOTE [Shape rules]).
        notes = getattr(e, "__notes__", None)
        if notes:
            notes[:] = [n for n in notes if "JAX_TRACEBACK_FILTERING" not in n]

    def backward(self, args: RuleArgs) -> list[Any]:
        """The rules applied to given values; the eager node and the compiled lowering both call it."""
        g, out, inputs, params, needed = args
        vjps = self.vjps
        if vjps is None:  # one joint rule (``defprim`` takes exactly one of the two)
            if not any(needed):
                return [None] * len(needed)
            joint = cast(Rule, self.joint_vjp)
            return [gi if need else None for gi, need in zip(joint(g, out, *inputs, **params), needed, strict=True)]
        # A counted loop, not a zip(strict=True) comprehension, and no ``**{}``: the
        # comprehension cost as much again as the rule of a cheap op.
        n = len(needed)
        if len(vjps) != n:
            raise ValueError(f"{self.name} has {len(vjps)} backward rules, but was called with {n} inputs")
        grads: list[Any] = [None] * n
        i = 0
        for rule in vjps:
            if needed[i] and rule is not None:
                grads[i] = rule(g, out, *inputs, **params) if params else rule(g, out, *inputs)
            i += 1
        return grads

    def eager_backward(self, args: RuleArgs) -> list[Any]:
        """``backward`` for the eager engine without ``create_graph``: one jitted call when that pays.

        # NOTE [Fused eager rules]
        # A rule written in xgrad ops dispatches each op on its own (``g @ y.mT`` is two
        # jitted calls, tanh's ``g * (1 - out * out)`` three), and on small tensors each
        # dispatch costs more than its arithmetic. Where no graph is recorded, a node's
        # rules run instead as one ``jax.jit`` of those same rules, traced on tensors that
        # wrap tracers and cached per primitive and static signature: the static params,
        # which grads are needed, and what each rule argument is (an array, a Python
        # float passed as a weakly typed scalar, or a static value such as an ``Aval``).
        # The first node of a signature traces its rules once and counts the ops in the
        # trace (its own: another thread's dispatches never count); only a signature whose
        # rules make two or more is fused (a rule that
        # returns ``g`` as it is, or makes one call, gains nothing). Every node of a
        # signature then runs the same way, the first one included, so a backward gives
        # the same bits on its first call as on later ones. The fused rules are compiled
        # without XLA's algebraic simplifier, whose rewrites are not IEEE-exact where NaN
        # and inf appear (``g * mask`` becomes a select, so ``inf * 0`` gives 0 instead of
        # NaN; ``a / b`` becomes ``a * (1 / b)``): they then agree with the rules run op
        # by op (``create_graph``, anomaly mode) on NaN and inf exactly, as PyTorch's
        # formulas compute them, and on finite values up to the rounding of contracted
        # multiply-adds. Rules that cannot be traced (they read a concrete value),
        # traced values (``xgrad.compile``, vmap), anomaly mode, a live dual level (tangents
        # pass through the rules' ops) and primitives made with ``register=False`` (whose
        # rules may be instrumented) stay op by op. A registered
        # rule is pure (NOTE [Derivatives are data]): it runs when traced, as under ``jax.jit``.
        """
        if REGISTRY.get(self.name) is not self:  # made at run time (``register=False``): rules run as written
            return self.backward(_made(args))
        key, g_arrays, arrays = fusion_signature(args)
        if key is None:
            return self.backward(_made(args))
        fused = self._fused.get(key)
        if fused is None:
            fused = fuse(self, key, args.params, g_arrays, arrays)
            self._fused[key] = fused
        if fused is not UNFUSED:
            try:
                results = fused(g_arrays, arrays)
            except Exception:  # noqa: BLE001 - untraceable rules: op by op raises any real error
                logger.debug("%s: the fused rules failed; they run op by op from now on", self.node_name, exc_info=True)
                self._fused[key] = UNFUSED
            else:
                return [None if r is None else Tensor(r) for r in results]
        return self.backward(_made(args))

    @property
    def host_only(self) -> bool:
        """Registered primitives that do not jit their forward are device moves: one XLA
        program cannot move values between devices, so the compiled backward runs them on the host."""
        return not self.jit and REGISTRY.get(self.name) is self

    def __repr__(self) -> str:
        return f"Primitive({self.name})"


REGISTRY: dict[str, Primitive] = {}


def _made(args: RuleArgs) -> RuleArgs:
    """``args`` with the unmade zeros of its ``g`` made, for rules run op by op (NOTE [Unmade zeros])."""
    return args if type(args.g) is not tuple else args._replace(g=made_grads(args.g))


def _named(impl: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``impl`` under the name its ``jit`` equation carries in a traced program (NOTE [Data flow as eager sees it])."""

    def primitive(*arrays: Any) -> Any:
        return impl(*arrays)

    primitive.__name__ = primitive.__qualname__ = PRIMITIVE_JIT_PREFIX + name
    return primitive


def _checked(impl: Callable[..., Any], shape_rule: Callable[..., None]) -> Callable[..., Any]:
    """``impl`` that runs ``shape_rule`` first: when jitted, once per traced signature (NOTE [Shape rules])."""

    def checked(*arrays: Any, **params: Any) -> Any:
        shape_rule(*arrays, **params)
        return impl(*arrays, **params)

    return checked


def _rule_reads(rule: Rule | None) -> tuple[frozenset[int], bool] | None:
    """The inputs ``rule(g, out, *inputs, **params)`` reads, and whether it reads ``out``.

    Read off the rule's bytecode: a parameter the code never loads (nor captures in a
    closure) cannot reach the gradient. ``None`` when that cannot be known: not a plain
    function, ``*args``, or a call to ``locals``/``vars``.
    """
    code = getattr(rule, "__code__", None)
    if code is None or code.co_flags & 0x04 or {"locals", "vars"} & set(code.co_names):  # 0x04: CO_VARARGS
        return None
    names = code.co_varnames[: code.co_argcount]
    loaded = loaded_names(code)
    inputs = frozenset(i - 2 for i, name in enumerate(names) if i >= 2 and name in loaded)
    return inputs, len(names) > 1 and names[1] in loaded


def defprim(
    name: str,
    impl: Callable[..., Any],
    vjp: Sequence[Rule | None] | None = None,
    *,
    joint_vjp: Rule | None = None,
    save: Sequence[int] | None = None,
    save_out: bool = False,
    num_outputs: int = 1,
    register: bool = True,
    jit: bool = True,
    shape_rule: Callable[..., None] | None = None,
    doc: str | None = None,
) -> Callable[..., Any]:
    """Register a primitive and return the function that applies it to tensors.

    Args:
        name: registry name; the node is named ``<Name>Backward``.
        impl: the forward on arrays, ``impl(*arrays, **params)``.
        vjp: one rule per positional argument (``None`` for non-differentiable ones).
        joint_vjp: instead of ``vjp``, one rule returning a tuple of all input grads.
        save: indices of inputs whose values the rules need (default: all of them); the
            others reach the rules as an ``Aval``. Tensor inputs no needed rule reads are
            kept as ``None`` either way (NOTE [Save what the needed rules read]).
        save_out: whether the rules read the output.
        num_outputs: number of arrays ``impl`` returns (a tuple when more than one).
        register: ``False`` for primitives made at run time (``from_jax``) that the
            registry-driven tests cannot know about.
        jit: dispatch the forward through ``jax.jit`` (NOTE [Jitted dispatch]); ``False``
            for forwards that are jitted already or must run eagerly (device moves).
        shape_rule: ``shape_rule(*arrays, **params)`` raises PyTorch's error for arguments whose
            shapes or dtypes the op refuses (NOTE [Shape rules] in ``shape_rules.py``).
        doc: the docstring of the returned function (summary and ``>>>`` example).

    >>> import jax.numpy as jnp, xgrad
    >>> twice = xgrad.defprim("twice_doc", lambda x: 2 * x, (lambda g, out, x: 2 * g,), save=(), register=False)
    >>> x = xgrad.tensor([1.0, 3.0], requires_grad=True)
    >>> twice(x).sum().backward()
    >>> x.grad.tolist()
    [2.0, 2.0]
    """
    if (vjp is None) == (joint_vjp is None):
        raise ValueError(f"primitive {name!r} needs exactly one of vjp= and joint_vjp=")
    if register and name in REGISTRY:
        raise ValueError(f"primitive {name!r} is already registered")
    prim = Primitive(name, impl, vjp, joint_vjp, save, save_out, num_outputs, jit, shape_rule)
    if register:
        REGISTRY[name] = prim

    def apply(*args: Any, **params: Any) -> Any:
        return bind(prim, args, params)

    apply.__name__ = name
    apply.__qualname__ = name
    apply.__doc__ = doc
    # Owned by the module that defines its rules, and so the op, so doctest finds its example.
    rules = [joint_vjp] if joint_vjp is not None else [rule for rule in vjp or () if rule is not None]
    if rules:
        apply.__module__ = getattr(rules[0], "__module__", apply.__module__)
    apply.primitive = prim  # type: ignore[attr-defined]
    return apply


# Whether the process holds several devices, read at the first op of a tensor (NOTE [One device, no device check] in
# ``devices.py``).
_several_devices: bool | None = None


def _count_devices() -> bool:
    global _several_devices
    _several_devices = devices_in_process() > 1
    return _several_devices


def _no_tangent_rule(prim: Primitive, args: tuple[Any, ...], params: dict[str, Any]) -> tuple[Tensor | None, ...] | None:
    raise AssertionError("xgrad internal error: xgrad.ops.tangents was not imported; please report a bug")


# The forward-mode rule of every primitive: ``xgrad.ops.tangents`` sets it (it builds on
# ``from_jax``, which builds on this module).
tangent_rule: Callable[[Primitive, tuple[Any, ...], dict[str, Any]], tuple[Tensor | None, ...] | None] = _no_tangent_rule


# NOTE [Recording cost]
# ``bind`` runs once per op, so it is written for the interpreter. One pass over the
# arguments serves the run and the record: the arrays, the edges (inline, not through
# ``gradient_edge``; a leaf's ``AccumulateGrad`` read from its weak reference in place,
# made with the node when it is not alive), the node's topological number (above 0
# exactly when a graph is wanted), and the key of the primitive's save plan
# (``_SavePlan``, cached per kinds of arguments). The plan names the positions that get
# a ``SavedTensor``, an ``Aval`` or ``None`` and the tensors that need no grad (checked
# for a cut by a JAX transformation only when a node is made): the second pass touches
# those alone, and an op that keeps its arguments as they are copies nothing. The
# record is ``bind``'s tail, not a call of its own; ``from_jax``'s traced ops, which
# have run already, enter it with their outputs. The outputs' metadata comes from
# ``aval``'s fields (the array's ``shape``/``dtype`` are Python properties over them),
# and a one-output primitive reuses it per output ``aval`` (NOTE [One metadata per
# output aval]). The output ``Tensor`` is made by ``Tensor._fill``, not through its
# type's call (NOTE [Op outputs made without the type's call]). The node is made by
# ``Node``'s constructor and its rule fields are set here (``PrimitiveNode`` has no
# constructor of its own: a frame less). Whether a dtype is
# differentiable is cached per dtype (``jnp.issubdtype`` costs as much as a node). The
# ``Edge``, ``InputMetadata`` and ``Aval`` named tuples are made by ``tuple.__new__``
# (``_new_tuple``): their own ``__new__`` is a Python function, a frame that costs as
# much as the tuple. ``isinstance(a, Tensor)`` alone: it checks the exact type first
# in C, faster than a ``type(a) is Tensor`` before it.
_INEXACT: dict[Any, bool] = {}
_new_tuple = tuple.__new__
_new_object = object.__new__
_fill_tensor = Tensor._fill  # an op output: ``_fill_tensor(_new_object(Tensor), out)`` (NOTE [Op outputs made without the type's call])


def _differentiable_dtype(dtype: Any) -> bool:
    known = _INEXACT.get(dtype)
    if known is None:
        known = _INEXACT[dtype] = bool(jnp.issubdtype(dtype, jnp.inexact))
    return known


# How many output avals a primitive keeps the metadata of (NOTE [One metadata per output aval]).
_MAX_OUTPUT_AVALS = 64

# ``bind``'s ``out`` when the op is still to run.
_RUN: Any = object()


def bind(
    prim: Primitive, args: tuple[Any, ...], params: dict[str, Any], out: Any = _RUN, tangents: tuple[Any, ...] | None = None
) -> Any:
    """Run ``prim`` on ``args`` and, when grad mode asks for it, record its node.

    With ``out`` (and its ``tangents``) the op has run already and is recorded alone: ``from_jax``'s
    traced ops, whose caller has checked that a graph is wanted.
    """
    # One pass over the arguments for the run and the record (NOTE [Recording cost]).
    arrays: list[Any] = []
    edges: list[Any] = []
    kinds: list[int] = []
    topo = 0  # the node's topological number; above 0 when an argument wants a grad
    missing = False  # a leaf whose AccumulateGrad is made with the node (grad mode may be off)
    scalars = False
    first = None  # the first tensor argument; the others are found again where needed
    for a in args:
        if isinstance(a, Tensor):
            arrays.append(a._array)
            if first is None:
                first = a
            fn = a.grad_fn
            if fn is not None:
                edges.append(_new_tuple(Edge, (fn, a._output_nr)))
                kinds.append(_WANTS_GRAD)
                if fn.topological_nr >= topo:
                    topo = fn.topological_nr + 1
            elif a._requires_grad:
                ref = a._grad_accumulator  # ``grad_accumulator``'s hit, inline
                accumulator = ref() if ref is not None else None
                if accumulator is None:
                    missing = True
                    edges.append(None)
                else:
                    edges.append(_new_tuple(Edge, (accumulator, 0)))
                kinds.append(_WANTS_GRAD)
                if not topo:  # an AccumulateGrad's number is 0
                    topo = 1
            else:
                edges.append(NO_EDGE)
                kinds.append(_NO_GRAD)
        else:
            arrays.append(a)
            edges.append(NO_EDGE)
            kinds.append(_CONSTANT)
            if type(a) is float or type(a) is int:
                scalars = True
    if out is _RUN:
        trace = _current_step()
        if trace is not None:  # a step being traced finds its state here (NOTE [The step-trace seam])
            for a in args:
                if isinstance(a, Tensor):
                    trace.read(a)
        if first is not None and (_several_devices if _several_devices is not None else _count_devices()):
            tensors = [a for a in args if isinstance(a, Tensor)]  # NOTE [One device, no device check]
            if len(tensors) > 1:
                check_same_devices(args, tensors, arrays)
        if scalars and prim.jit and first is not None and not isinstance(first._array, _Tracer):  # NOTE [Scalar constants]
            arrays = [device_scalar(a) if type(a) is float or type(a) is int else a for a in arrays]
        dispatch = DISPATCH.get()  # NOTE [Dispatch seam] in xgrad/ops/dispatch.py
        fast = prim._fast
        if dispatch is not None:
            out = dispatch(prim, arrays, params)
        elif fast is None or params:
            out = prim.dispatch(arrays, params)
        else:  # the fast program called here (NOTE [Jitted dispatch]), as ``dispatch`` would call it
            for array in arrays:
                if isinstance(array, _Tracer):  # traced: the program without options
                    out = prim.dispatch(arrays, params)
                    break
            else:
                try:
                    out = fast(*arrays)
                except ValueError:  # a trace that refuses the program's options: ``dispatch``'s fallback
                    out = prim.dispatch(arrays, params)
                except Exception as e:
                    prim._failed(e, arrays)
                    raise
        if LEVEL.current is not None and first is not None and tangents_on():  # NOTE [Tangents are jvp of the forward]
            tangents = tangent_rule(prim, args, params)
        if not (topo and _grad_state.enabled):
            if _grad_state.stop_trace is not None and trace is None and stops_gradients(arrays):
                out = jax.lax.stop_gradient(out)  # NOTE [Grad mode on JAX's AD]
            if prim.num_outputs == 1:
                result = _fill_tensor(_new_object(Tensor), out)
                if tangents is not None:
                    set_tangent(result, tangents[0])
                return result
            results = tuple(Tensor(o) for o in out)
            if tangents is not None:
                for r, t in zip(results, tangents, strict=True):
                    set_tangent(r, t)
            return results
    # Recording.
    single = prim.num_outputs == 1
    traced = isinstance(out if single else out[0], _Tracer)
    if traced:
        check_captured_leaves(args, out if single else out[0])  # NOTE [Captured leaves]
    key = tuple(kinds)
    plan = prim._saves.get(key)
    _, save_out, wanted, save_at, aval_at, drop_at, no_grad_at, holds_tensors = plan if plan is not None else prim._save_plan(key)
    for i in no_grad_at:
        cut_site = args[i]._cut_site  # set by every Tensor's constructor
        if cut_site is not None:  # NOTE [Outputs of JAX transformations]
            raise RuntimeError(ERR_CUT_BY_JAX.format(where=cut_site))
    if missing:
        for i, edge in enumerate(edges):
            if edge is None:
                edges[i] = _new_tuple(Edge, (grad_accumulator(args[i]), 0))
    # The arguments as the rules get them: constants as they are, tensors by the plan.
    saved: Any = args
    if save_at or aval_at or drop_at:
        saved = list(args)
        for i in save_at:
            saved[i] = SavedTensor(args[i], False, prim.name)
        for i in drop_at:  # no needed rule reads it (NOTE [Save what the needed rules read])
            saved[i] = None
        for i in aval_at:
            array = args[i]._array
            saved[i] = _new_tuple(Aval, (array.shape, array.dtype))
        saved = tuple(saved)
    if single:
        # The fields of ``aval``, not the array's ``shape`` and ``dtype``: each of those is a Python
        # property reading ``aval``; the sharding's field likewise (``ARRAY_SHARDING_FIELD``). A
        # traced value has no sharding (``sharding_of``).
        aval = getattr(out, "aval", out)
        dtype = aval.dtype
        metadata: tuple[InputMetadata, ...]
        if traced or aval is out:  # a traced value has no sharding (``sharding_of``), nor a value that is not JAX's
            metadata = (_new_tuple(InputMetadata, (aval.shape, dtype, None)),)
        else:
            sharding = getattr(out, ARRAY_SHARDING_FIELD, None)
            known = prim._outputs.get(aval)  # NOTE [One metadata per output aval]
            metadata = known[1] if known is not None and known[0] is sharding else prim._output_metadata(aval, sharding)
    else:
        outs = tuple(out)
        metadata = tuple(
            [_new_tuple(InputMetadata, (o.shape, o.dtype, None if traced else getattr(o, "sharding", None))) for o in outs]
        )
    node = PrimitiveNode(tuple(edges), metadata, None, topo)  # Node's constructor: the rest is set here
    node._edges_needed = wanted  # known here: a fresh node need not build it in backward
    node.prim = prim
    node.params = params
    node.saved = saved
    # Whether ``saved`` or ``saved_out`` has a SavedTensor: a node without one has
    # nothing to unpack or release (``y * 1.0001``, NOTE [Save what the needed rules read]).
    node.holds_tensors = holds_tensors
    node.saved_out = None
    node.structure = None  # NOTE [Structure fragments]
    if ANOMALY.enabled:
        record_forward_trace(node)
    if single:
        result = _fill_tensor(_new_object(Tensor), out)
        differentiable = _INEXACT.get(dtype)
        if differentiable if differentiable is not None else _differentiable_dtype(dtype):
            result.grad_fn = node  # output 0: Tensor's default _output_nr
        if tangents is not None:  # before saving: a saved output keeps its tangent
            set_tangent(result, tangents[0])
        if save_out:
            node.saved_out = (SavedTensor(result, True, prim.name),)
        on_record = PrimitiveNode.on_record  # NOTE [Rule nodes]
        if on_record is not None:
            on_record(node)
        return result
    results = tuple(
        [Tensor._from_graph(o, node, k) if _differentiable_dtype(o.dtype) else Tensor(o) for k, o in enumerate(outs)]
    )
    if tangents is not None:
        for r, t in zip(results, tangents, strict=True):
            set_tangent(r, t)
    if save_out:
        node.saved_out = tuple([SavedTensor(r, True, prim.name) for r in results])
    on_record = PrimitiveNode.on_record
    if on_record is not None:
        on_record(node)
    return results

"""Every JAX (and CPython) behaviour xgrad relies on beyond JAX's stable public API, in one place.

What xgrad uses of JAX, by how stable it is:

- Public: ``jax.Array`` and its documented attributes (``aval``, ``weak_type``,
  ``committed``, ``sharding``), ``jax.core.Tracer``, ``jax.jit``/``make_jaxpr``/``vjp``,
  ``jax.tree_util`` (a Tensor is a pytree node), the ``__jax_array__`` protocol (how ``jnp``
  functions and ``jax.Array``'s operators convert a Tensor: NOTE [Tensors that require grad
  become arrays] in ``tensor/jax_boundary.py``, pinned by ``tests/test_jax_boundary.py``), ``jax.dtypes``,
  ``jax.config.update``.
- Public but unstable, re-exported here so that a JAX upgrade that moves them is
  handled once: ``jax.extend.backend.backends`` (``devices_in_process``),
  ``jax.extend.core`` (``ClosedJaxpr``, ``Literal``, ``jaxpr_as_fun``,
  ``get_opaque_trace_state``, and a jaxpr's ``eqns``/``invars``/``outvars``/
  ``constvars``/``effects``; ``Jaxpr``, ``Var``, ``DropVar``, ``DebugInfo`` and an
  equation's ``replace``/``params``/``ctx``/``source_info`` for ``from_jax(fn,
  trace=True)``, NOTE [Traced from_jax]), an equation's name stack (its ``stack`` of
  ``Scope``/``Transform`` entries, read by ``name_scopes``, checked at import) and
  traceback (its ``frames``, read by ``source_frames``), ``jax.experimental.io_callback`` and
  ``jax.experimental.compilation_cache.compilation_cache.reset_cache``.
- Internal: ``BatchTracer.val`` and ``JVPTracer``/``LinearizeTracer.primal``
  (``concrete_value``: the values under ``vmap``/``grad`` tracers, which an op's
  index check reads as eagerly). A JAX that moves them fails the import; one that
  changes what they hold fails ``tests/test_bad_input.py``'s index checks under ``xgrad.func.vmap``.
  The current trace (``core.trace_ctx.trace``), a ``BatchTrace``'s ``axis_data``,
  ``parent_trace`` and ``to_batch_info``, ``core.set_current_trace`` and the
  ``BatchTracer`` constructor (``batching_level``: an ``autograd.Function``'s own
  ``vmap`` rule runs one level down and its outputs are batched at the level, as JAX's
  batching rules are; checked at import by ``_self_test_batching_level``).
  ``pxla.ExecuteReplicated.__call__``, wrapped so that a host call's own exception, not JAX's
  ``JaxRuntimeError``, reaches the caller of a plain ``jax.jit`` program (``reraise_host_errors``).
- Behaviour no public API promises, checked by a self-test: at import for what needs
  no device (``_self_test``), at the first use for what needs one
  (``check_consts_keep_identity``):

  1. The arrays a ``jax.make_jaxpr`` trace closes over come back as the very objects
     in ``ClosedJaxpr.consts``: ``xgrad.compile`` finds which tensor a constant came
     from by identity (NOTE [Whole-step compile] in ``xgrad/compile_step``).
  2. CPython bytecode: ``loaded_names`` reads which parameters a backward rule loads
     (NOTE [Save what the needed rules read] in ``ops/registry.py``), matching opcodes
     by name (``LOAD_FAST``, 3.12's ``LOAD_FAST_AND_CLEAR``, 3.13's combined
     ``LOAD_FAST_LOAD_FAST``/``STORE_FAST_LOAD_FAST``, 3.14's ``LOAD_FAST_BORROW``, ...).
     A Python whose bytecode the import-time check reads wrongly does not fail the import:
     ``loaded_names`` then counts every name a function could load (its rules save all
     their inputs: more memory, the same gradients) and says so once in a warning.

The versions tested are those ``pyproject.toml`` declares; ``.ci/run`` runs both ends
(Python 3.11 with JAX 0.10, Python 3.13 with JAX 0.12). Between those ends nothing this
module re-exports or checks differs; what did differ is the set of XLA flags (jax 0.12's
XLA has no ``--xla_cpu_use_fusion_emitters``), which only the test suite passes and checks
against the running XLA (``tests/_scripts.py``).
"""

from __future__ import annotations

import dis
import threading
import warnings
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

import jax
import jax.extend.backend
from jax.experimental import io_callback
from jax.experimental.compilation_cache import compilation_cache
from jax.extend.core import ClosedJaxpr, DebugInfo, DropVar, Jaxpr, Literal, Var, get_opaque_trace_state, jaxpr_as_fun
from jax.extend.source_info_util import new_name_stack

__all__ = [
    "ARRAY_SHARDING_FIELD", "BYTECODE_SCAN_EXACT", "BytecodeScanFallback", "ClosedJaxpr", "DebugInfo", "DropVar", "Jaxpr", "JaxBehaviourChanged",
    "Literal", "Var", "abstractifying",
    "check_consts_keep_identity", "concrete_value", "devices_in_process", "get_opaque_trace_state", "io_callback",
    "jaxpr_as_fun", "loaded_names", "reraise_host_errors",
    "BatchingLevel", "batching_level", "name_scopes", "reset_compilation_cache", "single_device_sharding",
    "source_frames", "unwrap_tracer",
]

ERR_CHANGED = (
    "xgrad relies on a JAX or Python behaviour that changed in this version (JAX {jax}): {what}. "
    "Install a JAX version that pyproject.toml declares, or report this to xgrad."
)


class JaxBehaviourChanged(ImportError):
    """A behaviour xgrad relies on is not what this JAX or Python version does (the message says which)."""


def _changed(what: str) -> JaxBehaviourChanged:
    return JaxBehaviourChanged(ERR_CHANGED.format(jax=jax.__version__, what=what))


try:
    from jax._src.core import set_current_trace, trace_ctx
    from jax._src.interpreters.ad import JVPTracer, LinearizeTracer
    from jax._src.interpreters.batching import BatchTrace, BatchTracer
    from jax._src.interpreters.pxla import ExecuteReplicated
except ImportError as error:  # pragma: no cover - a JAX that moved them
    raise _changed(
        "jax._src.interpreters.batching.BatchTracer, ad.JVPTracer/LinearizeTracer or pxla.ExecuteReplicated moved"
    ) from error


# -- 1. ClosedJaxpr.consts are the arrays the trace closed over ---------------------------

_consts_checked = False
_consts_lock = threading.Lock()


def check_consts_keep_identity() -> None:
    """Raise ``JaxBehaviourChanged`` unless ``make_jaxpr`` hands back closed-over arrays as themselves (behaviour 1).

    Run once, by the first ``xgrad.compile`` trace (it needs a device).

    >>> check_consts_keep_identity()
    """
    global _consts_checked
    if _consts_checked:
        return
    with _consts_lock:
        if _consts_checked:
            return
        array = jax.numpy.arange(3.0)
        closed = jax.make_jaxpr(lambda x: x * array)(1.0)
        if not any(c is array for c in closed.consts):
            raise _changed("ClosedJaxpr.consts no longer holds the closed-over arrays themselves")
        _consts_checked = True


# -- 2. which names a function's bytecode loads -------------------------------------------


def loaded_names(code: CodeType) -> set[str]:
    """The local, cell and global names ``code`` loads (a superset: attribute names come too).

    Every opcode whose name contains ``LOAD`` counts; a combined opcode's argument is a
    tuple of names, all counted (a superset is safe: it only saves more). Where the
    import-time check found this Python's bytecode read wrongly, every name ``code``
    could load.

    >>> def rule(g, out, x, y):
    ...     return g * x
    >>> sorted(loaded_names(rule.__code__) & {"g", "out", "x", "y"})
    ['g', 'x']
    """
    if not BYTECODE_SCAN_EXACT:
        return _every_name(code)
    return _scanned_names(code)


def _every_name(code: CodeType) -> set[str]:
    return {*code.co_varnames, *code.co_cellvars, *code.co_freevars, *code.co_names}


def _scanned_names(code: CodeType) -> set[str]:
    loaded = set(code.co_cellvars)
    for ins in dis.get_instructions(code):
        if "LOAD" in ins.opname:
            loaded.update(ins.argval if isinstance(ins.argval, tuple) else (ins.argval,))
    return loaded


def _bytecode_scan_mistakes() -> list[str]:
    """How ``_scanned_names`` misreads this Python's bytecode for rules of each shape (none: it reads it right)."""

    def pair(g: Any, out: Any, a: Any, b: Any) -> Any:
        return a + b  # 3.13: one LOAD_FAST_LOAD_FAST

    def stored(g: Any, out: Any, a: Any, b: Any) -> Any:
        c = g
        return c * b  # 3.13: STORE_FAST_LOAD_FAST

    def closure(g: Any, out: Any, a: Any, b: Any) -> Any:
        return (lambda: a)()  # a cell

    def comprehension(g: Any, out: Any, a: Any, b: Any) -> Any:
        return [g for _ in b]  # 3.12: inlined, LOAD_FAST_AND_CLEAR

    expected = {pair: {"a", "b"}, stored: {"g", "b"}, closure: {"a"}, comprehension: {"g", "b"}}
    mistakes = []
    for fn, names in expected.items():
        found = _scanned_names(fn.__code__) & {"g", "out", "a", "b"}
        if found != names:
            mistakes.append(f"a rule like {fn.__name__!r} reads as loading {sorted(found)}, not {sorted(names)}")
    return mistakes


class BytecodeScanFallback(UserWarning):
    """This Python's bytecode is not read as xgrad expects: backward rules save all their inputs."""


def _check_bytecode_scan() -> bool:
    mistakes = _bytecode_scan_mistakes()
    if mistakes:
        warnings.warn(
            f"xgrad reads this Python's bytecode wrongly ({'; '.join(mistakes)}): backward rules save all "
            "their inputs instead (more memory, the same gradients). Please report this to xgrad.",
            BytecodeScanFallback, stacklevel=2,
        )
    return not mistakes


def abstractifying(frame: FrameType | None) -> bool:
    """Whether ``frame`` is JAX asking an object for its abstract value (``core.typeof``,
    ``core.shaped_abstractify``), which refuses objects with ``__jax_array__``: a Tensor
    where an array belongs (``jax.grad``'s output, a ``lax`` function's argument) then
    raises xgrad's error naming the fix instead of JAX's (``tests/test_jax_boundary.py`` pins it)."""
    return (
        frame is not None
        and frame.f_code.co_name in ("typeof", "shaped_abstractify")
        and frame.f_globals.get("__name__") == "jax._src.core"
    )


# -- 3. An equation's name stack and Python frames (NOTE [Traced from_jax]) ---------------


def name_scopes(name_stack: Any) -> tuple[str, ...]:
    """The ``jax.named_scope`` names of an equation's name stack, outermost first, without transforms (``vmap``)."""
    return tuple(entry.name for entry in name_stack.stack if type(entry).__name__ == "Scope")


def source_frames(source_info: Any) -> list[tuple[str, int, str]]:
    """The Python frames that made an equation, innermost first: ``(file, line, qualified function name)``."""
    traceback = source_info.traceback
    return [] if traceback is None else [(f.file_name, f.line_num, f.function_name) for f in traceback.frames]


def _self_test_name_scopes() -> None:
    stack = new_name_stack("model").extend("layer").transform("vmap").extend("dense")
    if name_scopes(stack) != ("model", "layer", "dense"):
        raise _changed(f"a name stack's scopes read as {name_scopes(stack)}, not ('model', 'layer', 'dense')")


def concrete_value(x: Any, *, through_vmap: bool = True) -> Any:
    """``x``, or the array under its ``vmap``/``grad``/``jvp`` tracers; ``None`` where there is none (``jit``, ``make_jaxpr``).

    A transformation applied to concrete arrays (``jax.vmap(f)(x)``, ``xgrad.func.vmap``)
    still holds them: a batched tracer its batched value (every lane), a JVP tracer its
    primal. Checks of values read them there, as PyTorch's eager transforms do. With
    ``through_vmap=False`` a batched tracer has no value (one lane's is not an array).
    """
    while isinstance(x, jax.core.Tracer):
        if isinstance(x, BatchTracer) and not through_vmap:
            return None
        x = unwrap_tracer(x)
    return x


def unwrap_tracer(x: Any) -> Any:
    """The array one ``vmap`` (its batched value) or ``grad``/``jvp`` (its primal) tracer holds; ``None`` for others."""
    if isinstance(x, BatchTracer):
        return x.val
    if isinstance(x, (JVPTracer, LinearizeTracer)):
        return x.primal
    return None


class BatchingLevel:
    """The innermost ``vmap`` being traced, as an ``autograd.Function``'s ``vmap`` rule sees it.

    ``unbatched(x)`` gives ``(value, batch dim or None)`` of ``x`` at this level;
    ``lower()`` runs code one level down (on the unbatched values); ``batched(value,
    dim)`` makes a value of this level from one with the batch at ``dim`` (``None``: the
    same for every lane).
    """

    __slots__ = ("_trace", "axis_name", "size")

    def __init__(self, trace: Any) -> None:
        self._trace = trace
        self.axis_name = trace.axis_data.name
        self.size = trace.axis_data.size

    def unbatched(self, x: Any) -> tuple[Any, int | None]:
        return self._trace.to_batch_info(x)  # type: ignore[no-any-return]

    def lower(self) -> Any:
        return set_current_trace(self._trace.parent_trace)

    def batched(self, value: Any, dim: int | None) -> Any:
        return value if dim is None else BatchTracer(self._trace, value, dim)


def batching_level() -> BatchingLevel | None:
    """The ``vmap`` being traced when it is the innermost transformation, else ``None``."""
    trace = trace_ctx.trace
    return BatchingLevel(trace) if isinstance(trace, BatchTrace) else None


def _self_test_batching_level() -> None:
    seen = []

    def lane(x: Any) -> Any:
        level = batching_level()
        if level is None:
            raise _changed("jax.vmap's function runs with no BatchTrace as the current trace")
        value, dim = level.unbatched(x)
        seen.append((level.axis_name, level.size, dim, getattr(value, "shape", None)))
        with level.lower():
            doubled = value * 2
        return level.batched(doubled, dim)

    # Traced, not run: importing xgrad must not start a JAX backend (``jax.distributed.initialize`` comes first).
    closed = jax.make_jaxpr(jax.vmap(lane, axis_name="lanes"))(jax.ShapeDtypeStruct((3, 2), jax.numpy.float32))
    (out,) = closed.out_avals
    equations = [str(eqn.primitive) for eqn in closed.jaxpr.eqns]
    if seen != [("lanes", 3, 0, (3, 2))] or out.shape != (3, 2) or equations != ["mul"]:
        raise _changed(f"a BatchTrace's batch info reads {seen} and rebatches to {out} by {equations}")


# -- a jax.Array's sharding as its field ---------------------------------------------------
# ``jax.Array.sharding`` is a Python property that returns the array's ``_sharding``. Every
# recorded op keeps its output's sharding (``InputMetadata``) and reads the field itself:
# the property's call cost 0.04-0.1 µs of each. Checked here, on the class (no
# backend starts), that the property still reads that field and nothing else, or (JAX 0.12)
# that field after asserting that a ``NamedSharding``'s spec has no unreduced axes, which an
# op's output never has.
ARRAY_SHARDING_FIELD = "_sharding"
_SHARDING_PROPERTY_NAMES = ((ARRAY_SHARDING_FIELD,), (ARRAY_SHARDING_FIELD, "isinstance", "NamedSharding", "spec", "unreduced"))
try:
    from jax._src.array import ArrayImpl as _ArrayImpl
except ImportError as error:  # pragma: no cover - a JAX that moved it
    raise _changed("jax._src.array.ArrayImpl moved") from error
_sharding_code = getattr(getattr(vars(_ArrayImpl).get("sharding"), "fget", None), "__code__", None)
if _sharding_code is None or _sharding_code.co_names not in _SHARDING_PROPERTY_NAMES:  # pragma: no cover - a JAX that changed it
    raise _changed(f"jax.Array.sharding no longer returns its {ARRAY_SHARDING_FIELD} field")


def single_device_sharding(device: Any) -> Any:
    """The sharding that puts a whole array on ``device``: ``jax.sharding.SingleDeviceSharding``
    until JAX 0.12.1 deprecated the class for ``jax.sharding.make_single_device_sharding``."""
    make = getattr(jax.sharding, "make_single_device_sharding", None)
    return make(device) if make is not None else jax.sharding.SingleDeviceSharding(device)


def devices_in_process() -> int:
    """How many devices every backend of this process holds together (``jax.extend.backend.backends``
    initialises them all, as the first array made does)."""
    return sum(len(backend.devices()) for backend in jax.extend.backend.backends().values())


def reraise_host_errors(original_of: Callable[[BaseException], BaseException | None]) -> None:
    """Where JAX runs a program and raises its ``JaxRuntimeError`` for a host callback that raised, raise instead the
    exception ``original_of`` finds behind it (``None``: JAX's own). Internal: ``pxla.ExecuteReplicated.__call__``
    runs every program with host callbacks (they leave JAX's C++ fast path), and on the CPU backend a callback's
    error comes out of it; ``tests/test_hooks_jax.py`` checks the exception a hook raises under ``jax.jit``.
    """
    run = ExecuteReplicated.__call__

    def call(self: Any, *args: Any) -> Any:
        try:
            return run(self, *args)
        except jax.errors.JaxRuntimeError as error:
            original = original_of(error)
            if original is None:
                raise
            raise original.with_traceback(original.__traceback__) from None

    ExecuteReplicated.__call__ = call  # type: ignore[method-assign]


def reset_compilation_cache() -> None:
    """Make JAX read ``jax_compilation_cache_dir`` again (it decides once, at its first compile)."""
    compilation_cache.reset_cache()


#: Whether ``loaded_names`` reads this Python's bytecode (checked at import), or counts every name.
BYTECODE_SCAN_EXACT = _check_bytecode_scan()
_self_test_name_scopes()
_self_test_batching_level()

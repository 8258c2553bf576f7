"""What ``xgrad.compile`` tells the user about a step it traces: why a call missed the cache (the argument and
what changed in it), where a trace needed a concrete value, and which variables the step's own code rebinds."""

from __future__ import annotations

import inspect
import linecache
import os
import traceback
import warnings
from typing import Any

import jax

from xgrad.compile_step.errors import WARN_REBINDS, CompileSideEffectWarning
from xgrad.compile_step.hook_purity import writes
from xgrad.tensor.hook_kinds import LEAF_KINDS

_XGRAD_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__))


def warn_rebinds(fn: Any, name: str) -> None:
    """Warn once per variable that ``fn``'s own code rebinds and that outlives the call (a global, a closed-over name).

    Only ``fn``'s own bytecode is read: a write through a call (``log.append(x)``, an
    attribute set) looks like the bookkeeping xgrad and optax do below the step, so it
    is not told apart (README, "Plain Python side effects").
    """
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:
        return
    seen = set()
    for instruction, kind in writes(code, code.co_freevars):
        if kind not in ("global", "closed-over") or instruction.argval in seen:
            continue
        seen.add(instruction.argval)
        line = instruction.positions.lineno if instruction.positions is not None else None
        site = f"{code.co_filename}:{line}"
        warnings.warn(
            WARN_REBINDS.format(name=name, kind=kind, var=instruction.argval, site=site), CompileSideEffectWarning,
            stacklevel=4,
        )


def concrete_value_needed(exc: BaseException) -> tuple[str, str]:
    """Why and where a trace needed a concrete value: the construct, named by the xgrad function the user's line
    called (``Tensor.item``, ``Tensor.__bool__``, ...), and that line with its source."""
    frames = [(frame.f_code, lineno) for frame, lineno in traceback.walk_tb(exc.__traceback__)]
    for i in range(len(frames) - 1, -1, -1):
        code, lineno = frames[i]
        path = os.path.abspath(code.co_filename)
        if not path.startswith((_XGRAD_DIR, _JAX_DIR)) and "/jax/" not in path and "/jaxlib/" not in path:
            callee = frames[i + 1][0] if i + 1 < len(frames) else None
            construct = None
            if callee is not None and callee.co_filename.startswith(_XGRAD_DIR):
                construct = _CONSTRUCTS.get(callee.co_name)
            if construct is None and type(exc).__name__ == "NonConcreteBooleanIndexError":
                construct = "a boolean mask as an index (the result's shape depends on the values)"
            source = linecache.getline(code.co_filename, lineno).strip()
            site = f"{code.co_filename}:{lineno}" + (f", `{source}`" if source else "")
            return f"Python needs a concrete value here: {construct or _ANY_CONSTRUCT}", site
    return f"Python needs a concrete value here: {_ANY_CONSTRUCT}", "unknown location"


_ANY_CONSTRUCT = ".item(), .numpy(), bool() or int() of a tensor, a boolean mask"
#: What needs a concrete value, by the xgrad function the user's line called.
_CONSTRUCTS = {
    "item": "t.item() (compiled only as an f-string's value inside print())",
    "tolist": "t.tolist()",
    "numpy": "t.numpy()",
    "to_numpy_array": "np.asarray() of a tensor",
    "to_bool": "bool() of a tensor (an if, while, assert, and/or/not on a tensor)",
    "to_float": "float() of a tensor",
    "to_int": "int() of a tensor",
    "to_index": "a tensor used as a Python int (an index, range(), a size)",
    "tensor_repr": "str()/repr() of a tensor whose text goes somewhere other than print() (compiled inside print())",
    "tensor_format": "an f-string or format() of a tensor whose text goes somewhere other than print() "
    "(compiled inside print())",
}


def describe_change(fn: Any, old: Any, new: Any) -> str:
    """What changed between two call signatures (``signature_of``), in one line naming the argument."""
    if old is None:
        return "first call"
    (old_tree, old_leaves, old_alias, old_mode), (new_tree, new_leaves, new_alias, new_mode) = old, new
    if old_tree != new_tree:
        return _describe_structure_change(fn, old_tree, new_tree)
    for i, (a, b) in enumerate(zip(old_leaves, new_leaves, strict=True)):
        if a != b:
            return f"argument {_leaf_name(fn, new_tree, i)}: {_describe_leaf_change(a, b)}"
    if old_alias != new_alias:
        return "which arguments are the same tensor changed"
    if old_mode[0] != new_mode[0]:
        return f"grad mode changed from {old_mode[0]} to {new_mode[0]}"
    if old_mode != new_mode:
        return f"autocast changed from {dict(old_mode[1]) or 'off'} to {dict(new_mode[1]) or 'off'}"
    return (
        "the state fn reads (a .grad set or cleared, requires_grad, hooks, a shape, a module's train/eval mode, or a "
        "value a traced-in hook reads: mark a hook whose value changes every call xgrad.autograd.compiled.host_hook)"
    )


def _leaf_name(fn: Any, tree: Any, i: int) -> str:
    """Leaf ``i`` of a call's ``(args, kwargs)`` as the user names it: its parameter, then the path inside it
    (``batch['x']``)."""
    placeholder = jax.tree_util.tree_unflatten(tree, list(range(tree.num_leaves)))
    path = jax.tree_util.tree_flatten_with_path(placeholder)[0][i][0]
    where, key, inner = path[0].idx, path[1], jax.tree_util.keystr(path[2:])
    return f"{key.key if where == 1 else _positional_name(fn, key.idx)}{inner}"


def _positional_name(fn: Any, i: int) -> str:
    """The name of ``fn``'s ``i``-th positional parameter (``rest[2]`` for one in ``*rest``), else ``i``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin, a C callable)
        params = []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if i < len(positional):
        return positional[i].name
    rest = [p for p in params if p.kind is p.VAR_POSITIONAL]
    return f"{rest[0].name}[{i - len(positional)}]" if rest else str(i)


def _describe_structure_change(fn: Any, old_tree: Any, new_tree: Any) -> str:
    """Which argument's structure changed (a dict's keys, a list's length, a tensor where ``None`` was), and how."""
    (old_args, old_kwargs), (new_args, new_kwargs) = (
        jax.tree_util.tree_unflatten(tree, [0] * tree.num_leaves) for tree in (old_tree, new_tree)
    )
    if len(old_args) != len(new_args):
        return f"the number of positional arguments changed from {len(old_args)} to {len(new_args)}"
    if sorted(old_kwargs) != sorted(new_kwargs):
        return f"the keyword arguments changed from {sorted(old_kwargs)} to {sorted(new_kwargs)}"
    pairs = [(_positional_name(fn, i), a, b) for i, (a, b) in enumerate(zip(old_args, new_args, strict=True))]
    pairs += [(k, old_kwargs[k], new_kwargs[k]) for k in sorted(old_kwargs)]
    for name, a, b in pairs:
        old: Any = jax.tree_util.tree_structure(a)  # typed: the stub's PyTreeDef has no ``!=``
        new: Any = jax.tree_util.tree_structure(b)
        if old != new:
            return f"argument {name}: structure {old} -> {new}"
    return f"the arguments' structure changed from {old_tree} to {new_tree}"


# What a leaf's key (``leaf_key`` in ``signature.py``) holds after its kind, by kind.
_KEY_FIELDS = {
    "tensor": ("shape", "dtype", "sharding", "grad_fn", "requires_grad", ".grad is None", ".grad's shape", "hooks"),
    "array": ("shape", "dtype", "sharding", "weak_type"),
    "ndarray": ("shape", "dtype"),
}


def _describe_leaf_change(old: Any, new: Any) -> str:
    if old[0] != new[0] or old[0] == "static":
        return f"{_describe_leaf(old)} -> {_describe_leaf(new)}"
    changes = []
    for field, a, b in zip(_KEY_FIELDS[old[0]], old[1:], new[1:], strict=True):
        if a != b:
            if field == "shape":
                a, b = list(a), list(b)
            elif field == "hooks":  # per kind a leaf keeps (NOTE [Hook kinds]), how many
                changes += [
                    f"{kind.label} hooks {len(x)} -> {len(y)}" for kind, x, y in zip(LEAF_KINDS, a, b, strict=True) if x != y
                ]
                continue
            changes.append(f"{field} {a} -> {b}")
    return ", ".join(changes)


def _describe_leaf(key: Any) -> str:
    if key[0] == "static":
        return f"the value {key[2]!r}"
    return f"{_KIND_NAMES[key[0]]} of shape {list(key[1])} and dtype {key[2]}"


_KIND_NAMES = {"tensor": "a Tensor", "array": "a jax.Array", "ndarray": "a NumPy array"}

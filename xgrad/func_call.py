"""``xgrad.func.functional_call``: a module called with other parameters and buffers in place of its own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from xgrad.tensor import Tensor

_MISSING = object()


def _merge(parameter_and_buffer_dicts: Any) -> dict[str, Any]:
    if isinstance(parameter_and_buffer_dicts, Mapping):
        return dict(parameter_and_buffer_dicts)
    if isinstance(parameter_and_buffer_dicts, (list, tuple)) and all(isinstance(d, Mapping) for d in parameter_and_buffer_dicts):
        merged: dict[str, Any] = {}
        for d in parameter_and_buffer_dicts:
            for key, value in d.items():
                if key in merged:
                    raise ValueError(f"{key} appeared in multiple dictionaries; behavior of functional call is ambiguous")
                merged[key] = value
        return merged
    raise ValueError(
        "Expected parameter_and_buffer_dicts to be a dict, or a list/tuple of dicts, but got "
        f"{type(parameter_and_buffer_dicts)}"
    )


def functional_call(
    module: Any,
    parameter_and_buffer_dicts: Any,
    args: Any = None,
    kwargs: dict[str, Any] | None = None,
    *,
    tie_weights: bool = True,
    strict: bool = False,
) -> Any:
    """``torch.func.functional_call``: call ``module`` with these parameters and buffers in place of its own.

    The module is left as it was afterwards. Names are ``named_parameters()``'s and
    ``named_buffers()``'s; values are Tensors (or arrays). With ``tie_weights`` a value
    given for one of several names of one tied tensor is used for all of them; with
    ``strict`` every parameter and buffer must be given, and nothing else.

    Args:
        module: the ``nn.Module`` to call.
        parameter_and_buffer_dicts: a dict of name -> value, or a tuple of such dicts.
        args: the positional arguments (one that is not a tuple is the only one).
        kwargs: keyword arguments.

    >>> import xgrad
    >>> lin = xgrad.nn.Linear(2, 1, key=0)
    >>> params = {"weight": xgrad.tensor([[1.0, 2.0]]), "bias": xgrad.tensor([0.5])}
    >>> xgrad.func.functional_call(lin, params, (xgrad.tensor([[1.0, 1.0]]),)).tolist()
    [[3.5]]
    """
    values = _merge(parameter_and_buffer_dicts)
    own: dict[str, Any] = {}
    for name, t in module.named_parameters(remove_duplicate=False):
        own[name] = t
    for name, t in module.named_buffers(remove_duplicate=False):
        own[name] = t
    if strict:
        missing = [k for k in own if k not in values]
        unexpected = [k for k in values if k not in own]
        if missing or unexpected:
            lines = [f"Error(s) in reparametrizing for {type(module).__name__}:"]
            if unexpected:
                lines.append("\tUnexpected key(s): " + ", ".join(f"'{k}'" for k in unexpected) + ".")
            if missing:
                lines.append("\tMissing key(s): " + ", ".join(f"'{k}'" for k in missing) + ".")
            raise RuntimeError("\n".join(lines))
    if tie_weights:
        tied: dict[int, list[str]] = {}
        for name, t in own.items():
            tied.setdefault(id(t), []).append(name)
        for names in tied.values():
            given = [n for n in names if n in values]
            if len(given) > 1 and any(values[n] is not values[given[0]] for n in given[1:]):
                raise ValueError(
                    f"functional_call got multiple values for keys {given}, which are tied. Consider using tie_weights=False"
                )
            if given:
                for n in names:
                    values.setdefault(n, values[given[0]])
    swapped: list[tuple[Any, str, Any]] = []
    try:
        for name, value in values.items():
            owner, attr = _owner(module, name)
            swapped.append((owner, attr, owner.__dict__.get(attr, _MISSING)))
            object.__setattr__(owner, attr, Tensor(value) if isinstance(value, jax.Array) else value)
        call_args = args if isinstance(args, tuple) else (() if args is None else (args,))
        return module(*call_args, **(kwargs or {}))
    finally:
        for owner, attr, old in reversed(swapped):
            if old is _MISSING:
                object.__delattr__(owner, attr)
            else:
                object.__setattr__(owner, attr, old)


def _owner(module: Any, name: str) -> tuple[Any, str]:
    """The module holding attribute ``name`` (dotted) directly, and the attribute."""
    *path, attr = name.split(".")
    owner = module
    for part in path:
        child = owner._modules.get(part) if part in owner._modules else owner.__dict__.get(part)
        if child is None or not hasattr(child, "_modules"):
            raise ValueError(
                f"functional_call: '{name}' does not name a parameter or buffer that a module holds as an attribute "
                f"('{part}' is not a submodule of {type(owner).__name__})"
            )
        owner = child
    if attr in owner._modules:
        raise ValueError(f"functional_call: '{name}' names a submodule, not a parameter or buffer")
    return owner, attr

"""What a compiled program communicates: its collectives, counted and sized from the optimized HLO."""

from __future__ import annotations

import math
import re
from typing import Any

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_COLLECTIVE = re.compile(r"= (.*?) (" + "|".join(KINDS) + r")(-start)?\(")
_SHAPE = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")
_BITS = re.compile(r"[0-9]+$")


def _bytes(dtype: str, dims: str) -> int:
    elements = math.prod(int(d) for d in dims.split(",") if d)
    if dtype == "pred":
        return elements
    bits = _BITS.search(dtype)
    return elements * (int(bits.group()) // 8 if bits else 4)


def collective_stats(program: Any) -> dict[str, tuple[int, int]]:
    """``{kind: (count, bytes)}`` of the collectives in a compiled program, by their result sizes.

    ``program``: the optimized HLO text, or anything with ``.as_text()`` giving it
    (``step.lower(*args).compile()`` of an ``xgrad.compile``d step, JAX's ``Compiled``).
    A collective's bytes are those of its result (an all-gather's gathered array, an
    all-reduce's reduced one), per device; an async ``-start`` counts once.

    >>> from xgrad.distributed import collective_stats
    >>> collective_stats("%ag = f32[8,4]{1,0} all-gather(f32[2,4]{1,0} %p), dimensions={0}")
    {'all-gather': (1, 128)}
    """
    text = program if isinstance(program, str) else program.as_text()
    found: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        match = _COLLECTIVE.search(line)
        if match is None:
            continue
        shapes = _SHAPE.findall(match.group(1))
        if match.group(3):  # an async start's result is (operands, results): the second half
            shapes = shapes[len(shapes) // 2:]
        count, size = found.get(match.group(2), (0, 0))
        found[match.group(2)] = (count + 1, size + sum(_bytes(dtype, dims) for dtype, dims in shapes))
    return found

"""A compiled backward's program: its steps split into jitted segments at host steps, and chunks of long ones.

NOTE [Compiled backward], stage 3. ``Program`` cuts the steps (``lower.py``) into
segments: ``Segment`` is a maximal run of traced steps, or a chunk of a long one (NOTE
[Chunks]); ``Traced`` is a segment traced and jitted for one layout of its inputs, and
``Variant`` a segment's use of one (chunks of equal structure share a ``Traced``).
``pretrace`` traces every segment before any runs.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import jax

from xgrad.engine.compiled.cache import chunks, counters, insert, lookup
from xgrad.engine.compiled.key import EDGES_FIELD, K_FUNC, Walk
from xgrad.engine.compiled.lower import Step, Values, trace_node, tracing
from xgrad.engine.dataflow import output_deps
from xgrad.engine.graph_task import InputBuffer
from xgrad.engine.node import Node
from xgrad.engine.rules import RuleNode, jax_op
from xgrad.jax_internals import Literal, jaxpr_as_fun, single_device_sharding
from xgrad.tensor import Tensor, is_tensor

# -- segments and their compiled variants --------------------------------------------

# NOTE [Chunks]
# A long graph compiled as one program costs seconds: tracing, lowering and XLA's
# compile all grow with the number of steps. So a segment of more than
# ``CHUNK_THRESHOLD`` steps is cut into chunks of at most ``CHUNK_STEPS``, each an
# ordinary ``Segment``: the host carries the grads in flight from one to the next, as
# across a hook. A cut falls at the latest step in the second half of the window
# where the fewest grads are in flight, so the chunks of a repeating graph (a chain,
# a deep model's identical blocks) start at the same point of the repeat. A chunk
# takes in and gives back only the grads in flight to its own steps and to those it
# sends grads to (``Segment.touches``); the rest (a long skip's grad, on its way to a
# far step) pass it by on the host, so they do not make equal chunks differ. Each
# chunk is cached by its structure (``cache.chunks``, bounded, emptied by ``reset``):
# its steps' keys without their edges' discovery indices, its edges as positions
# relative to its first step, whether it is first or last, and its inputs' layout and
# avals. A chunk equal to one compiled before takes that one's ``Traced`` without
# tracing: the flat inputs and outputs line up, since every position in them differs
# by one offset and pytrees order dict keys by value; only the output pytree is
# renumbered (``Variant``). So a miss on a long chain costs the walk plus a few
# compiles, whatever its length, and a hit one call per chunk. ``Program.hlo_text(i)``
# shows chunk ``i``; a cached ``Traced`` keeps its jaxpr (its ``op`` runs that jaxpr
# under create_graph), none of a user's graph.

#: A segment with more steps than this is compiled in chunks (NOTE [Chunks]). Measured
#: on CPU (benchmarks/RESULTS.md): a program's compile grows faster than its number of
#: steps, and each chunk adds one call, about 60 µs, to a hit.
CHUNK_THRESHOLD = 1024
#: The most steps in one chunk.
CHUNK_STEPS = 256


def _chunk_cuts(steps: list[Step], lo: int, hi: int) -> list[int]:
    """Where chunks of the steps ``lo:hi`` start (the first at ``lo``); NOTE [Chunks]."""
    if hi - lo <= CHUNK_THRESHOLD:
        return [lo]
    # In flight before step p: the grads sent to a slot at or after p by a step before it.
    opened: dict[tuple[int, int, int], int] = {}
    for pos in range(lo, hi):
        for target in steps[pos].targets:
            if target is not None and target not in opened:
                opened[target] = pos
    change = [0] * (hi - lo + 1)
    for (tpos, *_), source in opened.items():
        if tpos > source:
            change[source + 1 - lo] += 1
            change[min(tpos, hi - 1) + 1 - lo] -= 1
    in_flight = list(itertools.accumulate(change))
    cuts = [lo]
    while hi - cuts[-1] > CHUNK_STEPS:
        start = cuts[-1]
        best = start + CHUNK_STEPS  # the latest step of the window with the fewest grads in flight (never ``start``)
        for pos in range(best - 1, max(start, start + CHUNK_STEPS // 2 - 1), -1):
            if in_flight[pos - lo] < in_flight[best - lo]:
                best = pos
        cuts.append(best)
    return cuts


def _shift(by_pos: dict[int, Any], offset: int) -> dict[int, Any]:
    """Values keyed by step positions (grads in flight, new ``.grad``s), the positions moved by ``offset``."""
    return {pos + offset: g for pos, g in by_pos.items()}


def _renumbered(tree: Any, shift: Callable[[Any], Any]) -> Any:
    """The pytree structure ``tree`` with its dict keys moved by ``shift``; its leaves keep their order."""
    n = tree.num_leaves
    leaves, moved = jax.tree_util.tree_flatten(shift(jax.tree_util.tree_unflatten(tree, list(range(n)))))
    if leaves != list(range(n)):
        raise AssertionError("renumbering a chunk's positions reordered its inputs or outputs")
    return moved


class Segment:
    """A run of traced steps between host steps (or a chunk of one): one jitted program per input layout."""

    def __init__(self, program: Program, lo: int, hi: int, chunked: bool) -> None:
        self.program = program
        self.first = not program.segments  # the first takes the root grads
        self.last = False  # set once the program has all its segments
        self.base, self.hi = lo, hi  # its steps; chunks are renumbered from their first (NOTE [Chunks])
        self.arg_lo, self.arg_hi = program.starts[lo], program.starts[hi]
        steps = program.steps
        self.leaf_steps = [steps[pos] for pos in range(lo, hi) if steps[pos].leaf]
        self.variants: dict[Any, Variant] = {}
        self.touches: frozenset[int] | None = None  # a chunk's: the buffers it takes in and gives back (NOTE [Chunks])
        if chunked:
            targets = (t[0] for pos in range(lo, hi) for t in steps[pos].targets if t is not None)
            self.touches = frozenset((*range(lo, hi), *targets))

    def variant(self, nodes: list[Node], saved: list[Any], live_tree: Any, live: list[Any], roots: list[Any],
                old_mask: tuple[bool, ...], old: list[Any]) -> Variant:
        """Its program for these inputs (each with a shape and dtype; ``old``: the leaves' ``.grad`` where ``old_mask``
        says one is): the one compiled for their layout, or traced now on ``nodes``, or a chunk of equal structure's."""
        signature = (live_tree, old_mask, tuple((a.shape, a.dtype) for a in [*live, *old]))
        variant = self.variants.get(signature)
        if variant is not None:
            return variant
        start = time.perf_counter()
        inputs = (_structs(saved), jax.tree_util.tree_unflatten(live_tree, _structs(live)), _structs(roots), _structs(old))
        avals = jax.tree_util.tree_leaves(inputs)
        key = traced = None
        if self.touches is not None:  # a chunk
            relative_live = _renumbered(live_tree, lambda live: _shift(live, -self.base))
            key = (self.structure(), relative_live, len(saved), len(live), len(roots), old_mask, tuple((a.shape, a.dtype) for a in avals))
            traced = lookup(key, chunks)
            if traced is not None:
                counters.add("chunk_reuses")
        if traced is None:
            traced = Traced(self, nodes, inputs, old_mask)
            counters.add("compiles")
            if key is not None:
                traced = insert(key, traced, chunks)
                counters.add("chunk_compiles")
        counters.add("compile_seconds", time.perf_counter() - start)
        return self.variants.setdefault(signature, Variant(traced, self))

    def split_live(self, live: dict[int, Any]) -> tuple[dict[int, Any], dict[int, Any]]:
        """``live`` (``Values.live``) as what this segment takes in, and the buffers that pass it by."""
        if self.touches is None:
            return live, {}
        touches = self.touches
        return {p: g for p, g in live.items() if p in touches}, {p: g for p, g in live.items() if p not in touches}

    def structure(self) -> tuple[Any, ...]:
        """This chunk's structure, positions relative to its first step (NOTE [Chunks])."""
        program = self.program
        steps = program.steps
        base = self.base
        per_step = []
        for pos in range(base, self.hi):
            step = steps[pos]
            nkey = program.node_keys[pos]
            edges_field = EDGES_FIELD.get(step.kind)
            if edges_field is not None:
                nkey = nkey[:edges_field] + nkey[edges_field + 1:]
            targets = tuple(None if t is None else (t[0] - base, *t[1:]) for t in step.targets)
            per_step.append((nkey, step.meta, step.edges, targets))
        root = (True, program.root_nr) if self.first else (False,)
        return (root, self.last, program.create_graph, tuple(per_step), self.arg_hi - self.arg_lo)


class Traced:
    """A segment traced to a jaxpr for one layout of its inputs, and jitted (NOTE [Compiled backward], stage 3);
    chunks of equal structure share one."""

    __slots__ = ("base", "deps", "example", "fresh", "op", "out_avals", "out_tree", "plain", "used")

    def __init__(self, segment: Segment, nodes: list[Node], inputs: tuple[Any, ...], old_mask: tuple[bool, ...]) -> None:
        self.example = avals = jax.tree_util.tree_leaves(inputs)  # the abstract inputs it was traced for, flat
        self.fresh = True  # not yet called: its first call compiles
        self.base = segment.base  # what its ``out_tree`` is numbered from
        trees: list[Any] = []
        program = segment.program
        steps = program.steps
        with_old = [s.pos for s, has in zip(segment.leaf_steps, old_mask, strict=True) if has]

        def traced(saved: list[Any], live: Any, roots: list[Any], old: list[Any]) -> list[Any]:  # run on ``nodes``
            counters.add("traces")
            old_grads = {pos: Tensor(a) for pos, a in zip(with_old, old, strict=True)}
            values = Values(jax.tree_util.tree_map(Tensor, live), [Tensor(a) for a in roots], old_grads)
            if segment.first and program.root_nr >= 0:
                buf = values.buffers[0] = InputBuffer(len(steps[0].meta))
                buf.add(program.root_nr, values.roots[0])
            args = iter(saved)
            for pos in range(segment.base, segment.hi):
                trace_node(steps[pos], nodes[pos], values, args)
            outputs = (None if segment.last else values.live(), values.grads, values.captures, values.retained)
            leaves, tree = jax.tree_util.tree_flatten(outputs, is_leaf=is_tensor)
            trees.append(tree)
            return [t._array for t in leaves]

        with tracing():
            closed = jax.make_jaxpr(traced)(*inputs)
        self.out_tree = trees[0]
        self.out_avals = closed.out_avals
        jaxpr = closed.jaxpr
        # Which inputs each output depends on as eager's ``requires_grad`` would see it,
        # op by op (NOTE [Data flow as eager sees it]): ``relu``'s backward keeps ``relu``'s
        # output, ``maximum``'s, which reads its inputs through comparisons only, does not.
        self.deps: list[frozenset[int]] = output_deps(jaxpr)
        index = {v: i for i, v in enumerate(jaxpr.invars)}
        read = itertools.chain((v for eqn in jaxpr.eqns for v in eqn.invars), jaxpr.outvars)
        self.used = used = sorted({index[v] for v in read if not isinstance(v, Literal) and v in index})
        run_all = jaxpr_as_fun(closed)
        n_in = len(avals)

        def run(*used_args: Any) -> Any:  # the jaxpr on the inputs it reads (no equation reads the others)
            given = dict(zip(used, used_args, strict=True))
            return run_all(*map(given.get, range(n_in)))

        # No buffer donated (NOTE [Compiled backward]; donating the old ``.grad`` saved about 3%, benchmarks/RESULTS.md).
        self.plain = jax.jit(run)
        # create_graph: the segment as one differentiable op of the inputs it reads, so an input it never reads gets
        # no edge, and a gradient of the result with respect to it is None, as in eager (never zeros).
        position = {i: k for k, i in enumerate(used)}  # an input's place among the op's inputs
        self.op = jax_op(run, name="compiled", deps=[frozenset(position[i] for i in d) for d in self.deps])


def _shift_outputs(outputs: Any, offset: int) -> Any:
    live, grads, captures, retained = outputs
    return (
        None if live is None else _shift(live, offset),
        _shift(grads, offset),
        captures,  # numbered by the call's outputs, which the chunk's key holds
        {(pos + offset, nr): g for (pos, nr), g in retained.items()},
    )


class Variant:
    """A segment's compiled program for one layout of its inputs: a ``Traced``, its outputs numbered for this segment."""

    __slots__ = ("device", "out_tree", "shardings", "traced")

    def __init__(self, traced: Traced, segment: Segment) -> None:
        self.traced = traced
        self.device: Any = None  # set when its inputs sit on several devices: where it runs
        self.shardings: list[Any] | None = None  # of the used inputs, from the first call (for ``hlo_text``)
        offset = segment.base - traced.base
        self.out_tree = traced.out_tree
        if offset:  # a chunk compiled elsewhere (NOTE [Chunks])
            self.out_tree = _renumbered(traced.out_tree, lambda out: _shift_outputs(out, offset))


class Program:
    """The compiled form of one graph structure: its steps, and its segments split at host steps."""

    def __init__(self, walk: Walk) -> None:
        key = walk.key
        self.create_graph = key[0]
        self.root_nr = key[3]
        self.node_keys = key[4]
        # Calls without inputs find the program by ``walk_structure``'s key: where that
        # walk's nodes and flat values sit in this program's order (set on such a call's miss).
        self.hit_order: tuple[list[int], list[int]] = ([], [])
        position = {node: pos for pos, node in enumerate(walk.nodes)}
        self.steps = [
            Step(pos, node, nkey, position) for pos, (node, nkey) in enumerate(zip(walk.nodes, self.node_keys, strict=True))
        ]
        self.starts: list[int] = walk.starts  # type: ignore[assignment]  # each step's first flat value
        # The nodes whose release_variables frees something: Functions, and rule nodes that
        # saved a tensor (avals and constants stay; the other kinds hold nothing).
        self.released = [
            s.pos for s, node in zip(self.steps, walk.nodes, strict=True)
            if s.runs and (s.kind == K_FUNC or (isinstance(node, RuleNode) and node.holds_tensors))
        ]
        self.items: list[Any] = []  # segments, with host steps between them
        self.segments: list[Segment] = []
        lo = 0
        for step in self.steps:
            if step.host or step.host_pre:
                self._add_segments(lo, step.pos)
                self.items.append(step)
                lo = step.pos if step.host_pre else step.pos + 1
        self._add_segments(lo, len(self.steps))
        self.segments[-1].last = True

    def _add_segments(self, lo: int, hi: int) -> None:
        """One segment for the traced steps ``lo:hi``, or its chunks if it is long (NOTE [Chunks])."""
        cuts = _chunk_cuts(self.steps, lo, hi)
        for start, end in zip(cuts, [*cuts[1:], hi], strict=True):
            segment = Segment(self, start, end, len(cuts) > 1)
            self.segments.append(segment)
            self.items.append(segment)

    def hlo_text(self, segment: int = 0) -> str:
        """The compiled HLO of one segment's first variant, for the input shardings it ran with: it shows the
        collectives XLA runs (a sharded batch's all-reduce, say). A long graph's segments are its chunks (NOTE
        [Chunks]): ``segment`` picks one, and chunks of equal structure show the same program."""
        variant = next(iter(self.segments[segment].variants.values()))
        traced = variant.traced
        args = [traced.example[i] for i in traced.used]
        if variant.shardings is not None:
            shardings = variant.shardings
            if variant.device is not None:  # inputs from several devices ran on one (``_run_plain`` in ``run.py``)
                shardings = [single_device_sharding(variant.device)] * len(args)
            args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(args, shardings, strict=True)]
        text = traced.plain.lower(*args).compile().as_text()
        if text is None:
            raise RuntimeError("this backend gives no HLO text")
        return text


# -- compiling: trace every segment before any runs -------------------------------


def pretrace(program: Program, walk: Walk, roots: list[Tensor]) -> None:
    """Trace every segment before any runs, so nothing traceable fails halfway through a backward.

    Each segment's live inputs are the previous one's live outputs, and a host step's outputs are assumed to reach
    every next node of the program; old ``.grad``s come from the key. Hooks keep shapes and dtypes (eager checks
    what they return), so pre-hooks alone on the host change no shape.
    """
    live: Any = {}  # the grads in flight, abstract
    for item in program.items:
        if type(item) is Step:
            if item.host:
                live = _host_step_avals(program, walk.nodes, item.pos, live)
            continue
        live_in, passing = item.split_live(live)
        live_avals, live_tree = jax.tree_util.tree_flatten(live_in)
        old = [program.node_keys[s.pos][2] for s in item.leaf_steps]  # (shape, dtype) of a ``.grad``, or None
        variant = item.variant(
            walk.nodes, walk.flat[item.arg_lo:item.arg_hi], live_tree, live_avals, roots if item.first else [],
            tuple(k is not None for k in old), [jax.ShapeDtypeStruct(*k) for k in old if k is not None],
        )
        live_out = jax.tree_util.tree_unflatten(variant.out_tree, _structs(variant.traced.out_avals))[0]
        if live_out is not None:
            live = live_out
            live.update(passing)


def _structs(arrays: Any) -> Any:
    return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]


def _host_step_avals(program: Program, nodes: list[Node], pos: int, live: Any) -> Any:
    """The grads in flight after a host step, abstractly, from those before it; its pure hooks traced once."""

    def run(live: Any) -> Any:
        values = Values(jax.tree_util.tree_map(Tensor, live))
        trace_node(program.steps[pos], nodes[pos], values, None)
        return jax.tree_util.tree_map(lambda t: t._array, values.live(), is_leaf=is_tensor)

    with tracing():
        return jax.eval_shape(run, live)

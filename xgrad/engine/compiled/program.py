"""A compiled backward's program: its steps split into jitted segments at host hooks, and chunks of long ones.

NOTE [Compiled backward], stage 3. ``Program`` orders the steps' phases (``lower.py``)
and cuts them into segments: ``Segment`` is a maximal run of traced phases, or a chunk
of a long one (NOTE [Chunks]); ``Traced`` is a segment traced and jitted for one layout
of its inputs, and ``Variant`` a segment's use of one (chunks of equal structure share
a ``Traced``). ``pretrace`` traces every segment before any runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from xgrad.engine.compiled.cache import chunks, counters, insert, lookup
from xgrad.engine.compiled.key import (
    EDGES_FIELD,
    HOST,
    K_ACC,
    K_FUNC,
    K_PRIM,
    TENSOR,
    Walk,
)
from xgrad.engine.compiled.lower import (
    BODY,
    CAPTURE,
    POST,
    PRE,
    ROUTE,
    Values,
    _build_steps,
    _retain_recorders,
    _Step,
    run_phase,
    tracing,
)
from xgrad.engine.dataflow import output_deps
from xgrad.engine.graph_task import InputBuffer
from xgrad.engine.rules import jax_op
from xgrad.jax_internals import Literal, jaxpr_as_fun, single_device_sharding
from xgrad.tensor import Tensor, is_tensor

# -- segments and their compiled variants --------------------------------------------

# NOTE [Chunks]
# A long graph compiled as one program costs seconds: JAX's tracing and lowering and
# XLA's compile all grow with the number of steps. So a segment of more than
# ``CHUNK_THRESHOLD`` steps is cut into chunks of at most ``CHUNK_STEPS`` steps, each an
# ordinary ``Segment`` (one mechanism: the host carries the grads in flight from one
# to the next, as across a hook). A cut falls between two steps, at the latest point
# in the second half of the window where the fewest grads are in flight, so the chunks
# of a repeating graph (a chain, a deep model's identical blocks) start at the same
# point of the repeat and have the same structure. A chunk takes in and gives back
# only the grads in flight to its own steps and to those it sends grads to; the rest
# (a long skip's grad, on its way to a far step) pass it by on the host.
# Each chunk is cached by that structure (``cache.chunks``, bounded, emptied by
# ``reset``): its steps' keys without the discovery indices of their edges, its edges
# as positions relative to its first step, its phases, whether it is first or last,
# and the layout and avals of its inputs. A chunk equal to one compiled before takes
# that one's ``Traced`` (its jaxpr and jitted callable) without tracing anything: the
# flat inputs and outputs line up, since every position and leaf slot in them differs
# by one offset and pytrees order dict keys by value; only the output pytree is
# renumbered (``Variant``). So a miss on a long chain costs the walk plus a few
# compiles, whatever its length; a hit costs one call per chunk. ``Program.hlo_text(i)``
# shows chunk ``i``; a cached ``Traced`` keeps its jaxpr (its ``op`` runs that jaxpr
# under create_graph), none of a user's graph.

#: A segment with more steps than this is compiled in chunks (NOTE [Chunks]). Measured
#: on CPU (benchmarks/RESULTS.md): a program's compile grows faster than its number of
#: steps, and each chunk adds one call, about 60 µs, to a hit.
CHUNK_THRESHOLD = 1024
#: The most steps in one chunk.
CHUNK_STEPS = 256


def _chunk_cuts(steps: list[_Step], phases: list[tuple[int, int]]) -> list[int]:
    """Where chunks of ``phases`` start (indices into it, the first 0); NOTE [Chunks]."""
    first, last = phases[0][1], phases[-1][1]
    if last - first + 1 <= CHUNK_THRESHOLD:
        return [0]
    # In flight before step p: the grads sent to a slot at or after p by a step before it.
    opened: dict[tuple[int, int], int] = {}
    for op, pos in phases:
        if op == ROUTE:
            for target in steps[pos].targets:
                if target is not None and target not in opened:
                    opened[target] = pos
    change = [0] * (last - first + 2)
    for (tpos, _), source in opened.items():
        if tpos > source:
            change[source + 1 - first] += 1
            change[min(tpos, last) + 1 - first] -= 1
    in_flight = [0] * len(change)
    running = 0
    for i, c in enumerate(change):
        running += c
        in_flight[i] = running
    phase_of = {pos: j for j, (_, pos) in enumerate(phases) if j and phases[j - 1][1] != pos}
    cuts = [0]
    lo = first
    while last - lo + 1 > CHUNK_STEPS:
        best = None
        for pos in range(lo + CHUNK_STEPS, max(lo, lo + CHUNK_STEPS // 2 - 1), -1):  # never at lo: each chunk has a step
            if pos in phase_of and (best is None or in_flight[pos - first] < in_flight[best - first]):
                best = pos
        if best is None:  # no step starts in the window (cannot happen: segments hold whole runs of steps)
            break
        cuts.append(phase_of[best])
        lo = best
    return cuts


def _shift_live(live: Any, offset: int) -> Any:
    """Grads in flight (``Values.live``) with positions moved by ``offset``."""
    buffers, current = live
    return {pos + offset: g for pos, g in buffers.items()}, {pos + offset: c for pos, c in current.items()}


def _renumbered(tree: Any, shift: Callable[[Any], Any]) -> Any:
    """The pytree structure ``tree`` with its dict keys moved by ``shift``; its leaves keep their order."""
    n = tree.num_leaves
    leaves, moved = jax.tree_util.tree_flatten(shift(jax.tree_util.tree_unflatten(tree, list(range(n)))))
    if leaves != list(range(n)):
        raise AssertionError("renumbering a chunk's positions reordered its inputs or outputs")
    return moved


class Segment:
    """A run of traced phases between host hooks (or a chunk of one): one jitted program per input layout."""

    def __init__(self, program: Program, index: int, phases: list[tuple[int, int]], arg_lo: int, arg_hi: int,
                 chunked: bool) -> None:
        self.program = program
        self.index = index
        self.phases = phases
        self.arg_lo = arg_lo
        self.arg_hi = arg_hi
        steps = program.steps
        self.leaf_steps = [steps[pos] for op, pos in phases if op == BODY and steps[pos].kind == K_ACC]
        self.variants: dict[Any, Variant] = {}
        # Chunks are renumbered from their first step and first leaf (NOTE [Chunks]).
        self.base = phases[0][1] if phases else 0
        self.first_slot = self.leaf_steps[0].leaf_slot if self.leaf_steps else 0
        self.chunk_key: Any = None  # a chunk's structure, set once the program has all its segments
        self.chunked = chunked
        # A chunk's inputs and outputs in flight are the buffers of its own steps and of
        # the steps it sends grads to; others pass it by on the host, so that a grad on its
        # way to a far step (a long skip) does not make equal chunks differ.
        self.touches: frozenset[int] | None = None
        if chunked:
            targets = (t[0] for op, pos in phases if op == ROUTE for t in steps[pos].targets if t is not None)
            self.touches = frozenset((*(pos for _, pos in phases), *targets))

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == len(self.program.segments) - 1

    def split_live(self, live: Any) -> tuple[Any, dict[int, Any]]:
        """``live`` (``Values.live``) as what this segment takes in, and the buffers that pass it by."""
        if self.touches is None:
            return live, {}
        buffers, current = live
        touches = self.touches
        inside = {pos: g for pos, g in buffers.items() if pos in touches}
        return (inside, current), {pos: g for pos, g in buffers.items() if pos not in touches}

    def structure(self) -> tuple[Any, ...]:
        """This chunk's structure, positions relative to its first step (NOTE [Chunks])."""
        program = self.program
        steps = program.steps
        base = self.base
        per_step = []
        for pos in range(base, self.phases[-1][1] + 1):
            step = steps[pos]
            nkey = program.node_keys[pos]
            edges_field = EDGES_FIELD.get(step.kind)
            if edges_field is not None:
                nkey = nkey[:edges_field] + nkey[edges_field + 1:]
            edges: Any = None
            if step.runs:
                edges = tuple(
                    (None if t is None else (t[0] - base, t[1], steps[t[0]].size),
                     None if e.node is None else (e.node.name(), e.node.input_metadata[e.input_nr]))
                    for t, e in zip(step.targets, step.edge_views, strict=True)
                )
            per_step.append((nkey, step.meta, edges))
        root = (True, program.root_nr) if self.first else (False,)
        phases = tuple((op, pos - base) for op, pos in self.phases)
        return (root, self.last, program.create_graph, phases, tuple(per_step), self.arg_hi - self.arg_lo)

    def trace(self, flat: list[Any], layout: tuple[Any, ...]) -> tuple[list[Any], Any]:
        """The segment as a function of flat arrays; returns the flat outputs and their pytree."""
        counters.add("traces")
        n_saved, live_tree, n_live, n_roots, old_mask = layout
        args = iter(flat[:n_saved])
        live = jax.tree_util.tree_unflatten(live_tree, [Tensor(a) for a in flat[n_saved:n_saved + n_live]])
        roots = [Tensor(a) for a in flat[n_saved + n_live:n_saved + n_live + n_roots]]
        old_arrays = iter(flat[n_saved + n_live + n_roots:])
        old = {s.leaf_slot: Tensor(next(old_arrays)) for s, has in zip(self.leaf_steps, old_mask, strict=True) if has}
        values = Values.from_live(live)
        program = self.program
        steps = program.steps
        if self.first and program.root_nr >= 0:
            buf = InputBuffer(steps[0].size)
            buf.add(program.root_nr, roots[0])
            values.buffers[0] = buf
        for op, pos in self.phases:
            step = steps[pos]
            view = step.post if op == POST else step.pre
            if op == PRE and view._retains_grad_hooks:
                view = _retain_recorders(view, pos, values)
            run_phase(steps, step, op, view, values, args, roots, old)
        outputs = (
            None if self.last else values.live(),
            values.grads,
            values.captures,
            values.retained,
        )
        leaves, tree = jax.tree_util.tree_flatten(outputs, is_leaf=is_tensor)
        return [t._array for t in leaves], tree


class Traced:
    """A segment traced for one layout of its inputs, and jitted; chunks of equal structure share one.

    Traced once to a jaxpr: the inputs no equation reads are dropped, the data flow
    from inputs to outputs is kept (create_graph detaches outputs that need no graph),
    and the rest runs as ``jax.jit`` of the jaxpr.
    """

    __slots__ = ("base", "deps", "example", "first_slot", "fresh", "op", "out_avals", "out_tree", "plain", "used")

    def __init__(self, segment: Segment, avals: list[Any], layout: tuple[Any, ...]) -> None:
        self.example = avals  # the abstract inputs it was traced for
        self.fresh = True  # not yet called: its first call compiles
        self.base, self.first_slot = segment.base, segment.first_slot  # what its ``out_tree`` is numbered from
        trees: list[Any] = []

        def traced(*flat: Any) -> list[Any]:
            leaves, tree = segment.trace(list(flat), layout)
            trees.append(tree)
            return leaves

        with tracing():
            closed = jax.make_jaxpr(traced)(*avals)
        self.out_tree = trees[0]
        self.out_avals = closed.out_avals
        jaxpr = closed.jaxpr
        # Which inputs each output depends on as eager's ``requires_grad`` would see it,
        # op by op (NOTE [Data flow as eager sees it]): ``relu``'s backward keeps ``relu``'s
        # output, ``maximum``'s, which reads its inputs through comparisons only, does not.
        self.deps: list[frozenset[int]] = output_deps(jaxpr)
        index = {v: i for i, v in enumerate(jaxpr.invars)}
        used = {index[v] for eqn in jaxpr.eqns for v in eqn.invars if not isinstance(v, Literal) and v in index}
        used.update(index[v] for v in jaxpr.outvars if not isinstance(v, Literal) and v in index)
        self.used = sorted(used)
        run_all = jaxpr_as_fun(closed)
        n_in = len(avals)
        used_idx = tuple(self.used)

        def run(*used_args: Any) -> Any:
            full: list[Any] = [None] * n_in
            for i, a in zip(used_idx, used_args, strict=True):
                full[i] = a
            return run_all(*full)

        # No buffer is donated: the old ``.grad`` is a user-visible tensor that another
        # thread may read at any moment (measured in benchmarks/RESULTS.md: donating it
        # saved about 3% of an accumulating backward).
        self.plain = jax.jit(run)
        # create_graph: the segment as one differentiable op of the inputs it reads, so
        # an input it never reads gets no edge, and a gradient of the result with respect
        # to that input is None, as in eager (never zeros).
        position = {i: k for k, i in enumerate(used_idx)}  # an input's place among the op's inputs
        self.op = jax_op(run, name="compiled", deps=[frozenset(position[i] for i in d) for d in self.deps])


def _shift_outputs(outputs: Any, offset: int, slot_offset: int) -> Any:
    live, grads, captures, retained = outputs
    return (
        None if live is None else _shift_live(live, offset),
        {slot + slot_offset: g for slot, g in grads.items()},
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
        offset, slot_offset = segment.base - traced.base, segment.first_slot - traced.first_slot
        self.out_tree = traced.out_tree
        if offset or slot_offset:  # a chunk compiled elsewhere (NOTE [Chunks])
            self.out_tree = _renumbered(traced.out_tree, lambda out: _shift_outputs(out, offset, slot_offset))


class Program:
    """The compiled form of one graph structure: its steps, and its segments split at host hooks."""

    def __init__(self, walk: Walk) -> None:
        key = walk.key
        self.create_graph = key[0]
        self.root_nr = key[3]
        self.node_keys = key[4]
        # Calls without inputs find the program by ``walk_structure``'s key: where that
        # walk's nodes and flat values sit in this program's order (set on the miss).
        self.hit_order: tuple[list[int], list[int]] | None = None
        self.steps = _build_steps(walk)
        # The nodes whose release_variables frees something: Functions, and primitives that
        # saved a tensor (avals and constants stay; the other kinds hold nothing).
        self.released = [
            s.pos for s in self.steps if s.runs and (s.kind == K_FUNC or (s.kind == K_PRIM and any(v is TENSOR for v in s.saved)))
        ]
        self.items: list[Any] = []  # segments, with host phases (op, pos) between them
        self.segments: list[Segment] = []
        phases: list[tuple[int, int]] = []
        args_at: list[int] = []  # per phase, where its step's saved values start among the flat inputs
        arg = 0
        starts = walk.starts
        assert starts is not None, "a program is built from the schedule walk"
        for step in self.steps:
            ops = []
            if step.captures is not None and step.runs:
                ops.append(CAPTURE)  # eager captures a running node's grads before its hooks
            if step.pre is not None:
                ops.append(PRE)
            if not step.runs:
                ops.append(CAPTURE)
            else:
                ops.append(BODY)
                if step.post is not None:
                    ops.append(POST)
                ops.append(ROUTE)
            for op in ops:
                if (op == PRE and step.pre is HOST) or (op == POST and step.post is HOST) or (op == BODY and step.host_body):
                    self._add_segments(phases, args_at, arg)
                    phases, args_at = [], []
                    self.items.append((op, step.pos))
                else:
                    phases.append((op, step.pos))
                    args_at.append(arg)
                    if op == BODY:
                        arg += starts[step.pos + 1] - starts[step.pos]
        self._add_segments(phases, args_at, arg)
        for segment in self.segments:
            if segment.chunked:
                segment.chunk_key = segment.structure()

    def _add_segments(self, phases: list[tuple[int, int]], args_at: list[int], hi: int) -> None:
        """One segment for a run of traced phases, or its chunks if it is long (NOTE [Chunks])."""
        cuts = _chunk_cuts(self.steps, phases) if phases else [0]
        ends = [*cuts[1:], len(phases)]
        for lo, end in zip(cuts, ends, strict=True):
            segment = Segment(
                self, len(self.segments), phases[lo:end], args_at[lo] if phases else hi, args_at[end] if end < len(phases) else hi,
                len(cuts) > 1,
            )
            self.segments.append(segment)
            self.items.append(segment)

    def hlo_text(self, segment: int = 0) -> str:
        """The compiled HLO of one segment's first variant, for the input shardings it ran with.

        So it shows the collectives XLA runs (a sharded batch's all-reduce, say). A long
        graph's segments are its chunks (NOTE [Chunks]): ``segment`` picks one, and
        chunks of equal structure show the same program.
        """
        variant = next(iter(self.segments[segment].variants.values()))
        traced = variant.traced
        args = [traced.example[i] for i in traced.used]
        if variant.shardings is not None:
            shardings = variant.shardings
            if variant.device is not None:  # inputs from several devices ran on one (``_call`` in ``run.py``)
                shardings = [single_device_sharding(variant.device)] * len(args)
            args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(args, shardings, strict=True)]
        text = traced.plain.lower(*args).compile().as_text()
        if text is None:
            raise RuntimeError("this backend gives no HLO text")
        return text


# -- running a program ---------------------------------------------------------------


# -- compiling: trace every segment before any runs -------------------------------


def array_of(x: Any) -> Any:
    return x._array if isinstance(x, Tensor) else x


def abstract(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def compile_variant(segment: Segment, avals: list[Any], layout: tuple[Any, ...], signature: Any) -> Variant:
    """``segment``'s program for this layout of its inputs: traced now, or a chunk of equal structure's."""
    start = time.perf_counter()
    if segment.chunk_key is None:
        traced = _trace(segment, avals, layout)
    else:
        n_saved, live_tree, n_live, n_roots, old_mask = layout
        relative_live = _renumbered(live_tree, lambda live: _shift_live(live, -segment.base))
        key = (segment.chunk_key, relative_live, n_saved, n_live, n_roots, old_mask, tuple((a.shape, a.dtype) for a in avals))
        traced = lookup(key, chunks)
        if traced is None:
            traced = insert(key, _trace(segment, avals, layout), chunks)
            counters.add("chunk_compiles")
        else:
            counters.add("chunk_reuses")
    counters.add("compile_seconds", time.perf_counter() - start)
    return segment.variants.setdefault(signature, Variant(traced, segment))


def _trace(segment: Segment, avals: list[Any], layout: tuple[Any, ...]) -> Traced:
    traced = Traced(segment, avals, layout)
    counters.add("compiles")
    return traced


def pretrace(program: Program, walk: Walk, roots: list[Tensor]) -> None:
    """Trace every segment before any runs, so nothing traceable fails halfway through a backward.

    Each segment's live inputs are the previous one's live outputs (host hooks keep
    shapes and dtypes: eager checks what they return); old ``.grad``s come from the key.
    """
    live: Any = Values().live()  # the grads in flight, abstract
    for item in program.items:
        if type(item) is tuple:
            op, pos = item
            if op == BODY:  # a device move on the host: find what it leaves behind, abstractly
                live = _host_body_avals(program, pos, live)
            continue
        segment = item
        live_in, passing = segment.split_live(live)
        live_avals, live_tree = jax.tree_util.tree_flatten(live_in)
        saved = [abstract(array_of(x).shape, array_of(x).dtype) for x in walk.flat[segment.arg_lo:segment.arg_hi]]
        old_keys = [program.node_keys[s.pos][2] for s in segment.leaf_steps]
        old_mask = tuple(k is not None for k in old_keys)
        old_avals = tuple(k for k in old_keys if k is not None)
        root_avals = [abstract(r._array.shape, r._array.dtype) for r in roots] if segment.first else []
        layout = (len(saved), live_tree, len(live_avals), len(root_avals), old_mask)
        avals = [*saved, *live_avals, *root_avals, *(abstract(*a) for a in old_avals)]
        signature = (live_tree, old_mask, tuple((a.shape, a.dtype) for a in live_avals), old_avals)
        variant = compile_variant(segment, avals, layout, signature)
        out = [abstract(a.shape, a.dtype) for a in variant.traced.out_avals]
        live_out = jax.tree_util.tree_unflatten(variant.out_tree, out)[0]
        if live_out is not None:
            live = live_out
            live[0].update(passing)


def _host_body_avals(program: Program, pos: int, live: Any) -> Any:
    """The grads in flight after a host body (a device move), abstractly, from those before it."""
    step = program.steps[pos]
    live_avals, live_tree = jax.tree_util.tree_flatten(live)

    def body(*arrays: Any) -> Any:
        live = jax.tree_util.tree_unflatten(live_tree, [Tensor(a) for a in arrays])
        values = Values.from_live(live)
        if step.kind == K_FUNC:
            # The user's backward is not called here: assume a grad for every edge, fitted
            # as validate_outputs fits it. A call that returns None somewhere gives the next
            # segment another input layout, compiled when it first runs.
            arrived = values.buffers.pop(pos, None)
            outs: list[Tensor | None] = []
            for view in step.edge_views:
                meta = None if view.node is None else view.node.input_metadata[view.input_nr]
                outs.append(None if meta is None else Tensor(jnp.zeros(meta.shape, meta.dtype)))
            values.current[pos] = (outs, [] if arrived is None or step.post is None else arrived.buffer)
        else:
            run_phase(program.steps, step, BODY, None, values, iter(()), [], {})
        return jax.tree_util.tree_map(array_of, values.live(), is_leaf=is_tensor)

    with tracing():
        out = jax.eval_shape(body, *live_avals)
    return jax.tree_util.tree_map(lambda a: abstract(a.shape, a.dtype), out)


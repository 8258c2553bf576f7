"""Compiled backward against eager xgrad and against the jitted JAX pullback, side by side.

Run: ``python benchmarks/bench_compiled.py`` (``--quick`` for fewer repeats; ``--miss`` for
section 4 alone).

1. A chain of N=1000 elementwise ops on 1-element tensors: eager backward vs compiled
   backward on a cache hit, and the structural-key walk per node (the hit path's, and
   the schedule replay that misses and calls with ``inputs`` take).
2. An MLP (256→512→512→10, batch 64, tanh, cross-entropy) and a 2-layer transformer
   block (d=256, seq 128, batch 8: layer_norm, einsum attention, softmax, gelu): the
   backward alone, eager vs compiled (hit) vs ``jax.jit`` of the same forward's
   ``jax.vjp`` pullback (the floor), and the compile time of a miss.
3. How hooks that are not pure run: splitting the program at the hook (what xgrad
   does) vs one program with an ordered ``io_callback``.
4. The miss on long chains (N = 100 ... 10000 multiplies): the first compiled backward
   after ``compiled.reset()`` (walk, trace, compile, run, grads waited for), the hit of the
   same graph, and the chunks compiled and reused (NOTE [Chunks] in
   ``xgrad/engine/compiled/program.py``). It uses only the public API, so it can time another
   checkout of xgrad too (``PYTHONPATH=that/checkout``). Then the same for a deep model
   of identical blocks (``--layers``, 400 residual layers). Set ``XGRAD_COMPILATION_CACHE=0``
   to time cold compiles: JAX's persistent cache would read programs back from disk.

Times are medians of many repeats, the compared variants timed in turns (eager, compiled hit,
floor, eager, ...) so that load on the shared machine hits them alike; the forward is rebuilt,
and waited for, outside the timed region.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import jax
import jax.numpy as jnp
import numpy as np
from _timing import interleaved, median_seconds, mul_chain, table
from jax.experimental import io_callback

import xgrad
from xgrad.autograd import compiled
from xgrad.engine import compiled as compiled_engine
from xgrad.engine import engine
from xgrad.engine.node import gradient_edge

N = 1000


def forward_done(loss: xgrad.Tensor) -> xgrad.Tensor:
    """``loss`` once its forward has run: JAX dispatches asynchronously, and the floor's
    residuals are ready before its clock starts, so the backward's clock starts the same way."""
    jax.block_until_ready(loss.array)
    return loss


def backward_seconds(build, params, flag: bool) -> float:
    """Seconds of one ``loss.backward(compiled=flag)`` until the grads are ready."""
    loss = forward_done(build())
    for p in params:
        p.grad = None
    start = time.perf_counter()
    loss.backward(compiled=flag)
    jax.block_until_ready([p.grad.array for p in params])
    return time.perf_counter() - start


def miss_seconds(build, params) -> float:
    """Wall time of the first compiled backward of a structure (walk, trace, XLA compile, run)."""
    compiled.reset()
    return backward_seconds(build, params, True)


def chain_rows(repeats: int) -> list[tuple[str, ...]]:
    x = xgrad.tensor([0.5], requires_grad=True)

    def build() -> xgrad.Tensor:
        return mul_chain(x, N)

    miss = miss_seconds(build, [x])

    def walk_costs() -> tuple[float, float]:
        """The hit path's one-pass key walk (with the hash a lookup takes), and for comparison
        what a call with ``inputs`` walks instead: ``engine.prepare`` and the schedule replay."""
        loss = forward_done(build())
        edge = gradient_edge(loss)
        start = time.perf_counter()
        hash(compiled_engine.key.walk_structure(edge.node, False, edge.input_nr).key)
        mid = time.perf_counter()
        graph_task, root, _ = engine.prepare([edge], [xgrad.tensor(1.0)], False, False, True, [])
        hash(compiled_engine.key.walk_schedule(graph_task, root, False, True, 0, edge.input_nr).key)
        return mid - start, time.perf_counter() - mid

    costs: list[tuple[float, float]] = []

    def walk_only() -> float:
        costs.append(walk_costs())
        return 0.0

    medians = interleaved(
        {"eager": lambda: backward_seconds(build, [x], False), "hit": lambda: backward_seconds(build, [x], True), "walk": walk_only},
        repeats,
        warmup=0,
    )
    eager, hit = medians["eager"], medians["hit"]
    walk = statistics.median(c[0] for c in costs)
    replay = statistics.median(c[1] for c in costs)
    us = lambda s: f"{s / N * 1e6:.2f}"  # noqa: E731
    return [
        ("eager backward", us(eager), f"{eager * 1e3:.2f}"),
        ("compiled backward (hit)", us(hit), f"{hit * 1e3:.2f}"),
        ("  of which key walk (one pass: key, saved arrays, hash)", us(walk), f"{walk * 1e3:.2f}"),
        ("calls with inputs instead: engine.prepare + schedule replay", us(replay), f"{replay * 1e3:.2f}"),
        ("compiled backward (miss: trace + compile)", us(miss), f"{miss * 1e3:.1f}"),
        ("speed-up eager / compiled hit", f"{eager / hit:.1f}x", ""),
    ]


# -- models written once for xgrad and jax.numpy ---------------------------------------


class JaxOps:
    """The few xgrad ops the models use, on jax arrays."""

    tanh = staticmethod(jnp.tanh)
    einsum = staticmethod(jnp.einsum)

    @staticmethod
    def softmax(x, dim):  # noqa: ANN001, ANN205
        return jax.nn.softmax(x, axis=dim)

    @staticmethod
    def gelu(x):  # noqa: ANN001, ANN205
        return jax.nn.gelu(x, approximate=False)

    @staticmethod
    def layer_norm(x, shape, w, b, eps=1e-5):  # noqa: ANN001, ANN205
        mean = jnp.mean(x, -1, keepdims=True)
        var = jnp.mean((x - mean) ** 2, -1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + eps) * w + b

    @staticmethod
    def cross_entropy(logits, labels):  # noqa: ANN001, ANN205
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))

    @staticmethod
    def mean(x):  # noqa: ANN001, ANN205
        return jnp.mean(x)


class XgradOps:
    tanh = staticmethod(xgrad.tanh)
    einsum = staticmethod(xgrad.einsum)
    softmax = staticmethod(xgrad.softmax)
    gelu = staticmethod(xgrad.gelu)
    layer_norm = staticmethod(xgrad.layer_norm)
    cross_entropy = staticmethod(xgrad.cross_entropy)

    @staticmethod
    def mean(x):  # noqa: ANN001, ANN205
        return x.mean()


def mlp(ops, params, x, labels):  # noqa: ANN001, ANN201
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = ops.tanh(h)
    return ops.cross_entropy(h, labels)


def transformer(ops, params, x, heads=4):  # noqa: ANN001, ANN201
    batch, seq, d = x.shape
    h = x
    for p in params:
        a = ops.layer_norm(h, (d,), p["ln1_w"], p["ln1_b"])
        q = ops.einsum("bsd,dhk->bhsk", a, p["wq"])
        k = ops.einsum("bsd,dhk->bhsk", a, p["wk"])
        v = ops.einsum("bsd,dhk->bhsk", a, p["wv"])
        scores = ops.einsum("bhsk,bhtk->bhst", q, k) * (1.0 / (d // heads) ** 0.5)
        attn = ops.einsum("bhst,bhtk->bhsk", ops.softmax(scores, -1), v)
        h = h + ops.einsum("bhsk,hkd->bsd", attn, p["wo"])
        m = ops.layer_norm(h, (d,), p["ln2_w"], p["ln2_b"])
        h = h + ops.gelu(m @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
    return ops.mean(h * h)


def init_mlp(rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    sizes = (256, 512, 512, 10)
    return [
        (rng.uniform(-1, 1, (i, o)).astype(np.float32) / np.sqrt(i), np.zeros(o, np.float32))
        for i, o in zip(sizes[:-1], sizes[1:], strict=True)
    ]


def init_transformer(rng: np.random.Generator, d: int = 256, heads: int = 4, layers: int = 2) -> list[dict[str, np.ndarray]]:
    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    return [
        {
            "ln1_w": np.ones(d, np.float32), "ln1_b": np.zeros(d, np.float32),
            "wq": w(d, heads, d // heads), "wk": w(d, heads, d // heads), "wv": w(d, heads, d // heads),
            "wo": w(heads, d // heads, d),
            "ln2_w": np.ones(d, np.float32), "ln2_b": np.zeros(d, np.float32),
            "w1": w(d, 4 * d), "b1": np.zeros(4 * d, np.float32), "w2": w(4 * d, d), "b2": np.zeros(d, np.float32),
        }
        for _ in range(layers)
    ]


def model_rows(name: str, fn, params_np, inputs_np, repeats: int) -> list[tuple[str, ...]]:  # noqa: ANN001
    leaves_np, tree = jax.tree_util.tree_flatten(params_np)
    xleaves = [xgrad.tensor(p, requires_grad=True) for p in leaves_np]
    xparams = jax.tree_util.tree_unflatten(tree, xleaves)
    xinputs = [xgrad.tensor(a) for a in inputs_np]
    jparams = jax.tree_util.tree_map(jnp.asarray, params_np)
    jinputs = [jnp.asarray(a) for a in inputs_np]

    def build() -> xgrad.Tensor:
        return fn(XgradOps, xparams, *xinputs)

    miss = miss_seconds(build, xleaves)

    # The floor: the pullback of jax.vjp of the same forward, jitted; residuals are its inputs.
    forward = jax.jit(lambda p, *xs: jax.vjp(lambda q: fn(JaxOps, q, *xs), p))
    pullback = jax.jit(lambda vjp_fn, g: vjp_fn(g))
    loss, vjp_fn = forward(jparams, *jinputs)
    one = jnp.ones_like(loss)

    def floor_seconds() -> float:
        # From the state xgrad's backwards start in: just after an eager forward. XLA's CPU
        # threads are parked after Python-heavy work and hot after XLA work; timed without
        # this, the floor ran hot right after the compiled backward and the compiled hit
        # cold right after the eager one (measured: a run order alone moved the ratio by 0.2).
        forward_done(build())
        start = time.perf_counter()
        jax.block_until_ready(pullback(vjp_fn, one))
        return time.perf_counter() - start

    medians = interleaved(
        {
            "eager": lambda: backward_seconds(build, xleaves, False),
            "hit": lambda: backward_seconds(build, xleaves, True),
            "floor": floor_seconds,
        },
        repeats,
    )
    eager, hit, floor = medians["eager"], medians["hit"], medians["floor"]

    # The compiled grads equal JAX's (float32 tolerance).
    for p in xleaves:
        p.grad = None
    build().backward(compiled=True)
    (expected,) = pullback(vjp_fn, one)
    worst = max(float(np.max(np.abs(p.grad.numpy() - np.asarray(e)))) for p, e in zip(xleaves, jax.tree_util.tree_leaves(expected), strict=True))
    ms = lambda s: f"{s * 1e3:.2f}"  # noqa: E731
    return [
        (f"{name}: eager backward", ms(eager), f"{eager / floor:.2f}x"),
        (f"{name}: compiled backward (hit)", ms(hit), f"{hit / floor:.2f}x"),
        (f"{name}: jax.jit(jax.vjp) pullback (floor)", ms(floor), "1.00x"),
        (f"{name}: compiled miss (trace + compile + run)", ms(miss), ""),
        (f"{name}: max |compiled - jax| grad", f"{worst:.1e}", ""),
    ]


# -- hooks that are not pure: split vs io_callback ---------------------------------------


def hook_rows(repeats: int) -> list[tuple[str, ...]]:
    seen = []

    def hook(g: np.ndarray) -> np.ndarray:
        seen.append(float(g.ravel()[0]))
        return g

    x = jnp.ones((64, 256), jnp.float32)
    w = jnp.ones((256, 256), jnp.float32) / 256

    def first(x):  # noqa: ANN001, ANN202
        return jnp.tanh(x @ w)

    def second(h):  # noqa: ANN001, ANN202
        return jnp.tanh(h @ w).sum(0)

    def with_callback(x):  # noqa: ANN001, ANN202
        h = first(x)
        h = io_callback(hook, jax.ShapeDtypeStruct(h.shape, h.dtype), h, ordered=True)
        return second(h)

    one_program = jax.jit(with_callback)
    no_hook = jax.jit(lambda x: second(first(x)))
    first_j, second_j = jax.jit(first), jax.jit(second)

    def split() -> None:
        h = first_j(x)
        hook(np.asarray(h))  # the host hook sees a concrete value
        jax.block_until_ready(second_j(h))

    callback = median_seconds(lambda: jax.block_until_ready(one_program(x)), repeats)
    split_time = median_seconds(split, repeats)
    plain = median_seconds(lambda: jax.block_until_ready(no_hook(x)), repeats)
    us = lambda s: f"{s * 1e6:.0f}"  # noqa: E731
    return [
        ("one program, no hook", us(plain), "1.00x"),
        ("split at the hook: 2 programs + host call (xgrad's choice)", us(split_time), f"{split_time / plain:.2f}x"),
        ("one program with io_callback(ordered=True)", us(callback), f"{callback / plain:.2f}x"),
    ]


MISS_SIZES = (100, 1000, 3000, 10000)


def miss_rows(sizes: tuple[int, ...], repeats: int) -> list[tuple[str, ...]]:
    x = xgrad.tensor([0.5], requires_grad=True)
    mul_chain(x, 10).backward(compiled=True)  # the process's first compiled backward jits the rules
    rows = []
    for n in sizes:
        def build(n: int = n) -> xgrad.Tensor:
            return mul_chain(x, n)

        miss = miss_seconds(build, [x])
        s = compiled.stats()  # another checkout may have no chunk counters
        chunks = f"{s.get('chunk_compiles', '-')} / {s.get('chunk_reuses', '-')}"
        hit = interleaved({"hit": lambda build=build: backward_seconds(build, [x], True)}, repeats, warmup=1)["hit"]
        rows.append((str(n), f"{miss:.2f}", f"{miss / n * 1e3:.3f}", f"{hit * 1e3:.2f}", f"{hit / n * 1e6:.2f}", chunks))
    return rows


def residual_rows(layers: int, repeats: int) -> list[tuple[str, ...]]:
    """A deep model of identical blocks: ``h = (h @ w + b).tanh() + h``, each ``w`` and ``b`` a leaf."""
    rng = np.random.default_rng(0)
    ws = [xgrad.tensor(rng.standard_normal((16, 16)).astype(np.float32) * 0.25, requires_grad=True) for _ in range(layers)]
    bs = [xgrad.tensor(np.zeros(16, np.float32), requires_grad=True) for _ in range(layers)]
    x = xgrad.tensor(rng.standard_normal((4, 16)).astype(np.float32))

    def build() -> xgrad.Tensor:
        h = x
        for w, b in zip(ws, bs, strict=True):
            h = (h @ w + b).tanh() + h
        return (h * h).sum()

    miss = miss_seconds(build, ws + bs)
    s = compiled.stats()
    chunks = f"{s.get('chunk_compiles', '-')} / {s.get('chunk_reuses', '-')}"
    hit = interleaved({"hit": lambda: backward_seconds(build, ws + bs, True)}, repeats, warmup=1)["hit"]
    return [(str(layers), f"{miss:.2f}", f"{hit * 1e3:.1f}", chunks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--miss", action="store_true", help="only the misses on long chains (section 4)")
    parser.add_argument("--sizes", default=",".join(map(str, MISS_SIZES)), help="chain lengths for --miss")
    parser.add_argument("--layers", type=int, default=400, help="residual layers for --miss (0: none)")
    args = parser.parse_args()
    repeats = 5 if args.quick else 25
    rng = np.random.default_rng(0)
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPUs; medians of {repeats} runs\n")
    if args.miss:
        sizes = tuple(int(n) for n in args.sizes.split(","))
        print("Chains of N one-element multiplies: the first compiled backward (miss) and later ones (hit)\n")
        header = ("N", "miss s", "miss ms / node", "hit ms", "hit us / node", "chunks compiled / reused")
        print(table(miss_rows(sizes, repeats), header))
        if args.layers:
            print(f"\n{args.layers} residual layers h = (h @ w + b).tanh() + h (16x16, batch 4; w, b leaves)\n")
            print(table(residual_rows(args.layers, repeats), ("layers", "miss s", "hit ms", "chunks compiled / reused")))
        return
    print(f"Chain of {N} one-element multiplies\n")
    print(table(chain_rows(repeats), ("backward", "us / node", "ms total")))
    labels = rng.integers(0, 10, 64)
    rows = model_rows("MLP", mlp, init_mlp(rng), [rng.standard_normal((64, 256)).astype(np.float32), labels], repeats)
    rows += model_rows("transformer", transformer, init_transformer(rng), [rng.standard_normal((8, 128, 256)).astype(np.float32)], repeats)
    print("\nMLP 256-512-512-10 (batch 64) and 2-layer transformer block (d=256, seq 128, batch 8)\n")
    print(table(rows, ("backward", "ms", "vs floor")))
    print("\nA hook that is not pure (matmul-tanh, hook, matmul-tanh; 64x256)\n")
    print(table(hook_rows(repeats), ("how", "us", "vs no hook")))


if __name__ == "__main__":
    main()

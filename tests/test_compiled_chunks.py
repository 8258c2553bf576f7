"""Compiled backward of long graphs: chunks cached by their own structure (NOTE [Chunks] in compiled/program.py).

The chunk sizes are lowered here so that small graphs are long: every test compares a
chunked compiled backward with eager and, where the function is plain math, with
``jax.grad`` of the same function on plain arrays.
"""

from __future__ import annotations

import gc
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad.autograd import Function, compiled
from xgrad.engine import compiled as compiled_engine
from xgrad.engine.compiled import program as compiled_program

CHUNK = 4


@pytest.fixture(autouse=True)
def short_chunks(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(compiled_program, "CHUNK_THRESHOLD", 2 * CHUNK)
    monkeypatch.setattr(compiled_program, "CHUNK_STEPS", CHUNK)
    compiled.reset()
    yield
    compiled.reset()


def the_program() -> compiled_program.Program:
    """The program of the latest backward."""
    return next(reversed(compiled_engine.cache.programs.values()))


def chain(x, n):  # noqa: ANN001, ANN201  (xgrad tensors or jax arrays)
    h = x
    for _ in range(n):
        h = h * 1.25
    return (h * h).sum()


def test_long_chain_matches_eager_and_jax_and_reuses_its_chunks():
    n = 40
    x_np = np.array([0.5, -1.5])
    expected = jax.grad(lambda x: chain(x, n))(jnp.asarray(x_np))
    grads = {}
    for flag in (False, True, True):
        x = xgrad.tensor(x_np, requires_grad=True)
        chain(x, n).backward(compiled=flag)
        grads[flag] = x.grad.detach().numpy()
        np.testing.assert_allclose(grads[flag], expected, rtol=1e-12)
    np.testing.assert_allclose(grads[True], grads[False], rtol=1e-14)
    s = compiled.stats()
    assert len(the_program().segments) == (n + 3 + CHUNK - 1) // CHUNK  # n multiplies, the square, the sum, the leaf
    # The first chunk (the root), one middle chunk and the last (the leaf) are compiled;
    # every other middle chunk reuses the middle one. The second backward is a hit.
    assert (s["misses"], s["hits"], s["chunk_compiles"], s["compiles"]) == (1, 1, 3, 3)
    assert s["chunk_reuses"] == len(the_program().segments) - 3
    assert s["chunk_cache_size"] == 3


def test_short_graphs_stay_one_program():
    x = xgrad.tensor([0.5], requires_grad=True)
    chain(x, 2 * CHUNK - 3).backward(compiled=True)  # 2 * CHUNK steps: at the threshold
    assert len(the_program().segments) == 1
    s = compiled.stats()
    assert (s["chunk_compiles"], s["chunk_reuses"], s["chunk_cache_size"]) == (0, 0, 0)


def blocks(x, ws, first, sin=xgrad.sin):  # noqa: ANN001, ANN201
    """Residual blocks with fan-out and a long skip from the first value to the end."""
    h = x
    for w in ws:
        a = sin(h * w)
        h = a * h + a
    return (h + first * x).sum()


def test_branches_fan_out_and_leaves_across_chunk_borders():
    """Each block reads its own leaf; grads accumulate into old ``.grad``s on a second call."""
    rng = np.random.default_rng(0)
    x_np, ws_np, c_np = rng.standard_normal(3), rng.standard_normal((12, 3)) * 0.5, rng.standard_normal(3)

    def reference(x, ws, c):  # noqa: ANN001, ANN202
        return blocks(x, list(ws), jnp.exp(c), jnp.sin)

    expected = jax.grad(reference, argnums=(0, 1, 2))(jnp.asarray(x_np), jnp.asarray(ws_np), jnp.asarray(c_np))
    results = {}
    for flag in (False, True):
        x = xgrad.tensor(x_np, requires_grad=True)
        ws = [xgrad.tensor(w, requires_grad=True) for w in ws_np]
        c = xgrad.tensor(c_np, requires_grad=True)
        for _ in range(2):  # the second call adds into the first's .grad
            blocks(x, ws, c.exp()).backward(compiled=flag)
        results[flag] = [x.grad.detach().numpy(), np.stack([w.grad.detach().numpy() for w in ws]), c.grad.detach().numpy()]
        for got, want in zip(results[flag], expected, strict=True):
            np.testing.assert_allclose(got, 2 * np.asarray(want), rtol=1e-10)
    for got, want in zip(results[True], results[False], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    s = compiled.stats()
    assert len(the_program().segments) > 3
    assert s["chunk_reuses"] > 0  # the blocks repeat: chunks cut at the same point of a block are equal
    assert s["fallbacks"] == {}


def test_chunks_are_cut_where_few_grads_are_in_flight():
    """A block of 7 steps has 2 grads in flight inside it and 1 between blocks: cuts fall between blocks."""
    x = xgrad.tensor([0.3, 0.7], requires_grad=True)
    ws = [xgrad.tensor([1.1, 0.9]) for _ in range(10)]  # constants: no leaf steps
    blocks(x, ws, xgrad.tensor([1.0, 1.0])).backward(compiled=True)
    segments = the_program().segments
    steps = the_program().steps
    assert len(segments) > 4
    assert all(steps[seg.base].name == "AddBackward" for seg in segments[1:-1])
    # Chunks of whole blocks are equal, but for the first, the last, and the one whose block
    # sends x its grad.
    s = compiled.stats()
    assert (s["chunk_compiles"], s["chunk_reuses"]) == (4, len(segments) - 4)


def plus_one(g):  # noqa: ANN001, ANN201
    return g + 1.0


def hooked_chain(flag: bool, events: list, n: int = 30) -> tuple[np.ndarray, np.ndarray]:
    x = xgrad.tensor(np.array([0.5, 2.0]), requires_grad=True)
    h = x
    retained = None
    for i in range(n):
        h = h * 1.5
        if i == n // 2:
            h.register_hook(lambda g: events.append(("host hook", g.tolist())) or g * 3)
            retained = h
            h.retain_grad()
        if i % 3 == 0:
            h.register_hook(compiled.pure_hook(plus_one))
    h.sum().backward(compiled=flag)
    assert retained is not None
    return x.grad.detach().numpy(), retained.grad.detach().numpy()


def test_a_hook_in_the_middle_runs_between_chunks_as_in_eager():
    eager_events: list = []
    eager = hooked_chain(False, eager_events)
    for _ in range(2):  # a miss, then a hit
        events: list = []
        got = hooked_chain(True, events)
        assert events == eager_events
        for a, b in zip(got, eager, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12)
    s = compiled.stats()
    assert (s["misses"], s["hits"], s["fallbacks"]) == (1, 1, {})
    assert s["chunk_reuses"] > 0


def test_retained_grads_inside_reused_chunks():
    """``retain_grad`` on every fourth value: equal chunks each record their own retained grads."""
    def run(flag: bool) -> list[np.ndarray]:
        x = xgrad.tensor(np.array([0.5, 1.5]), requires_grad=True)
        h, kept = x, []
        for i in range(32):
            h = h * 1.1
            if i % CHUNK == 1:
                h.retain_grad()
                kept.append(h)
        (h * h).sum().backward(compiled=flag)
        return [x.grad.detach().numpy(), *(t.grad.detach().numpy() for t in kept)]

    eager = run(False)
    for _ in range(2):
        got = run(True)
        assert len(got) == len(eager)
        for a, b in zip(got, eager, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12)
    s = compiled.stats()
    assert s["chunk_reuses"] > 0 and s["hits"] == 1


class Cube(Function):
    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        (x,) = ctx.saved_tensors
        return g * 3 * x * x


def test_a_function_in_a_long_chain_runs_on_the_host():
    def run(flag: bool) -> np.ndarray:
        x = xgrad.tensor(np.array([0.9, 1.1]), requires_grad=True)
        h = x
        for i in range(24):
            h = Cube.apply(h) if i == 11 else h * 1.01
        h.sum().backward(compiled=flag)
        return x.grad.detach().numpy()

    def reference(x):  # noqa: ANN001, ANN202
        h = x
        for i in range(24):
            h = h**3 if i == 11 else h * 1.01
        return h.sum()

    expected = jax.grad(reference)(jnp.asarray([0.9, 1.1]))
    np.testing.assert_allclose(run(False), expected, rtol=1e-12)
    np.testing.assert_allclose(run(True), expected, rtol=1e-12)
    assert compiled.stats()["fallbacks"] == {}


def test_create_graph_through_chunks():
    """The second derivative of a chunked first backward, as eager and as jax."""
    def f(x, sin=jnp.sin):  # noqa: ANN001, ANN202
        h = x
        for _ in range(12):
            h = sin(h * 0.9)
        return h.sum()

    x_np = np.array([0.4, -0.8])
    expected = jax.grad(lambda x: jax.grad(f)(x).sum())(jnp.asarray(x_np))
    for flag in (False, True):
        x = xgrad.tensor(x_np, requires_grad=True)
        (g,) = xgrad.autograd.grad(f(x, xgrad.sin), [x], create_graph=True, compiled=flag)
        np.testing.assert_allclose(g.detach().numpy(), jax.grad(f)(jnp.asarray(x_np)), rtol=1e-12)
        g.sum().backward(compiled=flag)
        np.testing.assert_allclose(x.grad.detach().numpy(), expected, rtol=1e-10)
    assert len(the_program().segments) > 1


def test_grad_of_inputs_inside_chunks():
    """``grad(..., inputs)`` captures grads of intermediate values from several chunks."""
    def run(flag: bool) -> list[np.ndarray]:
        x = xgrad.tensor(np.array([0.5, 1.5]), requires_grad=True)
        h, mids = x, []
        for i in range(30):
            h = (h * 1.1).tanh() if i % 2 else h * 0.95
            if i in (5, 17, 26):
                mids.append(h)
        return [g.detach().numpy() for g in xgrad.autograd.grad(h.sum(), [x, *mids], compiled=flag)]

    for got, want in zip(run(True), run(False), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    assert len(the_program().segments) > 3


def test_leaves_on_two_devices_in_a_long_chain():
    dev0, dev1 = jax.devices()[:2]

    def run(flag: bool) -> tuple[np.ndarray, np.ndarray, object]:
        x = xgrad.tensor(np.array([0.5, -1.0]), device=dev0, requires_grad=True)
        w = xgrad.tensor(np.array([1.5, 0.5]), device=dev1, requires_grad=True)
        h = x
        for _ in range(10):
            h = h * 1.1
        h = h.to(dev1) * w
        for _ in range(10):
            h = h * 0.9
        h.sum().backward(compiled=flag)
        assert x.grad.device == dev0 and w.grad.device == dev1
        return x.grad.detach().numpy(), w.grad.detach().numpy()

    for got, want in zip(run(True), run(False), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    assert compiled.stats()["fallbacks"] == {}


def test_hlo_text_of_each_chunk():
    x = xgrad.tensor([0.5], requires_grad=True)
    h = x
    for _ in range(3 * CHUNK):
        h = h.sin()
    h.sum().backward(compiled=True)
    program = the_program()
    assert len(program.segments) >= 3
    for i in range(len(program.segments)):
        assert "cosine" in program.hlo_text(i)


def test_no_reference_to_the_graph_is_kept():
    refs = []
    x = xgrad.tensor([0.5, 1.0], requires_grad=True)
    for _ in range(3):
        h = x.exp()
        refs.append(weakref.ref(h.grad_fn))
        chain(h, 20).backward(compiled=True)
        del h
    gc.collect()
    assert all(ref() is None for ref in refs)
    assert compiled.stats()["chunk_cache_size"] > 0


def test_reset_empties_the_chunk_cache():
    x = xgrad.tensor([0.5], requires_grad=True)
    chain(x, 20).backward(compiled=True)
    assert compiled.stats()["chunk_cache_size"] > 0
    compiled.reset()
    s = compiled.stats()
    assert (s["chunk_cache_size"], s["chunk_compiles"], s["chunk_reuses"]) == (0, 0, 0)
    x.grad = None
    chain(x, 20).backward(compiled=True)
    assert compiled.stats()["chunk_compiles"] == 3


def test_the_chunk_cache_is_bounded(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(compiled_engine.cache, "CHUNK_CACHE_SIZE", 2)
    x = xgrad.tensor([0.5], requires_grad=True)
    for n in (20, 21):
        x.grad = None
        chain(x, n).backward(compiled=True)
        np.testing.assert_allclose(x.grad.detach().numpy(), 2 * 0.5 * 1.25 ** (2 * n), rtol=1e-6)
    assert compiled.stats()["chunk_cache_size"] == 2


def test_threads_share_chunks():
    """Threads compiling and running long chains of one structure at once: each gets its own exact grads."""
    errors: list[BaseException] = []

    def worker(scale: float) -> None:
        try:
            for _ in range(3):
                x = xgrad.tensor(np.array([scale]), requires_grad=True)
                chain(x, 24).backward(compiled=True)
                np.testing.assert_allclose(x.grad.detach().numpy(), [2 * scale * 1.25**48], rtol=1e-12)
        except BaseException as exc:  # noqa: BLE001  (reported by the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(0.1 * (i + 1),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors

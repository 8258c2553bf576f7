"""Gradient-changing hooks at JAX speed: Equinox's MNIST CNN and the demo MLP, hooks against ``custom_vjp``.

Each model's gradient is changed at two points (one gradient clipped to [-0.01, 0.01],
one scaled by 0.5) and read at two others (a gradient norm each, per step), run as:

1. ``jax.jit(jax.grad)`` of the plain loss (Equinox's ``filter_jit(filter_grad)`` for the CNN) (the floor every time is divided by);
2. the pure-JAX equivalent: ``jax.jit(jax.grad)`` of the loss with ``custom_vjp``
   identities that clip and scale, and zero probes whose gradients give the two norms;
3. xgrad eager with the four hooks (tensor hooks, registered as a PyTorch user would:
   the two readers append ``g.norm()`` to a list);
4. the same with ``backward(compiled=True)``;
5. the same step under ``xgrad.compile`` (the clip and scale are traced in without
   being marked, NOTE [Hooks traced in]; the readers only observe);
6. (the CNN) the same step, the model's arrays its argument, under a plain ``jax.jit``:
   with the clip and scale alone, marked ``pure_hook`` (a plain trace cannot guard the
   globals they read, so unmarked they would run on the host), and with the two readers
   too, which run through ordered host calls at every step (NOTE [Hooks under jax.jit]):
   what that route costs.

Equinox's MNIST CNN (its tutorial's model, unmodified, batch 16) runs through
``xgrad.from_jax(loss, trace=True)`` and ``xgrad.intermediates()``, the hooks on the
outputs of ``layers[0]`` (read), ``layers[4]`` (clipped), ``layers[6]`` (scaled) and
``layers[8]`` (read). The demo MLP (2-64-64-3, batch 128, Adam: ``benchmarks/bench_hooks.py``)
has them on its parameters (first weight clipped, second weight scaled, the last two
read), and the xgrad.compile step runs with and without them. The timers take turns round
after round; medians are printed with the ratios the targets name.

    python benchmarks/bench_hooks_jax.py            # ~2 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from _timing import interleaved, table
from bench_hooks import _timer

import xgrad
from xgrad import demo

CLIP, SCALE = 0.01, 0.5
BATCH = 16
STEPS_PER_ROUND = 10


class CNN(eqx.Module):
    """Equinox's MNIST tutorial CNN, as the tutorial writes it."""

    layers: list[Any]

    def __init__(self, key: Any) -> None:
        key1, key2, key3, key4 = jax.random.split(key, 4)
        self.layers = [
            eqx.nn.Conv2d(1, 3, kernel_size=4, key=key1),
            eqx.nn.MaxPool2d(kernel_size=2),
            jax.nn.relu,
            jnp.ravel,
            eqx.nn.Linear(1728, 512, key=key2),
            jax.nn.sigmoid,
            eqx.nn.Linear(512, 64, key=key3),
            jax.nn.relu,
            eqx.nn.Linear(64, 10, key=key4),
            jax.nn.log_softmax,
        ]

    def __call__(self, x: Any) -> Any:
        for layer in self.layers:
            x = layer(x)
        return x


def cnn_loss(model: CNN, x: Any, y: Any) -> Any:
    """The tutorial's cross-entropy."""
    pred_y = jax.vmap(model)(x)
    return -jnp.mean(jnp.take_along_axis(pred_y, jnp.expand_dims(y, 1), axis=1))


@jax.custom_vjp
def clip_grad(x: Any) -> Any:
    return x


clip_grad.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -CLIP, CLIP),))


@jax.custom_vjp
def scale_grad(x: Any) -> Any:
    return x


scale_grad.defvjp(lambda x: (x, None), lambda _, g: (g * SCALE,))


def cnn_loss_with_vjps(model: CNN, probes: tuple[Any, Any], x: Any, y: Any) -> Any:
    """``cnn_loss`` with the clip and scale as ``custom_vjp``s and zero probes at the two read points."""
    changed = {0: lambda h, i: h + probes[0][i], 4: lambda h, _: clip_grad(h), 6: lambda h, _: scale_grad(h),
               8: lambda h, i: h + probes[1][i]}

    def one(x: Any, i: Any) -> Any:
        for k, layer in enumerate(model.layers):
            x = layer(x)
            if k in changed:
                x = changed[k](x, i)
        return x

    pred_y = jax.vmap(one)(x, jnp.arange(x.shape[0]))
    return -jnp.mean(jnp.take_along_axis(pred_y, jnp.expand_dims(y, 1), axis=1))


def _clip(g: Any) -> Any:
    return g.clamp(-CLIP, CLIP)


def _scale(g: Any) -> Any:
    return g * SCALE


def cnn_timers(sync: bool) -> tuple[dict[str, Callable[[], float]], list[Any]]:
    model = CNN(jax.random.PRNGKey(0))
    keys = jax.random.split(jax.random.PRNGKey(1), 4)
    batches = [(jax.random.normal(k, (BATCH, 1, 28, 28)), jax.random.randint(k, (BATCH,), 0, 10)) for k in keys]
    plain = eqx.filter_jit(eqx.filter_grad(cnn_loss))
    probe_shapes = ((BATCH, 3, 25, 25), (BATCH, 10))

    @eqx.filter_jit
    def with_vjps(model: CNN, x: Any, y: Any) -> Any:
        probes = tuple(jnp.zeros(s) for s in probe_shapes)
        grads, (p0, p1) = eqx.filter_grad(lambda both, x, y: cnn_loss_with_vjps(*both, x, y))((model, probes), x, y)
        return grads, (jnp.linalg.norm(p0), jnp.linalg.norm(p1))

    traced = xgrad.from_jax(cnn_loss, trace=True)

    def xgrad_step(compiled_backward: bool) -> tuple[Callable[..., Any], Any, list[Any]]:
        params = jax.tree_util.tree_map(lambda a: xgrad.tensor(a, requires_grad=True) if eqx.is_array(a) else a, model)
        leaves = [t for t in jax.tree_util.tree_leaves(params, is_leaf=xgrad.is_tensor) if xgrad.is_tensor(t)]
        norms: list[Any] = []

        def step(x: Any, y: Any) -> Any:
            for p in leaves:
                p.grad = None
            with xgrad.intermediates() as acts:
                loss = traced(params, x, y)
            acts["layers[0]"].register_hook(lambda g: norms.append(g.norm()))
            acts["layers[4]"].register_hook(_clip)
            acts["layers[6]"].register_hook(_scale)
            acts["layers[8]"].register_hook(lambda g: norms.append(g.norm()))
            loss.backward(compiled=compiled_backward)
            return loss

        return step, leaves, norms

    arrays, static = eqx.partition(model, eqx.is_array)

    def jitted_step(read: bool) -> Callable[..., Any]:
        norms: list[Any] = []

        @jax.jit
        def step(arrays: Any, x: Any, y: Any) -> Any:
            params = jax.tree_util.tree_map(
                lambda a: xgrad.Tensor(a, requires_grad=True) if eqx.is_array(a) else a, eqx.combine(arrays, static),
            )
            with xgrad.intermediates() as acts:
                loss = traced(params, xgrad.Tensor(x), xgrad.Tensor(y))
            acts["layers[4]"].register_hook(xgrad.autograd.compiled.pure_hook(_clip))
            acts["layers[6]"].register_hook(xgrad.autograd.compiled.pure_hook(_scale))
            if read:
                acts["layers[0]"].register_hook(lambda g: norms.append(g.norm()))
                acts["layers[8]"].register_hook(lambda g: norms.append(g.norm()))
            loss.backward()
            return [t.grad.array for t in jax.tree_util.tree_leaves(params, is_leaf=xgrad.is_tensor) if xgrad.is_tensor(t)]

        def call(x: Any, y: Any) -> Any:
            norms.clear()
            results["jit"] = step(arrays, x, y)
            return results["jit"][0]

        return call

    eager, eager_leaves, eager_norms = xgrad_step(False)
    compiled, compiled_leaves, compiled_norms = xgrad_step(True)
    step, step_leaves, step_norms = xgrad_step(False)
    whole = xgrad.compile(step)
    results: dict[str, Any] = {}

    def run(fn: Callable[..., Any], norms: list[Any]) -> Callable[[Any, Any], Any]:
        def call(x: Any, y: Any) -> Any:
            norms.clear()
            return fn(xgrad.Tensor(x), xgrad.Tensor(y)).array

        return call

    def jax_run(fn: Callable[..., Any], key: str) -> Callable[[Any, Any], Any]:
        def call(x: Any, y: Any) -> Any:
            results[key] = fn(model, x, y)
            return jax.tree_util.tree_leaves(results[key])[0]

        return call

    def last(key: str) -> Callable[[], Any]:
        return lambda: jax.tree_util.tree_leaves(results.get(key))

    timers = {
        "jax.jit(jax.grad), no hooks": _timer(jax_run(plain, "plain"), last("plain"), batches, STEPS_PER_ROUND, sync),
        "jax.jit(jax.grad), custom_vjp clip/scale + 2 probe norms":
            _timer(jax_run(with_vjps, "vjps"), last("vjps"), batches, STEPS_PER_ROUND, sync),
        "xgrad eager, 4 hooks": _timer(run(eager, eager_norms), lambda: eager_leaves[0].grad.array, batches, 2, sync),
        "backward(compiled=True), 4 hooks":
            _timer(run(compiled, compiled_norms), lambda: compiled_leaves[0].grad.array, batches, STEPS_PER_ROUND, sync),
        "xgrad.compile, 4 hooks":
            _timer(run(whole, step_norms), lambda: step_leaves[0].grad.array, batches, STEPS_PER_ROUND, sync),
        "jax.jit of the xgrad step, clip/scale (pure_hook)":
            _timer(jitted_step(False), last("jit"), batches, STEPS_PER_ROUND, sync),
        "jax.jit of the xgrad step, clip/scale + 2 readers on the host":
            _timer(jitted_step(True), last("jit"), batches, STEPS_PER_ROUND, sync),
    }
    return timers, [whole]


def mlp_timers(sync: bool) -> tuple[dict[str, Callable[[], float]], list[Any]]:
    device = jax.devices()[0]
    batches = demo.make_batches(device)
    tx = optax.adam(1e-3)

    def jax_state() -> dict[str, Any]:
        params = [p.array for p in demo.make_model(device).parameters()]
        return {"params": params, "opt": tx.init(params)}

    def changed_loss(params: list[Any], x: Any, y: Any) -> Any:
        return demo.jax_loss([clip_grad(params[0]), params[1], scale_grad(params[2]), *params[3:]], x, y)

    def jax_step(loss: Callable[..., Any], norms: bool) -> Callable[..., Any]:
        @jax.jit
        def step(params: Any, opt_state: Any, x: Any, y: Any) -> Any:
            value, grads = jax.value_and_grad(loss)(params, x, y)
            read = (jnp.linalg.norm(grads[-2]), jnp.linalg.norm(grads[-1])) if norms else ()
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, value, read

        return step

    def jax_run(step: Callable[..., Any], state: dict[str, Any]) -> Callable[[Any, Any], Any]:
        def call(x: Any, y: Any) -> Any:
            state["params"], state["opt"], loss, _ = step(state["params"], state["opt"], x, y)
            return loss

        return call

    def xgrad_step(hooks: bool, compiled_backward: bool = False) -> tuple[Callable[..., Any], list[Any], list[Any]]:
        model = demo.make_model(device)
        opt = xgrad.optim.Adam(model.parameters(), lr=1e-3)
        params = list(model.parameters())
        norms: list[Any] = []
        if hooks:
            params[0].register_hook(_clip)
            params[2].register_hook(_scale)
            params[-2].register_hook(lambda g: norms.append(g.norm()))
            params[-1].register_hook(lambda g: norms.append(g.norm()))

        def step(x: Any, y: Any) -> Any:
            opt.zero_grad()
            loss = xgrad.cross_entropy(model(x), y)
            loss.backward(compiled=compiled_backward)
            opt.step()
            return loss

        return step, params, norms

    def run(fn: Callable[..., Any], norms: list[Any]) -> Callable[[Any, Any], Any]:
        def call(x: Any, y: Any) -> Any:
            norms.clear()
            return fn(x, y).array

        return call

    plain_state, vjp_state = jax_state(), jax_state()
    eager, eager_params, eager_norms = xgrad_step(True)
    compiled, compiled_params, compiled_norms = xgrad_step(True, compiled_backward=True)
    bare_fn, bare_params, bare_norms = xgrad_step(False)
    hooked_fn, hooked_params, hooked_norms = xgrad_step(True)
    bare, hooked = xgrad.compile(bare_fn), xgrad.compile(hooked_fn)
    timers = {
        "jax.jit(jax.grad), no hooks": _timer(jax_run(jax_step(demo.jax_loss, False), plain_state),
                                              lambda: plain_state["params"][-1], batches, STEPS_PER_ROUND, sync),
        "jax.jit(jax.grad), custom_vjp clip/scale + 2 norms":
            _timer(jax_run(jax_step(changed_loss, True), vjp_state), lambda: vjp_state["params"][-1], batches,
                   STEPS_PER_ROUND, sync),
        "xgrad eager, 4 hooks": _timer(run(eager, eager_norms), lambda: eager_params[-1].array, batches, 2, sync),
        "backward(compiled=True), 4 hooks":
            _timer(run(compiled, compiled_norms), lambda: compiled_params[-1].array, batches, STEPS_PER_ROUND, sync),
        "xgrad.compile, no hooks": _timer(run(bare, bare_norms), lambda: bare_params[-1].array, batches, STEPS_PER_ROUND, sync),
        "xgrad.compile, 4 hooks":
            _timer(run(hooked, hooked_norms), lambda: hooked_params[-1].array, batches, STEPS_PER_ROUND, sync),
    }
    return timers, [bare, hooked]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--sync", action="store_true", help="wait for each step's results before the next")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"jax {jax.__version__}, equinox {eqx.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPUs; "
          f"medians of {args.rounds} interleaved rounds of {STEPS_PER_ROUND} steps (eager: 2)"
          f"{', each waited for' if args.sync else ''}; load average {load[0]:.2f}\n")
    for title, make in (("Equinox MNIST CNN, batch 16", cnn_timers), ("demo MLP step with Adam, batch 128", mlp_timers)):
        timers, steps = make(args.sync)
        us = {name: seconds * 1e6 for name, seconds in interleaved(timers, repeats=args.rounds).items()}
        floor = us["jax.jit(jax.grad), no hooks"]
        print(table([(name, f"{value:.1f}", f"{value / floor:.2f}x") for name, value in us.items()],
                    (title, "µs/step", "vs jax.jit(jax.grad)")))
        vjps = next(v for k, v in us.items() if "custom_vjp" in k)
        rows = [("xgrad.compile vs the custom_vjp equivalent (compile time / JAX time)",
                 f"{us['xgrad.compile, 4 hooks'] / vjps:.2f}x", "<= 1.0x")]
        if "xgrad.compile, no hooks" in us:
            rows.append(("xgrad.compile: with the hooks vs without (no hooks / hooks)",
                         f"{us['xgrad.compile, no hooks'] / us['xgrad.compile, 4 hooks']:.2f}x", ">= 0.85x"))
        print()
        print(table(rows, ("ratio", "measured", "target")))
        print(f"\nxgrad.compile stats: {[step.stats() for step in steps]}\n")


if __name__ == "__main__":
    main()

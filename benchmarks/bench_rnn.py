"""Training steps of a small LSTM language model: eager, ``xgrad.compile``, an LSTMCell loop, PyTorch.

Run: ``python benchmarks/bench_rnn.py`` (``--quick`` for fewer repeats).

The model is pytorch/examples' word_language_model at a small size: Embedding(1000, 128),
a 2-layer LSTM(128, 128), Linear(128, 1000); sequences of 35 tokens, batch 20, float32.
A step is zero_grad, forward, cross-entropy, backward and an SGD update. Rows:

- xgrad eager: ``nn.LSTM``, each layer one primitive (a ``jax.lax.scan``, NOTE [Recurrent
  scans] in ``xgrad/ops/rnn.py``);
- xgrad eager, LSTMCell loop: the same model unrolled by hand over the 35 steps with
  ``nn.LSTMCell`` (one node per step per layer): what the scan saves;
- ``xgrad.compile``: the whole step as one program;
- ``jax.jit(jax.grad)`` of the same model written in JAX (``lax.scan``): the floor;
- PyTorch (CPU, one thread), when it is installed.

Times are medians, the rows timed in turns so that load on the shared machine hits them alike.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import jax
import jax.numpy as jnp
import numpy as np
from _timing import interleaved, table

import xgrad
from xgrad import nn

VOCAB, EMBED, HIDDEN, LAYERS, STEPS, BATCH, LR = 1000, 128, 128, 2, 35, 20, 0.1


class LanguageModel(nn.Module):
    def __init__(self, cells: bool) -> None:
        self.encoder = nn.Embedding(VOCAB, EMBED, key=0)
        self.cells = cells
        if cells:
            self.rnn = nn.ModuleList([nn.LSTMCell(EMBED if i == 0 else HIDDEN, HIDDEN, key=1 + i) for i in range(LAYERS)])
        else:
            self.rnn = nn.LSTM(EMBED, HIDDEN, LAYERS, key=1)
        self.decoder = nn.Linear(HIDDEN, VOCAB, key=5)

    def forward(self, tokens: xgrad.Tensor) -> xgrad.Tensor:
        x = self.encoder(tokens)
        if self.cells:
            for cell in self.rnn:
                h = c = xgrad.zeros(BATCH, HIDDEN)
                outs = []
                for t in range(STEPS):
                    h, c = cell(x[t], (h, c))
                    outs.append(h)
                x = xgrad.stack(outs)
        else:
            x, _ = self.rnn(x)
        return self.decoder(x)


def xgrad_step(cells: bool):
    model = LanguageModel(cells)
    opt = xgrad.optim.SGD(model.parameters(), lr=LR)

    def step(tokens: xgrad.Tensor, targets: xgrad.Tensor) -> xgrad.Tensor:
        opt.zero_grad()
        loss = xgrad.cross_entropy(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    return step


def jax_step():
    """The same model in JAX, one jitted value_and_grad and update: the floor."""
    keys = jax.random.split(jax.random.key(0), 8)
    bound = 1 / np.sqrt(HIDDEN)
    params = {"embed": jax.random.normal(keys[0], (VOCAB, EMBED)),
              "dec_w": jax.random.uniform(keys[1], (VOCAB, HIDDEN), minval=-bound, maxval=bound),
              "dec_b": jnp.zeros(VOCAB)}
    for i in range(LAYERS):
        for name, shape in (("w_ih", (4 * HIDDEN, EMBED if i == 0 else HIDDEN)), ("w_hh", (4 * HIDDEN, HIDDEN)),
                            ("b", (4 * HIDDEN,))):
            params[f"{name}{i}"] = jax.random.uniform(keys[2 + i], shape, minval=-bound, maxval=bound)

    def loss_fn(p, tokens, targets):
        x = p["embed"][tokens]
        for i in range(LAYERS):
            def cell(carry, x_t, i=i):
                h, c = carry
                gates = x_t @ p[f"w_ih{i}"].T + h @ p[f"w_hh{i}"].T + p[f"b{i}"]
                gi, gf, gg, go = jnp.split(gates, 4, axis=-1)
                c = jax.nn.sigmoid(gf) * c + jax.nn.sigmoid(gi) * jnp.tanh(gg)
                h = jax.nn.sigmoid(go) * jnp.tanh(c)
                return (h, c), h
            zeros = jnp.zeros((BATCH, HIDDEN))
            _, x = jax.lax.scan(cell, (zeros, zeros), x)
        logits = x @ p["dec_w"].T + p["dec_b"]
        logp = jax.nn.log_softmax(logits.reshape(-1, VOCAB))
        return -jnp.mean(jnp.take_along_axis(logp, targets.reshape(-1, 1), axis=1))

    @jax.jit
    def update(p, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(p, tokens, targets)
        return jax.tree.map(lambda a, g: a - LR * g, p, grads), loss

    state = {"params": params}

    def step(tokens, targets):
        state["params"], loss = update(state["params"], tokens, targets)
        return loss

    return step


def torch_step():
    import torch

    # One thread: on this 2-core machine, shared with other jobs, PyTorch's two intra-op threads
    # wait on each other and a step took 5x longer (0.39 s against 0.07 s).
    torch.set_num_threads(1)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = torch.nn.Embedding(VOCAB, EMBED)
            self.rnn = torch.nn.LSTM(EMBED, HIDDEN, LAYERS)
            self.decoder = torch.nn.Linear(HIDDEN, VOCAB)

        def forward(self, tokens):
            return self.decoder(self.rnn(self.encoder(tokens))[0])

    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step(tokens, targets):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    return step, torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 5 if args.quick else 20
    rng = np.random.default_rng(0)
    tokens_np = rng.integers(0, VOCAB, (STEPS, BATCH))
    targets_np = rng.integers(0, VOCAB, (STEPS, BATCH))
    tokens, targets = xgrad.tensor(tokens_np), xgrad.tensor(targets_np)

    def timer(step, args, wait):
        def run() -> float:
            import time

            start = time.perf_counter()
            wait(step(*args))
            return time.perf_counter() - start
        return run

    def wait_xgrad(loss):
        return jax.block_until_ready(loss.array)

    timers = {
        "xgrad eager (nn.LSTM: a scan per layer)": timer(xgrad_step(cells=False), (tokens, targets), wait_xgrad),
        "xgrad eager, LSTMCell loop (35 steps)": timer(xgrad_step(cells=True), (tokens, targets), wait_xgrad),
        "xgrad.compile (nn.LSTM)": timer(xgrad.compile(xgrad_step(cells=False)), (tokens, targets), wait_xgrad),
        "jax.jit(value_and_grad), lax.scan": timer(jax_step(), (jnp.asarray(tokens_np), jnp.asarray(targets_np)),
                                                    jax.block_until_ready),
    }
    try:
        step, torch = torch_step()
    except ImportError:
        torch_version = None
    else:
        torch_version = torch.__version__
        timers["PyTorch eager (CPU, 1 thread)"] = timer(step, (torch.as_tensor(tokens_np), torch.as_tensor(targets_np)), lambda loss: loss)
    medians = interleaved(timers, repeats=repeats)
    floor = medians["jax.jit(value_and_grad), lax.scan"]
    rows = [(name, f"{1000 * s:.1f}", f"{1 / s:.1f}", f"{s / floor:.2f}x") for name, s in medians.items()]
    print(f"jax {jax.__version__} on {jax.default_backend()}, torch {torch_version}, medians of {repeats} steps")
    print(f"LSTM language model: vocab {VOCAB}, embed/hidden {EMBED}/{HIDDEN}, {LAYERS} layers, {STEPS} steps, "
          f"batch {BATCH}, float32; a training step (forward, backward, SGD)\n")
    print(table(rows, ("what", "ms/step", "steps/s", "vs jit")))


if __name__ == "__main__":
    main()

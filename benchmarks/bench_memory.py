"""Peak memory of a training step: xgrad eager, ``xgrad.compile``, ``jax.jit`` with donation, PyTorch eager.

Two models, each trained with Adam (PyTorch's defaults, lr 1e-3), zeroing grads first
(``set_to_none``) as PyTorch 2.x does:

1. an MLP 4096-4096-4096-10 (ReLU, batch 64, cross-entropy): 33.6 M parameters, 134 MB of
   float32 parameters, 268 MB of Adam state, 134 MB of ``.grad``s;
2. ``examples/nanogpt.py``'s GPT at nanoGPT's Shakespeare-char size (6 layers, 6 heads, 384
   wide, vocabulary 65, batch 8 of 128 tokens): 10.7 M parameters.

Each system runs in a process of its own (on CPU, device memory is host memory): it builds
the model, runs one step (compiling), resets the kernel's peak-RSS mark
(``/proc/self/clear_refs``), runs three more steps, each ending when its parameters are
ready, and reports the peak resident set (``VmHWM``) over them; before them it collects the
first call's garbage and trims the C allocator, alike in every system. ``jax.jit`` is
``jax.value_and_grad`` plus ``optax.adam`` in one program, parameters and optimizer state
donated (``donate_argnums``); the GPT's loss there is the same xgrad module called through
``xgrad.func.functional_call``. PyTorch runs under ``--torch-python`` (an interpreter with
``torch``; the row says "unavailable" without it) and never imports xgrad or JAX.

Peak RSS moves by tens of MB from one process to the next (the allocator's slack, other jobs), so
``--repeats N`` runs each system N times, in turn with the others and in reverse order every other
round, and reports medians, with the range over the runs.

    python benchmarks/bench_memory.py --torch-python /path/to/python-with-torch   # ~3 min on 2 cores
    python benchmarks/bench_memory.py --models mlp --systems compile,jit --repeats 5
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

SYSTEMS = ("eager", "compile", "jit", "torch")
NAMES = {"eager": "xgrad eager", "compile": "xgrad.compile", "jit": "jax.jit, donated", "torch": "torch eager"}
MODELS = ("mlp", "gpt")
STEPS = 3
BATCH = {"mlp": 64, "gpt": 8}
MLP_SIZES = (4096, 4096, 4096, 10)
GPT = {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 128, "vocab_size": 65}
LR = 1e-3
GRAD_MB = {"mlp": 134.4, "gpt": 42.9}  # the float32 .grads PyTorch keeps between steps (one per parameter)
_HERE = os.path.dirname(os.path.abspath(__file__))


# -- measuring, in the child ----------------------------------------------------------------
def _peak_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def program_mb(lowered: Any) -> float:
    """What XLA's buffer assignment holds while the program runs: its inputs, the outputs that
    take no donated input's memory, and its temporaries (independent of the allocator)."""
    memory = lowered.compile().memory_analysis()
    held = memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
    return (held + memory.temp_size_in_bytes) / 1e6


def measure(step: Callable[[], None]) -> dict[str, Any]:
    """The first call of ``step`` (compiling), then the peak RSS over ``STEPS`` more."""
    step()
    # What the first call left for the collector (a trace's graph) and the allocator's slack go
    # first, in every system alike: the peak is the steady state's.
    gc.collect()
    ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the peak RSS mark starts again from the current RSS
    start = _peak_kib()
    for _ in range(STEPS):
        step()
    return {"peak_mb": _peak_kib() * 1024 / 1e6, "before_mb": start * 1024 / 1e6}


def _data(model: str) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    batch = BATCH[model]
    if model == "mlp":
        return rng.normal(size=(batch, MLP_SIZES[0])).astype(np.float32), rng.integers(0, MLP_SIZES[-1], size=batch)
    tokens = rng.integers(0, GPT["vocab_size"], size=(batch, GPT["block_size"] + 1))
    return tokens[:, :-1].astype(np.int32), tokens[:, 1:].astype(np.int32)


def _xgrad_model(model: str) -> Any:
    import xgrad
    from xgrad import nn

    if model == "mlp":
        layers: list[Any] = []
        for i, (n_in, n_out) in enumerate(zip(MLP_SIZES, MLP_SIZES[1:], strict=False)):
            layers += [nn.Linear(n_in, n_out, key=i)] + ([nn.ReLU()] if i < len(MLP_SIZES) - 2 else [])
        net = nn.Sequential(*layers)
        return lambda x, y: xgrad.cross_entropy(net(x), y), net
    sys.path.insert(0, os.path.join(_HERE, "..", "examples"))
    import nanogpt

    gpt = nanogpt.GPT(nanogpt.GPTConfig(**GPT))
    return lambda x, y: gpt(x, y)[1], gpt


def run_xgrad(model: str, compiled: bool) -> dict[str, Any]:
    import jax

    import xgrad

    loss_of, net = _xgrad_model(model)
    params = list(net.parameters())
    opt = xgrad.optim.Adam(params, lr=LR)
    x, y = (xgrad.tensor(a) for a in _data(model))

    def train_step(x: Any, y: Any) -> Any:
        opt.zero_grad()
        loss = loss_of(x, y)
        loss.backward()
        opt.step()
        return loss

    step_fn = xgrad.compile(train_step, fallback="error") if compiled else train_step

    def step() -> None:
        step_fn(x, y)
        jax.block_until_ready([p.array for p in params])

    result = measure(step)
    if compiled:
        result["program_mb"] = program_mb(step_fn.lower(x, y))
    return result


def run_jit(model: str) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import optax

    x, y = (jnp.asarray(a) for a in _data(model))
    if model == "mlp":
        keys = jax.random.split(jax.random.key(0), len(MLP_SIZES) - 1)
        params: Any = [
            (jax.random.normal(k, (n_out, n_in)) / n_in**0.5, jnp.zeros(n_out))
            for k, n_in, n_out in zip(keys, MLP_SIZES, MLP_SIZES[1:], strict=False)
        ]

        def loss_of(params: Any, x: Any, y: Any) -> Any:
            h = x
            for i, (w, b) in enumerate(params):
                h = h @ w.T + b
                if i < len(params) - 1:
                    h = jax.nn.relu(h)
            return optax.softmax_cross_entropy_with_integer_labels(h, y).mean()
    else:
        import xgrad

        _, gpt = _xgrad_model(model)
        params = {name: p.array for name, p in gpt.named_parameters()}

        def loss_of(params: Any, x: Any, y: Any) -> Any:
            _, loss = xgrad.func.functional_call(gpt, params, (xgrad.Tensor(x), xgrad.Tensor(y)))
            return loss.array

    tx = optax.adam(LR)
    state = tx.init(params)

    @jax.jit
    def train_step(params: Any, state: Any, x: Any, y: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_of)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    donated = jax.jit(train_step, donate_argnums=(0, 1))
    box = [params, state]

    def step() -> None:
        box[0], box[1], _ = donated(box[0], box[1], x, y)
        jax.block_until_ready(box[0])

    result = measure(step)
    result["program_mb"] = program_mb(donated.lower(box[0], box[1], x, y))
    return result


def run_torch(model: str) -> dict[str, Any]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    x, y = (torch.from_numpy(a).long() if a.dtype.kind == "i" else torch.from_numpy(a) for a in _data(model))
    if model == "mlp":
        layers: list[Any] = []
        for i, (n_in, n_out) in enumerate(zip(MLP_SIZES, MLP_SIZES[1:], strict=False)):
            layers += [nn.Linear(n_in, n_out)] + ([nn.ReLU()] if i < len(MLP_SIZES) - 2 else [])
        net: Any = nn.Sequential(*layers)
        loss_of = lambda x, y: nn.functional.cross_entropy(net(x), y)  # noqa: E731
    else:
        net = _torch_gpt(torch, nn)
        loss_of = net
    opt = torch.optim.Adam(net.parameters(), lr=LR)

    def step() -> None:
        opt.zero_grad()
        loss_of(x, y).backward()
        opt.step()

    return measure(step)


def _torch_gpt(torch: Any, nn: Any) -> Any:
    """``examples/nanogpt.py``'s GPT in PyTorch: the same modules, attention written out the same way."""
    n_embd, n_head, block = GPT["n_embd"], GPT["n_head"], GPT["block_size"]

    class Attention(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
            self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

        def forward(self, x: Any) -> Any:
            B, T, C = x.shape
            q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in self.c_attn(x).split(n_embd, dim=2))
            att = (q @ k.transpose(-2, -1)) * (1.0 / (C // n_head) ** 0.5)
            att = torch.softmax(att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf")), dim=-1)
            return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))

    class Block(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(n_embd), Attention(), nn.LayerNorm(n_embd)
            self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

        def forward(self, x: Any) -> Any:
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Model(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(GPT["vocab_size"], n_embd), nn.Embedding(block, n_embd)
            self.h = nn.ModuleList([Block() for _ in range(GPT["n_layer"])])
            self.ln_f = nn.LayerNorm(n_embd)
            self.lm_head = nn.Linear(n_embd, GPT["vocab_size"], bias=False)
            self.wte.weight = self.lm_head.weight

        def forward(self, idx: Any, targets: Any) -> Any:
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for block_ in self.h:
                x = block_(x)
            logits = self.lm_head(self.ln_f(x))
            return nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    return Model()


def child(system: str, model: str) -> dict[str, Any]:
    if system == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            return {"unavailable": "torch is not importable"}
        return run_torch(model)
    if system == "jit":
        return run_jit(model)
    return run_xgrad(model, compiled=system == "compile")


# -- the table, in the parent ---------------------------------------------------------------
def run_one(system: str, model: str, torch_python: str) -> dict[str, Any]:
    python = torch_python if system == "torch" else sys.executable
    if system == "torch" and not os.path.exists(python):
        return {"unavailable": f"no interpreter at {python}"}
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    done = subprocess.run(
        [python, os.path.abspath(__file__), "--child", system, model], capture_output=True, text=True, env=env,
    )
    if done.returncode != 0:
        return {"unavailable": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_rounds(systems: list[str], model: str, torch_python: str, repeats: int) -> dict[str, list[dict[str, Any]]]:
    """Each system's results over ``repeats`` rounds, the order reversed every other round."""
    results: dict[str, list[dict[str, Any]]] = {system: [] for system in systems}
    for round_ in range(repeats):
        for system in systems if round_ % 2 == 0 else systems[::-1]:
            results[system].append(run_one(system, model, torch_python))
    return results


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians of a system's runs (and its peaks' range), or the reason it did not run."""
    done = [run for run in runs if "peak_mb" in run]
    if len(done) < len(runs):
        return next(run for run in runs if "unavailable" in run)
    medians = {key: statistics.median(run[key] for run in done) for key in done[0]}
    return {**medians, "low_mb": min(run["peak_mb"] for run in done), "high_mb": max(run["peak_mb"] for run in done)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--torch-python", default=sys.executable, help="an interpreter that can import torch")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each system; medians are reported")
    parser.add_argument("--child", nargs=2, metavar=("SYSTEM", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    for model in args.models.split(","):
        medians = "" if args.repeats == 1 else f", medians of {args.repeats} runs (the peaks' range)"
        print(f"\n{model}: peak RSS over {STEPS} steps after the first (MB){medians}; RSS when they start in brackets;")
        print("  XLA program: its arguments, outputs not donated into and temporaries (MB)")
        rounds = run_rounds(args.systems.split(","), model, args.torch_python, args.repeats)
        results = {system: summary(runs) for system, runs in rounds.items()}
        for system, result in results.items():
            spread = f" ({result['low_mb']:.0f}-{result['high_mb']:.0f})" if "peak_mb" in result and args.repeats > 1 else ""
            shown = result.get("unavailable") or f"{result['peak_mb']:8.0f}{spread}   ({result['before_mb']:.0f})" + (
                f"   XLA program {result['program_mb']:.0f}" if "program_mb" in result else ""
            )
            print(f"  {NAMES[system]:<18} {shown}", flush=True)
        compiled, jitted = results.get("compile", {}), results.get("jit", {})
        if "peak_mb" in compiled and "peak_mb" in jitted:
            for what, key in (("peak RSS", "peak_mb"), ("XLA program", "program_mb")):
                bound = jitted[key] + GRAD_MB[model]
                print(f"  xgrad.compile / (jax.jit donated + .grads), {what}: {compiled[key] / bound:.2f}")
        if "peak_mb" in results.get("torch", {}) and "peak_mb" in results.get("eager", {}):
            print(f"  xgrad eager / torch eager: {results['eager']['peak_mb'] / results['torch']['peak_mb']:.2f}")


if __name__ == "__main__":
    main()

"""Run a public PyTorch program, unchanged, under a framework, and record the losses it trains on.

The same code runs the program under xgrad (test_programs.py) and under PyTorch
(tests/fixtures/make_program_losses.py, which makes ``import xgrad`` give ``torch``), so
both runs see the same three things from outside the program:

* initial weights: at a model's first call, before the first backward (or after it, with
  ``late_models``: a GAN's generator is first called after the discriminator's first
  backward), every parameter is
  set (``copy_`` under ``no_grad``) to values drawn from one NumPy stream, in
  ``named_parameters()`` order; buffers stay as the program made them. The program's own
  initialisation still runs before, but its random draws cannot agree across frameworks;
* random draws: ``randn`` and ``randn_like`` draw from a NumPy stream (a VAE's noise,
  the regression's data), and so do ``randint`` where a program samples its batches
  with it (``numpy_randint``: nanoGPT's ``get_batch``) and ``randperm`` where a program splits
  its data with it (``numpy_randperm``: GAT's nodes; a shuffling DataLoader's own draws stay the framework's);
* dropout, where a program fixes ``p`` in its code rather than its arguments
  (``dropout_off``): set to 0 at the same first call (``Dropout`` modules' ``p`` and
  ``MultiheadAttention``'s ``dropout``).

Everything else is the program: its argument parsing (``argv``), data loading, model,
loss, optimizer, scheduler and loop. Each ``Tensor.backward`` call records the value of
the tensor it starts from; ``max_backward`` stops a program whose loop has no end of
its own (it raises ``StopProgram`` out of the ``backward`` call).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import runpy
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

PROGRAMS = Path(__file__).parent


class StopProgram(Exception):
    """Raised out of ``backward`` once a program has trained the steps the test needs."""


@dataclass(frozen=True)
class Program:
    """A program file, the command line it runs with and what the harness sets from outside."""

    script: str
    argv: tuple[str, ...] = ()
    files: dict[str, str | bytes] = field(default_factory=dict)
    max_backward: int | None = None
    dropout_off: bool = False
    numpy_randint: bool = False
    numpy_randperm: bool = False
    late_models: bool = False
    float64: bool = True  # the default dtype; False keeps float32, for a program that mixes in float32 data


@dataclass
class _Recorder:
    framework: ModuleType
    program: Program
    rng: np.random.Generator
    losses: list[float] = field(default_factory=list)
    initialised: set[int] = field(default_factory=set)
    depth: int = 0

    def backward(self, original: Any) -> Any:
        def recorded_backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            self.losses.append(float(tensor.item()))
            result = original(tensor, *args, **kwargs)
            if self.program.max_backward is not None and len(self.losses) >= self.program.max_backward:
                raise StopProgram
            return result

        return recorded_backward

    def module_call(self, original: Any) -> Any:
        def call_with_shared_initial_weights(module: Any, *args: Any, **kwargs: Any) -> Any:
            if self.depth == 0 and (not self.losses or self.program.late_models) and id(module) not in self.initialised:
                self.initialised.add(id(module))
                self.set_initial_weights(module)
            self.depth += 1
            try:
                return original(module, *args, **kwargs)
            finally:
                self.depth -= 1

        return call_with_shared_initial_weights

    def set_initial_weights(self, model: Any) -> None:
        framework = self.framework
        with framework.no_grad():
            for name, parameter in model.named_parameters():
                shape = tuple(parameter.shape)
                if len(shape) >= 2:
                    bound = 1.0 / np.sqrt(np.prod(shape[1:]))
                    value = self.rng.uniform(-bound, bound, shape)
                else:  # biases near 0, normalisation weights near 1
                    value = self.rng.uniform(-0.1, 0.1, shape) + (1.0 if name.endswith("weight") else 0.0)
                parameter.copy_(framework.tensor(value, dtype=parameter.dtype))
        if self.program.dropout_off:
            for submodule in model.modules():
                if type(submodule).__name__.startswith("Dropout"):
                    submodule.p = 0.0
                elif type(submodule).__name__ == "MultiheadAttention":  # its attention dropout is a float attribute
                    submodule.dropout = 0.0

    def randn(self, *size: Any, **kwargs: Any) -> Any:
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        return self.framework.tensor(self.rng.standard_normal(shape), dtype=kwargs.get("dtype"))

    def randn_like(self, like: Any, **kwargs: Any) -> Any:
        return self.framework.tensor(self.rng.standard_normal(tuple(like.shape)), dtype=kwargs.get("dtype", like.dtype))

    def randint(self, *args: Any, **kwargs: Any) -> Any:
        """``randint(high, size)`` or ``randint(low, high, size)``, as int64 drawn from the NumPy stream."""
        low, high, size = (0, *args) if len(args) == 2 else args
        return self.framework.tensor(self.rng.integers(low, high, tuple(size)), dtype=kwargs.get("dtype"))
    def randperm(self, n: int, **kwargs: Any) -> Any:
        return self.framework.tensor(self.rng.permutation(n), dtype=kwargs.get("dtype", self.framework.int64))


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def run_program(framework: ModuleType, program: Program, workdir: Path, seed: int = 0) -> list[float]:
    """Run ``program`` under ``framework`` (``xgrad`` or ``torch``) in float64 (unless it says not) inside ``workdir``;
    return the value of every tensor ``backward`` was called on, in order."""
    script = PROGRAMS / program.script
    for relative, content in program.files.items():
        (workdir / relative).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (workdir / relative).write_bytes(content)
        else:
            (workdir / relative).write_text(content)
    recorder = _Recorder(framework, program, np.random.default_rng(seed))
    modules_before = set(sys.modules)
    saved_argv, saved_path, saved_cwd = sys.argv, list(sys.path), os.getcwd()
    saved_dtype, saved_precision = framework.get_default_dtype(), framework.get_float32_matmul_precision()
    cudnn = framework.backends.cudnn
    saved_cudnn = {flag: getattr(cudnn, flag) for flag in ("benchmark", "deterministic", "allow_tf32")}
    sys.argv = [str(script), *program.argv]
    sys.path.insert(0, str(script.parent))
    os.chdir(workdir)
    framework.set_default_dtype(framework.float64 if program.float64 else framework.float32)
    try:
        with contextlib.ExitStack() as patches:
            patches.enter_context(_patched(framework.Tensor, "backward", recorder.backward(framework.Tensor.backward)))
            patches.enter_context(_patched(framework.nn.Module, "__call__", recorder.module_call(framework.nn.Module.__call__)))
            patches.enter_context(_patched(framework, "randn", recorder.randn))
            patches.enter_context(_patched(framework, "randn_like", recorder.randn_like))
            if program.numpy_randint:
                patches.enter_context(_patched(framework, "randint", recorder.randint))
            if program.numpy_randperm:
                patches.enter_context(_patched(framework, "randperm", recorder.randperm))
            with contextlib.suppress(StopProgram):
                runpy.run_path(str(script), run_name="__main__")
    finally:
        framework.set_default_dtype(saved_dtype)
        framework.set_float32_matmul_precision(saved_precision)  # nanoGPT sets torch.backends.cuda.matmul.allow_tf32
        for flag, value in saved_cudnn.items():  # DCGAN sets cudnn.benchmark
            setattr(cudnn, flag, value)
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(saved_cwd)
        for name in set(sys.modules) - modules_before:  # the program's own modules (model.py, data.py, mingpt)
            if str(PROGRAMS) in str(getattr(sys.modules[name], "__file__", "") or ""):
                del sys.modules[name]
    return recorder.losses


def _corpus(lines: int, seed: int) -> str:
    """Lines of seven words drawn from ten, as a small stand-in for WikiText-2."""
    words = np.random.default_rng(seed).integers(0, 10, (lines, 7))
    return "".join(" ".join(f"w{w}" for w in line) + "\n" for line in words)


_WIKITEXT = {f"data/wikitext-2/{split}.txt": _corpus(lines, seed)
             for split, lines, seed in (("train", 8, 0), ("valid", 4, 1), ("test", 4, 2))}
def _cora(nodes: int, features: int, classes: int, edges: int, seed: int) -> dict[str, str]:
    """A random graph in Cora's format: ``cora.content`` rows ``id word-flags... class`` (every node has a
    word), ``cora.cites`` rows ``cited citing``."""
    rng = np.random.default_rng(seed)
    ids = rng.choice(10_000, nodes, replace=False)
    words = rng.integers(0, 2, (nodes, features))
    words[np.arange(nodes), rng.integers(0, features, nodes)] = 1
    content = "".join(f"{i} {' '.join(map(str, row))} class_{c}\n"
                      for i, row, c in zip(ids, words, rng.integers(0, classes, nodes), strict=True))
    cites = "".join(f"{ids[a]} {ids[b]}\n" for a, b in rng.integers(0, nodes, (edges, 2)))
    return {"cora/cora.content": content, "cora/cora.cites": cites}


_WORD_LM_SIZES = ("--emsize", "8", "--nhid", "8", "--nlayers", "2", "--bptt", "5", "--batch_size", "4",
                  "--epochs", "2", "--dropout", "0", "--log-interval", "1")
_CHARGPT_SIZES = ("--model.model_type=None", "--model.n_layer=2", "--model.n_head=2", "--model.n_embd=16",
                  "--model.embd_pdrop=0.0", "--model.resid_pdrop=0.0", "--model.attn_pdrop=0.0",
                  "--data.block_size=10", "--trainer.max_iters=3", "--trainer.batch_size=4", "--trainer.num_workers=0")

def _token_files(dataset: str, seed: int) -> dict[str, str | bytes]:
    """nanoGPT's data directory: train.bin and val.bin (uint16 tokens, as its prepare.py writes them) and meta.pkl."""
    rng = np.random.default_rng(seed)
    return {f"data/{dataset}/train.bin": rng.integers(0, 11, 64).astype(np.uint16).tobytes(),
            f"data/{dataset}/val.bin": rng.integers(0, 11, 32).astype(np.uint16).tobytes(),
            f"data/{dataset}/meta.pkl": pickle.dumps({"vocab_size": 11}),
            "configurator.py": (PROGRAMS / "nanogpt" / "configurator.py").read_text()}


_NANOGPT_SIZES = ("--device=cpu", "--dataset=tokens", "--n_layer=2", "--n_head=2", "--n_embd=8", "--block_size=8",
                  "--batch_size=2", "--gradient_accumulation_steps=2", "--max_iters=3", "--eval_interval=1000",
                  "--eval_iters=2", "--warmup_iters=2", "--lr_decay_iters=3", "--learning_rate=0.01", "--min_lr=0.001")

# name: the program and how it is run. Sizes are small so that each trains in a few seconds.
CASES = {
    "mnist": Program("mnist/main.py", ("--batch-size", "4", "--test-batch-size", "6", "--epochs", "2", "--log-interval", "1"),
                     dropout_off=True),
    "mnist_rnn": Program("mnist_rnn/main.py", ("--batch-size", "4", "--test-batch-size", "6", "--epochs", "2",
                                               "--log-interval", "1"), dropout_off=True),
    "regression": Program("regression/main.py", max_backward=5),
    "time_sequence_prediction": Program("time_sequence_prediction/train.py"),
    "vae": Program("vae/main.py"),
    "word_language_model_lstm": Program("word_language_model/main.py", _WORD_LM_SIZES + ("--tied",), files=_WIKITEXT),
    "word_language_model_transformer": Program("word_language_model/main.py", _WORD_LM_SIZES + ("--model", "Transformer"),
                                               files=_WIKITEXT, dropout_off=True),
    # one training sequence (block_size + 1 characters), so the sampler's random picks all give it
    "nanogpt": Program("nanogpt/train.py", _NANOGPT_SIZES, files=_token_files("tokens", 0), numpy_randint=True),
    "chargpt": Program("mingpt/chargpt.py", _CHARGPT_SIZES, files={"input.txt": "O God, abc!"}),
    # Its features are float32 (torch.FloatTensor) and meet float32 parameters: it runs in float32.
    "dcgan": Program("dcgan/main.py", ("--dataset", "fake", "--workers", "0", "--batchSize", "1", "--imageSize", "64",
                                       "--nz", "4", "--ngf", "2", "--ndf", "2", "--niter", "2", "--manualSeed", "1"), late_models=True),
    "gat": Program("gat/main.py", ("--epochs", "3", "--hidden-dim", "4", "--num-heads", "2", "--dropout-p", "0",
                                   "--val-every", "1"), files=_cora(12, 6, 3, 20, seed=0), numpy_randperm=True,
                   float64=False),
    "super_resolution": Program("super_resolution/main.py", ("--upscale_factor", "3", "--batchSize", "1", "--testBatchSize",
                                                             "1", "--nEpochs", "3", "--threads", "0")),
}

"""A nanoGPT-style character model, written the way PyTorch code is written, trained with xgrad.

Read it next to Andrej Karpathy's nanoGPT ``model.py``/``train.py``: the modules, the
parameter names (``transformer.h.0.attn.c_attn.weight``, ``lm_head.weight`` tied to
``transformer.wte.weight``), the causal mask as a buffer, AdamW with a cosine schedule
and ``zero_grad``/``backward``/``step`` are PyTorch's. What differs is listed in
docs/migrating_from_pytorch.md; here it is the ``import``s, ``key=`` seeds for the
initialisation, and ``backward(compiled=True)`` where a compiled backward pays off.

    python examples/nanogpt.py --steps 300            # eager backward
    python examples/nanogpt.py --steps 300 --compiled # the backward as one jax.jit program
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import jax
import numpy as np

import xgrad
from xgrad import nn
from xgrad.optim import lr_scheduler

TEXT = (
    "First Citizen: Before we proceed any further, hear me speak. "
    "All: Speak, speak. First Citizen: You are all resolved rather to die than to famish? "
    "All: Resolved. resolved. First Citizen: First, you know Caius Marcius is chief enemy to the people. "
)


@dataclass
class GPTConfig:
    block_size: int = 32
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, key: jax.Array) -> None:
        super().__init__()
        k_attn, k_proj = jax.random.split(key)
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, key=k_attn)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, key=k_proj)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd = config.n_head, config.n_embd
        # nanoGPT's mask buffer: saved with the model, never trained.
        causal = np.tril(np.ones((config.block_size, config.block_size), np.float32))
        self.register_buffer("bias", xgrad.tensor(causal).view(1, 1, config.block_size, config.block_size))

    def forward(self, x: xgrad.Tensor) -> xgrad.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_dropout(xgrad.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig, key: jax.Array) -> None:
        super().__init__()
        k_fc, k_proj = jax.random.split(key)
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, key=k_fc)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, key=k_proj)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: xgrad.Tensor) -> xgrad.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, key: jax.Array) -> None:
        super().__init__()
        k_attn, k_mlp = jax.random.split(key)
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config, k_attn)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config, k_mlp)

    def forward(self, x: xgrad.Tensor) -> xgrad.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, key: int = 0) -> None:
        super().__init__()
        self.config = config
        keys = jax.random.split(jax.random.key(key), config.n_layer + 3)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd, key=keys[0]),
            wpe=nn.Embedding(config.block_size, config.n_embd, key=keys[1]),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, keys[3 + i]) for i in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False, key=keys[2])
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT does
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: xgrad.Tensor, targets: xgrad.Tensor | None = None) -> tuple[xgrad.Tensor, xgrad.Tensor | None]:
        _, t = idx.shape
        pos = xgrad.arange(0, t)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits, None
        return logits, xgrad.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def get_batch(data: np.ndarray, block_size: int, batch_size: int, rng: np.random.Generator) -> tuple[xgrad.Tensor, xgrad.Tensor]:
    ix = rng.integers(0, len(data) - block_size - 1, size=batch_size)
    x = np.stack([data[i:i + block_size] for i in ix])
    y = np.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return xgrad.tensor(x), xgrad.tensor(y)


def train(steps: int = 200, batch_size: int = 8, compiled: bool = False, config: GPTConfig | None = None, log_every: int = 50) -> list[float]:
    """Train on ``TEXT`` and return the loss of every step."""
    chars = sorted(set(TEXT))
    data = np.array([chars.index(c) for c in TEXT], dtype=np.int32)
    config = config or GPTConfig()
    config.vocab_size = len(chars)
    xgrad.manual_seed(0)
    model = GPT(config)
    optimizer = xgrad.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    scheduler = lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps, eta_min=3e-4)
    rng = np.random.default_rng(0)
    losses = []
    start = time.perf_counter()
    for step in range(steps):
        x, y = get_batch(data, config.block_size, batch_size, rng)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward(compiled=compiled)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:4d}  loss {losses[-1]:.4f}  lr {scheduler.get_last_lr()[0]:.2e}  {time.perf_counter() - start:.1f}s")
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--compiled", action="store_true", help="run the backward as one compiled program")
    args = parser.parse_args()
    n_params = sum(p.numel() for p in GPT(GPTConfig(vocab_size=len(set(TEXT)))).parameters())
    print(f"{n_params} parameters")
    train(args.steps, args.batch_size, args.compiled)


if __name__ == "__main__":
    main()

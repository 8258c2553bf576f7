"""The examples run: examples/nanogpt.py trains a few steps in a few seconds."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # compiling each primitive's first call dominates: ~30 s on 2 busy cores
def test_nanogpt_trains_with_pytorch_names():
    nanogpt = _load("nanogpt")
    config = nanogpt.GPTConfig(block_size=8, n_layer=1, n_head=2, n_embd=16)
    losses = nanogpt.train(steps=12, batch_size=4, config=config, log_every=0)
    assert np.isfinite(losses).all() and np.mean(losses[-3:]) < np.mean(losses[:3])
    model = nanogpt.GPT(config)
    names = list(model.state_dict())
    assert names[:3] == ["transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight"]
    assert "transformer.h.0.attn.bias" in names and names[-1] == "lm_head.weight"
    assert model.lm_head.weight is model.transformer.wte.weight  # tied: one parameter, both names saved
    assert len(list(model.parameters())) == len(names) - 2  # minus the mask buffer and the tied duplicate

"""``xgrad.nn.modules.<path>`` holds each layer where PyTorch keeps it, and ``xgrad.nn`` mirrors
those paths (NOTE [Layer names live at PyTorch's paths]); the reference is PyTorch's own layout,
recorded by tests/fixtures/make_torch_nn_module_paths.py."""

import importlib
import json
import pkgutil
from pathlib import Path

import pytest

import xgrad.nn
import xgrad.nn.modules

TORCH = json.loads((Path(__file__).parent / "fixtures" / "torch_nn_module_paths.json").read_text())
PATHS = sorted(info.name for info in pkgutil.iter_modules(xgrad.nn.modules.__path__))


def _path(name: str):
    return importlib.import_module(f"xgrad.nn.modules.{name}")


def test_the_package_lists_every_path():
    assert sorted(xgrad.nn.modules.__all__) == PATHS


@pytest.mark.parametrize("name", PATHS)
def test_a_path_is_pytorch_s_and_holds_only_its_names(name):
    assert name in TORCH["paths"]
    assert set(_path(name).__all__) <= set(TORCH["paths"][name])


@pytest.mark.parametrize("name", PATHS)
def test_nn_mirrors_the_path(name):
    path = _path(name)
    for member in path.__all__:
        if member in TORCH["in_nn"]:
            assert member in xgrad.nn.__all__ and getattr(xgrad.nn, member) is getattr(path, member), member
        else:  # the global module hooks stay at nn.modules.module, as PyTorch's
            assert not hasattr(xgrad.nn, member), member


def test_each_layer_of_nn_sits_at_pytorch_s_path():
    home = {member: name for name, members in TORCH["paths"].items() for member in members}
    misplaced = []
    for member in xgrad.nn.__all__:
        name = home.get(member)
        if name is not None and (name not in PATHS or member not in _path(name).__all__):
            misplaced.append(f"{member} (torch.nn.modules.{name})")
    assert misplaced == []

"""Containers: ``Sequential``, ``ModuleList``, ``ModuleDict`` (children held by key, named as PyTorch names them)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from xgrad.nn.module import Module


class Sequential(Module):
    """Modules applied one after the other, named ``"0"``, ``"1"``, … (or by an ``OrderedDict``'s keys).

    >>> import xgrad
    >>> net = xgrad.nn.Sequential(xgrad.nn.Linear(2, 4, key=0), xgrad.nn.Tanh())
    >>> net(xgrad.ones(1, 2)).shape, list(net.state_dict())
    ((1, 4), ['0.weight', '0.bias'])
    """

    def __init__(self, *args: Any) -> None:
        items = list(args[0].items()) if len(args) == 1 and isinstance(args[0], OrderedDict) else list(enumerate(args))
        for key, layer in items:
            if not isinstance(layer, Module):
                raise TypeError(f"Sequential takes Modules, got {type(layer).__name__}")
            self.add_module(str(key), layer)

    def forward(self, x: Any) -> Any:
        for layer in self._modules.values():
            if layer is not None:
                x = layer(x)
        return x

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return type(self)(OrderedDict(list(self._modules.items())[index]))
        return _at(self._modules, index)

    def __setitem__(self, index: int, module: Module) -> None:
        _at(self._modules, index)
        self.add_module(list(self._modules)[index], module)

    def __delitem__(self, index: int | slice) -> None:
        keys = list(self._modules)
        for key in keys[index] if isinstance(index, slice) else [keys[_index(keys, index)]]:
            del self._modules[key]
        if all(key.isdigit() for key in keys):  # numbered: numbered again from 0, as PyTorch does
            renumbered = {str(i): m for i, m in enumerate(self._modules.values())}
            self._modules.clear()
            self._modules.update(renumbered)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(m for m in self._modules.values() if m is not None)

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self


def _index(entries: Any, index: int) -> int:
    """A position (negative counts from the end) checked, with PyTorch's IndexError."""
    n = len(entries)
    if not -n <= index < n:
        raise IndexError(f"index {index} is out of range")
    return index % n


def _at(modules: dict[str, Any], index: int) -> Any:
    """The entry at a position (negative counts from the end), with PyTorch's IndexError."""
    return list(modules.values())[_index(modules, index)]


class ModuleList(Module):
    """A list of submodules, registered as ``"0"``, ``"1"``, …

    >>> import xgrad
    >>> blocks = xgrad.nn.ModuleList([xgrad.nn.Linear(2, 2, key=i) for i in range(2)])
    >>> _ = blocks.append(xgrad.nn.ReLU()); len(blocks), [n for n, _ in blocks.named_parameters()][:2]
    (3, ['0.weight', '0.bias'])
    """

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        if modules is not None:
            self.extend(modules)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return ModuleList([m for m in list(self._modules.values())[index] if m is not None])
        return _at(self._modules, index)

    def __setitem__(self, index: int, module: Module) -> None:
        _at(self._modules, index)
        self.add_module(str(index % len(self)), module)

    def __delitem__(self, index: int | slice) -> None:
        values = list(self._modules.values())
        del values[index]
        self._modules.clear()
        self.extend(values)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())  # type: ignore[arg-type]

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        values = list(self._modules.values())
        values.insert(index, module)
        self._modules.clear()
        self.extend(values)  # type: ignore[arg-type]


class ModuleDict(Module):
    """A dict of submodules, registered under their keys.

    >>> import xgrad
    >>> heads = xgrad.nn.ModuleDict({"cls": xgrad.nn.Linear(2, 3, key=0)})
    >>> list(heads.state_dict()), "cls" in heads
    (['cls.weight', 'cls.bias'], True)
    """

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None) -> None:
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        module = self._modules[key]
        assert module is not None
        return module

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: object) -> bool:
        return key in self._modules

    def keys(self) -> Iterable[str]:
        return self._modules.keys()

    def values(self) -> Iterable[Module]:
        return self._modules.values()  # type: ignore[return-value]

    def items(self) -> Iterable[tuple[str, Module]]:
        return self._modules.items()  # type: ignore[return-value]

    def pop(self, key: str) -> Module:
        module = self[key]
        del self[key]
        return module

    def clear(self) -> None:
        self._modules.clear()

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        for key, module in (modules.items() if isinstance(modules, Mapping) else modules):
            self[key] = module

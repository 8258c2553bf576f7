"""``torch.backends.mps``: JAX drives no Apple MPS device, so there is none."""

__all__ = ["is_available", "is_built"]


def is_available() -> bool:
    return False


def is_built() -> bool:
    return False

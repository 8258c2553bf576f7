"""``torch.backends.cpu``."""

__all__ = ["get_cpu_capability"]


def get_cpu_capability() -> str:
    """``"DEFAULT"``: XLA compiles for the host CPU's own instruction set, with no PyTorch-style level to report."""
    return "DEFAULT"

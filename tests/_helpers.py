"""Small helpers the test files share."""

from typing import Any

import numpy as np

import xgrad


def leaf(values: Any) -> xgrad.Tensor:
    """A float64 leaf that requires grad."""
    return xgrad.tensor(np.asarray(values, dtype=np.float64), requires_grad=True)


def close(actual: Any, expected: Any) -> None:
    """Equal to float64 precision (Tensors, arrays or lists)."""
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=1e-12, atol=1e-12)

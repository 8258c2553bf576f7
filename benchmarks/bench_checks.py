"""Cost of the bad-input checks on the forward: µs per op, with and without the check.

Run: ``python benchmarks/bench_checks.py`` (add ``--quick`` for a short run). To compare
with a checkout that has no checks, run the same file with that checkout first on
``PYTHONPATH``: the "op" column is then the before figure.

Each op runs on a 1-element and a 1000-element input, once with its integer index
coming from NumPy (checked on the host) and once as a device ``Tensor`` (checked by one
jitted reduction and a host sync). "check alone" times ``check_index_range`` by itself.
Every timed call waits for its result, so the figures include the device work.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import jax
import numpy as np
from _timing import median_seconds, table

import xgrad


def cases(n: int) -> dict[str, tuple[object, object]]:
    """name -> (op on (x, index), index as NumPy) for an input of ``n`` elements."""
    rng = np.random.default_rng(0)
    index = rng.integers(0, n, size=n)
    classes = 10 if n > 1 else 1
    return {
        "x[index]": (lambda x, i: x[i], index),
        "x[index] = v": (lambda x, i: x.__setitem__(i, 1.0), index),
        "gather": (lambda x, i: xgrad.gather(x, 0, i), index),
        "index_select": (lambda x, i: xgrad.index_select(x, 0, i), index),
        "embedding": (lambda x, i: xgrad.embedding(i, x.reshape(n, 1)), index),
        "cross_entropy": (
            lambda x, i: xgrad.cross_entropy(x.reshape(-1, classes), i),
            rng.integers(0, classes, size=n // classes),
        ),
    }


def rows(repeats: int) -> list[tuple[str, ...]]:
    try:
        from xgrad.ops._util import check_index_range
    except ImportError:  # a checkout without the checks
        check_index_range = None
    out = []
    for n in (1, 1000):
        x = xgrad.tensor(np.linspace(0.0, 1.0, n))
        for name, (op, index) in cases(n).items():
            device_index = xgrad.tensor(index)
            jax.block_until_ready(device_index.array)
            for kind, idx in (("numpy", index), ("device", device_index)):
                def run(op=op, idx=idx, x=x) -> None:  # noqa: ANN001
                    y = op(x, idx)
                    jax.block_until_ready((y if y is not None else x).array)

                us = median_seconds(run, repeats) * 1e6
                check = ""
                if check_index_range is not None:
                    arr = idx.array if kind == "device" else idx
                    check = f"{median_seconds(lambda a=arr, n=n: check_index_range(a, n, 'x {index}'), repeats) * 1e6:.1f}"
                out.append((f"{name}, n={n}, {kind} index", f"{us:.1f}", check))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    repeats = 20 if args.quick else 200
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, xgrad from {os.path.dirname(xgrad.__file__)}, "
          f"medians of {repeats} repeats\n")
    print(table(rows(repeats), ("op", "µs/op", "check alone µs")))


if __name__ == "__main__":
    main()

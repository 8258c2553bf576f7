"""Public PyTorch programs (tests/programs/*), changed only in their imports, data and sizes, train
under xgrad to PyTorch's losses.

Each program runs through ``_harness.run_program`` in float64, as
tests/fixtures/make_program_losses.py ran it under PyTorch: the same initial weights and random
draws, the program's own arguments, data loading, model, loss, optimizer and loop. Every value
``backward`` was called on must match PyTorch's, with the eager engine and with every backward
compiled.
"""

import json
from pathlib import Path

import numpy as np
import pytest

import xgrad
from tests._backward_modes import eager_and_compiled  # noqa: F401
from tests.programs._harness import CASES, run_program

# Slow: each program's first steps compile its ops (tens of XLA compiles, seconds each on a busy 2-core machine).
pytestmark = [pytest.mark.usefixtures("eager_and_compiled"), pytest.mark.slow]

# The Transformer language model builds its positional encodings in float32 (``dtype=torch.float``),
# where PyTorch's and XLA's sin/cos differ in the last bit: its losses agree to float32 rounding.
# GAT runs in float32 (its features are torch.FloatTensor): its losses agree to float32 rounding.
RTOL = {"word_language_model_transformer": 1e-6, "gat": 1e-6}

TORCH_LOSSES = json.loads((Path(__file__).parents[1] / "fixtures" / "program_losses.json").read_text())


# chargpt reads its input with open(...).read() and never closes the file ("don't worry we won't
# run out of file handles"): the program's own ResourceWarning, not xgrad's. nanoGPT makes a
# torch.cuda.amp.GradScaler, deprecated, which disables itself without a GPU: PyTorch's warnings, as PyTorch.
@pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning",
    "ignore:`torch.cuda.amp.GradScaler:FutureWarning", "ignore:torch.cuda.amp.GradScaler is enabled:UserWarning",
    "ignore:dropout2d. Received a 2-D input:UserWarning",  # mnist_rnn's Dropout2d after its LSTM: PyTorch warns too
)
@pytest.mark.parametrize("name", sorted(CASES))
def test_program_trains_to_pytorchs_losses(name: str, tmp_path: Path) -> None:
    losses = run_program(xgrad, CASES[name], tmp_path)
    np.testing.assert_allclose(losses, TORCH_LOSSES[name], rtol=RTOL.get(name, 1e-10), atol=0)

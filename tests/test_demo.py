"""``python -m xgrad demo`` end to end, in a subprocess as a user runs it."""

import json
import re
import subprocess
import sys

import pytest


def _run(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "xgrad", *args], capture_output=True, text=True, timeout=timeout)


def _final_losses(stdout):
    """``{run name: final loss}`` from the demo's table."""
    rows = re.findall(r"^(xgrad eager|xgrad compiled backward|jax\.jit\S* \+ optax)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", stdout, re.M)
    return {name: float(loss) for name, _, _, loss in rows}


@pytest.mark.slow
def test_eager_demo_trains_matches_jax_and_writes_a_trace(tmp_path):
    trace = tmp_path / "trace.json"
    proc = _run("demo", "--steps", "20", "--eager", "--profile", str(trace))
    assert proc.returncode == 0, proc.stderr
    losses = _final_losses(proc.stdout)
    assert set(losses) == {"xgrad eager", "jax.jit(jax.value_and_grad) + optax"}
    # Same init, batches and optimizer: the eager run must track plain JAX.
    assert losses["xgrad eager"] == pytest.approx(losses["jax.jit(jax.value_and_grad) + optax"], rel=1e-3, abs=1e-4)
    assert "20 steps on cpu:0" in proc.stdout
    assert "eager:" in proc.stderr and "loss=" in proc.stderr  # the progress bar
    assert "LinearBackward" in proc.stdout  # the profile table
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e["name"] == "TanhBackward" for e in events)


@pytest.mark.slow
def test_default_demo_compares_eager_and_compiled():
    # Needs xgrad.autograd.compiled (the compiled backward).
    proc = _run("demo", "--steps", "20")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "eager and compiled agree" in proc.stdout
    assert set(_final_losses(proc.stdout)) == {"xgrad eager", "xgrad compiled backward", "jax.jit(jax.value_and_grad) + optax"}
    hits = int(re.search(r"(\d+) cache hits", proc.stdout).group(1))
    assert hits >= 18  # one miss, then every step of the same shapes hits


def test_bad_arguments(capsys):
    from xgrad.__main__ import main
    from xgrad.demo import main as demo_main

    with pytest.raises(SystemExit) as exit_info:
        demo_main(["--steps", "1"])
    assert exit_info.value.code == 2 and "--steps must be more than 2" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        demo_main(["--device", "tpu:9"])
    assert exit_info.value.code == 2 and "tpu:9" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        demo_main(["--eager", "--compiled"])
    assert "not allowed with argument" in capsys.readouterr().err
    assert main(["train"]) == 2 and "unknown command 'train'" in capsys.readouterr().err
    assert main([]) == 2 and "usage: python -m xgrad COMMAND" in capsys.readouterr().out
    assert main(["--help"]) == 0 and "  demo  train a small MLP" in capsys.readouterr().out


def test_help_describes_the_four_ways_it_trains(capsys):
    from xgrad.__main__ import main
    from xgrad.demo import main as demo_main

    with pytest.raises(SystemExit) as exit_info:
        demo_main(["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    for way in ("1. xgrad eager", "2. xgrad compiled backward", "3. xgrad.compile", "4. the reference: a plain jax.jit"):
        assert way in out
    assert "python -m xgrad demo --eager --steps 50" in out  # a runnable example
    assert main(["--help"]) == 0
    assert "four ways (eager, compiled backward, xgrad.compile, jax.jit)" in capsys.readouterr().out

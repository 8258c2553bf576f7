"""Run a test's Python script in a fresh interpreter: another device count, a fork, an exit.

The script sees float64 on and the host split into ``devices`` devices before JAX is
imported; it prints one JSON document on its last stdout line, which ``run_json`` returns.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Sequence

# XLA options that compile the suite's thousands of tiny CPU programs about twice as fast
# (LLVM's optimizations and the fusion emitters dominate their compile time); they change
# how XLA generates code, not what a program computes, beyond the last bits of some float64
# functions (NOTE [A fused float64 tanh] in test_compile_observers.py). XLA aborts the process at JAX's first
# computation on a flag it does not know, and each XLA release drops some (jax 0.12's has no
# --xla_cpu_use_fusion_emitters), so the suite passes only those the installed XLA knows.
FAST_COMPILE_CANDIDATES = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",
)
UNKNOWN_XLA_FLAGS = re.compile(r"Unknown flags? in XLA_FLAGS: (.*)")
# The answer for this test session, inherited by its xdist workers and the scripts its tests run.
FAST_COMPILES_ENV = "XGRAD_TEST_FAST_COMPILES"


def _flag_name(flag: str) -> str:
    return flag.split("=", 1)[0]


def known_xla_flags(flags: Sequence[str]) -> list[str]:
    """``flags`` less those the installed XLA does not know, asked of XLA itself in a fresh
    interpreter (it names the unknown ones as it refuses them)."""
    remaining = list(flags)
    while True:
        probe = subprocess.run(
            [sys.executable, "-c", "import jax; jax.devices()"], capture_output=True, text=True, timeout=120,
            env={**os.environ, "XLA_FLAGS": " ".join(remaining), "JAX_PLATFORMS": "cpu"},
        )
        if probe.returncode == 0:
            return remaining
        match = UNKNOWN_XLA_FLAGS.search(probe.stderr)
        unknown = {_flag_name(flag) for flag in match.group(1).split()} if match else set()
        known = [flag for flag in remaining if _flag_name(flag) not in unknown]
        if len(known) == len(remaining):
            raise RuntimeError(f"JAX does not start with XLA_FLAGS={' '.join(remaining)!r}:\n{probe.stderr}")
        remaining = known


if FAST_COMPILES_ENV not in os.environ:
    os.environ[FAST_COMPILES_ENV] = " ".join(known_xla_flags(FAST_COMPILE_CANDIDATES))
FAST_COMPILES = os.environ[FAST_COMPILES_ENV]

PRELUDE = f"""\
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count={{devices}} {FAST_COMPILES}"
import jax
jax.config.update("jax_enable_x64", True)
"""


def run_script(code: str, devices: int = 4, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` (dedented) after the prelude; fail with its stderr if it exits non-zero."""
    source = PRELUDE.format(devices=devices) + textwrap.dedent(code)
    full_env = {**os.environ, **(env or {})}
    full_env.pop("XLA_FLAGS", None)
    result = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=timeout, env=full_env)
    if result.returncode != 0:
        raise AssertionError(f"script exited with {result.returncode}:\n{result.stderr}")
    return result


def run_json(code: str, devices: int = 4, timeout: float = 60, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` and return the JSON document it printed last."""
    result = run_script(code, devices, timeout, env)
    return json.loads(result.stdout.strip().splitlines()[-1])

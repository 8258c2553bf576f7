"""Run a test's Python script in a fresh interpreter: another device count, a fork, an exit.

The script sees float64 on and the host split into ``devices`` devices before JAX is
imported; it prints one JSON document on its last stdout line, which ``run_json`` returns.
"""

import json
import os
import subprocess
import sys
import textwrap

# XLA options that compile the suite's thousands of tiny CPU programs about twice as fast
# (LLVM's optimizations and the fusion emitters dominate their compile time); they change
# how XLA generates code, not what a program computes.
FAST_COMPILES = (
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false"
)

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

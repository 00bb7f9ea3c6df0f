"""The package's tests run on cudamem's simulated GPU (no GPU, no torch needed)."""

import itertools
import os
import subprocess
import sys

os.environ.setdefault("CUDAMEM_DEVICE", "sim")

import pytest  # noqa: E402

import cudamem  # noqa: E402

# Each test gets device ordinals nobody used before, so that it sees fresh allocators and
# statistics (the allocators of a process live until it exits).
_ordinals = itertools.count(1)


@pytest.fixture
def dev():
    d = next(_ordinals)
    assert d < cudamem._cudamem.MAX_DEVICES, "too many tests for the device ordinals"
    return d


@pytest.fixture
def new_dev():
    """A factory of fresh device ordinals, for tests that need several."""
    return lambda: next(_ordinals)


@pytest.fixture
def run_python():
    """Runs `code` in a fresh interpreter on the simulated device, with `env` added to the
    environment; returns the completed process (text output captured)."""

    def run(code, **env):
        full = {**os.environ, "CUDAMEM_DEVICE": "sim", **env}
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)

    return run

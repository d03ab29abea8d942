"""Shared fixtures of the unit tests."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

# One torch thread in each test process. The README's command runs two workers on the two cores, so a second
# intra-op thread in one worker only waits for the core the other holds: tests/test_checkers.py took 18 s with
# torch's default of two threads and 3.5 s with one, next to a process busy on the other core. A test about
# threads sets its own count first; the notebooks' kernels set theirs in helpers.seed_everything.
torch.set_num_threads(1)

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def load_experiment_script(name: str) -> ModuleType:
    """Import ``experiments/<name>.py`` (the sweep scripts are files, not a package)."""
    path = EXPERIMENTS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"experiments_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def experiment_script():
    """``experiment_script(name)`` imports ``experiments/<name>.py`` once per session."""
    cache: dict[str, ModuleType] = {}

    def load(name: str) -> ModuleType:
        if name not in cache:
            cache[name] = load_experiment_script(name)
        return cache[name]

    return load

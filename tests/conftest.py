"""Shared fixtures of the unit tests."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

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

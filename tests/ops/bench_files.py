"""A script or helper of bench/, imported from its path for a CPU test (not a test module)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str):
    """bench/NAME.py as a fresh module (each call runs it anew)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")  # named as the file (test_patch checks)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

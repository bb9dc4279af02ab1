"""Load a script or benchmark of the repository (not a package) as a module, for its tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load(relative: str) -> ModuleType:
    """The file at ``relative`` (to the repository's root), imported under a name of its own."""
    name = Path(relative).stem
    spec = importlib.util.spec_from_file_location(f"_dpkit_{name}", REPO / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while it loads
    spec.loader.exec_module(module)
    return module

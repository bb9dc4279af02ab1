"""dpkit.check_environment(): is this environment ready for the course? One line per item.

The usual trouble it catches: ipywidgets without its JupyterLab extension, or the two at
versions that do not fit ("Error displaying widget" in the browser while the kernel is
fine), and a torch too old for dpkit.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dpkit import device

MIN_TORCH = (2, 4)


@dataclass
class EnvironmentReport:
    """What ``check_environment()`` found: a line per item, and whether all it needs is there."""

    lines: list[str] = field(default_factory=list)
    ok: bool = True

    def add(self, passed: bool, text: str, required: bool = True) -> None:
        self.lines.append(f"{'ok  ' if passed else ('FAIL' if required else 'note')}  {text}")
        self.ok = self.ok and (passed or not required)

    def __str__(self) -> str:
        verdict = "ready for the course" if self.ok else "not ready: fix the FAIL lines above"
        return "\n".join([*self.lines, "", verdict])


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _major(version: str | None) -> int | None:
    return int(version.split(".")[0]) if version else None


def _torch_ok() -> bool:
    release = torch.__version__.split("+")[0].split(".")
    return tuple(int(part) for part in release[:2]) >= MIN_TORCH


def _widget_extension_installed() -> bool:
    share = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "@jupyter-widgets"
    return (share / "jupyterlab-manager").exists()


def front_end() -> str:
    """Where the notebooks are shown: ``"colab"`` (Google Colab draws widgets with its own
    manager) or ``"jupyter"`` (JupyterLab or the classic Notebook, from this environment)."""
    if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ:
        return "colab"
    return "jupyter"


def check_environment(verbose: bool = True) -> EnvironmentReport:
    """Check torch, the devices dpkit will use, and the widget stack; print and return it.
    The widget front end may be JupyterLab (jupyterlab_widgets 3), the classic Notebook
    (widgetsnbextension 4) or Colab (its own, nothing to install)."""
    report = EnvironmentReport()
    report.add(sys.version_info >= (3, 10), f"python {platform.python_version()} (needs >= 3.10)")
    report.add(_torch_ok(), f"torch {torch.__version__} (needs >= 2.4)")
    kind, count = device.accelerator_type(), device.accelerator_count()
    found = f"{count} x {kind}" if kind else "none: virtual CPU lanes will stand in"
    report.add(True, f"accelerators: {found}")
    report.add(True, describe_choice(4))
    ipywidgets, lab_widgets = _version("ipywidgets"), _version("jupyterlab_widgets")
    report.add(ipywidgets is not None, f"ipywidgets {ipywidgets or 'missing: pip install it'}")
    if front_end() == "colab":
        report.add(True, "front end: Colab, which draws the widgets itself")
    else:
        classic = _version("widgetsnbextension")
        matching = _major(ipywidgets) == 8 and (_major(lab_widgets) == 3 or _major(classic) == 4)
        report.add(
            matching,
            f"jupyterlab_widgets {lab_widgets or 'missing'}, widgetsnbextension "
            f"{classic or 'missing'} (ipywidgets 8 needs jupyterlab_widgets 3 for JupyterLab "
            "or widgetsnbextension 4 for the classic Notebook, else 'Error displaying widget')",
        )
        report.add(
            _widget_extension_installed(),
            "widget extension for JupyterLab in this environment",
            required=False,
        )
    report.add(_version("matplotlib") is not None, f"matplotlib {_version('matplotlib')}")
    pytest, hypothesis = _version("pytest"), _version("hypothesis")
    report.add(
        pytest is not None and hypothesis is not None,
        f"pytest {pytest or 'missing'}, hypothesis {hypothesis or 'missing'} "
        "(dpkit grade runs the exercises' graders with them)",
    )
    if verbose:
        print(report)
    return report


def describe_choice(n: int) -> str:
    """One line saying which kind of device ``devices(n)`` gives on this machine, and why."""
    chosen = device.devices(n)
    if chosen[0].kind == device.REAL:
        names = ", ".join(d.name for d in chosen)
        return f"devices({n}) -> {_counted(n, 'real accelerator')}: {names}"
    where = "the GPU, a CUDA stream each" if chosen[0].has_own_stream else "the CPU, a thread each"
    have = _counted(device.accelerator_count(), "real accelerator")
    return f"devices({n}) -> {_counted(n, 'virtual lane')} on {where} (this machine has {have})"


def _counted(count: int, thing: str) -> str:
    return f"{count} {thing}" if count == 1 else f"{count} {thing}s"
